"""A broker or Redis that is not there: one line naming the address and what to try, exit 2, in seconds.

Each command runs as the user runs it (a subprocess of ``python -m firstfault``), so
librdkafka's own log or a traceback on stderr would fail the test. The broker and
Redis that *are* there are real (conftest_kafka)."""
from __future__ import annotations

pytest_plugins = ["conftest_kafka"]

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from firstfault.streams import runfile
from firstfault.streams.broker import free_port
from firstfault.streams.runfile import NO_BROKER, RunInfo

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "worked-example"
BROKER_COMMANDS = {
    "ship": ["ship", str(SAMPLE)],
    "diagnoses": ["diagnoses"],
    "replay": ["replay", "--since", "2026-11-01", "--until", "2026-11-10"],
    "topology": ["topology"],
}


def run(argv: list[str], tmp_path: Path, **env: str) -> tuple[int, str, str, float]:
    """``firstfault ARGV`` with only these FIRSTFAULT_ variables (and a run file of this test's own)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTFAULT_")}
    clean.update(FIRSTFAULT_RUN_FILE=str(tmp_path / "run" / "up.json"), **env)
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "firstfault", *argv], env=clean, cwd=tmp_path, capture_output=True,
                       text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr, time.monotonic() - t0


def assert_one_line(rc: int, err: str, elapsed: float, *names: str) -> None:
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and "rdkafka" not in err and "%3|" not in err
    for name in names:
        assert name in lines[0], (name, err)
    # A bound on waiting, not a speed: the commands give up after their own few-second probe
    # (streams/reach.py), where librdkafka alone would retry until run()'s 60 s timeout.
    assert elapsed < 45, elapsed


@pytest.mark.parametrize("command", sorted(BROKER_COMMANDS))
def test_a_closed_port_is_one_line_naming_it(command, tmp_path):
    addr = f"127.0.0.1:{free_port()}"
    rc, out, err, elapsed = run(BROKER_COMMANDS[command], tmp_path, FIRSTFAULT_KAFKA_BOOTSTRAP=addr)
    assert_one_line(rc, err, elapsed, addr, "connection refused", "FIRSTFAULT_KAFKA_BOOTSTRAP")
    assert out == ""


@pytest.fixture
def silent_port():
    """A port that accepts connections and never says a word: not a Kafka broker."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join(2)
    for s in held:
        s.close()
    srv.close()


def test_a_port_that_is_not_kafka_is_one_line_within_the_timeout(silent_port, tmp_path):
    rc, _, err, elapsed = run(["diagnoses"], tmp_path, FIRSTFAULT_KAFKA_BOOTSTRAP=silent_port)
    assert_one_line(rc, err, elapsed, silent_port, "no Kafka broker answered")


def test_an_unknown_host_is_one_line(tmp_path):
    rc, _, err, elapsed = run(["ship", str(SAMPLE)], tmp_path, FIRSTFAULT_KAFKA_BOOTSTRAP="no-such-host.invalid:9092")
    assert_one_line(rc, err, elapsed, "no-such-host.invalid:9092", "unknown host")


@pytest.mark.parametrize("command", ["ship", "diagnoses", "replay"])
def test_no_broker_and_no_up_says_how_to_get_one(command, tmp_path):
    rc, _, err, elapsed = run(BROKER_COMMANDS[command], tmp_path)
    assert_one_line(rc, err, elapsed)
    assert err.strip() == f"firstfault: {NO_BROKER}"


def test_a_stale_run_file_is_ignored_and_said_so(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    path = tmp_path / "run" / "up.json"
    runfile.write(RunInfo(bootstrap="127.0.0.1:1", pid=p.pid, started_at=runfile.now_iso(), rules_version="x"), path)
    rc, _, err, elapsed = run(["ship", str(SAMPLE)], tmp_path)
    assert_one_line(rc, err, elapsed, NO_BROKER, f"stale run file {path}", f"pid {p.pid}")


def test_a_run_file_whose_broker_is_gone_names_the_up_behind_it(tmp_path):
    # A live pid (this test) announcing a broker that is not there: what a wedged `up` looks like.
    addr = f"127.0.0.1:{free_port()}"
    path = tmp_path / "run" / "up.json"
    runfile.write(RunInfo(bootstrap=addr, pid=os.getpid(), started_at=runfile.now_iso(), rules_version="x",
                          log_file="/somewhere/up.log"), path)
    rc, _, err, elapsed = run(["diagnoses"], tmp_path)
    assert_one_line(rc, err, elapsed, addr, f"pid {os.getpid()}", str(path), "/somewhere/up.log")


def test_topology_without_a_broker_describes_what_up_would_start(tmp_path):
    rc, out, err, _ = run(["topology"], tmp_path)
    assert rc == 0, err
    assert out.startswith("bootstrap  embedded Tansu")


def test_a_run_file_leads_topology_to_the_running_broker(kafka_bootstrap, redis_url, tmp_path):
    runfile.write(RunInfo(bootstrap=kafka_bootstrap, redis=redis_url, prefix="rf.", pid=os.getpid(),
                          started_at=runfile.now_iso(), rules_version="x"), tmp_path / "run" / "up.json")
    rc, out, err, _ = run(["topology"], tmp_path)
    assert rc == 0, err
    assert out.splitlines()[:2] == [f"bootstrap  {kafka_bootstrap}", f"redis      {redis_url}"]
    assert "rf.diagnoses" in out


@pytest.mark.parametrize("command", ["diagnoses", "replay"])
def test_a_closed_redis_port_is_one_line_naming_it(command, kafka_bootstrap, tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"
    rc, _, err, elapsed = run(BROKER_COMMANDS[command], tmp_path, FIRSTFAULT_KAFKA_BOOTSTRAP=kafka_bootstrap,
                              FIRSTFAULT_REDIS_URL=url, FIRSTFAULT_TOPIC_PREFIX=f"cli{os.getpid()}.")
    assert_one_line(rc, err, elapsed, url, "FIRSTFAULT_REDIS_URL")


def test_serve_with_a_closed_redis_port_is_one_line(tmp_path):
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    rc, _, err, elapsed = run(["serve", "--port", str(free_port()), "--redis-url", url], tmp_path)
    assert_one_line(rc, err, elapsed, "redis://:***@127.0.0.1", "--redis-url")
    assert "hunter2" not in err                             # the password is not printed


def test_serve_takes_the_store_of_a_running_up_unless_given_one(tmp_path, monkeypatch):
    from firstfault import cli

    path = tmp_path / "up.json"
    runfile.write(RunInfo(bootstrap="127.0.0.1:1", redis="redis://127.0.0.1:6379/7", pid=os.getpid(),
                          started_at=runfile.now_iso(), rules_version="x"), path)
    monkeypatch.setenv("FIRSTFAULT_RUN_FILE", str(path))
    monkeypatch.setenv("FIRSTFAULT_REDIS_URL", "")               # recorded, so what _serve_store sets is undone
    monkeypatch.delenv("FIRSTFAULT_REDIS_URL")
    cli._serve_store(["--redis-url", "redis://elsewhere/0"])
    assert "FIRSTFAULT_REDIS_URL" not in os.environ               # the flag wins: serve_main reads it
    cli._serve_store(["--port", "8081"])
    assert os.environ["FIRSTFAULT_REDIS_URL"] == "redis://127.0.0.1:6379/7"
    monkeypatch.setenv("FIRSTFAULT_REDIS_URL", "redis://mine/0")
    cli._serve_store([])
    assert os.environ["FIRSTFAULT_REDIS_URL"] == "redis://mine/0"
