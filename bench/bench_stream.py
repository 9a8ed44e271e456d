#!/usr/bin/env python3
"""Benchmark the streaming path on a real broker (the embedded Tansu unless --bootstrap).

    python bench/bench_stream.py [--lines 100000] [--nodes 16] [--copies 200] [--workloads 20] [--json]

Each measurement has its own topics (a fresh prefix) and fails on its own: one that
cannot run (e.g. the correlator does not start) reports its error and the others
still run. In one run, on one generated job (bench/gen_bundle.py, ~97 % noise):

* ``consume_ceiling``: confluent-kafka ``consume(num_messages=batch)`` over the raw
  topic from offset 0 (assign, no group): the yardstick no worker can beat;
* ``decode``: ``decode_raw`` of the Avro RawLine values one by one, in process;
* ``decode_batch``: ``raw_lines`` over consume-sized batches, as the extractor worker decodes;
* ``extractor_core``: ``ExtractorCore.handle`` on decoded records, in process;
* ``extractor_worker``: the whole ``ExtractorWorker`` loop (consume, decode, extract,
  produce EventBatches, commit) fed from the topic, in process;
* ``correlator``: one correlator worker process on pre-produced EventBatches of
  ``--copies`` copies of the job, rate from its committed offsets (commit interval 0.2 s),
  per wall second and per second of the worker's own CPU;
* ``latency``: end event -> final diagnosis over ``--workloads`` attempts whose
  start and evidence the correlator already holds; p50/p99, raw and beyond the grace.

The job's records are frozen out of the garbage collector before measuring (they are this
script's data; a worker process does not hold them), and the in-process worker freezes its
start-up heap as ``ExtractorWorker.run()`` does.

The broker, the workers and this script share the machine's cores: rates are floors.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from confluent_kafka.admin import AdminClient

from firstfault.connectors.shipper import bundle_records, scheduler_message
from firstfault.rules.catalog import load_catalog
from firstfault.schemas import EventBatch, RawLine, SchedulerEvent, WorkloadRecord
from firstfault.schemas.avro import decode, encode
from firstfault.streams import kafka
from firstfault.streams.broker import EmbeddedBroker
from firstfault.streams.codecs import decode_raw, raw_lines
from firstfault.streams.config import StreamConfig
from firstfault.streams.extractor import ExtractorCore, ExtractorWorker, freeze_startup_heap

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
GRACE_S = 1.0


# ---------------------------------------------------------------- data
def job_bundle(nodes: int, lines: int) -> Path:
    target = OUT / f"job-{nodes}n-{lines}"
    if not (target / "workload.json").exists():
        subprocess.run([sys.executable, str(HERE / "gen_bundle.py"), str(target), "--nodes", str(nodes),
                        "--lines", str(lines)], check=True, stdout=subprocess.DEVNULL)
    return target


class Job:
    """The job's records, encoded once; every measurement reuses them."""

    def __init__(self, path: Path) -> None:
        self.workload, pairs = bundle_records(path)
        self.records: list[RawLine] = [r for _, r in pairs]
        self.keys = [k.encode() for k, _ in pairs]
        self.values = [encode(r) for r in self.records]
        self.bytes = sum(map(len, self.values))

    def end_event(self, workload: WorkloadRecord | None = None) -> SchedulerEvent:
        wl = workload or self.workload
        return SchedulerEvent(type="end", workload=wl, ts=wl.end_time)


def fresh_cfg(base: StreamConfig) -> StreamConfig:
    tag = f"b{uuid.uuid4().hex[:8]}"
    return base.model_copy(update={"prefix": f"{tag}.", "app_id": f"{tag}-correlator",
                                   "extractor_group": f"{tag}-extractor"})


def produce(cfg: StreamConfig, topic: str, items, on_delivery: Callable | None = None) -> float:
    prod = kafka.producer(cfg, **{"linger.ms": 20, "batch.size": 1_000_000})
    t0 = time.perf_counter()
    for key, value in items:
        while True:
            try:
                prod.produce(topic, key=key, value=value, on_delivery=on_delivery)
                break
            except BufferError:
                prod.poll(0.05)
    prod.flush(120)
    return time.perf_counter() - t0


def ship_job(cfg: StreamConfig, job: Job) -> None:
    kafka.ensure_topics(cfg)
    wid = job.workload.workload_id.encode()
    produce(cfg, cfg.topic("scheduler"), [(wid, scheduler_message("start", job.workload))])
    produce(cfg, cfg.topic("raw"), zip(job.keys, job.values))
    produce(cfg, cfg.topic("scheduler"), [(wid, scheduler_message("end", job.workload))])


def rate(n: float, seconds: float) -> float:
    return round(n / seconds, 1) if seconds > 0 else float("nan")


# ---------------------------------------------------------------- measurements
def m_consume_ceiling(base: StreamConfig, job: Job) -> dict[str, Any]:
    cfg = fresh_cfg(base)
    topic = cfg.topic("raw")
    kafka.ensure_topics(cfg, [topic])
    produce_s = produce(cfg, topic, zip(job.keys, job.values))
    c = kafka.consumer(cfg, group=f"{cfg.prefix}ceiling")
    parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    n, first, last = 0, None, None
    deadline = time.monotonic() + 120
    while n < len(job.values) and time.monotonic() < deadline:
        msgs = c.consume(num_messages=cfg.batch, timeout=1.0)
        if msgs:
            first = first or time.perf_counter()
            n += sum(1 for m in msgs if m.error() is None)
            last = time.perf_counter()
    c.close()
    secs = (last - first) if first and last else 0.0
    return {"records": n, "seconds": round(secs, 3), "records_per_s": rate(n, secs),
            "mb_per_s": rate(job.bytes / 1e6, secs), "produce_records_per_s": rate(len(job.values), produce_s),
            "batch": cfg.batch, "partitions": cfg.partitions}


def m_decode(base: StreamConfig, job: Job) -> dict[str, Any]:
    t0 = time.perf_counter()
    for k, v in zip(job.keys, job.values):
        decode_raw(v, k)
    secs = time.perf_counter() - t0
    return {"records": len(job.values), "seconds": round(secs, 3), "records_per_s": rate(len(job.values), secs)}


def m_decode_batch(base: StreamConfig, job: Job) -> dict[str, Any]:
    """What the worker runs: ``raw_lines`` over consume-sized batches (one pass, no per-record dispatch)."""
    t0 = time.perf_counter()
    for i in range(0, len(job.values), base.batch):
        raw_lines(job.values[i:i + base.batch])
    secs = time.perf_counter() - t0
    return {"records": len(job.values), "seconds": round(secs, 3), "records_per_s": rate(len(job.values), secs)}


def m_extractor_core(base: StreamConfig, job: Job) -> dict[str, Any]:
    core = ExtractorCore(base, load_catalog(base.rules))
    core.timeline.apply(job.end_event())
    ts = int(time.time() * 1000)
    batches = events = 0
    t0 = time.perf_counter()
    for i in range(0, len(job.records), base.batch):
        out = core.handle([(r, ts) for r in job.records[i:i + base.batch]])
        batches += len(out)
        events += sum(len(b.events) for b in out.values())
    secs = time.perf_counter() - t0
    return {"records": len(job.records), "seconds": round(secs, 3), "records_per_s": rate(len(job.records), secs),
            "event_batches": batches, "events": events, "candidates": core.counters.candidates}


def m_extractor_worker(base: StreamConfig, job: Job) -> dict[str, Any]:
    cfg = fresh_cfg(base)
    ship_job(cfg, job)
    t0 = time.perf_counter()
    worker = ExtractorWorker(cfg)
    freeze_startup_heap()                  # as ExtractorWorker.run() does before its loop
    first, after_first = None, 0
    deadline = time.monotonic() + 300
    try:
        while worker.core.counters.records < len(job.records) and time.monotonic() < deadline:
            if worker.step(timeout=0.5) and first is None:
                # The clock starts once the first batch is done (group join, first fetch): the
                # records it handled are not counted either.
                first, after_first = time.perf_counter(), worker.core.counters.records
        done = time.perf_counter()
        worker.producer.flush(30)
    finally:
        worker.close()
    n = worker.core.counters.records
    steady = done - first if first else 0.0
    return {"records": n, "seconds": round(steady, 3), "records_per_s": rate(n - after_first, steady),
            "including_startup_s": round(done - t0, 3), "batches_out": worker.core.counters.batches_out,
            "deadletters": worker.core.counters.deadletters}


class Correlator:
    """One correlator worker process with this measurement's topics and a fast commit interval."""

    def __init__(self, cfg: StreamConfig, log_path: Path) -> None:
        self.group = cfg.app_id            # Faust's consumer group is its app id
        env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTFAULT_")}
        env.update({"FIRSTFAULT_KAFKA_BOOTSTRAP": cfg.bootstrap, "FIRSTFAULT_TOPIC_PREFIX": cfg.prefix,
                    "FIRSTFAULT_PARTITIONS": str(cfg.partitions), "FIRSTFAULT_APP_ID": cfg.app_id,
                    "FIRSTFAULT_GRACE_S": str(GRACE_S), "FIRSTFAULT_GRACE_CAP_S": str(GRACE_S),
                    "FIRSTFAULT_COMMIT_INTERVAL_S": "0.2", "PYTHONUNBUFFERED": "1"})
        if cfg.redis_url:
            env["FIRSTFAULT_REDIS_URL"] = cfg.redis_url
        self.log_path = log_path
        self.started = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "firstfault.streams.correlator"], env=env,
                                     stdout=open(log_path, "ab"), stderr=subprocess.STDOUT)

    def committed(self, admin: AdminClient, topic: str, parts: list[int]) -> int:
        from confluent_kafka import ConsumerGroupTopicPartitions

        fut = admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(self.group, [TopicPartition(topic, p) for p in parts])])
        res = fut[self.group].result(10)
        return sum(tp.offset for tp in res.topic_partitions if tp.offset > 0)

    def cpu_s(self) -> float | None:
        """The worker's CPU seconds so far (user + system, from /proc), None where /proc has none."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def wait_committed(self, cfg: StreamConfig, topic: str, total: int,
                       timeout: float) -> list[tuple[float, int, float | None]]:
        """(time, committed, worker CPU s) samples until everything is committed; raises if the worker
        dies or stalls."""
        admin = AdminClient({"bootstrap.servers": cfg.bootstrap})
        parts = list(range(cfg.partitions))
        samples: list[tuple[float, int, float | None]] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the correlator exited with code {self.proc.returncode}; see {self.log_path}")
            n = self.committed(admin, topic, parts)
            samples.append((time.perf_counter(), n, self.cpu_s()))
            if n >= total:
                return samples
            time.sleep(0.1)
        raise RuntimeError(f"the correlator committed {samples[-1][1] if samples else 0} of {total} in {timeout}s; "
                           f"see {self.log_path}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def job_batches(base: StreamConfig, job: Job) -> list[EventBatch]:
    """What one extractor publishes for the job (its EventBatches, in order)."""
    core = ExtractorCore(base, load_catalog(base.rules))
    core.timeline.apply(job.end_event())
    ts = int(time.time() * 1000)
    out: list[EventBatch] = []
    for i in range(0, len(job.records), base.batch):
        out += list(core.handle([(r, ts) for r in job.records[i:i + base.batch]]).values())
    return out


def _copy(wl: WorkloadRecord, wid: str) -> WorkloadRecord:
    return wl.model_copy(update={"workload_id": wid})


def m_correlator(base: StreamConfig, job: Job, copies: int, tmp: Path) -> dict[str, Any]:
    cfg = fresh_cfg(base)
    kafka.ensure_topics(cfg)
    batches = job_batches(base, job)
    start = job.workload.model_copy(update={"state": "RUNNING", "end_time": None, "exit_code": None})
    sched, events, n_events = [], [], 0
    for i in range(copies):
        wid = f"bench-{i:05d}"
        sched.append((wid.encode(), encode(SchedulerEvent(type="start", workload=_copy(start, wid),
                                                          ts=start.start_time))))
        for b in batches:
            events.append((wid.encode(), encode(b.model_copy(update={"workload_id": wid}))))
            n_events += len(b.events)
    produce(cfg, cfg.topic("scheduler"), sched)
    produce(cfg, cfg.topic("events"), events)
    worker = Correlator(cfg, tmp / f"{cfg.prefix}correlator.log")
    try:
        samples = worker.wait_committed(cfg, cfg.topic("events"), len(events), timeout=600)
    finally:
        worker.stop()
    moving = [s for s in samples if s[1] > 0]
    (t1, n1, c1), (t2, n2, c2) = moving[0], moving[-1]
    secs = t2 - t1
    per_batch = n_events / len(events)
    cpu = c2 - c1 if c1 is not None and c2 is not None else None
    return {"event_batches": len(events), "events": n_events, "workloads": copies,
            "batches_per_s": rate(n2 - n1, secs), "events_per_s": rate((n2 - n1) * per_batch, secs),
            # the worker's own CPU over the same window: steadier than wall time where the broker and
            # other work share the cores
            "events_per_cpu_s": rate((n2 - n1) * per_batch, cpu) if cpu else None,
            "seconds": round(secs, 3), "cpu_s": round(cpu, 3) if cpu is not None else None,
            "ready_s": round(t1 - worker.started, 3),
            "note": "rate between the first and the last committed-offset sample (commit interval 0.2 s)"}


def m_latency(base: StreamConfig, job: Job, workloads: int, interval_s: float, tmp: Path) -> dict[str, Any]:
    cfg = fresh_cfg(base)
    kafka.ensure_topics(cfg)
    merged: dict[str, Any] = {}
    for b in job_batches(base, job):       # one batch per attempt: the job's whole evidence
        for e in b.events:
            merged.setdefault(e.signature, e)
    evidence = EventBatch(workload_id="-", attempt=job.workload.attempt, events=list(merged.values()),
                          paths=sorted({r.path for r in job.records}))
    start = job.workload.model_copy(update={"state": "RUNNING", "end_time": None, "exit_code": None})
    wids = [f"lat-{i:05d}" for i in range(workloads)]
    produce(cfg, cfg.topic("scheduler"), [(w.encode(), encode(SchedulerEvent(type="start", workload=_copy(start, w),
                                                                             ts=start.start_time))) for w in wids])
    produce(cfg, cfg.topic("events"), [(w.encode(), encode(evidence.model_copy(update={"workload_id": w})))
                                       for w in wids])
    finals: dict[str, int] = {}
    stop = threading.Event()

    def collect() -> None:
        c = kafka.consumer(cfg, group=f"{cfg.prefix}lat-reader")
        topic = cfg.topic("diagnoses")
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(cfg.partitions)])
        while not stop.is_set():
            for m in c.consume(num_messages=100, timeout=0.2):
                if m.error() is None and m.value():
                    d = decode(m.value())
                    if not d.provisional and d.workload_id not in finals:
                        finals[d.workload_id] = m.timestamp()[1]
        c.close()

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    worker = Correlator(cfg, tmp / f"{cfg.prefix}correlator.log")
    ends: dict[str, int] = {}
    try:
        worker.wait_committed(cfg, cfg.topic("events"), len(wids), timeout=300)   # the evidence is in state
        worker.wait_committed(cfg, cfg.topic("scheduler"), len(wids), timeout=300)   # and the starts
        prod = kafka.producer(cfg, **{"linger.ms": 0})
        for w in wids:
            wl = _copy(job.workload, w)
            prod.produce(cfg.topic("scheduler"), key=w.encode(), value=scheduler_message("end", wl),
                         on_delivery=lambda err, m, w=w: ends.__setitem__(w, m.timestamp()[1]))
            prod.poll(0)
            time.sleep(interval_s)
        prod.flush(30)
        deadline = time.monotonic() + 60 + 2 * GRACE_S
        while len(finals) < len(wids) and time.monotonic() < deadline:
            if worker.proc.poll() is not None:
                raise RuntimeError(f"the correlator exited; see {worker.log_path}")
            time.sleep(0.1)
    finally:
        stop.set()
        reader.join(5)
        worker.stop()
    lat = sorted((finals[w] - ends[w]) / 1000 for w in wids if w in finals and w in ends)
    if not lat:
        raise RuntimeError(f"no final diagnosis arrived; see {worker.log_path}")

    def pct(p: float) -> float:
        return round(lat[min(len(lat) - 1, int(round(p * (len(lat) - 1))))], 3)

    return {"workloads": len(wids), "diagnosed": len(lat), "grace_s": GRACE_S,
            "p50_s": pct(0.50), "p99_s": pct(0.99), "max_s": round(lat[-1], 3),
            "p50_beyond_grace_s": round(pct(0.50) - GRACE_S, 3), "p99_beyond_grace_s": round(pct(0.99) - GRACE_S, 3),
            "mean_s": round(statistics.fmean(lat), 3), "events_per_attempt": len(evidence.events),
            "end_interval_s": interval_s}


# ---------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=100_000, help="lines in the generated job")
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--copies", type=int, default=200,
                    help="correlator: copies of the job's EventBatches (200: a window of several seconds, so the "
                         "0.2 s commit interval moves the rate by a few per cent, not tens)")
    ap.add_argument("--workloads", type=int, default=20, help="latency: attempts ended one after another")
    ap.add_argument("--end-interval", type=float, default=0.5, help="latency: seconds between end events")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--bootstrap", default=os.environ.get("FIRSTFAULT_KAFKA_BOOTSTRAP"))
    ap.add_argument("--only", nargs="*", help="run only these measurements")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    broker = None
    if not args.bootstrap:
        broker = EmbeddedBroker(log_path=OUT / "bench-stream-tansu.log")
        OUT.mkdir(parents=True, exist_ok=True)
        args.bootstrap = broker.start()
    tmp = OUT / "bench-stream"
    tmp.mkdir(parents=True, exist_ok=True)
    base = StreamConfig(bootstrap=args.bootstrap, partitions=args.partitions)
    results: dict[str, Any] = {"broker": "embedded Tansu" if broker else args.bootstrap, "cores": os.cpu_count(),
                               "lines": args.lines, "nodes": args.nodes}
    try:
        t0 = time.perf_counter()
        job = Job(job_bundle(args.nodes, args.lines))
        results["prepare_s"] = round(time.perf_counter() - t0, 2)
        # The job's records are this script's, not a worker's: out of the garbage collector's sight,
        # or every full collection in an in-process measurement would walk them (a worker's heap has none).
        gc.collect()
        gc.freeze()
        plan: dict[str, Callable[[], dict[str, Any]]] = {
            "consume_ceiling": lambda: m_consume_ceiling(base, job),
            "decode": lambda: m_decode(base, job),
            "decode_batch": lambda: m_decode_batch(base, job),
            "extractor_core": lambda: m_extractor_core(base, job),
            "extractor_worker": lambda: m_extractor_worker(base, job),
            "correlator": lambda: m_correlator(base, job, args.copies, tmp),
            "latency": lambda: m_latency(base, job, args.workloads, args.end_interval, tmp),
        }
        for name, fn in plan.items():
            if args.only and name not in args.only:
                continue
            try:
                results[name] = fn()
            except Exception as exc:          # each measurement stands alone
                results[name] = {"error": f"{type(exc).__name__}: {exc}"}
                if not args.json:
                    traceback.print_exc()
            if not args.json:
                print(f"{name:18} {json.dumps(results[name])}", flush=True)
    finally:
        if broker:
            broker.stop()
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
