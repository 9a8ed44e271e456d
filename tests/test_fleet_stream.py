"""The fleet memory on the real broker: rebuilt from the diagnoses topic, kept current by the
node-health worker, and published to the compacted node-health topic (key: the host)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from firstfault.connectors.sinks.node_health import NodeHealthStore
from firstfault.schemas.avro import encode
from firstfault.streams import kafka
from firstfault.streams.follow import TopicReader
from firstfault.streams.node_health import follow

from conftest import redis_key_prefix

from fleet_bundles import T0, diagnose, ib_bundle, xid79_bundle

pytest_plugins = ["conftest_kafka"]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def redis_prefix(redis_url):
    with redis_key_prefix(redis_url, "fleetstream") as p:
        yield p


def _publish(cfg, diagnoses) -> None:
    producer = kafka.producer(cfg)
    for d in diagnoses:
        producer.produce(cfg.topic("diagnoses"), key=d.workload_id.encode(), value=encode(d))
    assert producer.flush(15) == 0


def _node_health(cfg) -> dict[str, dict]:
    latest = {}
    for m in TopicReader(cfg, cfg.topic("node-health"), idle_s=2.0):
        latest[m.key().decode()] = json.loads(m.value())
    return latest


def test_rebuild_from_the_diagnoses_topic_gives_avoid_and_publishes_node_health(
        stream_cfg, redis_url, redis_prefix, tmp_path):
    cfg = stream_cfg
    kafka.ensure_topics(cfg, [cfg.topic("diagnoses")])
    a = diagnose(xid79_bundle(tmp_path, "train-a", "node-07", T0))
    b = diagnose(xid79_bundle(tmp_path, "train-b", "node-07", T0 + timedelta(days=2)))
    c = diagnose(ib_bundle(tmp_path, "train-c", "node-03", T0 + timedelta(hours=1)))
    _publish(cfg, [a, b, c])
    # Something stale in the record that the topic does not hold: a rebuild drops it.
    NodeHealthStore(redis_url, redis_prefix).record(diagnose(xid79_bundle(tmp_path, "stale", "node-50", T0)))
    env = {**os.environ, "FIRSTFAULT_REDIS_PREFIX": redis_prefix, "FIRSTFAULT_TIME_INDEX": "scan"}
    env.pop("FIRSTFAULT_TOPOLOGY", None)
    # Judged at the end of the newest episode's cycle, not the clock (the record is in the past).
    out = subprocess.run([sys.executable, "-m", "firstfault", "nodes", "--rebuild", "--json",
                          "--at", "2026-11-04T11:00:00Z",
                          "--bootstrap", cfg.bootstrap, "--redis-url", redis_url, "--prefix", cfg.prefix],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "3 diagnoses" in out.stderr
    report = json.loads(out.stdout)
    recs = {n["host"]: n["recommendation"] for n in report["nodes"]}
    assert recs == {"node-07": "avoid", "node-03": "watch"}
    topic = _node_health(cfg)
    assert sorted(topic) == ["node-03", "node-07"]
    assert {e["workload_id"] for e in topic["node-07"]["episodes"]} == {"train-a", "train-b"}


def test_the_worker_records_new_diagnoses_as_they_arrive(stream_cfg, redis_url, redis_prefix, tmp_path):
    cfg = stream_cfg.model_copy(update={"redis_url": redis_url, "redis_prefix": redis_prefix})
    kafka.ensure_topics(cfg, [cfg.topic("diagnoses")])
    store = NodeHealthStore(redis_url, redis_prefix)
    stop = threading.Event()
    worker = threading.Thread(target=follow, args=(cfg, store, stop, f"{cfg.prefix}node-health"), daemon=True)
    worker.start()
    try:
        _publish(cfg, [diagnose(ib_bundle(tmp_path, f"job-{h}", h, T0)) for h in ("node-01", "node-02")])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and store.hosts() != ["node-01", "node-02"]:
            time.sleep(0.2)
        assert store.hosts() == ["node-01", "node-02"]
    finally:
        stop.set()
        worker.join(30)
    assert not worker.is_alive()
    assert sorted(_node_health(cfg)) == ["node-01", "node-02"]


def test_up_runs_the_node_health_worker_when_there_is_redis_to_keep_it_in(tmp_path):
    from firstfault.streams.config import StreamConfig
    from firstfault.streams.up import describe, make_workers

    with_redis = StreamConfig(bootstrap="127.0.0.1:9", redis_url="redis://127.0.0.1:6379/0", prefix="t.")
    names = [w.name for w in make_workers(with_redis, 1, str(tmp_path))]
    assert names == ["extractor-1", "correlator", "node-health"]
    nh = make_workers(with_redis, 1, str(tmp_path))[-1]
    assert nh.health_port is None and nh.group == f"{with_redis.app_id}-node-health"
    assert "node-health" in with_redis.topics
    assert [w.name for w in make_workers(StreamConfig(bootstrap="127.0.0.1:9", prefix="t."), 1, str(tmp_path))] == [
        "extractor-1", "correlator"]
    topo = describe(with_redis)
    assert [t.producers for t in topo.topics if t.logical == "node-health"] == [["node-health"]]


def test_the_correlator_escalates_an_attempt_that_fails_like_the_one_before(kafka_bootstrap, redis_url, redis_prefix,
                                                                             tmp_path):
    """Attempt 1 of a workload failing like attempt 0 (the same Xid 79 on the same node): the stream's
    diagnosis says so in recovery.reason and summary (rules/attempts.py, wired in the correlator)."""
    import shutil

    from firstfault.connectors.shipper import ship
    from stream_pipeline import pipeline_cfg, read_finals, running_pipeline

    tag = f"esc{uuid.uuid4().hex[:8]}"
    cfg = pipeline_cfg(kafka_bootstrap, tag).model_copy(update={"redis_url": redis_url, "redis_prefix": redis_prefix,
                                                                "grace_cap_s": 4.0})
    attempts = []
    for n in (0, 1):
        b = tmp_path / f"attempt-{n}"
        shutil.copytree(ROOT / "samples" / "hang-until-timeout", b, ignore=shutil.ignore_patterns("expected.json"))
        wl = json.loads((b / "workload.json").read_text())
        wl.update(workload_id=f"{tag}-job", attempt=n)
        (b / "workload.json").write_text(json.dumps(wl))
        attempts.append(b)
    (tmp_path / "workers").mkdir()
    with running_pipeline(cfg, tmp_path / "workers") as cfg:
        ship(attempts[0], cfg)
        first = read_finals(cfg, lambda out: f"{tag}-job" in out, timeout=120)[f"{tag}-job"][-1]
        deadline = time.monotonic() + 30
        from firstfault.connectors.sinks.redis_store import DiagnosisStore
        store = DiagnosisStore(redis_url, redis_prefix)
        while store.latest(f"{tag}-job", 0) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        ship(attempts[1], cfg)
        finals = read_finals(cfg, lambda out: any(d.attempt == 1 for d in out.get(f"{tag}-job", [])), timeout=120)
    second = next(d for d in finals[f"{tag}-job"] if d.attempt == 1)
    assert first.attempt == 0 and not first.recovery.reason.startswith("repeats attempt")
    assert second.sub_domain == first.sub_domain == "gpu_fell_off_bus"
    assert second.recovery.reason.startswith("repeats attempt 0"), second.recovery.reason
    assert second.recovery.action == "drain_nodes" and "attempt 0" in second.summary


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_worker_waits_out_a_redis_outage_in_one_line_a_try_and_catches_up(stream_cfg, tmp_path, caplog):
    """Issue 22, item 7: with Redis down the worker raised, exited with a traceback and `up` restarted it
    (3 restarts in 34 s). Now it keeps the batch, says so in one line per retry, and records it once Redis
    answers."""
    import logging
    import shutil

    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no redis-server binary to bring Redis up mid-test")
    port = _free_port()
    url = f"redis://127.0.0.1:{port}/0"
    cfg = stream_cfg.model_copy(update={"redis_url": url, "redis_prefix": "nh:"})
    kafka.ensure_topics(cfg, [cfg.topic("diagnoses")])
    store = NodeHealthStore(url, "nh:")
    stop = threading.Event()
    caplog.set_level(logging.WARNING, logger="firstfault.node_health")
    crashed: list[BaseException] = []

    def run() -> None:
        try:
            follow(cfg, store, stop, f"{cfg.prefix}node-health", retry_first_s=0.05, retry_max_s=0.2)
        except BaseException as exc:        # the old worker died here
            crashed.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    server = None
    try:
        _publish(cfg, [diagnose(ib_bundle(tmp_path, "job-down", "node-05", T0))])
        deadline = time.monotonic() + 60

        def retries() -> list[str]:
            return [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]

        while time.monotonic() < deadline and len(retries()) < 3 and not crashed:
            time.sleep(0.05)
        assert not crashed, repr(crashed)
        assert len(retries()) >= 3 and worker.is_alive()
        assert all("\n" not in m and "store is unavailable" in m and "1 diagnoses wait" in m for m in retries())
        server = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while time.monotonic() < deadline and store.ping() is False:
            time.sleep(0.05)
        # The worker writes the record, then says the store is back: wait for both (a busy machine may
        # run this thread between the two).
        while time.monotonic() < deadline and (store.hosts() != ["node-05"]
                                               or not any("store is back" in r.getMessage() for r in caplog.records)):
            time.sleep(0.1)
        assert store.hosts() == ["node-05"]
        assert any("store is back" in r.getMessage() for r in caplog.records)
    finally:
        stop.set()
        worker.join(30)
        if server is not None:
            server.terminate()
            server.wait(10)
    assert not worker.is_alive() and not crashed
    assert sorted(_node_health(cfg)) == ["node-05"]
