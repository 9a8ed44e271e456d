"""The extractor worker against a real broker: shipped bundle in, EventBatch records out."""
import json
import threading
import time

import pytest
from confluent_kafka import TopicPartition

from firstfault.connectors.shipper import ship
from firstfault.rules.catalog import load_catalog
from firstfault.rules.diagnose import diagnose
from firstfault.rules.engine import analyze_path, inventory_from_paths
from firstfault.rules.model import Ev, EventSet
from firstfault.schemas import DeadLetter, RawLine, SchedulerEvent, WorkloadRecord
from firstfault.schemas.avro import encode
from firstfault.streams import kafka
from firstfault.streams.codecs import decode_batch
from firstfault.streams.extractor import ExtractorWorker
from conftest import sample_dirs
from stream_pipeline import drain as _drain

pytest_plugins = ["conftest_kafka"]





def _run_worker(cfg, stop):
    w = ExtractorWorker(cfg)
    while not stop.is_set():
        w.step(timeout=0.2)
    w.close()


@pytest.fixture
def worker(stream_cfg):
    kafka.ensure_topics(stream_cfg)
    stop = threading.Event()
    t = threading.Thread(target=_run_worker, args=(stream_cfg, stop), daemon=True)
    t.start()
    yield stream_cfg
    stop.set()
    t.join(15)


def test_shipped_sample_yields_the_offline_events(worker):
    cfg = worker
    sample = "samples/worked-example"
    ship(sample, cfg)
    offline = analyze_path(sample).diagnosis.to_json()
    events, paths = EventSet(), set()

    def complete(msgs):
        events.__init__()
        paths.clear()
        for m in msgs:
            b = decode_batch(m.value())
            assert m.key() == b"slurm-4471823"
            events.update(Ev.from_schema(e) for e in b.events)
            paths.update(b.paths)
        return len(paths) == 8 and len(events) >= 20

    msgs = _drain(cfg, cfg.topic("events"), complete)
    assert msgs, "no EventBatch on the events topic"
    complete(msgs)
    from firstfault.rules.bundle import open_bundle
    workload = open_bundle(sample).workload
    got = diagnose(workload, events.sorted(), load_catalog(), inventory_from_paths(workload, paths))
    assert got.to_json() == offline


def test_malformed_raw_record_goes_to_dead_letter_and_the_next_is_processed(worker):
    cfg = worker
    prod = kafka.producer(cfg)
    prod.produce(cfg.topic("raw"), key=b"node-02", value=b"\xc3\x01garbage-not-avro")
    prod.produce(cfg.topic("raw"), key=b"node-02", value=b'{"no_text_here": 1}')
    prod.flush(10)
    good = RawLine(host="node-02", path="logs/syslog/node-02.log", line=1,
                   text="Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
    prod.produce(cfg.topic("raw"), key=b"node-02", value=encode(good))
    start = SchedulerEvent(type="start", ts="2026-11-02T09:58:00Z", workload=WorkloadRecord.model_validate(
        {"workload_id": "wl-dl", "state": "RUNNING", "start_time": "2026-11-02T09:58:00Z", "nodes": ["node-02"]}))
    prod.produce(cfg.topic("scheduler"), key=b"wl-dl", value=encode(start))
    prod.flush(10)
    dead = _drain(cfg, cfg.topic("deadletter"), lambda got: len(got) >= 2)
    letters = [DeadLetter.model_validate_json(m.value()) for m in dead]
    reasons = sorted(d.reason for d in letters)
    assert len(letters) == 2
    assert any("single-object" in r or "fingerprint" in r for r in reasons)
    assert any("text fields" in r for r in reasons)
    assert all(d.topic == cfg.topic("raw") and d.stage == "extractor" and d.offset in (0, 1) for d in letters)
    # The valid line after them was processed: once its workload started it came out as an event.
    out = _drain(cfg, cfg.topic("events"), lambda got: any(decode_batch(m.value()).events for m in got))
    kinds = [e.kind for m in out for e in decode_batch(m.value()).events]
    assert kinds == ["xid"]


def test_line_on_a_node_with_no_workload_is_kept_for_node_history(stream_cfg):
    cfg = stream_cfg.model_copy(update={"hold_s": 0.5})
    kafka.ensure_topics(cfg)
    stop = threading.Event()
    t = threading.Thread(target=_run_worker, args=(cfg, stop), daemon=True)
    t.start()
    try:
        line = RawLine(host="node-77", path="logs/syslog/node-77.log", line=5,
                       text="Nov  2 10:03:11 node-77 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
        prod = kafka.producer(cfg)
        prod.produce(cfg.topic("raw"), key=b"node-77", value=encode(line))
        prod.flush(10)
        kept = _drain(cfg, cfg.topic("node-history"), lambda got: len(got) >= 1)
    finally:
        stop.set()
        t.join(15)
    from firstfault.schemas.avro import decode
    ev = decode(kept[0].value())
    assert kept[0].key() == b"node-77"
    assert (ev.kind, ev.host, ev.ref.line, ev.fields["xid"]) == ("xid", "node-77", 5, 79)


def test_a_batch_whose_output_was_not_delivered_is_read_again_not_committed(stream_cfg):
    """A delivery report with an error (here: the report the producer's callback gets when the
    broker refuses a record) means the batch's events may be lost: its offsets stay uncommitted
    and the worker reads it again."""
    from confluent_kafka import KafkaError

    cfg = stream_cfg
    kafka.ensure_topics(cfg)
    prod = kafka.producer(cfg)
    for n in range(1, 4):
        prod.produce(cfg.topic("raw"), key=b"node-02", value=encode(RawLine(
            host="node-02", path="logs/syslog/node-02.log", line=n, text=f"Nov  2 10:0{n}:00 node-02 kernel: hello")))
    prod.flush(10)
    w = ExtractorWorker(cfg)
    real_publish, failed = w.publish, []

    def publish_then_refused(batches, *rest):
        real_publish(batches, *rest)
        if not failed:
            failed.append(1)
            w._delivered(KafkaError(KafkaError._MSG_TIMED_OUT), None)

    w.publish = publish_then_refused
    seen: list[int] = []
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and w.core.counters.records < 6:
            before = w.core.counters.records
            w.step(timeout=0.5)
            if w.core.counters.records > before:
                seen.append(w.core.counters.records - before)
        committed = w.consumer.committed([TopicPartition(cfg.topic("raw"), p) for p in range(cfg.partitions)], 10)
    finally:
        w.close()
    assert failed and seen[:2] == [3, 3], seen            # read twice: refused once, then delivered
    assert sum(tp.offset for tp in committed if tp.offset >= 0) == 3
    assert w.metrics.kafka_errors._value.get() == 1


def _step_until(worker: ExtractorWorker, done, within_s: float = 120.0) -> None:
    """Turn the worker's loop until ``done()`` (a bound for a stuck run, not a timing)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and not done():
        worker.step(timeout=0.5)


def test_a_member_that_leaves_with_lines_held_loses_none_of_them(stream_cfg):
    """Lines wait for their workload's start (a new member's timeline is still catching up, or the
    scheduler connector polls): the commit stays below them, so when the member leaves its
    successor reads them again and, once the start is known, delivers their events."""
    cfg = stream_cfg.model_copy(update={"hold_s": 3600})
    kafka.ensure_topics(cfg)
    prod = kafka.producer(cfg)
    xid = ("Nov  2 10:03:11 node-05 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, "
           "GPU has fallen off the bus.")
    lines = [RawLine(host="node-05", path="logs/app/node-05.log", line=n, text=t, workload_id="held-1")
             for n, t in enumerate(["noise before", xid, "noise after"], 1)]
    for rec in lines:
        prod.produce(cfg.topic("raw"), key=b"node-05", value=encode(rec))
    prod.flush(10)
    first = ExtractorWorker(cfg)
    try:
        _step_until(first, lambda: first.core.counters.records >= 3)
        assert len(first.core.held) == 1 and first.core.held[0].at is not None
        part, off = first.core.held[0].at
        committed = first.consumer.committed([TopicPartition(cfg.topic("raw"), part)], 10)
    finally:
        first.close()                                      # leaves, the held line in its memory
    assert committed[0].offset == off                      # the commit waits at the held line
    wl = WorkloadRecord.model_validate({"workload_id": "held-1", "state": "RUNNING", "nodes": ["node-05"],
                                        "start_time": "2026-11-02T10:00:00Z"})
    prod.produce(cfg.topic("scheduler"), key=b"held-1",
                 value=encode(SchedulerEvent(type="start", workload=wl, ts=wl.start_time)))
    prod.flush(10)
    second = ExtractorWorker(cfg)
    try:
        _step_until(second, lambda: second.core.counters.events >= 1)
    finally:
        second.close()

    def mine(records):
        return [b for b in map(decode_batch, (m.value() for m in records)) if b.workload_id == "held-1" and b.events]

    got = mine(_drain(cfg, cfg.topic("events"), lambda records: bool(mine(records)), timeout=20))
    (batch,) = got
    assert [(e.kind, e.ref.line) for e in batch.events] == [("xid", 2)]
    assert batch.lines == [[0, 2, 2]]


def test_a_successor_reads_the_lines_before_the_committed_offset_as_context_only(stream_cfg):
    """A member dies at a committed offset in the middle of an application log; the member that takes
    the partition over re-reads what was before that offset for context (stamps inherited from the
    lines above) and extracts only what follows: together they deliver the events one reader would,
    and the commit never goes back."""
    from firstfault.connectors.shipper import bundle_records, start_record
    from firstfault.streams.extractor import ExtractorCore

    sample = next(p for p in sample_dirs() if p.name == "worked-example")
    wl, records = bundle_records(sample)
    recs = [r for _, r in records]
    k = 200                                                # inside node-01's application log
    cfg = stream_cfg
    kafka.ensure_topics(cfg)
    prod = kafka.producer(cfg)
    start = SchedulerEvent(type="start", workload=start_record(wl), ts=wl.start_time)
    prod.produce(cfg.topic("scheduler"), key=wl.workload_id.encode(), value=encode(start))
    raw = cfg.topic("raw")

    def produce(part):
        for rec in part:
            prod.produce(raw, key=(rec.host or "").encode(), value=encode(rec), partition=0)
        assert prod.flush(10) == 0

    produce(recs[:k])
    first = ExtractorWorker(cfg)
    try:
        _step_until(first, lambda: first.core.counters.records >= k)
    finally:
        first.close()
    produce(recs[k:])
    second = ExtractorWorker(cfg)
    try:
        _step_until(second, lambda: second.core.counters.records >= len(recs) - k)
        assert second.core.counters.records == len(recs) - k          # the context is not extracted again
        committed = second.consumer.committed([TopicPartition(raw, 0)], 10)[0].offset
    finally:
        second.close()
    assert committed == len(recs)

    one = ExtractorCore(cfg, load_catalog())
    one.timeline.apply(start)
    want = EventSet()
    for b in one.handle([(r, 0) for r in recs]).values():
        want.update(Ev.from_schema(e) for e in b.events)

    def merged(msgs) -> list:
        got = EventSet()
        for m in msgs:
            got.update(Ev.from_schema(e) for e in decode_batch(m.value()).events)
        return [e.to_schema() for e in got.sorted()]

    expected = [e.to_schema() for e in want.sorted()]
    n_lines = sum(e.count for e in want.sorted())
    # Read until the events carry as many lines as one reader's (more would be a duplicate), then compare.
    msgs = _drain(cfg, cfg.topic("events"), lambda msgs: sum(e.count for e in map(Ev.from_schema, (
        x for m in msgs for x in decode_batch(m.value()).events))) >= n_lines, timeout=60)
    assert merged(msgs) == expected
