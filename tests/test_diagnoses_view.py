"""``firstfault diagnoses``: the operator's view (latest per attempt, newest first, cause and recovery),
``--all`` for every publication, ``--json`` unchanged. Real broker; no fakes."""
from __future__ import annotations

pytest_plugins = ["conftest_kafka"]

import argparse
import json
import re
import time
from pathlib import Path

from firstfault.rules.engine import analyze_path
from firstfault.schemas import Diagnosis
from firstfault.schemas.avro import encode
from firstfault.streams import follow, kafka
from firstfault.streams.config import StreamConfig

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
IDLE = 1.0


def run_diagnoses(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="firstfault")
    follow.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["diagnoses", "--idle", str(IDLE), *argv])
    return args.fn(args)


def stream(sample: str, revision: int, provisional: bool, **changes) -> Diagnosis:
    d = analyze_path(SAMPLES / sample).diagnosis
    return d.model_copy(update={"revision": revision, "provisional": provisional, **changes})


def publish(cfg: StreamConfig, items: list[tuple[Diagnosis | bytes, int]]) -> None:
    topic = cfg.topic("diagnoses")
    kafka.ensure_topics(cfg, [topic])
    prod = kafka.producer(cfg)
    for d, ts in items:
        key = b"junk" if isinstance(d, bytes) else d.workload_id.encode()
        prod.produce(topic, key=key, value=d if isinstance(d, bytes) else encode(d), timestamp=ts)
    assert prod.flush(20) == 0


def test_latest_per_attempt_newest_first_with_cause_and_recovery(stream_cfg, monkeypatch, capsys):
    now = int(time.time() * 1000)
    oom_first = stream("host-oom-killer", 0, True, status="unattributed", sub_domain="unattributed",
                       responsible_nodes=[], root_cause=None)
    oom = stream("host-oom-killer", 1, False)
    cuda = stream("cuda-oom-one-rank", 0, False)
    amb = stream("ambiguous-two-faults", 0, False)
    straggler = stream("unattributed-straggler", 0, True)       # its end event has not come yet
    published = [(oom_first, now - 4000), (cuda, now - 3000), (b"not avro", now - 2500), (oom, now - 2000),
                 (amb, now - 1000), (straggler, now - 500)]
    publish(stream_cfg, published)
    monkeypatch.setenv("FIRSTFAULT_KAFKA_BOOTSTRAP", stream_cfg.bootstrap)
    monkeypatch.setenv("FIRSTFAULT_TOPIC_PREFIX", stream_cfg.prefix)
    monkeypatch.delenv("FIRSTFAULT_REDIS_URL", raising=False)
    monkeypatch.delenv("COLUMNS", raising=False)

    assert run_diagnoses([]) == 0
    out, err = capsys.readouterr()
    header, *rows = out.splitlines()
    assert header.split() == ["WORKLOAD", "ATTEMPT", "STATUS", "SUB_DOMAIN", "NODES", "RECOVERY", "CAUSE"]
    # One line per attempt, newest publication first; the OOM job shows revision 1, not the provisional 0.
    assert [r.split()[0] for r in rows] == [straggler.workload_id, amb.workload_id, oom.workload_id,
                                            cuda.workload_id]
    by_id = {r.split()[0]: r for r in rows}
    oom_row = by_id[oom.workload_id]
    assert oom_row.split()[1:6] == ["0", "attributed", "host_oom", "dgx-a02", "notify_owner"]
    assert oom_row.endswith(oom.root_cause.message)        # the root cause's sentence, whole: stdout is no terminal
    assert by_id[straggler.workload_id].split()[1:6] == ["0", "unattributed*", "unattributed", "suspect", "node-02"]
    assert by_id[straggler.workload_id].endswith(" ".join(straggler.summary.split()))
    assert "one of node-03,node-06" in by_id[amb.workload_id]
    assert by_id[amb.workload_id].split()[1:4] == ["0", "ambiguous", "ambiguous"]
    # Columns line up: every row's cause starts where the header's CAUSE does.
    col = header.index("CAUSE")
    assert oom_row[col:] == oom.root_cause.message and by_id[cuda.workload_id][col:] == cuda.root_cause.message
    assert "4 workload attempts, 5 publications" in err and "* provisional" in err
    assert "skipped 1 record" in err

    # Cut to the terminal's width, with an ellipsis where the cause was cut.
    monkeypatch.setenv("COLUMNS", "90")
    assert run_diagnoses([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 90 for line in lines) and len(lines) == 5
    assert any(line.endswith("\u2026") for line in lines)
    assert [line.split()[0] for line in lines[1:]] == [r.split()[0] for r in rows]


def test_all_lists_every_publication_and_json_is_unchanged(stream_cfg, monkeypatch, capsys):
    now = int(time.time() * 1000)
    first, final = stream("host-oom-killer", 0, True), stream("host-oom-killer", 1, False)
    other = stream("cuda-oom-one-rank", 0, False)
    # One partition: topic order is publication order, so the listing can be compared line for line.
    cfg = stream_cfg.model_copy(update={"partitions": 1})
    publish(cfg, [(first, now - 3000), (other, now - 2000), (final, now - 1000)])
    monkeypatch.setenv("FIRSTFAULT_KAFKA_BOOTSTRAP", cfg.bootstrap)
    monkeypatch.setenv("FIRSTFAULT_TOPIC_PREFIX", cfg.prefix)
    monkeypatch.delenv("FIRSTFAULT_REDIS_URL", raising=False)
    monkeypatch.delenv("COLUMNS", raising=False)          # whole lines: stdout is no terminal

    assert run_diagnoses(["--all"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [follow.summary_line(d, ts) for d, ts in ((first, now - 3000), (other, now - 2000),
                                                              (final, now - 1000))]
    assert "rev 0 provisional" in lines[0] and "rev 1 final" in lines[2]
    # Each line as the README says: the verdict, whom it names, the recovery action and the cause.
    assert lines[2].endswith(f"  recovery {final.recovery.action}  {final.root_cause.message}"), lines[2]
    monkeypatch.setenv("COLUMNS", "100")
    assert run_diagnoses(["--all"]) == 0
    cut = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 100 for line in cut) and all(line.endswith("\u2026") for line in cut), cut
    monkeypatch.delenv("COLUMNS")

    # --json: one object per publication, the exact bytes it always printed (sorted keys, UTF-8 as is).
    assert run_diagnoses(["--json"]) == 0
    out = capsys.readouterr().out
    assert out == "".join(json.dumps(d.to_dict(), sort_keys=True, ensure_ascii=False) + "\n"
                          for d in (first, other, final))


def test_empty_topic_says_so(stream_cfg, monkeypatch, capsys):
    kafka.ensure_topics(stream_cfg, [stream_cfg.topic("diagnoses")])
    monkeypatch.setenv("FIRSTFAULT_KAFKA_BOOTSTRAP", stream_cfg.bootstrap)
    monkeypatch.setenv("FIRSTFAULT_TOPIC_PREFIX", stream_cfg.prefix)
    monkeypatch.delenv("FIRSTFAULT_REDIS_URL", raising=False)
    assert run_diagnoses([]) == 0
    out, err = capsys.readouterr()
    assert out == "" and f"no diagnoses on {stream_cfg.topic('diagnoses')} yet" in err


def schedule(cfg: StreamConfig, sample: str, workload_id: str, end: bool, ts: int) -> None:
    """The scheduler's start (and end) record of a sample's workload under another id, stamped ``ts``."""
    from firstfault.rules.bundle import parse_workload
    from firstfault.schemas import SchedulerEvent

    wl = parse_workload((SAMPLES / sample / "workload.json").read_bytes()).model_copy(
        update={"workload_id": workload_id})
    topic = cfg.topic("scheduler")
    kafka.ensure_topics(cfg, [topic])
    prod = kafka.producer(cfg)
    prod.produce(topic, key=workload_id.encode(), timestamp=ts - 1,
                 value=encode(SchedulerEvent(type="start", workload=wl, ts=wl.start_time)))
    if end:
        prod.produce(topic, key=workload_id.encode(), timestamp=ts,
                     value=encode(SchedulerEvent(type="end", workload=wl, ts=wl.end_time)))
    assert prod.flush(20) == 0


def test_attempts_without_a_final_diagnosis_say_what_they_wait_for(stream_cfg, monkeypatch, capsys):
    """Right after `ship` nothing is published for the grace period: the view says so, per attempt."""
    now = int(time.time() * 1000)
    done = stream("cuda-oom-one-rank", 0, False)
    publish(stream_cfg, [(done, now - 1000)])
    schedule(stream_cfg, "cuda-oom-one-rank", done.workload_id, True, now - 2000)    # diagnosed: not listed
    schedule(stream_cfg, "host-oom-killer", "just-shipped", True, now - 1000)
    schedule(stream_cfg, "walltime-timeout", "still-running", False, now - 5000)
    monkeypatch.setenv("FIRSTFAULT_KAFKA_BOOTSTRAP", stream_cfg.bootstrap)
    monkeypatch.setenv("FIRSTFAULT_TOPIC_PREFIX", stream_cfg.prefix)
    monkeypatch.setenv("FIRSTFAULT_GRACE_CAP_S", "600")
    monkeypatch.delenv("FIRSTFAULT_REDIS_URL", raising=False)

    assert run_diagnoses([]) == 0
    out, err = capsys.readouterr()
    assert [r.split()[0] for r in out.splitlines()[1:]] == [done.workload_id]
    assert "1 workload attempt, 1 publication;" in err                       # plurals, not "(s)"
    waiting = [line for line in err.splitlines() if line.startswith(("waiting", "running"))]
    assert len(waiting) == 2, err
    assert re.fullmatch(r"waiting  just-shipped#0  ended \d+ s ago; final diagnosis in about (9|10) min \(the "
                        r"correlator's grace period for late lines, FIRSTFAULT_GRACE_CAP_S=600\)", waiting[0]), waiting
    assert re.fullmatch(r"running  still-running#0  started \d+ s ago on 4 nodes, no end event yet: diagnosed once "
                        r"it ends \(at once, provisionally, if a root cause shows\)", waiting[1]), waiting

    # Nothing diagnosed yet at all: it says so, and what it waits for.
    monkeypatch.setenv("FIRSTFAULT_TOPIC_PREFIX", stream_cfg.prefix + "x.")
    fresh = stream_cfg.model_copy(update={"prefix": stream_cfg.prefix + "x."})
    kafka.ensure_topics(fresh, [fresh.topic("diagnoses")])
    schedule(fresh, "host-oom-killer", "alone", True, int(time.time() * 1000))
    assert run_diagnoses([]) == 0
    out, err = capsys.readouterr()
    assert out == "" and f"no diagnoses on {fresh.topic('diagnoses')} yet" in err
    assert "waiting  alone#0  ended " in err

    # --json is for programs: exactly the diagnosis objects, and nothing about the scheduler on stderr.
    monkeypatch.setenv("FIRSTFAULT_TOPIC_PREFIX", stream_cfg.prefix)
    assert run_diagnoses(["--json"]) == 0
    out, err = capsys.readouterr()
    assert [json.loads(x)["workload_id"] for x in out.splitlines()] == [done.workload_id] and "waiting" not in err


def test_follow_lines_carry_recovery_and_cause_and_say_when_an_attempt_waits(stream_cfg, tmp_path):
    """`diagnoses --follow` as a user runs it: each publication with its recovery and cause; a job that
    just ended is announced with how long its final takes; Ctrl-C ends it quietly."""
    import os
    import signal
    import subprocess
    import sys
    import threading

    now = int(time.time() * 1000)
    oom = stream("host-oom-killer", 0, False)
    publish(stream_cfg, [(oom, now - 1000)])
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTFAULT_")}
    env.update(FIRSTFAULT_KAFKA_BOOTSTRAP=stream_cfg.bootstrap, FIRSTFAULT_TOPIC_PREFIX=stream_cfg.prefix,
               FIRSTFAULT_GRACE_CAP_S="600", COLUMNS="400")
    proc = subprocess.Popen([sys.executable, "-m", "firstfault", "diagnoses", "--follow"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    out: list[str] = []
    err: list[str] = []
    threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True).start()
    threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True).start()

    def wait_for(lines: list[str], text: str) -> str:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            hit = [line for line in list(lines) if text in line]
            if hit:
                return hit[0]
            assert proc.poll() is None, "".join(err)
            time.sleep(0.2)
        raise AssertionError(f"no {text!r} in {lines}")

    try:
        line = wait_for(out, oom.workload_id)
        assert line.rstrip("\n").endswith(f"recovery {oom.recovery.action}  {oom.root_cause.message}"), line
        assert "responsible dgx-a02" in line and "rev 0 final" in line
        schedule(stream_cfg, "cuda-oom-one-rank", "ended-now", True, int(time.time() * 1000))
        note = wait_for(err, "ended-now#0")
        assert note.startswith("waiting  ended-now#0  ended ") and "FIRSTFAULT_GRACE_CAP_S=600" in note
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not any("Traceback" in line for line in err), "".join(err)
