"""A batch read twice adds nothing (issue 26, part 2): the line ledger and the merge it guards.

Every way the stream re-reads raw lines (a batch re-read after a failed commit, a new owner
re-extracting from the last commit after a rebalance, cut into other batches, a shipper that
sends a line twice) must merge to the state one clean pass gives, counts included.
"""
from __future__ import annotations

import random
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings, strategies as st

from firstfault.connectors.shipper import bundle_records, start_record
from firstfault.rules.catalog import load_catalog
from firstfault.rules.engine import analyze_path
from firstfault.schemas import SchedulerEvent
from firstfault.streams.config import StreamConfig
from firstfault.schemas.avro import decode
from firstfault.streams.extractor import ExtractorCore, _merge, encode_batch, line_runs
from firstfault.streams.line_ledger import claim
from firstfault.streams.workload_state import apply_scheduler, diagnose_state, merge_batch, new_state

from conftest import SAMPLES

T0 = datetime(2026, 12, 6, tzinfo=timezone.utc)


# ---------------------------------------------------------------- the ledger

@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 60), st.integers(0, 8)), max_size=40))
def test_claim_counts_each_line_once_and_keeps_runs_sorted_disjoint(spans):
    runs: list[int] = []
    have: set[int] = set()
    for first, width in spans:
        want = set(range(first, first + width + 1))
        assert claim(runs, first, first + width) == len(want - have)
        have |= want
        pairs = list(zip(runs[::2], runs[1::2]))
        assert all(a <= b for a, b in pairs)
        assert all(b + 1 < c for (_, b), (c, _) in zip(pairs, pairs[1:]))     # sorted, apart, merged
        assert {n for a, b in pairs for n in range(a, b + 1)} == have


def test_line_runs_are_consecutive_lines_per_file():
    files: dict[str, int] = {}
    assert line_runs([("a", 3), ("a", 4), ("b", 1), ("a", 6), ("a", 4)], files) == [0, 3, 4, 0, 6, 6, 1, 1, 1]
    assert files == {"a": 0, "b": 1} and line_runs([], files) == []


# ---------------------------------------------------------------- re-reads merge to one pass

def _pass(wl, records, cut: int, start_at: int = 0):
    """What one extractor makes of records[start_at:] in batches of ``cut``: a new owner starts at its
    commit with nothing in memory."""
    core = ExtractorCore(StreamConfig(hold_s=3600), load_catalog())
    core.timeline.apply(SchedulerEvent(type="start", workload=start_record(wl), ts=wl.start_time))
    ts = int(wl.start_time.timestamp() * 1000)
    out = []
    for i in range(start_at, len(records), cut):
        out += core.handle([(r, ts) for _, r in records[i:i + cut]]).values()
    core.timeline.apply(SchedulerEvent(type="end", workload=wl, ts=wl.end_time or wl.start_time))
    out += core.retry_held()[0].values()
    return out


def _state(wl, batches):
    catalog = load_catalog()
    st_ = new_state(wl.workload_id, wl.attempt, T0)
    apply_scheduler(st_, SchedulerEvent(type="start", workload=start_record(wl), ts=wl.start_time), T0)
    for b in batches:
        merge_batch(st_, b, catalog)          # no offsets: every batch is a new record to the topic
    apply_scheduler(st_, SchedulerEvent(type="end", workload=wl, ts=wl.end_time or wl.start_time), T0)
    return st_


@pytest.mark.parametrize("name", ["worked-example", "gpu-fell-off-bus-32node", "host-oom-killer", "hang-until-timeout"])
def test_batches_read_again_and_cut_otherwise_merge_to_one_pass(name):
    wl, records = bundle_records(SAMPLES / name)
    rng = random.Random(name)
    once = _pass(wl, records, 700)
    counts = {k: e.count for k, e in _state(wl, once).events.items()}
    assert max(counts.values()) > 1                                   # counts that a double merge would change
    for _ in range(3):
        again = _pass(wl, records, rng.randint(50, 900), start_at=rng.randrange(len(records)))
        mixed = once + again
        rng.shuffle(mixed)
        got = _state(wl, mixed)
        assert {k: e.count for k, e in got.events.items()} == counts
        assert diagnose_state(got, load_catalog()).to_json() == analyze_path(SAMPLES / name).diagnosis.to_json()


def test_a_batch_without_lines_counts_as_delivered():
    """What an older extractor wrote (no lines): merged as before, counts add."""
    wl, records = bundle_records(SAMPLES / "host-oom-killer")
    once = _pass(wl, records, 700)
    bare = [b.model_copy(update={"lines": [], "line_files": []}) for b in once]
    single = sum(e.count for e in _state(wl, bare).events.values())
    assert sum(e.count for e in _state(wl, bare + bare).events.values()) == 2 * single
    assert sum(e.count for e in _state(wl, once + once).events.values()) == single


def test_a_batch_split_to_fit_the_topic_counts_each_event_by_its_own_lines():
    """An EventBatch over the record limit goes out in parts (a cascade's batch under a burst); each
    part carries its own events' lines, so the parts, delivered once or twice, count as the whole."""
    wl, records = bundle_records(SAMPLES / "gpu-fell-off-bus-32node")
    whole = _pass(wl, records, 5000)
    counts = {k: e.count for k, e in _state(wl, whole).events.items()}
    parts = []
    for batch in whole:
        failures: list = []
        parts += [decode(v) for v in encode_batch(batch, failures, limit=6000)]
        assert failures == []
    assert len(parts) > 2 * len(whole)
    assert all(len(p.lines) in (0, len(p.events)) for p in parts)
    for delivered in (parts, parts + parts[::-1]):
        got = _state(wl, delivered)
        assert {k: e.count for k, e in got.events.items()} == counts
    assert diagnose_state(got, load_catalog()).to_json() == analyze_path(SAMPLES / "gpu-fell-off-bus-32node").diagnosis.to_json()


def test_an_event_the_topic_cannot_carry_leaves_the_others_with_their_own_lines():
    wl, records = bundle_records(SAMPLES / "worked-example")
    batch = max(_pass(wl, records, 5000), key=lambda b: len(b.events))
    bad = 1
    events = list(batch.events)
    events[bad] = events[bad].model_copy(update={"count": 2 ** 70})     # past an Avro long
    failures: list = []
    sent = [decode(v) for v in encode_batch(batch.model_copy(update={"events": events}), failures)]
    assert [f.step for f in failures] == ["encode"] and failures[0].ref == events[bad].ref.key()
    assert [e.signature for p in sent for e in p.events] == [e.signature for i, e in enumerate(events) if i != bad]
    assert [r for p in sent for r in p.lines] == [r for i, r in enumerate(batch.lines) if i != bad]


def test_batches_joined_for_one_publish_keep_each_events_lines():
    """A batch that fails as a whole is extracted record by record and the results joined (the
    worker's fallback): the joined batch names each event's own lines, delivered once or twice."""
    wl, records = bundle_records(SAMPLES / "worked-example")
    counts = {k: e.count for k, e in _state(wl, _pass(wl, records, 700)).events.items()}
    core = ExtractorCore(StreamConfig(hold_s=3600), load_catalog())
    core.timeline.apply(SchedulerEvent(type="start", workload=start_record(wl), ts=wl.start_time))
    ts = int(wl.start_time.timestamp() * 1000)
    joined: dict = {}
    for _, rec in records:
        for key, batch in core.handle([(rec, ts)]).items():
            joined[key] = _merge(joined.get(key), batch)
    sent = [decode(v) for b in joined.values() for v in encode_batch(b, [])]
    assert len(sent) == 1 and len(sent[0].lines) == len(sent[0].events) > 1
    assert {k: e.count for k, e in _state(wl, sent + sent).events.items()} == counts


def test_files_credited_by_a_batch_that_was_not_delivered_are_credited_again_when_it_is_read_again():
    """The worker reads a batch again when some of its output did not reach the broker: the evidence
    inventory (which files hold lines) must come out again with it, not only the events."""
    wl, records = bundle_records(SAMPLES / "worked-example")
    core = ExtractorCore(StreamConfig(hold_s=3600), load_catalog())
    core.timeline.apply(SchedulerEvent(type="start", workload=start_record(wl), ts=wl.start_time))
    ts = int(wl.start_time.timestamp() * 1000)
    batch = [(r, ts) for _, r in records]

    def credited(batches) -> set[str]:
        return {p for b in batches.values() for p in b.paths}

    paths = credited(core.handle(batch))
    assert len(paths) > 1
    core.outputs_lost()
    assert credited(core.handle(batch)) == paths
    core.outputs_delivered()
    assert credited(core.handle(batch)) == set()         # delivered: sent once


def test_held_lines_and_a_start_replay_whose_batches_were_lost_are_made_again():
    """Lines read before their workload's start wait (held), and a start replays a host's recent lines;
    the batches those make are not a raw batch the worker can read again. If their delivery fails they
    are made again, and merged with what did arrive they count once."""
    wl, records = bundle_records(SAMPLES / "gpu-fell-off-bus-32node")
    once = _pass(wl, records, 700)
    counts = {k: e.count for k, e in _state(wl, once).events.items()}
    core = ExtractorCore(StreamConfig(hold_s=3600), load_catalog())
    ts = int(wl.start_time.timestamp() * 1000)
    assert core.handle([(r, ts) for _, r in records]) == {}           # nothing routed yet
    assert core.held
    alloc = core.timeline.apply(SchedulerEvent(type="start", workload=start_record(wl), ts=wl.start_time))
    first = list(core.started(alloc).values()) + list(core.retry_held()[0].values())
    assert first and not core.held and core.unconfirmed()
    core.outputs_lost()                                                # none of them reached the broker
    assert core.held and core.has_waiting()
    again = list(core.retry_held()[0].values())
    core.timeline.apply(SchedulerEvent(type="end", workload=wl, ts=wl.end_time or wl.start_time))
    again += core.retry_held()[0].values()
    core.outputs_delivered()
    assert not core.unconfirmed() and not core.has_waiting() and core.retry_held()[0] == {}
    for delivered in (again, first + again):
        got = _state(wl, delivered)
        assert {k: e.count for k, e in got.events.items()} == counts
    assert diagnose_state(got, load_catalog()).to_json() == analyze_path(SAMPLES / "gpu-fell-off-bus-32node").diagnosis.to_json()
