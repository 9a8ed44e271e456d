"""bench/hostile.py measures issue 10's probes: its inputs must be what they claim, its limits must hold."""
from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import yaml

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import hostile  # noqa: E402
import hostile_inputs as H  # noqa: E402
from hostile_run import run, stderr_verdict  # noqa: E402

CATALOG = Path(__file__).resolve().parents[1] / "rules" / "catalog"


def _regex(rule_id: str) -> str:
    for f in CATALOG.rglob("*.yaml"):
        for p in (yaml.safe_load(f.read_text()) or {}).get("patterns") or []:
            if p.get("id") == rule_id:
                return p["regex"]
    raise AssertionError(f"{rule_id} is not in the catalog")


def test_redos_line_is_230_bytes_of_the_rule_prefix_without_its_closing_part() -> None:
    line = H.redos_line("torch.watchdog_timeout", 26, 230)
    assert len(line.encode()) == 230 and line.count(H.REDOS_ITEM) == 26
    for rule in H.REDOS_HEADS:
        rx = re.compile(_regex(rule))
        short = H.redos_line(rule, 10)                  # few items: Python's re answers at once
        assert rx.search(short) is None
        # The same head and items do match once the closing part is there: the prefix is the rule's.
        closing = (", Timeout(ms)=1) ran for 1 milliseconds before timing out" if rule == "torch.watchdog_timeout"
                   else ", Timeout(ms)=1) timed out in blocking wait")
        assert rx.search(short[: -len(H.REDOS_TAILS[rule])] + closing) is not None


def test_hostlist_expansion_counts_every_node() -> None:
    nodes = hostile.expand("gpu[001-512]")
    assert len(nodes) == 512 and nodes[0] == "gpu001" and nodes[-1] == "gpu512"
    assert hostile.expand("n[1-3,7]x") == ["n1x", "n2x", "n3x", "n7x"]
    assert hostile.expand("gpu-017") == ["gpu-017"]


def test_run_kills_at_the_limit_and_measures_peak_rss(tmp_path: Path) -> None:
    t = time.perf_counter()
    slow = run([sys.executable, "-c", "import time; time.sleep(30)"], 0.5, tmp_path)
    assert slow.rc is None and time.perf_counter() - t < 25          # killed at 0.5 s, not after its 30 s sleep
    big = run([sys.executable, "-c", "b = bytearray(200 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096])"],
              60, tmp_path)
    assert big.rc == 0 and big.peak_mb is not None and big.peak_mb >= 200


def test_a_traceback_is_reported_by_its_exception() -> None:
    err = 'Traceback (most recent call last):\n  File "x", line 1\nOverflowError: date value out of range\n'
    assert stderr_verdict(err) == "TRACEBACK OverflowError: date value out of range"
    assert stderr_verdict("firstfault: unusable bundle: x\n") == "firstfault: unusable bundle: x"


def test_bombs_are_small_archives_that_expand_hugely(tmp_path: Path) -> None:
    tgz = H.tar_bomb(tmp_path, 64 * H.MiB)
    assert tgz.stat().st_size < 200 * 1024            # ~1000:1, so the 1 GiB probe is about 1 MiB
    z = H.zip_bomb(tmp_path, 64 * H.MiB)
    assert z.stat().st_size < 200 * 1024
