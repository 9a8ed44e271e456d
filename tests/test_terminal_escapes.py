"""Log lines, workload ids and file names are untrusted: on a terminal they are shown, never obeyed.

A line or an id may carry a clipboard write (OSC 52), a title change (OSC 0), a screen clear
(CSI 2J), a one-byte C1 CSI (0x9b) or a bidi override. Every human output escapes them; the
``--json`` outputs stay byte for byte what they were. Commands run as a user runs them (a
subprocess of ``python -m firstfault``); the broker for ``diagnoses`` is real (conftest_kafka)."""
from __future__ import annotations

pytest_plugins = ["conftest_kafka"]

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from firstfault.render import summary
from firstfault.rules.engine import analyze_path
from firstfault.schemas.avro import encode
from firstfault.streams import kafka, runfile
from firstfault.term import printable

ROOT = Path(__file__).resolve().parents[1]
OOM = ROOT / "samples" / "host-oom-killer"
CLIPBOARD, TITLE, CLEAR, CSI, BIDI = "\x1b]52;c;ZWNobyBoaQ==\x07", "\x1b]0;title\x07", "\x1b[2J", "\x9b2J", "\u202e"
PAYLOAD = CLIPBOARD + TITLE + CLEAR + CSI + BIDI
# What a reader sees instead: each control character written out.
SHOWN = ["\\x1b]52;c;ZWNobyBoaQ==\\x07", "\\x1b]0;title\\x07", "\\x1b[2J", "\\x9b2J", "\\u202e"]
# What a terminal would obey: C0 but the newline between lines, DEL, C1, the bidi controls.
OBEYED = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def hostile_bundle(tmp_path: Path) -> Path:
    """The OOM sample with the payload in its workload id and in the root cause's line."""
    root = tmp_path / "bundle"
    shutil.copytree(OOM, root)
    wl = json.loads((root / "workload.json").read_text())
    wl["workload_id"] = "slurm-1" + PAYLOAD
    (root / "workload.json").write_text(json.dumps(wl))
    log = root / "logs" / "syslog" / "dgx-a02.log"
    log.write_text(log.read_text().replace("] oom-kill:", "] " + PAYLOAD + "oom-kill:"))
    return root


def firstfault(argv: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTFAULT_")}
    clean.update(FIRSTFAULT_RUN_FILE=str(tmp_path / "run" / "up.json"), **env)
    return subprocess.run([sys.executable, "-m", "firstfault", *argv], env=clean, cwd=tmp_path, capture_output=True,
                          timeout=120)


def assert_inert(raw: bytes, *shown: str) -> str:
    text = raw.decode("utf-8")
    assert not OBEYED.findall(text), OBEYED.findall(text)
    for s in shown:
        assert s in text, (s, text)
    return text


def test_printable_writes_out_every_control_character():
    assert printable("plain ≥ → × text") == "plain ≥ → × text"
    assert printable(PAYLOAD) == "".join(SHOWN)
    assert printable("a\tb\nc\rd\x00\x7f\x85\u2066\u200f") == "a\\tb\\nc\\rd\\x00\\x7f\\x85\\u2066\\u200f"
    assert printable("one\ntwo\x1b", lines=True) == "one\ntwo\\x1b"           # newlines kept where they are structure
    assert printable("\udcff") == "\\udcff"                                    # a lone surrogate cannot reach the terminal


def test_analyze_text_shows_the_escapes_and_json_is_unchanged(tmp_path):
    bundle = hostile_bundle(tmp_path)
    p = firstfault(["analyze", str(bundle)], tmp_path)
    assert p.returncode == 0, p.stderr
    out = assert_inert(p.stdout, *SHOWN)
    assert out.startswith("firstfault  slurm-1" + "".join(SHOWN))              # the workload id
    assert "| Nov  6 08:41:16 dgx-a02 kernel: [971317.338714] " + "".join(SHOWN) + "oom-kill:" in out
    assert_inert(p.stderr)

    j = firstfault(["analyze", str(bundle), "--json"], tmp_path)
    assert j.returncode == 0, j.stderr
    assert j.stdout == (analyze_path(bundle).diagnosis.to_json() + "\n").encode()
    assert CSI.encode() in j.stdout and BIDI.encode() in j.stdout             # as the data has it: JSON is for programs


def test_a_warning_naming_a_hostile_file_is_escaped(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    shutil.copy(OOM / "logs" / "syslog" / "dgx-a02.log", logs / "dgx-a02.log")
    (logs / ("empty" + TITLE + ".log")).write_text("")                       # skipped, with a warning naming it
    p = firstfault(["analyze", str(logs)], tmp_path)
    assert p.returncode == 0, p.stderr
    assert_inert(p.stderr, "warning: skipped empty\\x1b]0;title\\x07.log: empty")


def test_the_coloured_summary_carries_no_escape_but_its_own_colours(tmp_path):
    d = analyze_path(hostile_bundle(tmp_path)).diagnosis
    text = summary(d, {"files": 1, "lines": 1, "candidates": 1, "matched": 1, "unparsed": 0}, color=True)
    ours = re.compile(r"\x1b\[(?:1;3[123]|1|0)m")
    assert ours.search(text)
    assert not OBEYED.findall(ours.sub("", text))
    assert "".join(SHOWN) in text


def test_an_error_naming_a_hostile_path_is_one_escaped_line(tmp_path):
    p = firstfault(["analyze", str(tmp_path / ("nope" + PAYLOAD))], tmp_path)
    assert p.returncode == 2
    err = assert_inert(p.stderr, *SHOWN)
    assert len(err.strip().splitlines()) == 1 and "no such file" in err


def test_a_run_file_naming_a_hostile_broker_is_shown_escaped(tmp_path):
    path = tmp_path / "run" / "up.json"
    runfile.write(runfile.RunInfo(bootstrap="127.0.0.1:1" + TITLE, pid=os.getpid(), started_at=runfile.now_iso(),
                                  rules_version="x", log_file="/x/up" + CLEAR + ".log"), path)
    p = firstfault(["diagnoses"], tmp_path)
    assert p.returncode == 2
    err = assert_inert(p.stderr, "127.0.0.1:1\\x1b]0;title\\x07", "/x/up\\x1b[2J.log")
    assert len(err.strip().splitlines()) == 1


def test_up_refusing_beside_a_hostile_run_file_shows_it_escaped(tmp_path):
    path = tmp_path / "run" / "up.json"
    runfile.write(runfile.RunInfo(bootstrap="127.0.0.1:1" + CLIPBOARD, pid=os.getpid(), started_at=runfile.now_iso(),
                                  rules_version="x"), path)
    p = firstfault(["up"], tmp_path)
    assert p.returncode == 2
    err = assert_inert(p.stderr, "already running", "127.0.0.1:1\\x1b]52;c;ZWNobyBoaQ==\\x07")
    assert len(err.strip().splitlines()) == 1


@pytest.fixture
def published(stream_cfg, tmp_path):
    """The hostile bundle's diagnosis, published on a diagnoses topic of this test's own."""
    d = analyze_path(hostile_bundle(tmp_path)).diagnosis.model_copy(update={"revision": 0, "provisional": False})
    topic = stream_cfg.topic("diagnoses")
    kafka.ensure_topics(stream_cfg, [topic])
    prod = kafka.producer(stream_cfg)
    prod.produce(topic, key=d.workload_id.encode(), value=encode(d))
    assert prod.flush(20) == 0
    return d


def test_diagnoses_shows_the_escapes_and_json_is_unchanged(stream_cfg, published, tmp_path):
    env = {"FIRSTFAULT_KAFKA_BOOTSTRAP": stream_cfg.bootstrap, "FIRSTFAULT_TOPIC_PREFIX": stream_cfg.prefix}
    for argv in (["diagnoses"], ["diagnoses", "--all"]):
        p = firstfault([*argv, "--idle", "1"], tmp_path, **env)
        assert p.returncode == 0, p.stderr
        out = assert_inert(p.stdout, "slurm-1" + "".join(SHOWN))
        assert_inert(p.stderr)
        assert "dgx-a02" in out
    j = firstfault(["diagnoses", "--json", "--idle", "1"], tmp_path, **env)
    assert j.returncode == 0, j.stderr
    assert j.stdout == (json.dumps(published.to_dict(), sort_keys=True, ensure_ascii=False) + "\n").encode()


def test_ship_names_a_hostile_bundle_path_escaped(stream_cfg, tmp_path):
    env = {"FIRSTFAULT_KAFKA_BOOTSTRAP": stream_cfg.bootstrap, "FIRSTFAULT_TOPIC_PREFIX": stream_cfg.prefix}
    p = firstfault(["ship", str(tmp_path / ("gone" + PAYLOAD))], tmp_path, **env)
    assert p.returncode == 2
    err = assert_inert(p.stderr, *SHOWN)
    assert len(err.strip().splitlines()) == 1


def test_up_relays_a_workers_lines_escaped_to_the_terminal_and_its_log(tmp_path, capfd):
    from firstfault.streams import up

    says = [sys.executable, "-c", f"print('published slurm-1' + {PAYLOAD!r}, flush=True)"]
    w = up.Worker("w", says, dict(os.environ), str(tmp_path))          # -v: on our stderr
    w.start()
    assert w.proc.wait(60) == 0
    w.drain()                                                           # its last lines written out
    err = capfd.readouterr().err
    assert not OBEYED.findall(err) and "published slurm-1" + "".join(SHOWN) + "\n" in err, err

    log = tmp_path / "up.log"
    fd = runfile.fresh_log(log)
    w = up.Worker("w", says, dict(os.environ), str(tmp_path), log=log, log_fd=fd)
    w.start()
    assert w.proc.wait(60) == 0
    w.drain()                                                           # its last lines written out
    os.close(fd)
    assert log.read_text() == "published slurm-1" + "".join(SHOWN) + "\n"


def test_ups_own_lines_are_escaped():
    import logging

    from firstfault.streams import up

    record = logging.LogRecord("firstfault.up", logging.ERROR, __file__, 1, "broker's last words: %s", (PAYLOAD,), None)
    assert up._Printable("%(message)s").format(record) == "broker's last words: " + "".join(SHOWN)
