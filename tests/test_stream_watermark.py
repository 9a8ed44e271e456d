"""The correlator finalizes only once the extractors read the raw topic up to the end (issue 10, finding 9).

Pure parts first (the progress records, the decision and its bound), then the real thing:
extractor and correlator subprocesses on the embedded broker; the extractor is stopped, a
workload ships, and past the grace no final diagnosis comes out; the extractor starts
again and the final equals ``analyze``'s.
"""
from __future__ import annotations

import json
import signal
import time
import uuid
from datetime import datetime, timedelta, timezone

from confluent_kafka import TopicPartition

from firstfault.connectors.shipper import ship
from firstfault.rules.bundle import open_bundle
from firstfault.rules.catalog import load_catalog
from firstfault.rules.engine import analyze_bundle, analyze_path
from firstfault.schemas.records import Progress
from firstfault.streams import kafka
from firstfault.streams.config import StreamConfig
from firstfault.streams.extractor import ExtractorWorker
from firstfault.streams.progress import ProgressTracker, ProgressView
from firstfault.streams.workload_state import Now, apply_scheduler, decide, merge_batch, new_state

from conftest import SAMPLES
from stream_pipeline import pipeline_cfg, read_finals, running_pipeline, start_worker

pytest_plugins = ["conftest_kafka"]
STREAM_ONLY = ("revision", "provisional")
T0 = 1_800_000_000_000


def rep(partition: int, position: int, high: int, ts_ms: int, events_end: dict | None = None,
        held: list[str] | None = None, fresh: bool = True, done: int = -1) -> Progress:
    return Progress(topic="t.raw", partition=partition, position=position, high=high, ts_ms=ts_ms, worker="x",
                    events_end=events_end or {}, held=held or [], fresh=fresh, done_ts_ms=done)


# ---------------------------------------------------------------- pure

def test_a_partition_counts_once_a_caught_up_report_is_stamped_after_the_end():
    view = ProgressView("t.raw", partitions=2)
    assert not view.seen_any and view.behind(T0, 0, 0) == [0, 1]
    view.add(rep(0, 10, 10, T0 - 1))                  # caught up, but before the end
    view.add(rep(1, 0, 0, T0 + 5))                    # idle: never held a record, caught up
    assert view.seen_any and view.behind(T0, 0, 0) == [0]
    view.add(rep(0, 10, 12, T0 + 10))                 # after the end, but two records behind
    assert view.behind(T0, 0, 0) == [0]
    view.add(rep(0, 12, 12, T0 + 20, {0: 7}))         # caught up; its EventBatches end at events offset 7
    assert view.behind(T0, 0, 6) == [0]               # the correlator merged up to 6 only
    assert view.behind(T0, 0, 7) == [] and view.behind(T0, 1, None) == []
    assert view.behind(T0 + 21, 0, 7) == [0, 1]       # a later end needs later reports
    view.add(rep(0, 5, -1, T0 + 30))                  # timeline not current: says nothing
    assert view.behind(T0 + 21, 0, 7) == [0, 1]


def test_under_a_backlog_a_partition_passes_once_a_record_after_the_end_is_read():
    """Never caught up (more keeps coming), yet read past the end: the attempt need not wait. A record
    stamped after the end record was appended after every line shipped before that end."""
    view = ProgressView("t.raw", partitions=1)
    end = T0 - 2_000                                  # the end record's time (+ margin); seen at T0
    view.add(rep(0, 300, 800, T0 + 1, {0: 3}, fresh=False, done=end - 5_000))
    assert view.behind(T0, 0, 10, end_ms=end) == [0]
    view.add(rep(0, 790, 1500, T0 + 9, {0: 6}, fresh=False, done=end - 10))
    assert view.behind(T0, 0, 10, end_ms=end) == [0]
    view.add(rep(0, 820, 2100, T0 + 14, {0: 8}, fresh=False, done=end + 30))   # a record after the end
    assert view.behind(T0, 0, 7, end_ms=end) == [0]   # ... once the batches that report counts on are merged
    assert view.behind(T0, 0, 8, end_ms=end) == []
    assert view.behind(T0 + 10, 0, 8, end_ms=end + 100) == [0]                 # a later end: not yet
    # Reports arriving out of stamp order (two owners' clocks) give the same answer.
    again = ProgressView("t.raw", partitions=1)
    for r in reversed([rep(0, 300, 800, T0 + 1, {0: 3}, fresh=False, done=end - 5_000),
                       rep(0, 820, 2100, T0 + 14, {0: 8}, fresh=False, done=end + 30)]):
        again.add(r)
    assert again.behind(T0, 0, 8, end_ms=end) == [] and again.behind(T0, 0, 8, end_ms=end + 31) == [0]


def test_a_high_watermark_from_a_backlog_proves_nothing():
    """Working through a backlog the consumer stops fetching: its cached high can be seconds old, so
    position >= high then does not say the lines shipped before the end were read (800 workloads at
    once published finals on partial evidence that way)."""
    view = ProgressView("t.raw", partitions=1)
    view.add(rep(0, 500, 500, T0 + 3, {0: 4}, fresh=False, done=T0 - 9_000))
    assert view.behind(T0, 0, 9, end_ms=T0 - 1_000) == [0]
    view.add(rep(0, 900, 900, T0 + 6, {0: 5}, fresh=True, done=T0 - 1_500))    # drained: that high is recent
    assert view.behind(T0, 0, 9, end_ms=T0 - 1_000) == []
    assert view.behind(T0 + 7, 0, 9, end_ms=T0 - 1_000) == [0]                 # stamped before the end was seen


def test_an_attempt_whose_lines_wait_unrouted_is_not_complete_whatever_the_position():
    """Under steady scheduler traffic the extractor's timeline is rarely read to its very end; reports
    name the attempts and hosts whose lines wait for a start event instead, and only those wait."""
    view = ProgressView("t.raw", partitions=1)
    view.add(rep(0, 50, 50, T0 + 1, held=["slurm-9", "node-07"]))
    mine, other = frozenset({"slurm-9", "node-01"}), frozenset({"slurm-3", "node-02"})
    assert view.behind(T0, 0, 0, mine) == [0] and view.behind(T0, 0, 0, other) == []
    assert view.behind(T0, 0, 0, frozenset({"slurm-4", "node-07"})) == [0]      # a host of the attempt
    view.add(rep(0, 70, 70, T0 + 2, held=["node-07"]))                          # slurm-9's start came
    assert view.behind(T0, 0, 0, mine) == []


def test_the_extractor_side_reports_committed_positions_and_delivered_events():
    tr = ProgressTracker("t.raw", "t.events", "w1")
    tr.assigned([0, 1])
    assert tr.unknown() == [0, 1] and tr.reports({}, T0) == []
    tr.start_at(0, 5)
    tr.start_at(1, -1001)                             # nothing committed: from the low watermark (0)
    tr.committed({0: 9})
    tr.delivered("t.events", 1, 41)
    tr.delivered("t.node-history", 0, 99)
    reports = {r.partition: r for r in tr.reports({0: 9, 1: 3}, T0)}
    assert (reports[0].position, reports[0].caught_up, reports[1].caught_up) == (9, True, False)
    assert reports[0].events_end == {1: 42}
    tr.revoked([1])
    assert [r.partition for r in tr.reports({0: 9}, T0)] == [0]


def _ended_state(cfg: StreamConfig, end_seen: datetime, sample: str = "cuda-oom-one-rank"):
    bundle = open_bundle(SAMPLES / sample)
    wl = bundle.workload
    st = new_state(wl.workload_id, wl.attempt, end_seen, partition=0)
    from firstfault.schemas import EventBatch, SchedulerEvent

    apply_scheduler(st, SchedulerEvent(type="start", workload=wl.model_copy(update={"end_time": None}),
                                       ts=wl.start_time), end_seen)
    events = [e.to_schema() for e in analyze_bundle(bundle, load_catalog(), keep_events=True).events]
    merge_batch(st, EventBatch(workload_id=wl.workload_id, events=events, paths=[f.path for f in bundle.files]),
                load_catalog(), 0, end_seen)
    apply_scheduler(st, SchedulerEvent(type="end", workload=wl, ts=wl.end_time), end_seen)
    return st


def test_past_the_wait_a_provisional_says_what_is_missing_and_the_final_waits_for_the_evidence():
    cfg = StreamConfig(grace_s=3600, grace_cap_s=1, watermark_wait_s=30, lateness_s=600)
    seen = datetime(2026, 11, 4, 15, 0, tzinfo=timezone.utc)
    catalog = load_catalog()
    st = _ended_state(cfg, seen)
    behind = lambda s: [1]                                           # noqa: E731 - partition 1 is behind
    at = lambda s: Now(wall=seen + timedelta(seconds=s), behind=behind)   # noqa: E731
    assert decide(st, catalog, at(5), cfg) == []
    assert decide(st, catalog, at(29), cfg) == []
    (prov,) = decide(st, catalog, at(30), cfg)
    assert prov.provisional and prov.revision == 0 and st.published is None
    note = [m for m in prov.missing_evidence if m.kind == "stream"]
    assert len(note) == 1 and "raw partition(s) 1" in note[0].detail
    assert decide(st, catalog, at(31), cfg) == []                   # said once; nothing new came
    # Caught up later: the final, with nothing said about the stream.
    (final,) = decide(st, catalog, Now(wall=seen + timedelta(seconds=90), behind=lambda s: []), cfg)
    assert not final.provisional and final.revision == 0
    assert not [m for m in final.missing_evidence if m.kind == "stream"]
    # Never caught up: at the lateness horizon a final that says so.
    st = _ended_state(cfg, seen)
    assert decide(st, catalog, at(30), cfg)[0].provisional
    assert decide(st, catalog, at(599), cfg) == []
    (last,) = decide(st, catalog, at(600), cfg)
    assert not last.provisional and [m for m in last.missing_evidence if m.kind == "stream"]


def test_no_drain_or_exclusion_on_evidence_known_to_be_incomplete():
    """A fault whose final drains a node: the provisional past the wait and the last-resort final
    hold the drain back and name it; the final on complete evidence drains."""
    cfg = StreamConfig(grace_s=3600, grace_cap_s=1, watermark_wait_s=30, lateness_s=600)
    seen = datetime(2026, 11, 4, 15, 0, tzinfo=timezone.utc)
    catalog = load_catalog()
    behind = lambda s: [0, 2]                                        # noqa: E731
    st = _ended_state(cfg, seen, "gpu-fell-off-bus-32node")
    (prov,) = decide(st, catalog, Now(wall=seen + timedelta(seconds=30), behind=behind), cfg)
    assert prov.recovery.action == "none" and prov.recovery.nodes == []
    assert "held back" in prov.recovery.reason and "drain_nodes" in prov.recovery.reason
    (last,) = decide(st, catalog, Now(wall=seen + timedelta(seconds=600), behind=behind), cfg)
    assert not last.provisional and last.recovery.action == "none"
    st = _ended_state(cfg, seen, "gpu-fell-off-bus-32node")
    (final,) = decide(st, catalog, Now(wall=seen + timedelta(seconds=2), behind=lambda s: []), cfg)
    assert final.recovery.action == "drain_nodes" and final.recovery.nodes
    # Caught up: final at the grace, nothing said; no extractor known (behind None): as before.
    for b in (lambda s: [], None):
        st = _ended_state(cfg, seen)
        (d,) = decide(st, catalog, Now(wall=seen + timedelta(seconds=2), behind=b), cfg)
        assert not [m for m in d.missing_evidence if m.kind == "stream"]
    off = cfg.model_copy(update={"watermark_wait_s": 0})             # 0: the gate is off
    assert decide(_ended_state(off, seen), catalog, Now(wall=seen + timedelta(seconds=2), behind=behind), off)


# ---------------------------------------------------------------- the extractor's reports, real broker

def test_an_idle_partition_is_reported_caught_up_and_a_busy_one_once_read(stream_cfg):
    cfg = stream_cfg
    kafka.ensure_topics(cfg)
    prod = kafka.producer(cfg)
    for i in range(3):
        prod.produce(cfg.topic("raw"), key=b"n1", value=b"plain line %d" % i, partition=0,
                     headers=[("host", b"n1")])
    assert prod.flush(10) == 0
    w = ExtractorWorker(cfg)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and w.core.counters.records < 3:
            w.step(timeout=0.3)
        time.sleep(1.1)
        w.step(timeout=0.3)                          # a report after the batch committed
        w.producer.flush(5)
    finally:
        w.close()
    c = kafka.consumer(cfg, group=f"{cfg.prefix}p-{uuid.uuid4().hex[:6]}")
    c.assign([TopicPartition(cfg.topic("progress"), p, 0) for p in range(cfg.partitions)])
    latest: dict[int, Progress] = {}
    try:
        end = time.monotonic() + 10
        while time.monotonic() < end and not (latest.get(0) and latest[0].position == 3 and 1 in latest):
            for m in c.consume(100, 0.5):
                if m.error() is None:
                    r = Progress.model_validate_json(m.value())
                    latest[r.partition] = r
                    assert m.key() == f"{cfg.topic('raw')}/{r.partition}".encode()
    finally:
        c.close()
    assert (latest[0].position, latest[0].high, latest[0].caught_up) == (3, 3, True)
    assert (latest[1].position, latest[1].high, latest[1].caught_up) == (0, 0, True)


# ---------------------------------------------------------------- the whole pipeline

def test_no_final_while_the_extractor_is_down_then_the_right_one(kafka_bootstrap, tmp_path):
    cfg = pipeline_cfg(kafka_bootstrap, f"wm-{uuid.uuid4().hex[:8]}").model_copy(
        update={"grace_cap_s": 2.0, "watermark_wait_s": 300.0})
    sample = SAMPLES / "host-oom-killer"
    wid = json.loads((sample / "workload.json").read_text())["workload_id"]
    procs: list = []
    with running_pipeline(cfg, tmp_path, procs):
        extractor = procs[0]
        extractor.send_signal(signal.SIGTERM)                      # stopped (a crash loop looks the same)
        extractor.wait(20)
        shipped = time.monotonic()
        ship(sample, cfg)
        # Well past the grace cap: the old correlator published revision 0 by now, without the evidence.
        early = read_finals(cfg, lambda out: wid in out, timeout=max(1.0, cfg.grace_cap_s + 6 - (time.monotonic() - shipped)))
        assert wid not in early, "a final diagnosis while the extractor had not read the raw topic"
        procs.append(start_worker(cfg, tmp_path, "extractor", "extractor-2"))
        got = read_finals(cfg, lambda out: wid in out, timeout=90)
        assert wid in got, (tmp_path / "correlator.log").read_text(errors="replace")[-3000:]
        final = got[wid][0]
        assert final.revision == 0
        assert {k: v for k, v in final.to_dict().items() if k not in STREAM_ONLY} == \
            json.loads(analyze_path(sample).diagnosis.to_json())
