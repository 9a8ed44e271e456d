"""The extractor's routing and aggregation, without Kafka: parity with the offline path.

These run the same ExtractorCore the Kafka worker runs, on the records the shipper
would send; the Kafka wiring itself is covered by the integration tests.
"""
import random

import pytest

from firstfault.connectors.shipper import bundle_records
from firstfault.rules.catalog import load_catalog
from firstfault.rules.diagnose import diagnose
from firstfault.rules.engine import analyze_path, inventory_from_paths
from firstfault.rules.model import Ev, EventSet
from firstfault.schemas import SchedulerEvent
from firstfault.streams.config import StreamConfig
from firstfault.streams.extractor import ExtractorCore
from firstfault.connectors.shipper import start_record

from conftest import sample_dirs


def _stream(sample, seed, start_first=True):
    wl, records = bundle_records(sample)
    core = ExtractorCore(StreamConfig(hold_s=3600), load_catalog())
    rng = random.Random(seed)
    by_file: dict[str, list] = {}
    for _, rec in records:
        by_file.setdefault(rec.path, []).append(rec)
    queues = list(by_file.values())
    mixed = []
    while queues:                                  # per-file order kept, files interleaved at random
        q = rng.choice(queues)
        mixed.append(q.pop(0))
        if not q:
            queues.remove(q)
    events, paths = EventSet(), set()

    def take(batches):
        for b in batches.values():
            events.update(Ev.from_schema(e) for e in b.events)
            paths.update(b.paths)

    ts = int(wl.start_time.timestamp() * 1000)
    if start_first:
        core.timeline.apply(SchedulerEvent(type="start", workload=start_record(wl), ts=wl.start_time))
    size = rng.randint(100, 3000)
    for i in range(0, len(mixed), size):
        if not start_first and i >= len(mixed) // 2 and len(core.timeline) == 0:
            core.timeline.apply(SchedulerEvent(type="start", workload=start_record(wl), ts=wl.start_time))
            take(core.retry_held()[0])
        take(core.handle([(r, ts) for r in mixed[i:i + size]]))
    core.timeline.apply(SchedulerEvent(type="end", workload=wl, ts=wl.end_time or wl.start_time))
    take(core.retry_held()[0])
    return wl, events, paths


@pytest.mark.parametrize("sample", sample_dirs(), ids=lambda p: p.name)
def test_stream_extraction_matches_offline(sample):
    wl, events, paths = _stream(sample, seed=7)
    catalog = load_catalog()
    got = diagnose(wl, events.sorted(), catalog, inventory_from_paths(wl, paths))
    assert got.to_json() == analyze_path(sample).diagnosis.to_json()


def test_lines_before_the_start_event_are_held_then_routed():
    sample = next(p for p in sample_dirs() if p.name == "worked-example")
    wl, events, paths = _stream(sample, seed=3, start_first=False)
    got = diagnose(wl, events.sorted(), load_catalog(), inventory_from_paths(wl, paths))
    assert got.to_json() == analyze_path(sample).diagnosis.to_json()


def test_node_lines_before_a_late_start_reach_the_new_workload():
    """A scheduler connector polls: node-scoped lines may come before the start event, even while
    another workload on the same hosts is still open. The new workload still gets them."""
    sample = next(p for p in sample_dirs() if p.name == "worked-example")
    wl, records = bundle_records(sample)
    core = ExtractorCore(StreamConfig(hold_s=3600), load_catalog())
    # An earlier job on the same nodes, ended an hour before: its horizon still covers the lines.
    earlier = wl.model_copy(update={"workload_id": "earlier", "start_time": wl.start_time.replace(hour=6),
                                    "end_time": wl.start_time.replace(hour=9)})
    core.timeline.apply(SchedulerEvent(type="end", workload=earlier, ts=earlier.end_time))
    events, paths = EventSet(), set()

    def take(batches):
        for (wid, _), b in batches.items():
            if wid == wl.workload_id:
                events.update(Ev.from_schema(e) for e in b.events)
                paths.update(b.paths)

    syslog = [(r, 0) for _, r in records if r.workload_id is None]
    app = [(r, 0) for _, r in records if r.workload_id is not None]
    take(core.handle(syslog))                      # node lines first: no start for this job yet
    alloc = core.timeline.apply(SchedulerEvent(type="start", workload=start_record(wl), ts=wl.start_time))
    take(core.started(alloc))
    take(core.handle(app))
    core.timeline.apply(SchedulerEvent(type="end", workload=wl, ts=wl.end_time))
    take(core.retry_held()[0])
    got = diagnose(wl, events.sorted(), load_catalog(), inventory_from_paths(wl, paths))
    assert got.to_json() == analyze_path(sample).diagnosis.to_json()


def test_a_held_line_is_counted_once_when_its_start_arrives():
    sample = next(p for p in sample_dirs() if p.name == "worked-example")
    wl, records = bundle_records(sample)
    core = ExtractorCore(StreamConfig(hold_s=3600), load_catalog())
    events = EventSet()
    take = lambda bs: [events.update(Ev.from_schema(e) for e in b.events) for b in bs.values()]  # noqa: E731
    take(core.handle([(r, 0) for _, r in records if r.workload_id is None]))     # all held: no workload yet
    alloc = core.timeline.apply(SchedulerEvent(type="start", workload=start_record(wl), ts=wl.start_time))
    take(core.started(alloc))
    take(core.retry_held()[0])
    xids = [e for e in events.sorted() if e.kind == "xid" and e.fields.get("xid") == 149]
    assert len(xids) == 1 and xids[0].count == 1


@pytest.mark.parametrize("seed,start_first", [(1, True), (2, True), (3, False), (4, False)])
def test_metrics_samples_in_any_batching_match_offline(tmp_path, seed, start_first):
    """DCGM samples on the raw topic: crossings sent once, unreadable lines counted once,
    metric hosts for the inventory; batches of any size, files interleaved; samples that
    come before their workload's start event wait for it."""
    import shutil

    from firstfault.rules.engine import stream_inventory
    from test_pipeline_parity import METRICS

    sample = tmp_path / "wm"
    shutil.copytree(next(p for p in sample_dirs() if p.name == "worked-example"), sample)
    (sample / "metrics").mkdir()
    (sample / "metrics" / "dcgm.jsonl").write_text(METRICS)
    wl, records = bundle_records(sample)
    assert sum(1 for _, r in records if r.source == "metrics") == len(METRICS.splitlines())
    rng = random.Random(seed)
    by_file: dict[str, list] = {}
    for _, rec in records:
        by_file.setdefault(rec.path, []).append(rec)
    queues, mixed = list(by_file.values()), []
    while queues:
        q = rng.choice(queues)
        mixed.append(q.pop(0))
        if not q:
            queues.remove(q)
    core = ExtractorCore(StreamConfig(hold_s=3600), load_catalog())
    start = SchedulerEvent(type="start", workload=start_record(wl), ts=wl.start_time)
    if start_first:
        core.timeline.apply(start)
    events, paths, hosts = EventSet(), set(), set()

    def take(batches):
        for b in batches.values():
            events.update(Ev.from_schema(e) for e in b.events)
            paths.update(b.paths)
            hosts.update(b.metric_hosts)

    size = rng.randint(1, 4)                       # the metrics file spans several batches
    for i in range(0, len(mixed), size):
        if not start_first and i >= len(mixed) - 3 and len(core.timeline) == 0:
            core.timeline.apply(start)             # late: most samples (and lines) waited
            take(core.retry_held()[0])
        take(core.handle([(r, 0) for r in mixed[i:i + size]]))
    core.timeline.apply(SchedulerEvent(type="end", workload=wl, ts=wl.end_time))
    take(core.retry_held()[0])
    assert not core.metric_pending
    assert hosts == {"node-01", "node-02", "node-04"}
    got = diagnose(wl, events.sorted(), load_catalog(), stream_inventory(wl, paths, hosts))
    assert got.to_json() == analyze_path(sample).diagnosis.to_json()
    assert [e.count for e in events.sorted() if e.kind == "dcgm_threshold"] == [1, 1]
    assert [e.count for e in events.sorted() if e.kind == "unparsed" and e.source == "metrics"] == [2]


def test_the_core_names_what_waits_for_a_start_event_until_it_comes():
    wl, records = bundle_records(next(p for p in sample_dirs() if p.name == "worked-example"))
    core = ExtractorCore(StreamConfig(hold_s=3600), load_catalog())
    ts = int(wl.start_time.timestamp() * 1000)
    assert core.waiting_for() == set()
    core.handle([(r, ts) for _, r in records])
    waiting = core.waiting_for()
    assert wl.workload_id in waiting                   # its application lines, held
    assert waiting & set(wl.nodes)                     # its hosts' node-scoped lines, held
    core.timeline.apply(SchedulerEvent(type="start", workload=start_record(wl), ts=wl.start_time))
    core.retry_held()
    assert core.waiting_for() == set()


def _split_run(sample, k: int, context: bool) -> list:
    """The sample's lines read by one core up to ``k`` and by a successor after it (as when a member
    dies and another takes its partition over from the committed offset ``k``), given the lines
    before ``k`` as context or not: every event either delivered, merged."""
    wl, records = bundle_records(sample)
    recs = [r for _, r in records]
    ts = int(wl.start_time.timestamp() * 1000)
    events = EventSet()
    cores = []
    for _ in range(2):
        core = ExtractorCore(StreamConfig(hold_s=3600), load_catalog())
        core.timeline.apply(SchedulerEvent(type="start", workload=start_record(wl), ts=wl.start_time))
        cores.append(core)
    first, successor = cores
    for b in first.handle([(r, ts) for r in recs[:k]]).values():
        events.update(Ev.from_schema(e) for e in b.events)
    if context:
        successor.remember_context([(r, ts) for r in recs[:k]])
    for b in successor.handle([(r, ts) for r in recs[k:]]).values():
        events.update(Ev.from_schema(e) for e in b.events)
    return [e.to_schema() for e in events.sorted()]


@pytest.mark.parametrize("sample", sample_dirs(), ids=lambda p: p.name)
def test_a_successor_given_the_lines_before_its_offset_extracts_what_one_reader_would(sample):
    whole = _split_run(sample, 0, context=False)
    n = len(bundle_records(sample)[1])
    for k in range(1, n, max(1, n // 25)):
        assert _split_run(sample, k, context=True) == whole, k


def test_without_the_lines_before_its_offset_a_successor_makes_other_events():
    sample = next(p for p in sample_dirs() if p.name == "worked-example")
    # Line 200 of the bundle is inside node-01's application log: what follows inherits from above it.
    assert _split_run(sample, 200, context=False) != _split_run(sample, 0, context=False)


def test_a_newer_record_keeps_what_a_file_said_of_its_next_lines(tmp_path):
    """The end event replaces the workload's record, and the extractor is made again for its hosts;
    srun's task exit above still scopes the lines below it (torn_down_by), as offline."""
    import json

    bundle = tmp_path / "b"
    (bundle / "logs" / "app").mkdir(parents=True)
    (bundle / "workload.json").write_text(json.dumps({
        "workload_id": "slurm-77", "state": "FAILED", "start_time": "2026-11-02T10:00:00Z",
        "end_time": "2026-11-02T10:20:00Z", "nodes": ["node-01"], "gpus_per_node": 8}))
    (bundle / "logs" / "app" / "node-01.log").write_text(
        "srun: error: node-01: task 0: Exited with exit code 1\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n")
    wl, records = bundle_records(bundle)
    recs = [rec for _, rec in records]
    core = ExtractorCore(StreamConfig(hold_s=3600), load_catalog())
    ts = int(wl.start_time.timestamp() * 1000)
    core.timeline.apply(SchedulerEvent(type="start", workload=start_record(wl), ts=wl.start_time))
    core.handle([(recs[0], ts)])
    core.timeline.apply(SchedulerEvent(type="end", workload=wl, ts=wl.end_time))
    batches = core.handle([(recs[1], ts)])
    got = [e for b in batches.values() for e in b.events if e.kind == "child_failed"]
    assert got and got[0].fields.get("torn_down_by") == "Exited with exit code 1"
    from firstfault.rules.engine import analyze_bundle
    from firstfault.rules.intake import open_input

    intake = open_input(bundle)
    kept = analyze_bundle(intake.bundle, load_catalog(), intake=intake, keep_events=True).events
    offline = [e for e in kept if e.kind == "child_failed"]
    assert offline and offline[0].fields.get("torn_down_by") == "Exited with exit code 1"
