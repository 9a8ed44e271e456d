"""The same incident told differently gives the same diagnosis.

Each sample is rewritten in ways that change no fact: its hosts renamed (in the record, the
lines and the file names), its dates moved four years on, its line ends made CRLF, a blank
line put after every line, spaces left at the ends of lines, its logs gzipped, its lines painted in terminal
colours (with and without their ESC), a byte-order mark at the start of each log, an unstamped progress-bar line
after every line. The status, sub_domain and recovery action stay, and the nodes named are the same nodes under their new names.
"""
from __future__ import annotations

import gzip
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from firstfault.rules.engine import analyze_path

from conftest import sample_dirs

MONTHS = "Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
_ISO_DATE = re.compile(r"(?<!\d)(20[0-3]\d)-(\d\d)-(\d\d)(?=[T _]\d\d:|\b)")
_MON_YEAR = re.compile(r"\b(?:" + MONTHS + r") +\d{1,2},? (20[0-3]\d)\b")       # Fabric Manager's "Jul 23 2024"
_CTIME_YEAR = re.compile(r"(\d\d:\d\d:\d\d) (20[0-3]\d)\b")                     # dmesg -T's "... 10:00:00 2026"


def _years_on(text: str, n: int = 4) -> str:
    text = _ISO_DATE.sub(lambda m: m[0] if (m[2], m[3]) == ("02", "29") else f"{int(m[1]) + n}-{m[2]}-{m[3]}", text)
    text = _MON_YEAR.sub(lambda m: m[0][:m.start(1) - m.start(0)] + str(int(m[1]) + n), text)
    return _CTIME_YEAR.sub(lambda m: f"{m[1]} {int(m[2]) + n}", text)


def _nodes(sample: Path) -> list[str]:
    import json
    return json.loads((sample / "workload.json").read_text())["nodes"]


def _rename_map(sample: Path) -> dict[str, str]:
    return {n: f"rack7-node{i:02d}" for i, n in enumerate(sorted(_nodes(sample)))}


def _rewrite(root: Path, fn: Callable[[str], str], logs_only: bool) -> None:
    for p in sorted(root.rglob("*")):
        if p.is_file() and not (logs_only and p.suffix == ".json"):
            p.write_bytes(fn(p.read_bytes().decode("latin-1")).encode("latin-1"))


def _renamed(sample: Path, dst: Path) -> dict[str, str]:
    names = _rename_map(sample)
    rx = re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")(?![\w-])")
    _rewrite(dst, lambda t: rx.sub(lambda m: names[m[1]], t), logs_only=False)
    for p in sorted(dst.rglob("*"), key=lambda p: -len(p.parts)):          # deepest first
        new = rx.sub(lambda m: names[m[1]], p.name)
        if new != p.name:
            p.rename(p.with_name(new))
    return {v: k for k, v in names.items()}


def _same(fn: Callable[[str], str], logs_only: bool) -> Callable[[Path, Path], dict[str, str]]:
    def rewrite(sample: Path, dst: Path) -> dict[str, str]:
        _rewrite(dst, fn, logs_only)
        return {}
    return rewrite


_BAR = "Epoch 3:  41%|####      | 410/1000 [01:02<01:30,  6.54it/s, loss=2.31]"      # no stamp, no anchor


def _each_line(text: str, fn: Callable[[str], str]) -> str:
    """``fn`` applied to every non-empty line; line ends kept."""
    return "".join(fn(line[:-1]) + "\n" if line.endswith("\n") else fn(line)
                   for line in text.splitlines(keepends=True) if line) if text else text


def _gzipped(sample: Path, dst: Path) -> dict[str, str]:
    for p in sorted((dst / "logs").rglob("*.log")):
        p.with_name(p.name + ".gz").write_bytes(gzip.compress(p.read_bytes()))
        p.unlink()
    return {}


# variant -> rewrite(sample, its copy) -> {new host name: old}
VARIANTS: dict[str, Callable[[Path, Path], dict[str, str]]] = {
    "hosts renamed": _renamed,
    "four years on": _same(_years_on, logs_only=False),
    "CRLF line ends": _same(lambda t: t.replace("\n", "\r\n"), logs_only=True),
    "a blank line after each": _same(lambda t: t.replace("\n", "\n\n"), logs_only=True),
    "trailing spaces": _same(lambda t: t.replace("\n", "  \n"), logs_only=True),
    "logs gzipped": _gzipped,
    # Ray wraps each relayed line in colours; pasted, the ESC is often lost ("[36m(Worker pid=N)[0m")
    "terminal colours": _same(lambda t: _each_line(t, lambda l: f"\x1b[36m{l}\x1b[0m"), logs_only=True),
    "colours without their ESC": _same(lambda t: _each_line(t, lambda l: f"[36m{l}[0m"), logs_only=True),
    "a byte-order mark": _same(lambda t: "\xef\xbb\xbf" + t, logs_only=True),         # UTF-8 BOM, as latin-1 text
    "a progress bar line after each": _same(lambda t: _each_line(t, lambda l: l + "\n" + _BAR), logs_only=True),
}


def _key(d: dict, back: dict[str, str]) -> dict:
    return {"status": d["status"], "sub_domain": d["sub_domain"], "recovery": d["recovery"]["action"],
            "responsible": sorted(back.get(n, n) for n in d["responsible_nodes"]),
            "suspects": sorted(back.get(n, n) for n in d["suspect_nodes"]),
            "recovery_nodes": sorted(back.get(n, n) for n in d["recovery"]["nodes"])}


def _text(root: Path) -> str:
    return "".join(p.as_posix() + p.read_bytes().decode("latin-1") for p in sorted(root.rglob("*")) if p.is_file())


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("sample", sample_dirs(), ids=lambda p: p.name)
def test_an_incident_told_differently_is_diagnosed_alike(sample, variant, tmp_path):
    dst = tmp_path / sample.name
    shutil.copytree(sample, dst)
    back = VARIANTS[variant](sample, dst)
    assert _text(dst) != _text(sample)                      # the rewrite changed something
    if back:
        assert not re.search(r"(?<![\w.-])(" + "|".join(map(re.escape, back.values())) + r")(?![\w-])", _text(dst))
    base = analyze_path(sample).diagnosis.to_dict()
    got = analyze_path(dst).diagnosis.to_dict()
    assert _key(got, back) == _key(base, {})


def test_years_move_in_every_written_form():
    assert _years_on("2026-11-02T10:00:00Z [Jul 23 2024 07:53:55] Mon Nov  2 10:00:00 2026 2024-02-29") == \
        "2030-11-02T10:00:00Z [Jul 23 2028 07:53:55] Mon Nov  2 10:00:00 2030 2024-02-29"


# Bare logs as posted (corpus/real), where nothing but the lines names the hosts and places the lines:
# the colours and the byte-order mark must not hide a prefix, a host or the cause.
CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "real"
BARE = ["app-usr-db-288", "app-usr-arcticinf-175", "app-oom-nccl-1235", "ho5-launch-rdzv-horovodrun-ssh-unresolved-host-slots-horovod-951",
        "ho3-usr-device-mismatch-rank2-grpo-xr1-21", "net-ncclcfg-nosockif-mambatree-14", "net-shm-docker-buserror-dope-297",
        "ho-unattr-watchdog-seq-mismatch-1516-1517-llamafactory-2902"]
BARE_VARIANTS = ("terminal colours", "colours without their ESC", "a byte-order mark", "a progress bar line after each")


@pytest.mark.parametrize("variant", BARE_VARIANTS)
@pytest.mark.parametrize("case", BARE)
def test_a_posted_log_told_differently_is_diagnosed_alike(case, variant, tmp_path):
    import json
    spec = json.loads((CORPUS / case / "case.json").read_text())
    src = CORPUS / case / spec["input"]
    assert src.is_file()
    dst = tmp_path / src.name
    shutil.copy(src, dst)
    VARIANTS[variant](src, tmp_path)
    assert dst.read_bytes() != src.read_bytes()
    base = analyze_path(src).diagnosis.to_dict()
    got = analyze_path(dst).diagnosis.to_dict()
    assert base["status"] == spec["expected"]["status"]
    assert _key(got, {}) == _key(base, {})
