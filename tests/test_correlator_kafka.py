"""The correlator worker against a real broker (embedded Tansu unless KAFKA_BOOTSTRAP) and a real Redis.

Scheduler start/end and EventBatches of a sample go in with confluent-kafka; the worker
runs as ``python -m firstfault.streams.correlator worker --without-web``; what comes out
on the diagnoses topic (and in Redis) must equal ``firstfault analyze --json`` apart
from the stream-only fields. The grace is an hour of stream time and record timestamps
are the workload's event times (or the wall clock), so only the wall-clock cap
(``grace_cap_s``) finalizes: the tests control when.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from firstfault.connectors.sinks.redis_store import DiagnosisStore
from firstfault.rules.bundle import open_bundle
from firstfault.rules.catalog import load_catalog
from firstfault.rules.engine import analyze_bundle
from firstfault.schemas import Diagnosis, EventBatch, SchedulerEvent
from firstfault.schemas.avro import decode, encode
from firstfault.streams import kafka, state_codec
from firstfault.streams.config import StreamConfig

from conftest import SAMPLES
from stream_pipeline import stop_all

pytest_plugins = ["conftest_kafka"]

PARTITIONS = 2
STREAM_ONLY = ("revision", "provisional")


def offline(sample: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "firstfault", "analyze", "--json", str(sample)],
                         capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout)


def bare(d: Diagnosis) -> dict:
    return {k: v for k, v in d.to_dict().items() if k not in STREAM_ONLY}


def _ms(t) -> int:
    return int(t.timestamp() * 1000)


class Pipeline:
    """One test's topics, producer, worker processes and readers."""

    def __init__(self, bootstrap: str, name: str, tmp: Path, grace_cap_s: float, redis_url: str | None = None,
                 commit_interval_s: float | None = None):
        self.cfg = StreamConfig(bootstrap=bootstrap, prefix=f"{name}.", partitions=PARTITIONS, grace_s=3600,
                                grace_cap_s=grace_cap_s, lateness_s=3600, app_id=f"{name}-correlator",
                                redis_url=redis_url, redis_prefix=f"{name}:")
        kafka.ensure_topics(self.cfg, [self.cfg.topic(n) for n in ("events", "scheduler", "diagnoses", "deadletter")])
        self.tmp = tmp
        self.commit_interval_s = commit_interval_s
        self.producer = kafka.producer(self.cfg)
        self.delivered: dict[bytes, tuple[str, int, int]] = {}     # value -> (topic, partition, offset)
        self.workers: list[subprocess.Popen] = []

    def produce(self, topic: str, key: bytes, value: bytes, ts_ms: int | None) -> None:
        def done(err, msg):
            assert err is None, err
            self.delivered[msg.value()] = (msg.topic(), msg.partition(), msg.offset())
        extra = {"timestamp": ts_ms} if ts_ms is not None else {}
        self.producer.produce(self.cfg.topic(topic), key=key, value=value, on_delivery=done, **extra)

    def produce_workload(self, sample: Path, seed: int, n_batches: int = 3, event_time: bool = True) -> None:
        """Start, the sample's events in random batches, then the end.

        Record timestamps are the workload's event times, or the wall clock (as a
        shipper replaying an old bundle makes them) with ``event_time=False``.
        """
        bundle = open_bundle(sample)
        wl = bundle.workload
        events = [e.to_schema() for e in analyze_bundle(bundle, load_catalog(), keep_events=True).events]
        paths = [f.path for f in bundle.files if f.size]
        rng = random.Random(seed)
        rng.shuffle(events)
        key = wl.workload_id.encode()
        start = wl.model_copy(update={"state": "RUNNING", "end_time": None, "exit_code": None})
        ts = (lambda t: _ms(t)) if event_time else (lambda t: None)
        self.produce("scheduler", key, encode(SchedulerEvent(type="start", workload=start, ts=wl.start_time)),
                     ts(wl.start_time))
        cuts = sorted(rng.sample(range(1, len(events)), n_batches - 1))
        for i, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(events)])):
            batch = EventBatch(workload_id=wl.workload_id, attempt=wl.attempt, events=events[a:b],
                               paths=paths[i::n_batches])
            self.produce("events", key, encode(batch), ts(wl.start_time))
        self.produce("scheduler", key, encode(SchedulerEvent(type="end", workload=wl, ts=wl.end_time)),
                     ts(wl.end_time))
        assert self.producer.flush(15) == 0

    def start_worker(self) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTFAULT_")}
        env.update(FIRSTFAULT_KAFKA_BOOTSTRAP=self.cfg.bootstrap, FIRSTFAULT_TOPIC_PREFIX=self.cfg.prefix,
                   FIRSTFAULT_PARTITIONS=str(PARTITIONS), FIRSTFAULT_GRACE_S=str(self.cfg.grace_s),
                   FIRSTFAULT_GRACE_CAP_S=str(self.cfg.grace_cap_s), FIRSTFAULT_LATENESS_S=str(self.cfg.lateness_s),
                   FIRSTFAULT_APP_ID=self.cfg.app_id, FIRSTFAULT_CHANGELOG_ONE_PER_BATCH="1",
                   TMPDIR=str(self.tmp))                  # Faust's datadir: a SIGKILL skips its cleanup
        if self.cfg.redis_url:
            env["FIRSTFAULT_REDIS_URL"] = self.cfg.redis_url
            env["FIRSTFAULT_REDIS_PREFIX"] = self.cfg.redis_prefix
        if self.commit_interval_s:
            env["FIRSTFAULT_COMMIT_INTERVAL_S"] = str(self.commit_interval_s)
        log = open(self.tmp / f"worker-{len(self.workers)}.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "firstfault.streams.correlator", "worker", "--without-web"],
                                env=env, cwd=self.tmp, stdout=log, stderr=subprocess.STDOUT)
        self.workers.append(proc)
        return proc

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-4000:] for p in sorted(self.tmp.glob("worker-*.log")))

    def read(self, topic: str, done: Callable[[list], bool], timeout: float, full_name: bool = False) -> list:
        """Every message of ``topic`` from the start, polling until ``done(messages)`` or the timeout."""
        name = topic if full_name else self.cfg.topic(topic)
        consumer = kafka.consumer(self.cfg, group=f"{self.cfg.app_id}-reader")
        deadline = time.monotonic() + timeout
        try:
            while name not in consumer.list_topics(timeout=5).topics:       # the changelog: made by the worker
                if time.monotonic() > deadline:
                    return []
                time.sleep(0.2)
            consumer.assign([TopicPartition(name, p, 0) for p in range(PARTITIONS)])
            got: list = []
            while time.monotonic() < deadline and not done(got):
                msg = consumer.poll(0.2)
                if msg is not None and not msg.error():
                    got.append(msg)
            return got
        finally:
            consumer.close()

    def diagnoses(self, done: Callable[[list[Diagnosis]], bool], timeout: float) -> list[Diagnosis]:
        msgs = self.read("diagnoses", lambda ms: done([decode(m.value()) for m in ms]), timeout)
        return [decode(m.value()) for m in msgs]

    def close(self) -> None:
        # All at once: this test's group is never used again, so a wedged group cannot hurt.
        stop_all(self.workers, 10)
        self.producer.flush(5)


@pytest.fixture
def pipeline(kafka_bootstrap, unique_name, tmp_path):
    made: list[Pipeline] = []

    def make(**kw) -> Pipeline:
        made.append(Pipeline(kafka_bootstrap, unique_name("cor"), tmp_path, **kw))
        return made[-1]

    yield make
    for p in made:
        p.close()


def finals(ds: list[Diagnosis]) -> list[Diagnosis]:
    return [d for d in ds if not d.provisional]


def _ended_keys(msgs, paths: int = 0) -> set[str]:
    """Table keys whose latest changelog value records the end event (and, with ``paths``, batches
    from at least that many files: every batch produce_workload made, merged)."""
    latest = {m.key(): m.value() for m in msgs}
    out = set()
    for k, v in latest.items():
        state = json.loads(state_codec.decode(v)) if v else {}
        if state.get("ended") and len(set(state.get("paths") or ())) >= paths:
            out.add(json.loads(k))
    return out


def test_worked_example_diagnosis_dead_letters_and_redis(pipeline, redis_url):
    sample = SAMPLES / "worked-example"
    pipe = pipeline(grace_cap_s=1.5, redis_url=redis_url)
    key = b"slurm-4471823"                            # the workload's key: same partitions as its records
    bad_sched, bad_batch = b'{"type": "start", "ts": "2026-11-02T09:58:00Z"}', b"\x00not an event batch"
    pipe.produce("scheduler", key, bad_sched, 1)
    pipe.produce("events", key, bad_batch, 1)
    pipe.produce_workload(sample, seed=1)
    worker = pipe.start_worker()

    ds = pipe.diagnoses(lambda ds: bool(finals(ds)), timeout=45)
    assert finals(ds), f"no final diagnosis\n{pipe.logs()}"
    final = finals(ds)[0]
    assert (final.revision, final.provisional) == (0, False)
    assert bare(final) == offline(sample)
    for d in ds:                                      # anything before it was an early, provisional view
        assert d.provisional is True or d.to_json() == final.to_json()
        assert d.revision == 0 and d.workload_id == final.workload_id

    dls = pipe.read("deadletter", lambda ms: len(ms) >= 2, timeout=10)
    letters = {json.loads(m.value())["topic"]: json.loads(m.value()) for m in dls}
    assert len(dls) == 2 and set(letters) == {pipe.cfg.topic("scheduler"), pipe.cfg.topic("events")}
    for bad, reason in ((bad_sched, "field 'workload'"), (bad_batch, "not Avro")):
        topic, partition, offset = pipe.delivered[bad]
        letter = letters[topic]
        assert reason in letter["reason"] and letter["stage"] == "correlator"
        assert (letter["partition"], letter["offset"]) == (partition, offset)
    assert worker.poll() is None                      # the agents survived both

    store = DiagnosisStore(redis_url, prefix=pipe.cfg.redis_prefix)
    deadline = time.monotonic() + 10                  # the store is written just after the topic
    while (stored := store.latest(final.workload_id, final.attempt)) is None or stored.provisional:
        assert time.monotonic() < deadline, f"not in Redis\n{pipe.logs()}"
        time.sleep(0.1)
    assert stored.to_json() == final.to_json()


def test_kill_9_between_end_and_finalization_publishes_one_diagnosis(pipeline):
    sample = SAMPLES / "host-oom-killer"
    # No offset commit before the kill: the restarted worker gets every record again and
    # must not merge a batch twice (counts, and so the diagnosis, would change).
    pipe = pipeline(grace_cap_s=10.0, commit_interval_s=60)
    pipe.produce_workload(sample, seed=2)
    first = pipe.start_worker()

    bundle = open_bundle(sample)
    key = f"{bundle.workload.workload_id}:0"
    # Killed once the end and every batch are merged: without extractors (no progress reports) only
    # the grace holds a final back, and a worker restored with the end but not yet the batches would
    # rightly finalize on what it has. That is another test's subject (tests/test_stream_watermark.py).
    files = len([f for f in bundle.files if f.size])
    changelog = pipe.read(f"{pipe.cfg.app_id}-workloads-changelog", lambda ms: key in _ended_keys(ms, files),
                          timeout=30, full_name=True)
    assert key in _ended_keys(changelog, files), f"the worker never recorded the end and every batch\n{pipe.logs()}"
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    # Normally the kill lands inside the grace, before the final. On a busy machine the grace may
    # pass first: then the restarted worker, reading every record again, must not publish it twice.
    # Either way exactly one final comes out, and it is analyze's.
    finalized_before_kill = bool(finals(pipe.diagnoses(lambda ds: False, timeout=1.0)))

    pipe.start_worker()                               # same app id: recovers the table, then finalizes
    ds = pipe.diagnoses(lambda ds: bool(finals(ds)), timeout=45)
    assert finals(ds), f"no final diagnosis after the restart\n{pipe.logs()}"
    ds = pipe.diagnoses(lambda _: False, timeout=2.5)  # anything a duplicate would have added by now
    contents: dict[tuple, set[str]] = {}
    for d in ds:
        contents.setdefault((d.diagnosis_id, d.revision, d.provisional), set()).add(d.to_json())
    assert all(len(v) == 1 for v in contents.values())          # a repeat is only ever identical
    final_keys = [k for k in contents if not k[2]]
    assert len(final_keys) == 1 and final_keys[0][1] == 0, (contents.keys(), finalized_before_kill)
    assert bare(finals(ds)[0]) == offline(sample)


def test_a_second_worker_takes_over_open_workloads_and_each_is_finalized_once(pipeline):
    """docker-compose runs two correlators in one group. Worker A sees every end; B joins during
    the grace and takes a partition over (its states from the changelog). A still holds its own
    copies of those states in memory: only the partition's owner may finalize them.

    Wall-clock record stamps: the samples' event times lie days apart, and one workload's
    records would carry stream time past another's end + grace before its batches (another
    topic) arrived. Live, all of them move with the clock."""
    samples = [SAMPLES / n for n in ("clean-completion", "walltime-timeout", "cuda-oom-one-rank")]
    wanted = {open_bundle(s).workload.workload_id: s for s in samples}
    pipe = pipeline(grace_cap_s=15.0)
    a = pipe.start_worker()
    for i, sample in enumerate(samples):
        pipe.produce_workload(sample, seed=10 + i, event_time=False)
    assert {p for _, p, _ in pipe.delivered.values()} == set(range(PARTITIONS))   # work for both

    keys = {f"{wid}:0" for wid in wanted}
    changelog = pipe.read(f"{pipe.cfg.app_id}-workloads-changelog", lambda ms: _ended_keys(ms) >= keys,
                          timeout=30, full_name=True)
    assert _ended_keys(changelog) >= keys, f"worker A never saw every end\n{pipe.logs()}"
    b = pipe.start_worker()

    ds = pipe.diagnoses(lambda ds: {d.workload_id for d in finals(ds)} >= set(wanted), timeout=45)
    assert {d.workload_id for d in finals(ds)} >= set(wanted), f"missing finals\n{pipe.logs()}"
    ds = pipe.diagnoses(lambda _: False, timeout=2.5)  # what a second finalization would have added
    for wid, sample in wanted.items():
        mine = [d for d in finals(ds) if d.workload_id == wid]
        assert len(mine) == 1, f"{wid}: {len(mine)} finals\n{pipe.logs()}"
        assert bare(mine[0]) == offline(sample)
    log_b = (pipe.tmp / "worker-1.log").read_text(errors="replace")
    assert " rev 0: " in log_b, f"B finalized nothing: it joined after the grace cap\n{pipe.logs()}"
    assert a.poll() is None and b.poll() is None
