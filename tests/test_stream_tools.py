"""The stream tools against a real broker and the real Redis: diagnoses, the offset
index, replay (and --diff), topology and ``up``. No fakes of Kafka or Redis."""
from __future__ import annotations

pytest_plugins = ["conftest_kafka"]

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from firstfault.connectors.shipper import ship
from firstfault.connectors.sinks.offset_index import HOUR_MS, OffsetIndex
from firstfault.rules.catalog import BUILTIN_CATALOG
from firstfault.rules.engine import analyze_path
from firstfault.schemas import Diagnosis
from firstfault.schemas.avro import decode, encode
from firstfault.streams import follow, kafka, replay, up
from firstfault.streams.config import StreamConfig
from stream_pipeline import start_up

ROOT = Path(__file__).resolve().parents[1]
OOM = ROOT / "samples" / "host-oom-killer"
OTHER = ROOT / "samples" / "cuda-oom-one-rank"
IDLE = 1.0


def run_cli(register, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="firstfault")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.fn(args)


def cli_env(monkeypatch, cfg: StreamConfig, redis_url: str | None = None) -> None:
    monkeypatch.setenv("FIRSTFAULT_KAFKA_BOOTSTRAP", cfg.bootstrap)
    monkeypatch.setenv("FIRSTFAULT_TOPIC_PREFIX", cfg.prefix)
    monkeypatch.setenv("FIRSTFAULT_PARTITIONS", str(cfg.partitions))
    if redis_url:
        monkeypatch.setenv("FIRSTFAULT_REDIS_URL", redis_url)
    else:
        monkeypatch.delenv("FIRSTFAULT_REDIS_URL", raising=False)


def publish(cfg: StreamConfig, topic: str, items: list[tuple[str, bytes, int | None]]) -> None:
    kafka.ensure_topics(cfg, [topic])
    prod = kafka.producer(cfg)
    for key, value, ts in items:
        prod.produce(topic, key=key.encode(), value=value, **({"timestamp": ts} if ts else {}))
    assert prod.flush(20) == 0


def stream_diagnosis(sample: Path, revision: int, provisional: bool) -> Diagnosis:
    d = analyze_path(sample).diagnosis
    return d.model_copy(update={"revision": revision, "provisional": provisional})


# ---------------------------------------------------------------- diagnoses
def test_diagnoses_prints_every_produced_diagnosis(stream_cfg, monkeypatch, capsys):
    first = stream_diagnosis(OOM, 0, True)
    second = stream_diagnosis(OTHER, 1, False)
    publish(stream_cfg, stream_cfg.topic("diagnoses"), [
        (first.workload_id, encode(first), None), ("junk", b"not avro", None), (second.workload_id, encode(second), None)])
    cli_env(monkeypatch, stream_cfg)

    assert run_cli(follow.register, ["diagnoses", "--json", "--idle", str(IDLE)]) == 0
    out, err = capsys.readouterr()
    printed = [json.loads(line) for line in out.splitlines()]
    assert sorted(printed, key=lambda d: d["workload_id"]) == sorted([first.to_dict(), second.to_dict()],
                                                                    key=lambda d: d["workload_id"])
    assert "skipped 1 record" in err

    assert run_cli(follow.register, ["diagnoses", "--all", "--idle", str(IDLE)]) == 0
    lines = {line.split()[1].split("#")[0]: line for line in capsys.readouterr().out.splitlines()}
    oom = lines[first.workload_id]
    assert "rev 0 provisional" in oom and "ATTRIBUTED" in oom and "host/host_oom" in oom
    assert "responsible dgx-a02" in oom
    assert "rev 1 final" in lines[second.workload_id] and "application/cuda_oom" in lines[second.workload_id]


def test_diagnoses_since_filters_on_publish_time(stream_cfg, monkeypatch, capsys):
    old, new = stream_diagnosis(OOM, 0, False), stream_diagnosis(OTHER, 0, False)
    now = int(time.time() * 1000)
    publish(stream_cfg, stream_cfg.topic("diagnoses"), [(old.workload_id, encode(old), now - 3 * HOUR_MS),
                                                        (new.workload_id, encode(new), now)])
    cli_env(monkeypatch, stream_cfg)
    assert run_cli(follow.register, ["diagnoses", "--json", "--since", "1h", "--idle", str(IDLE)]) == 0
    assert [json.loads(x)["workload_id"] for x in capsys.readouterr().out.splitlines()] == [new.workload_id]


def test_diagnoses_follow_prints_as_they_arrive_until_ctrl_c(stream_cfg):
    kafka.ensure_topics(stream_cfg, [stream_cfg.topic("diagnoses")])
    env = {**os.environ, "FIRSTFAULT_KAFKA_BOOTSTRAP": stream_cfg.bootstrap, "FIRSTFAULT_TOPIC_PREFIX": stream_cfg.prefix}
    env.pop("FIRSTFAULT_REDIS_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "firstfault.streams.follow", "--follow", "--json"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)        # it is waiting, not done: --follow never stops on its own
        assert proc.poll() is None
        d = stream_diagnosis(OOM, 0, False)
        publish(stream_cfg, stream_cfg.topic("diagnoses"), [(d.workload_id, encode(d), None)])
        line = proc.stdout.readline()
        assert json.loads(line) == d.to_dict()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(90) == 0      # leaving its group waits on the broker: a bound, not a speed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_time_index_mode_detects_tansu_and_honours_override(stream_cfg):
    assert follow.time_index_mode(stream_cfg, env={"FIRSTFAULT_TIME_INDEX": "offsets"}) == "offsets"
    assert follow.time_index_mode(stream_cfg, env={"FIRSTFAULT_TIME_INDEX": "scan"}) == "scan"
    if not os.environ.get("KAFKA_BOOTSTRAP"):
        assert follow.time_index_mode(stream_cfg, env={}) == "scan"


def test_parse_time():
    assert follow.parse_time("2026-11-02T10:00:00Z") == follow.parse_time("2026-11-02T10:00:00") == 1793613600000
    assert follow.parse_time("2026-11-02T11:00:00+01:00") == 1793613600000
    now = int(time.time() * 1000)
    assert abs(follow.parse_time("2h") - (now - 2 * HOUR_MS)) < 5000
    with pytest.raises(argparse.ArgumentTypeError):
        follow.parse_time("yesterday-ish")


# ---------------------------------------------------------------- offset index
def test_offset_index_round_trips_through_redis(redis_url):
    prefix = f"t{uuid.uuid4().hex[:10]}."
    h = 1_000 * HOUR_MS                       # some hour, in ms
    a = OffsetIndex(redis_url, prefix, flush_interval_s=3600)
    b = OffsetIndex(redis_url, prefix, flush_interval_s=3600)   # a second writer (another extractor)
    try:
        for off, ts in ((10, h + 5), (11, h + 6), (12, h + HOUR_MS + 1), (13, h + 2 * HOUR_MS)):
            a.note("raw", 0, off, ts)
        a.note("raw", 0, 9, h + 7)            # an earlier offset for the same hour wins
        a.note("raw", 1, 4, h + HOUR_MS)
        a.note("raw", 1, 3, None)             # no timestamp: nothing to index
        b.note("raw", 0, 20, h + 2 * HOUR_MS)  # later offset for an hour `a` has: must not win
        b.note("raw", 1, 2, h + HOUR_MS)       # earlier one: must win across writers
        assert a.flush() and b.flush()

        reader = OffsetIndex(redis_url, prefix)
        assert reader.entries("raw") == {0: {1000: 9, 1001: 12, 1002: 13}, 1: {1001: 2}}
        # the bucket holding `since`, or the smallest later one; partitions with nothing later are left out
        assert reader.start_offsets("raw", h + HOUR_MS + 30_000) == {0: 12, 1: 2}
        assert reader.start_offsets("raw", h + 10) == {0: 9, 1: 2}
        assert reader.start_offsets("raw", h + 2 * HOUR_MS + 1) == {0: 13}
        assert reader.start_offsets("raw", h + 3 * HOUR_MS) == {}
        assert reader.start_offsets("scheduler", h) == {}
    finally:
        a.forget(["raw"])
        a.close(), b.close()


def test_offset_index_flushes_on_its_own_and_is_off_without_redis(redis_url):
    prefix = f"t{uuid.uuid4().hex[:10]}."
    idx = OffsetIndex(redis_url, prefix, flush_interval_s=0.0)
    try:
        idx.note("raw", 3, 42, 5 * HOUR_MS)   # interval 0: this note flushes
        assert OffsetIndex(redis_url, prefix).entries("raw") == {3: {5: 42}}
    finally:
        idx.forget(["raw"])
        idx.close()
    off = OffsetIndex(None, prefix)
    off.note("raw", 0, 1, HOUR_MS)
    assert not off.enabled and off.flush() and off.start_offsets("raw", 0) == {}


def test_reader_seeks_with_the_offset_index(stream_cfg, redis_url):
    """Scan mode starts at the noted offset, so older records are not even fetched."""
    topic = stream_cfg.topic("seek")
    now = int(time.time() * 1000)
    stamps = [now - 5 * HOUR_MS] * 30 + [now - HOUR_MS // 2] * 5
    kafka.ensure_topics(stream_cfg.model_copy(update={"partitions": 1}), [topic])
    idx = OffsetIndex(redis_url, stream_cfg.prefix, flush_interval_s=3600)
    prod = kafka.producer(stream_cfg)
    for i, ts in enumerate(stamps):
        # the way the shipper notes: from delivery reports
        prod.produce(topic, value=f"r{i}".encode(), timestamp=ts, on_delivery=lambda e, m: idx.note_message(m))
    assert prod.flush(20) == 0
    idx.flush()
    try:
        reader = follow.TopicReader(stream_cfg, topic, since_ms=now - HOUR_MS, mode="scan", index=idx, idle_s=IDLE)
        got = [m.value() for m in reader]
        assert got == [f"r{i}".encode() for i in range(30, 35)]
        assert reader.read == 5
        # without an index it starts at 0 and filters client-side: same answer, more reading
        reader = follow.TopicReader(stream_cfg, topic, since_ms=now - HOUR_MS, mode="scan", index=None, idle_s=IDLE)
        assert [m.value() for m in reader] == got and reader.read == 35
    finally:
        idx.forget([topic])
        idx.close()


# ---------------------------------------------------------------- replay
def _oom_overlay(tmp_path: Path) -> Path:
    """Replace an EARLY rule: the OOM kill is tagged a kernel error instead of host OOM."""
    doc = yaml.safe_load((BUILTIN_CATALOG / "early" / "kernel.yaml").read_text())
    rule = next(r for r in doc["rules"] if r["id"] == "early.kernel.oom_kill")
    rule["tag"] = {**rule["tag"], "sub_domain": "host_kernel_error"}
    (tmp_path / "rules" / "early").mkdir(parents=True)
    (tmp_path / "rules" / "early" / "kernel.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return tmp_path / "rules"


def _read_all(cfg: StreamConfig, topic: str) -> list[Diagnosis]:
    return [decode(m.value()) for m in follow.TopicReader(cfg, topic, mode="scan", idle_s=IDLE)]


def test_replay_rediagnoses_a_shipped_sample_and_diffs_a_rule_change(stream_cfg, redis_url, monkeypatch, capsys,
                                                                     tmp_path):
    cfg = stream_cfg.model_copy(update={"redis_url": redis_url})
    kafka.ensure_topics(cfg)
    since = int(time.time() * 1000)
    ship(OOM, cfg)
    until = int(time.time() * 1000) + 1
    offline = analyze_path(OOM).diagnosis
    # What the pipeline published: the offline answer as a final stream diagnosis.
    published = offline.model_copy(update={"revision": 0, "provisional": False})
    publish(cfg, cfg.topic("diagnoses"), [(published.workload_id, encode(published), None)])

    # An earlier window holds nothing, by publish time or by end time (the sample ended 2026-11-06T08:51:21Z).
    empty = replay.replay(cfg, replay.Window(since_ms=since - 3 * HOUR_MS, until_ms=since - HOUR_MS), idle_s=IDLE,
                          by="publish-time")
    assert empty.workloads == 0
    ended = follow.parse_time("2026-11-06T08:51:21Z")
    assert replay.replay(cfg, replay.Window(since_ms=ended - HOUR_MS, until_ms=ended), idle_s=IDLE).workloads == 0

    report = replay.replay(cfg, replay.Window(since_ms=since, until_ms=until), with_diff=True, idle_s=IDLE,
                           by="publish-time")
    if not os.environ.get("KAFKA_BOOTSTRAP"):
        assert report.time_index == "scan"
    assert report.workloads == 1 and report.records["raw"] > 5000
    assert report.diff.unchanged == 1 and report.diff.changed == 0
    # Same evidence, same catalog: byte-identical to the offline analysis.
    [replayed] = _read_all(cfg, cfg.topic("diagnoses-replay"))
    assert replayed.to_dict() == offline.to_dict()

    cli_env(monkeypatch, cfg, redis_url)
    out_topic = f"{cfg.prefix}trial"
    assert run_cli(replay.register, ["replay", "--since", "2026-11-06T08:00:00Z", "--until", "2026-11-06T09:00:00Z",
                                     "--rules", str(_oom_overlay(tmp_path)), "--diff", "--json",
                                     "--output-topic", out_topic, "--idle", str(IDLE)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["workloads"] == 1 and summary["output_topic"] == out_topic
    assert summary["rules_version"] != offline.rules_version
    assert summary["diff"]["changed"] == 1
    [change] = summary["diff"]["changes"]
    assert change["workload_id"] == offline.workload_id
    assert change["fields"]["sub_domain"] == {"before": "host_oom", "after": "host_kernel_error"}
    # Same root line, same node: the label moved, and with it the taxonomy row's recovery.
    assert set(change["fields"]) == {"sub_domain", "recovery"}
    assert summary["diff"]["kinds"]["sub_domain"] == summary["diff"]["kinds"]["recovery"] == 1
    [trial] = _read_all(cfg, out_topic)
    assert trial.sub_domain == "host_kernel_error"
    text = replay.render_text(replay.ReplayReport.model_validate(summary))
    assert f"CHANGED  {offline.workload_id}#0" in text and "host_oom  ->  host_kernel_error" in text


def test_replay_rejects_an_empty_window(stream_cfg, monkeypatch, capsys):
    cli_env(monkeypatch, stream_cfg)
    assert run_cli(replay.register, ["replay", "--since", "2026-11-02T10:00:00Z", "--until", "2026-11-02T09:00:00Z"]) == 2
    assert "--until must be after --since" in capsys.readouterr().err


# ---------------------------------------------------------------- topology
def test_topology_names_every_topic_with_its_producers_and_consumers(capsys, monkeypatch):
    monkeypatch.delenv("FIRSTFAULT_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.setenv("FIRSTFAULT_TOPIC_PREFIX", "ops.")
    assert run_cli(up.register, ["topology", "--json", "--partitions", "6", "--extractors", "2"]) == 0
    topo = up.Topology.model_validate_json(capsys.readouterr().out)
    topics = {t.logical: t for t in topo.topics}
    assert set(topics) == set(StreamConfig().topics)
    assert topics["raw"].name == "ops.raw" and topics["raw"].partitions == 6 and topics["raw"].key == "host"
    assert topics["raw"].producers == ["ship"] and topics["raw"].consumers == ["extractor", "replay", "shadow"]
    assert topics["events"].producers == ["extractor"] and topics["events"].consumers == ["correlator"]
    assert topics["diagnoses"].producers == ["correlator"]
    assert {w.name: w.instances for w in topo.workers}["extractor"] == 2
    assert topo.redis.startswith("none")
    assert run_cli(up.register, ["topology"]) == 0
    assert "ops.diagnoses" in capsys.readouterr().out


def test_worker_env_is_explicit_and_drops_unset_settings():
    cfg = StreamConfig(bootstrap="k:9092", prefix="p.", partitions=3, rules="/r", standby_replicas=1)
    env = up.worker_env(cfg, base={"FIRSTFAULT_REDIS_URL": "redis://stale", "PATH": "/bin"})
    assert StreamConfig.from_env(env) == cfg
    assert "FIRSTFAULT_REDIS_URL" not in env and env["PATH"] == "/bin"


# ---------------------------------------------------------------- up
def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_up_starts_supervises_and_stops_cleanly(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTFAULT_")}
    env.update(FIRSTFAULT_TOPIC_PREFIX=f"t{uuid.uuid4().hex[:8]}.", FIRSTFAULT_GRACE_S="1", FIRSTFAULT_GRACE_CAP_S="1",
               FIRSTFAULT_RUN_FILE=str(tmp_path / "up.json"))
    proc, text, err_lines = start_up(env, tmp_path, "-v", timeout=30)   # -v: the supervisor's lines on stderr
    try:
        assert text.splitlines()[-1:] and text.splitlines()[-1].startswith("ready"), text + "".join(err_lines)
        assert re.search(r"broker 127\.0\.0\.1:\d+ \(embedded Tansu", text)
        assert "store     memory" in text and "firstfault diagnoses --follow" in text and "firstfault ship" in text
        pids = {name: int(pid) for name, pid in re.findall(r"(?:worker\s+(\S+)\s+|Tansu )pid (\d+)", text)}
        pids = {(name or "broker"): pid for name, pid in pids.items()}
        assert {"broker", "extractor-1", "correlator"} <= set(pids)

        # The printed way in works: ship a bundle, its diagnosis comes out of the pipeline.
        bootstrap = re.search(r"broker (\S+) \(embedded", text)[1]
        cfg = StreamConfig(bootstrap=bootstrap, prefix=env["FIRSTFAULT_TOPIC_PREFIX"], partitions=1)
        ship(OOM, cfg)
        offline = analyze_path(OOM).diagnosis
        # With a 1 s grace revision 0 may precede the extractor's last batches; late
        # evidence then revises it. The pipeline must converge on the offline answer.
        seen = []
        for m in follow.TopicReader(cfg, cfg.topic("diagnoses"), mode="scan", idle_s=45.0):
            d = decode(m.value())
            seen.append((d.revision, d.provisional, d.status, d.sub_domain))
            if not d.provisional and d.diagnosis_id == offline.diagnosis_id:
                break
        assert seen and seen[-1] == (seen[-1][0], False, "attributed", "host_oom"), (seen, "".join(err_lines))

        os.kill(pids["extractor-1"], signal.SIGKILL)          # a crash: it must come back
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not any("restarted extractor-1" in x for x in err_lines):
            time.sleep(0.1)
        assert any("restarted extractor-1" in x for x in err_lines), "".join(err_lines)
        new_pid = int(re.search(r"restarted extractor-1 \(pid (\d+)", "".join(err_lines))[1])

        os.killpg(proc.pid, signal.SIGINT)      # what Ctrl-C at a terminal does: the whole foreground group
        assert proc.wait(90) == 0               # a bound on a hang, not a speed: the workers stop on the broker
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    time.sleep(0.2)
    assert not [p for p in [*pids.values(), new_pid] if _alive(p)], "orphaned processes"
    log = "".join(err_lines)
    assert "stopped extractor-1" in log and "broker stopped" in log
    assert "broker had already exited" not in log          # the group Ctrl-C did not reach it
    assert log.index("stopped extractor-1") < log.index("broker stopped")


def test_supervisor_stops_one_at_a_time_pausing_inside_a_group_and_kills_the_stubborn(tmp_path):
    polite = [sys.executable, "-c", "import signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\nprint('up', flush=True)\ntime.sleep(60)"]
    stubborn = [sys.executable, "-c", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "print('up', flush=True)\ntime.sleep(60)"]
    env = dict(os.environ)
    a, b = (up.Worker(n, polite, env, str(tmp_path), group="g") for n in ("a", "b"))
    c = up.Worker("c", stubborn, env, str(tmp_path), group="h")
    sup = up.Supervisor([a, b, c], stop_timeout=1.0, settle_s=0.6)
    sup.start()
    time.sleep(0.8)                      # let the interpreters install their handlers
    t0 = time.monotonic()
    assert sup.stop() is False           # `c` ignored SIGTERM and had to be killed
    took = time.monotonic() - t0
    assert (a.proc.returncode, b.proc.returncode, c.proc.returncode) == (0, 0, -signal.SIGKILL)
    # the pause between a and b, then c's full timeout; the upper bound is one on hanging (the children
    # sleep 60 s), not a speed
    assert 1.6 <= took < 30
