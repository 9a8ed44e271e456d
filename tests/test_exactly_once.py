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
from firstfault.streams.extractor import ExtractorCore, line_runs
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
