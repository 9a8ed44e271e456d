"""The stream workers' /metrics, /healthz and /readyz, scraped over HTTP while they run on a real broker.

The extractor runs in a thread (the real ``ExtractorWorker`` loop), the correlator as
``python -m firstfault.streams.correlator worker --without-web``; each gets a metrics
port, a few records (one it cannot read) and must export every metric
``metrics_names.EXPORTED_BY`` lists for it, with the values those records make.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import TopicPartition

from firstfault.connectors import metrics_names as M
from firstfault.rules.bundle import open_bundle
from firstfault.rules.catalog import load_catalog
from firstfault.rules.engine import analyze_bundle
from firstfault.schemas import EventBatch, RawLine, SchedulerEvent, WorkloadRecord
from firstfault.schemas.avro import encode
from firstfault.streams import kafka
from firstfault.streams.broker import free_port
from firstfault.streams.config import StreamConfig
from firstfault.streams.extractor import ExtractorWorker

from conftest import SAMPLES

pytest_plugins = ["conftest_kafka"]

Samples = dict[str, list[tuple[dict[str, str], float]]]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:                      # not listening (yet)
        return 0, str(exc)


def scrape(base: str) -> Samples:
    from prometheus_client.parser import text_string_to_metric_families

    status, text = get(base + "/metrics")
    if status != 200:
        return {}
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The sum over the series of ``name`` whose labels include ``labels``; None when there is none."""
    found = [v for lab, v in samples.get(name, []) if labels.items() <= lab.items()]
    return sum(found) if found else None


def wait_for(cond: Callable[[], bool], timeout: float, step: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


def lag_series(samples: Samples, worker: str) -> dict[tuple[str, str], float]:
    return {(lab["topic"], lab["partition"]): v for lab, v in samples.get(M.CONSUMER_LAG, [])
            if lab.get("worker") == worker}


def exported_families(samples: Samples) -> set[str]:
    return {M.family(n) for n in samples if not n.endswith("_created")}


# ---------------------------------------------------------------- the lag computation itself

def _lag_once_known(c, keys: set, settled=lambda lag: True, within_s: float = 60.0) -> dict:
    """consumer_lag once it covers ``keys`` and ``settled`` holds (fetching meanwhile), or as it is at the end."""
    deadline = time.monotonic() + within_s
    while True:
        lag = kafka.consumer_lag(c)
        if (set(lag) >= keys and settled(lag)) or time.monotonic() >= deadline:
            return lag
        c.consume(num_messages=1, timeout=0.2)        # nothing to deliver: it only lets fetches happen


def test_consumer_lag_is_high_watermark_minus_position(stream_cfg, unique_name):
    topic = stream_cfg.topic(unique_name("lag"))
    kafka.ensure_topics(stream_cfg, [topic])
    prod = kafka.producer(stream_cfg)
    for i in range(5):
        prod.produce(topic, key=b"k", value=b"%d" % i, partition=0)
    assert prod.flush(10) == 0
    c = kafka.consumer(stream_cfg, group=unique_name("g"))
    try:
        c.assign([TopicPartition(topic, 0, 0), TopicPartition(topic, 1, 0)])
        got = []
        deadline = time.monotonic() + 15
        while len(got) < 2 and time.monotonic() < deadline:
            got += [m for m in c.consume(num_messages=2 - len(got), timeout=0.5) if m.error() is None]
        assert len(got) == 2
        # Position 2 of 5 on partition 0; partition 1 is empty (nothing read, watermark 0). The
        # watermarks come with fetch responses, on the client's own schedule: partition 0 is paused
        # (its position stays) while the client fetches until it knows both, however busy the machine.
        c.pause([TopicPartition(topic, 0)])
        assert _lag_once_known(c, {(topic, 0), (topic, 1)}) == {(topic, 0): 3, (topic, 1): 0}
        c.resume([TopicPartition(topic, 0)])
        while len(got) < 5 and time.monotonic() < deadline + 15:
            got += [m for m in c.consume(num_messages=5 - len(got), timeout=0.5) if m.error() is None]
        assert len(got) == 5
        assert _lag_once_known(c, {(topic, 0), (topic, 1)}, settled=lambda lag: lag.get((topic, 0)) == 0) == \
            {(topic, 0): 0, (topic, 1): 0}
    finally:
        c.close()


# ---------------------------------------------------------------- the extractor

XID = ("Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, "
       "GPU has fallen off the bus.")


def test_extractor_exports_its_metrics_and_answers_the_probes(stream_cfg):
    cfg = stream_cfg
    kafka.ensure_topics(cfg)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    stop, failed = threading.Event(), []

    def loop() -> None:
        try:
            w = ExtractorWorker(cfg, metrics_port=port)
        except Exception as exc:                # pragma: no cover - reported below
            failed.append(exc)
            return
        try:
            while not stop.is_set():
                w.step(timeout=0.2)
        finally:
            w.close()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        prod = kafka.producer(cfg)
        start = SchedulerEvent(type="start", ts="2026-11-02T09:58:00Z", workload=WorkloadRecord.model_validate(
            {"workload_id": "wl-m", "state": "RUNNING", "start_time": "2026-11-02T09:58:00Z", "nodes": ["node-02"]}))
        prod.produce(cfg.topic("scheduler"), key=b"wl-m", value=encode(start))
        prod.produce(cfg.topic("raw"), key=b"node-02", value=b"\xc3\x01garbage-not-avro")      # dead letter
        for n in range(1, 4):
            line = RawLine(host="node-02", path="logs/syslog/node-02.log", line=n, text=XID)
            prod.produce(cfg.topic("raw"), key=b"node-02", value=encode(line))
        assert prod.flush(10) == 0

        assert wait_for(lambda: get(base + "/readyz")[0] == 200, 30), (get(base + "/readyz"), failed)
        assert get(base + "/healthz")[0] == 200

        def settled() -> bool:
            s = scrape(base)
            lags = lag_series(s, "extractor")
            return (value(s, M.RECORDS_CONSUMED, worker="extractor", topic="raw") == 4
                    and {("raw", "0"), ("raw", "1"), ("scheduler", "0"), ("scheduler", "1")} <= set(lags)
                    and not any(lags.values()))
        assert wait_for(settled, 30), scrape(base)
        s = scrape(base)
    finally:
        stop.set()
        t.join(20)
    assert not failed
    assert exported_families(s) == set(M.EXPORTED_BY["extractor"])
    assert value(s, M.RECORDS_CONSUMED, worker="extractor", topic="raw") == 4      # 3 lines + 1 refused
    assert value(s, M.DEADLETTER, stage="extractor") == 1
    assert value(s, M.PUBLISH_ERRORS, sink="kafka") == 0                          # present, nothing failed
    assert set(lag_series(s, "extractor")) == {("raw", "0"), ("raw", "1"), ("scheduler", "0"), ("scheduler", "1")}
    assert get(base + "/healthz")[0] == 0                                       # closed with the worker


# ---------------------------------------------------------------- the correlator

def _correlator(cfg: StreamConfig, port: int, tmp: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTFAULT_")}
    env.update(FIRSTFAULT_KAFKA_BOOTSTRAP=cfg.bootstrap, FIRSTFAULT_TOPIC_PREFIX=cfg.prefix,
               FIRSTFAULT_PARTITIONS=str(cfg.partitions), FIRSTFAULT_GRACE_S=str(cfg.grace_s),
               FIRSTFAULT_GRACE_CAP_S=str(cfg.grace_cap_s), FIRSTFAULT_LATENESS_S=str(cfg.lateness_s),
               FIRSTFAULT_APP_ID=cfg.app_id, FIRSTFAULT_CHANGELOG_ONE_PER_BATCH="1",
               FIRSTFAULT_METRICS_PORT=str(port), TMPDIR=str(tmp))
    return subprocess.Popen([sys.executable, "-m", "firstfault.streams.correlator", "worker", "--without-web"],
                            env=env, cwd=tmp, stdout=open(tmp / "correlator.log", "wb"), stderr=subprocess.STDOUT)


def test_correlator_exports_its_metrics_and_answers_the_probes(kafka_bootstrap, unique_name, tmp_path):
    tag = unique_name("cm")
    cfg = StreamConfig(bootstrap=kafka_bootstrap, prefix=f"{tag}.", partitions=2, grace_s=3600, grace_cap_s=1.0,
                       lateness_s=3600, app_id=f"{tag}-correlator")
    kafka.ensure_topics(cfg, [cfg.topic(n) for n in ("events", "scheduler", "diagnoses", "deadletter", "raw")])
    bundle = open_bundle(SAMPLES / "worked-example")
    wl = bundle.workload
    events = [e.to_schema() for e in analyze_bundle(bundle, load_catalog(), keep_events=True).events]
    key = wl.workload_id.encode()
    running = wl.model_copy(update={"state": "RUNNING", "end_time": None, "exit_code": None})
    prod = kafka.producer(cfg)
    prod.produce(cfg.topic("events"), key=key, value=b"\x00not an event batch")                 # dead letter
    prod.produce(cfg.topic("scheduler"), key=key, value=encode(SchedulerEvent(type="start", workload=running,
                                                                                ts=wl.start_time)))
    prod.produce(cfg.topic("events"), key=key, value=encode(EventBatch(
        workload_id=wl.workload_id, attempt=wl.attempt, events=events, paths=[f.path for f in bundle.files])))
    prod.produce(cfg.topic("scheduler"), key=key, value=encode(SchedulerEvent(type="end", workload=wl,
                                                                                ts=wl.end_time)))
    # Lines on raw[0] and no extractor at all: a partition nobody reads.
    for i in range(3):
        prod.produce(cfg.topic("raw"), key=b"node-01", value=f"line {i}".encode(), partition=0)
    assert prod.flush(10) == 0

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = _correlator(cfg, port, tmp_path)

    def logs() -> str:
        return (tmp_path / "correlator.log").read_text(errors="replace")[-3000:]

    try:
        assert wait_for(lambda: get(base + "/healthz")[0] == 200, 20), logs()          # "starting" counts
        assert wait_for(lambda: get(base + "/readyz")[0] == 200, 30), (get(base + "/readyz"), logs())

        def settled() -> bool:
            s = scrape(base)
            lags = lag_series(s, "correlator")
            return (value(s, M.FINALIZATION_LATENCY + "_count") == 1
                    and value(s, M.RECORDS_CONSUMED, worker="correlator") == 4
                    and {("events", "0"), ("events", "1"), ("scheduler", "0"), ("scheduler", "1")} <= set(lags)
                    and not any(lags.values()))
        assert wait_for(settled, 30), (scrape(base), logs())

        def unread() -> dict[tuple[str, str], float]:
            return {(lab["topic"], lab["partition"]): v for lab, v in scrape(base).get(M.PARTITION_UNREAD, [])}
        # Two looks at least (every 5 s): the raw partition's wait grows, every other partition is read.
        assert wait_for(lambda: unread().get(("raw", "0"), 0) > 0, 30), (unread(), logs())
        seen = unread()
        assert {k for k, v in seen.items() if v > 0} == {("raw", "0")}, seen
        assert {("events", "0"), ("events", "1"), ("scheduler", "0"), ("scheduler", "1"), ("raw", "1")} <= set(seen)
        s = scrape(base)
        assert get(base + "/healthz")[0] == 200 and get(base + "/readyz") == (200, "ready\n")
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert exported_families(s) == set(M.EXPORTED_BY["correlator"])
    assert value(s, M.RECORDS_CONSUMED, worker="correlator", topic="events") == 2       # the batch and the refused one
    assert value(s, M.RECORDS_CONSUMED, worker="correlator", topic="scheduler") == 2
    assert value(s, M.DEADLETTER, stage="correlator") == 1
    assert value(s, M.STREAM_DIAGNOSES, kind="final") == 1
    assert 0 < value(s, M.FINALIZATION_LATENCY + "_sum") < 30
    assert value(s, M.WORKLOADS_OPEN) == 1                       # kept for late lines until lateness_s
    assert value(s, M.PUBLISH_ERRORS, sink="kafka") == 0 and value(s, M.PUBLISH_ERRORS, sink="redis") == 0
