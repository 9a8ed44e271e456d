"""The correlator's pure state logic on real sample events: parity with the offline path,
grace and lateness on both clocks, revisions only on a changed result, provisional
diagnoses for running workloads, redelivery and the outbox."""
from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone
from functools import lru_cache

import pytest

from firstfault.rules.bundle import open_bundle
from firstfault.rules.catalog import load_catalog
from firstfault.rules.engine import analyze_bundle, analyze_path
from firstfault.schemas import Diagnosis, Event, EventBatch, SchedulerEvent, WorkloadRecord
from firstfault.streams.config import StreamConfig
from firstfault.streams.workload_state import (
    Now, WorkloadState, apply_scheduler, decide, diagnose_state, due_for_final, expired, merge_batch, new_state,
    next_wake, past_lateness, result_hash, settle, state_json, strong_root_signatures,
)

from conftest import SAMPLES, sample_dirs

CFG = StreamConfig(grace_s=30, grace_cap_s=10, lateness_s=3600, hold_s=300)
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)        # the wall clock of these tests


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


@lru_cache(maxsize=None)
def sample(name: str) -> tuple[WorkloadRecord, tuple[Event, ...], tuple[str, ...], Diagnosis]:
    """(end record, extracted events, contributing paths, offline diagnosis) of a sample bundle."""
    bundle = open_bundle(SAMPLES / name)
    events = tuple(e.to_schema() for e in analyze_bundle(bundle, load_catalog(), keep_events=True).events)
    paths = tuple(f.path for f in bundle.files if f.size)
    return bundle.workload, events, paths, analyze_path(SAMPLES / name).diagnosis


def start_of(wl: WorkloadRecord) -> WorkloadRecord:
    return wl.model_copy(update={"state": "RUNNING", "end_time": None, "exit_code": None})


def sched(kind: str, wl: WorkloadRecord) -> SchedulerEvent:
    rec = start_of(wl) if kind == "start" else wl
    return SchedulerEvent(type=kind, workload=rec, ts=wl.start_time if kind == "start" else wl.end_time)


def split_batches(wl: WorkloadRecord, events, paths, rng: random.Random, n: int) -> list[EventBatch]:
    """Spread the events over n batches in random order; some repeated signatures split across batches."""
    parts: list[list[Event]] = [[] for _ in range(n)]
    for ev in events:
        if ev.count > 1 and rng.random() < 0.5:
            k = rng.randint(1, ev.count - 1)
            later = ev.last_stamp or ev.stamp
            # The later occurrences of the same signature, as another input batch would report them.
            tail = ev.model_copy(update={"count": ev.count - k, "stamp": later, "last_stamp": later, "onset": None,
                                         "ranks": ev.ranks[: len(ev.ranks) // 2]})
            parts[rng.randrange(n)].append(ev.model_copy(update={"count": k}))
            parts[rng.randrange(n)].append(tail)
        else:
            parts[rng.randrange(n)].append(ev)
    path_parts: list[list[str]] = [[] for _ in range(n)]
    for p in paths:
        path_parts[rng.randrange(n)].append(p)
    batches = [EventBatch(workload_id=wl.workload_id, attempt=wl.attempt, events=evs, paths=ps)
               for evs, ps in zip(parts, path_parts)]
    rng.shuffle(batches)
    return batches


def bare(d: Diagnosis) -> str:
    return d.model_copy(update={"revision": None, "provisional": None}).to_json()


def ended_state(name: str, catalog, evs=None) -> tuple[WorkloadState, WorkloadRecord]:
    wl, events, paths, _ = sample(name)
    st = new_state(wl.workload_id, wl.attempt, T0)
    apply_scheduler(st, sched("start", wl), T0)
    merge_batch(st, EventBatch(workload_id=wl.workload_id, events=list(events if evs is None else evs),
                               paths=list(paths)), catalog)
    apply_scheduler(st, sched("end", wl), T0)
    return st, wl


# ---------------------------------------------------------------- parity

@pytest.mark.parametrize("bundle", [p.name for p in sample_dirs()])
def test_final_equals_offline_whatever_the_batching(bundle, catalog):
    wl, events, paths, expected = sample(bundle)
    for seed in range(2):
        rng = random.Random(seed)
        batches = split_batches(wl, events, paths, rng, rng.randint(2, 6))
        st = new_state(wl.workload_id, wl.attempt, T0)
        inputs: list = [("batch", b) for b in batches]
        # the start anywhere among the batches (the extractor holds lines, but batches may overtake it)
        inputs.insert(rng.randrange(len(inputs) + 1), ("start", sched("start", wl)))
        for i, (kind, item) in enumerate(inputs):
            if kind == "start":
                apply_scheduler(st, item, T0, seq=0)
            else:
                assert merge_batch(st, item, catalog, seq=i)
            decide(st, catalog, Now(T0), CFG)
        st.pending.clear()                                # provisional ones are not under test here
        apply_scheduler(st, sched("end", wl), T0, seq=1)
        assert decide(st, catalog, Now(T0 + timedelta(seconds=5), wl.end_time), CFG) == []   # in the grace
        # the state survives its JSON form (the table's changelog) unchanged
        st = WorkloadState.model_validate_json(st.model_dump_json())
        (final,) = decide(st, catalog, Now(T0 + timedelta(seconds=CFG.grace_cap_s)), CFG)
        assert (final.revision, final.provisional) == (0, False)
        assert bare(final) == expected.to_json()
        assert len(st.events) <= len(events)              # one entry per signature, never per line


# ---------------------------------------------------------------- clocks

def test_grace_on_stream_time_with_a_wall_clock_cap(catalog):
    st, wl = ended_state("host-oom-killer", catalog)
    end = wl.end_time
    assert not due_for_final(st, end + timedelta(seconds=29), T0 + timedelta(seconds=9), CFG)
    assert due_for_final(st, end + timedelta(seconds=30), T0, CFG)                 # event time
    assert due_for_final(st, None, T0 + timedelta(seconds=10), CFG)                # processing-time cap
    wake = next_wake(st, CFG)
    assert (wake.stream, wake.wall) == (end + timedelta(seconds=30), T0 + timedelta(seconds=10))
    assert not wake.due(Now(T0 + timedelta(seconds=9), end + timedelta(seconds=29)))
    assert wake.due(Now(T0, end + timedelta(seconds=30)))


def test_grace_counts_from_a_late_shipped_end_record(catalog):
    """An end record produced long after end_time (a replay): the grace runs on its own timestamp."""
    wl, events, paths, _ = sample("host-oom-killer")
    st = new_state(wl.workload_id, wl.attempt, T0)
    shipped = wl.end_time + timedelta(days=30)
    apply_scheduler(st, sched("end", wl), T0, record_ts=shipped)
    assert not due_for_final(st, shipped + timedelta(seconds=1), T0, CFG)
    assert due_for_final(st, shipped + timedelta(seconds=30), T0, CFG)


def test_nothing_is_due_before_the_end(catalog):
    wl, events, paths, _ = sample("host-oom-killer")
    st = new_state(wl.workload_id, wl.attempt, T0)
    apply_scheduler(st, sched("start", wl), T0)
    assert next_wake(st, CFG) is None
    assert not due_for_final(st, wl.start_time + timedelta(days=1), T0 + timedelta(days=1), CFG)


# ---------------------------------------------------------------- revisions and lateness

def test_revision_only_when_the_result_changes(catalog):
    wl, events, paths, expected = sample("host-oom-killer")
    roots = strong_root_signatures(list(events), catalog)
    assert roots                                          # the OOM kills
    # ... and the rest of each OOM report: an invocation alone is weak host_oom evidence of its own
    roots |= {e.signature for e in events if e.kind == "oom_invoked"}
    early = [e for e in events if e.signature not in roots]
    late = [e for e in events if e.signature in roots]
    st, _ = ended_state("host-oom-killer", catalog, evs=early)
    (final,) = decide(st, catalog, Now(T0 + timedelta(seconds=10)), CFG)
    assert final.revision == 0 and final.status != "attributed"

    now = Now(T0 + timedelta(seconds=60))
    assert decide(st, catalog, now, CFG) == []            # nothing new: nothing to revise
    merge_batch(st, EventBatch(workload_id=wl.workload_id, events=late), catalog)
    (rev,) = decide(st, catalog, now, CFG)
    assert (rev.revision, rev.provisional) == (1, False)
    assert bare(rev) == expected.to_json()                # late evidence completes the offline answer

    # More of the same symptom: new evidence (a new diagnosis_id), the same result: no revision.
    extra = next(e for e in early if e.count >= 1 and e.kind != "oom_kill")
    more = extra.model_copy(update={"signature": extra.signature + "#late",
                                    "ref": extra.ref.model_copy(update={"line": extra.ref.line + 100000})})
    merge_batch(st, EventBatch(workload_id=wl.workload_id, events=[more]), catalog)
    assert diagnose_state(st, catalog).diagnosis_id != rev.diagnosis_id
    assert result_hash(diagnose_state(st, catalog)) == result_hash(rev)
    assert decide(st, catalog, now, CFG) == []
    assert st.published.revision == 1


def test_a_corrected_end_record_revises(catalog):
    st, wl = ended_state("host-oom-killer", catalog)
    (final,) = decide(st, catalog, Now(T0 + timedelta(seconds=10)), CFG)
    assert final.status == "attributed"
    apply_scheduler(st, sched("end", wl), T0)                         # the same end again: nothing
    assert decide(st, catalog, Now(T0 + timedelta(seconds=20)), CFG) == []
    apply_scheduler(st, sched("end", wl.model_copy(update={"state": "COMPLETED", "exit_code": "0:0"})), T0)
    (rev,) = decide(st, catalog, Now(T0 + timedelta(seconds=20)), CFG)
    assert (rev.revision, rev.status, rev.terminal_state) == (1, "no_failure", "completed")


@pytest.mark.parametrize("clock", ["stream", "wall"])
def test_lateness_horizon_closes_the_attempt(catalog, clock):
    wl, events, paths, _ = sample("host-oom-killer")
    roots = strong_root_signatures(list(events), catalog)
    st, _ = ended_state("host-oom-killer", catalog, evs=[e for e in events if e.signature not in roots])
    decide(st, catalog, Now(T0 + timedelta(seconds=10)), CFG)
    settle(st, has_store=False)                                       # nothing marked sent: stays pending
    assert len(st.pending) == 1
    st.pending[0].sent = True
    settle(st, has_store=False)
    assert st.pending == []

    beyond = timedelta(seconds=CFG.lateness_s + 1)
    now = Now(T0 + beyond, None) if clock == "wall" else Now(T0 + timedelta(seconds=11), wl.end_time + beyond)
    assert past_lateness(st, now.stream, now.wall, CFG)
    # A batch that would change the result, but it arrives past the horizon: dropped.
    merge_batch(st, EventBatch(workload_id=wl.workload_id, events=[e for e in events if e.signature in roots]),
                catalog)
    assert decide(st, catalog, now, CFG) == []
    assert st.closed_at == now.wall and st.events == {}
    assert not merge_batch(st, EventBatch(workload_id=wl.workload_id, events=list(events)), catalog)
    assert st.dropped == 1 and st.published.revision == 0
    assert not expired(st, now.wall, CFG)
    assert expired(st, now.wall + timedelta(seconds=CFG.lateness_s), CFG)


def test_within_the_horizon_late_evidence_still_revises(catalog):
    wl, events, paths, _ = sample("host-oom-killer")
    roots = strong_root_signatures(list(events), catalog)
    st, _ = ended_state("host-oom-killer", catalog, evs=[e for e in events if e.signature not in roots])
    decide(st, catalog, Now(T0 + timedelta(seconds=10)), CFG)
    almost = timedelta(seconds=CFG.lateness_s - 1)
    merge_batch(st, EventBatch(workload_id=wl.workload_id, events=[e for e in events if e.signature in roots]),
                catalog)
    (rev,) = decide(st, catalog, Now(T0 + almost, wl.end_time + almost), CFG)
    assert rev.revision == 1 and rev.status == "attributed"


# ---------------------------------------------------------------- provisional

def test_provisional_once_for_a_running_workload_whose_root_arrives_early(catalog):
    wl, events, paths, expected = sample("host-oom-killer")
    roots = strong_root_signatures(list(events), catalog)
    st = new_state(wl.workload_id, wl.attempt, T0)
    apply_scheduler(st, sched("start", wl), T0, seq=0)
    now = Now(T0)
    merge_batch(st, EventBatch(workload_id=wl.workload_id, events=[e for e in events if e.signature not in roots],
                               paths=list(paths)), catalog, seq=0)
    assert decide(st, catalog, now, CFG) == []                        # no strong root yet
    merge_batch(st, EventBatch(workload_id=wl.workload_id, events=[e for e in events if e.signature in roots]),
                catalog, seq=1)
    (prov,) = decide(st, catalog, now, CFG)
    assert (prov.provisional, prov.revision, prov.status) == (True, 0, "attributed")
    assert prov.terminal_state == "unknown"
    assert (prov.sub_domain, prov.responsible_nodes) == (expected.sub_domain, expected.responsible_nodes)
    # The same root again (its signature repeats): the result is the same, nothing more is published.
    merge_batch(st, EventBatch(workload_id=wl.workload_id, events=[e for e in events if e.signature in roots]),
                catalog, seq=2)
    assert decide(st, catalog, now, CFG) == []
    assert [p.diagnosis.provisional for p in st.pending] == [True]
    # The end: the final is still published, revision 0, not provisional.
    apply_scheduler(st, sched("end", wl), T0, seq=1)
    (final,) = decide(st, catalog, Now(T0 + timedelta(seconds=10)), CFG)
    assert (final.provisional, final.revision, final.status) == (False, 0, "attributed")


def test_provisional_only_for_a_strong_root_that_final_attributes(catalog):
    """Over every sample, running with all its evidence: provisional iff EARLY tags a strong root
    and FINAL, on the start record, attributes; both outcomes must occur for this to mean anything."""
    outcomes, held = set(), set()
    for bundle in sample_dirs():
        wl, events, paths, _ = sample(bundle.name)
        st = new_state(wl.workload_id, wl.attempt, T0)
        apply_scheduler(st, sched("start", wl), T0)
        merge_batch(st, EventBatch(workload_id=wl.workload_id, events=list(events), paths=list(paths)), catalog)
        strong = bool(strong_root_signatures(list(events), catalog))
        want = strong and diagnose_state(st, catalog).status == "attributed"
        got = decide(st, catalog, Now(T0), CFG)
        assert bool(got) == want, bundle.name
        assert not st.root_arrived
        outcomes.add(want)
        if got:                          # a running workload is incomplete evidence: no node taken out
            assert got[0].recovery.action not in ("drain_nodes", "retry_excluding_nodes"), bundle.name
            would = diagnose_state(st, catalog).recovery.action
            held.add(would in ("drain_nodes", "retry_excluding_nodes"))
            assert got[0].recovery.action == ("none" if would in ("drain_nodes", "retry_excluding_nodes")
                                              else would), bundle.name
    assert outcomes == {True, False}
    assert held == {True, False}         # some provisionals held a drain back, some had none to hold


def test_a_root_before_the_start_is_judged_when_the_start_arrives(catalog):
    wl, events, paths, _ = sample("host-oom-killer")
    st = new_state(wl.workload_id, wl.attempt, T0)
    merge_batch(st, EventBatch(workload_id=wl.workload_id, events=list(events), paths=list(paths)), catalog)
    assert decide(st, catalog, Now(T0), CFG) == []                    # no workload record yet
    apply_scheduler(st, sched("start", wl), T0)
    (prov,) = decide(st, catalog, Now(T0), CFG)
    assert prov.provisional


# ---------------------------------------------------------------- at least once

def test_redelivered_records_are_applied_once(catalog):
    wl, events, paths, _ = sample("cuda-oom-one-rank")
    batch = EventBatch(workload_id=wl.workload_id, events=list(events), paths=list(paths))
    st = new_state(wl.workload_id, wl.attempt, T0)
    assert merge_batch(st, batch, catalog, seq=7)
    counts = {k: e.count for k, e in st.events.items()}
    assert not merge_batch(st, batch, catalog, seq=7)
    assert not merge_batch(st, batch, catalog, seq=3)
    assert {k: e.count for k, e in st.events.items()} == counts
    assert merge_batch(st, batch, catalog, seq=8)                     # a new record is a new record
    assert sum(e.count for e in st.events.values()) == 2 * sum(counts.values())
    apply_scheduler(st, sched("end", wl), T0, seq=4)
    seen = st.end_seen
    assert not apply_scheduler(st, sched("end", wl), T0 + timedelta(seconds=5), seq=4)
    assert not apply_scheduler(st, sched("start", wl), T0, seq=5)     # a start after the end is stale
    assert st.end_seen == seen and st.workload.state == wl.state


def test_the_outbox_survives_the_changelog_byte_for_byte(catalog):
    st, wl = ended_state("worked-example", catalog)
    (final,) = decide(st, catalog, Now(T0 + timedelta(seconds=10)), CFG)
    back = WorkloadState.model_validate_json(st.model_dump_json())
    assert back.pending[0].diagnosis.to_json() == final.to_json()
    assert next_wake(back, CFG).due(Now(T0))                          # pending: the timer re-sends at once
    # the published record stops any second decision on the same evidence
    assert decide(back, catalog, Now(T0 + timedelta(seconds=20)), CFG) == []
    back.pending[0].sent = True
    settle(back, has_store=True)
    assert len(back.pending) == 1                                     # the store has not confirmed yet
    back.pending[0].stored = True
    settle(back, has_store=True)
    assert back.pending == []


def test_batches_whose_workload_never_starts_expire(catalog):
    wl, events, paths, _ = sample("cuda-oom-one-rank")
    st = new_state(wl.workload_id, wl.attempt, T0)
    merge_batch(st, EventBatch(workload_id=wl.workload_id, events=list(events)), catalog)
    assert next_wake(st, CFG).wall == T0 + timedelta(seconds=CFG.hold_s)
    assert not expired(st, T0 + timedelta(seconds=CFG.hold_s - 1), CFG)
    assert expired(st, T0 + timedelta(seconds=CFG.hold_s), CFG)


def test_the_stored_form_of_a_state_is_compressed_deterministic_and_reads_the_old_form(catalog):
    from firstfault.streams import state_codec

    wl, events, paths, _ = sample("gpu-fell-off-bus-32node")
    st = new_state(wl.workload_id, wl.attempt, T0)
    apply_scheduler(st, sched("start", wl), T0)
    merge_batch(st, EventBatch(workload_id=wl.workload_id, events=list(events), paths=list(paths)), catalog)
    text = st.model_dump_json()
    stored = state_codec.encode(text)
    assert stored == state_codec.encode(text) and len(stored) * 4 < len(text)
    assert state_codec.decode(stored) == text
    assert state_codec.decode(json.dumps(text).encode()) == text          # a record Faust's json serializer wrote
    assert state_codec.decode(text.encode()) == text and state_codec.decode(text) == text
    with pytest.raises(ValueError):
        state_codec.decode(state_codec.MARK + b"not zlib")


def test_the_state_text_reuses_unchanged_events_and_is_the_same_text_as_written_fresh(catalog):
    # The correlator writes a state after every window of batches; each event's JSON is kept on the
    # parsed state. Whatever was kept, the text is the one a fresh state gives, and reads back.
    wl, events, paths, _ = sample("gpu-fell-off-bus-32node")
    st = new_state(wl.workload_id, wl.attempt, T0)
    apply_scheduler(st, sched("start", wl), T0)
    fresh_texts = []
    for batch in split_batches(wl, events, paths, random.Random(7), 6):
        merge_batch(st, batch, catalog)
        text = state_json(st)                                  # with what the last window kept
        fresh = WorkloadState.model_validate_json(st.model_dump_json())
        assert state_json(fresh) == text                       # nothing kept: the same text
        back = WorkloadState.model_validate_json(text)
        assert back == st and back.model_dump_json() == st.model_dump_json()
        assert json.loads(text) == json.loads(st.model_dump_json())
        fresh_texts.append(text)
    assert len(set(fresh_texts)) == len(fresh_texts)           # every window changed the state
    replaced = next(iter(st.events))                           # a merge replaces an event: written anew
    st.events[replaced] = st.events[replaced].model_copy(update={"count": 999})
    assert '"count":999' in state_json(st)
    del st.events[replaced]                                    # a retracted crossing: gone from the text
    assert json.loads(state_json(st))["events"].keys() == st.events.keys()


@pytest.mark.parametrize("bundle", [p.name for p in sample_dirs()])
def test_strong_roots_are_found_as_running_every_event_through_early_would(bundle, catalog):
    # A running attempt's every batch is asked for strong roots; kinds no EARLY rule can make one
    # are not run: the answer is the one running them all gives.
    from firstfault.rules.early import may_be_strong_root, run_early
    from firstfault.rules.model import Ev

    _, events, _, _ = sample(bundle)
    kept, _ = run_early(catalog, [Ev.from_schema(e) for e in events])
    assert strong_root_signatures(list(events), catalog) == {
        e.signature for e in kept if e.role == "root" and e.strength == "strong"}
    if bundle == "gpu-fell-off-bus-32node":                # the cascade's echoes are not tried
        assert any(not may_be_strong_root(catalog, e.kind) for e in events)
        assert strong_root_signatures(list(events), catalog)
