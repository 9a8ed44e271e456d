"""`firstfault up` with nothing set: it says "ready" only once its workers joined their groups, announces
itself in the run file, keeps worker chatter in its log file, and a second terminal needs no variable.

Everything is real: `up` starts the embedded Tansu broker; `ship` and `diagnoses` are run as a
user runs them, as subprocesses with no FIRSTFAULT_KAFKA_BOOTSTRAP."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from firstfault.rules.engine import analyze_path
from firstfault.streams import runfile
from firstfault.streams.up import InFlight
from stream_pipeline import start_up

ROOT = Path(__file__).resolve().parents[1]
OOM = ROOT / "samples" / "host-oom-killer"


def base_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTFAULT_")}
    env["FIRSTFAULT_RUN_FILE"] = str(tmp_path / "run" / "up.json")
    return env


def cli(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "firstfault", *argv], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def groups_state(bootstrap: str, groups: list[str]) -> dict[str, str]:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    return {g: f.result().state.name for g, f in admin.describe_consumer_groups(groups, request_timeout=5).items()}


def test_up_is_found_with_nothing_set_and_says_ready_only_once_the_groups_are_joined(tmp_path):
    env = base_env(tmp_path)
    tag = f"r{uuid.uuid4().hex[:8]}"
    up_env = {**env, "FIRSTFAULT_TOPIC_PREFIX": f"{tag}.", "FIRSTFAULT_APP_ID": f"{tag}-correlator",
              "FIRSTFAULT_EXTRACTOR_GROUP": f"{tag}-extractor", "FIRSTFAULT_GRACE_S": "1", "FIRSTFAULT_GRACE_CAP_S": "1"}
    run_file = tmp_path / "run" / "up.json"
    log_file = run_file.with_name("up.log")
    # A stale run file from an `up` that was killed: replaced, not obeyed.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    runfile.write(runfile.RunInfo(bootstrap="127.0.0.1:1", pid=dead.pid, started_at="2026-01-01T00:00:00Z",
                                  rules_version="old"), run_file)
    # A symlink where its log goes: replaced by a file of its own, the target never written.
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    log_file.symlink_to(victim)
    stale = [f"firstfault up: ignoring stale run file {run_file}: `firstfault up` (pid {dead.pid}) is not running; "
             "replacing it\n"]

    proc, text, err_lines = start_up(up_env, ROOT)
    try:
        assert text.splitlines()[-1:] and text.splitlines()[-1].startswith("ready"), text + "".join(err_lines)
        assert victim.read_text() == "keep me" and not log_file.is_symlink()

        # At "ready" both groups have joined, as the broker sees it.
        info = runfile.read(run_file)
        assert info is not None and info.pid == proc.pid and info.prefix == f"{tag}."
        assert groups_state(info.bootstrap, [f"{tag}-correlator", f"{tag}-extractor"]) == {
            f"{tag}-correlator": "STABLE", f"{tag}-extractor": "STABLE"}
        assert info.redis == "memory" and info.log_file == str(log_file) and info.rules_version.startswith("sha256:")

        # The short block says where everything is; the chatter went to the log file, not the terminal.
        assert f"broker {info.bootstrap} (embedded Tansu" in text
        assert f"log       {log_file}" in text and f"run file  {run_file}" in text and "store     memory" in text
        assert "FIRSTFAULT_KAFKA_BOOTSTRAP" not in text          # nothing to export any more
        assert err_lines == stale, "".join(err_lines)            # said once, in one line
        log = log_file.read_text()
        assert "[^Worker]: Ready" in log and "assigned 1 partition(s)" in log   # Faust's and the extractor's lines

        # A second terminal: no variable, the run file leads the way.
        other = {**env}
        shipped = cli(["ship", str(OOM)], other, tmp_path)
        assert shipped.returncode == 0 and shipped.stderr == "", shipped.stderr
        assert f"to {tag}.raw" in shipped.stdout
        offline = analyze_path(OOM).diagnosis
        deadline, got = time.monotonic() + 60, []
        while time.monotonic() < deadline:
            listed = cli(["diagnoses", "--all", "--json"], other, tmp_path)
            assert listed.returncode == 0, listed.stderr
            got = [json.loads(x) for x in listed.stdout.splitlines() if x.strip()]
            if any(not d["provisional"] and d["diagnosis_id"] == offline.diagnosis_id for d in got):
                break
            time.sleep(1.0)
        finals = [d for d in got if not d["provisional"]]
        assert finals and finals[-1]["diagnosis_id"] == offline.diagnosis_id, got
        assert finals[-1]["sub_domain"] == offline.sub_domain == "host_oom"

        # A second `up` on the same run file refuses at once, in one line.
        second = subprocess.run([sys.executable, "-m", "firstfault.streams.up"], env=env, cwd=tmp_path,
                                capture_output=True, text=True, timeout=30)
        assert second.returncode == 2 and len(second.stderr.strip().splitlines()) == 1, second.stderr
        assert f"already running (pid {proc.pid}" in second.stderr
        assert runfile.read(run_file).pid == proc.pid                  # and did not touch the first's

        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not run_file.exists()                                      # removed on a clean stop
    assert err_lines == stale, "".join(err_lines)
    assert victim.read_text() == "keep me"
    assert re.search(r"up INFO stopped correlator", log_file.read_text())
    gone = cli(["diagnoses"], env, tmp_path)
    assert gone.returncode == 2 and gone.stderr.strip() == f"firstfault: {runfile.NO_BROKER}"


def _first_record(bootstrap: str, topic: str, within_s: float = 120.0) -> bool:
    """A record has reached ``topic`` (all partitions read from the start), within a bound."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{uuid.uuid4().hex[:8]}"})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if any(m.error() is None for m in c.consume(num_messages=10, timeout=0.5)):
                return True
        return False
    finally:
        c.close()


def test_when_its_broker_dies_up_says_what_was_lost_cleans_up_and_a_shipment_fails_at_once(tmp_path):
    env = base_env(tmp_path)
    (tmp_path / "tmp").mkdir()
    tag = f"d{uuid.uuid4().hex[:8]}"
    up_env = {**env, "TMPDIR": str(tmp_path / "tmp"), "FIRSTFAULT_TOPIC_PREFIX": f"{tag}.",
              "FIRSTFAULT_APP_ID": f"{tag}-correlator", "FIRSTFAULT_EXTRACTOR_GROUP": f"{tag}-extractor"}
    run_file = tmp_path / "run" / "up.json"
    proc, text, err_lines = start_up(up_env, ROOT)
    shipping = None
    try:
        assert text.splitlines()[-1:] and text.splitlines()[-1].startswith("ready"), text + "".join(err_lines)
        assert list((tmp_path / "tmp").glob("firstfault-up-*"))             # its run directory, while it runs
        broker_pid = int(re.search(r"embedded Tansu pid (\d+)", text).group(1))
        # A shipment in flight, paced so it is still sending when the broker dies.
        shipping = subprocess.Popen([sys.executable, "-m", "firstfault", "ship", "--rate", "50",
                                     str(ROOT / "samples" / "cuda-oom-one-rank")], env=env, cwd=tmp_path,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Once its first lines are on the broker (however long the start took), it keeps sending for
        # about 19 s; `up` looked at the workers' metrics at "ready" and looks every 5 s.
        info = runfile.read(run_file)
        assert info is not None and _first_record(info.bootstrap, f"{tag}.raw"), "the shipment never started"
        time.sleep(InFlight.EVERY_S + 1)
        os.kill(broker_pid, signal.SIGKILL)
        assert proc.wait(60) == 1
        _, ship_err = shipping.communicate(timeout=60)
    finally:
        for p in (proc, shipping):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    said = [line for line in err_lines if "the embedded broker exited" in line]
    assert len(said) == 1 and "keeps nothing on disk: lost" in said[0], "".join(err_lines)
    assert re.search(r"\d+ workload attempts? open in the correlator", said[0]), said[0]
    assert re.search(r"\d+ records? not yet processed", said[0]), said[0]
    assert not run_file.exists() and not list((tmp_path / "tmp").glob("firstfault-up-*"))
    assert shipping.returncode == 2
    assert f"`firstfault up` (pid {proc.pid}) stopped" in ship_err and "not delivered" in ship_err, ship_err
    assert len(ship_err.strip().splitlines()) == 1, ship_err
