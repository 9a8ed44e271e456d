"""Metrics samples out of time order and split across extractor batches: the stream's diagnosis
is still ``analyze``'s (same diagnosis_id, same crossing events), without a broker.

The extractor computes a series' crossing over the samples it has so far, so a later batch
with an earlier sample can change an event already sent (streams/metrics_reader.py then
sends a replacement or a retraction); the correlator keeps the version computed over the
most samples (workload_state.merge_events), whatever order the batches arrive in.
"""
from __future__ import annotations

import itertools
import json
import random
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest

from firstfault.connectors.shipper import bundle_records, start_record
from firstfault.rules.bundle import open_bundle
from firstfault.rules.catalog import load_catalog
from firstfault.rules.engine import analyze_bundle
from firstfault.schemas import EventBatch, SchedulerEvent
from firstfault.schemas.avro import encode
from firstfault.streams.codecs import decode_batch
from firstfault.streams.config import StreamConfig
from firstfault.streams.extractor import ExtractorCore
from firstfault.streams.metrics_reader import RETRACTED_FIELD, VERSION_FIELD
from firstfault.streams.workload_state import (
    apply_scheduler, diagnose_state, merge_batch, merge_events, new_state,
)

from conftest import sample_dirs

FLIT, PCIE = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
XID, TEMP = "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_GPU_TEMP"
T = "2026-11-02T{}Z"          # the worked example ran 09:58:00 - 10:13:19


def sample(hhmmss: str, host: str, gpu: int, name: str, value: float) -> str:
    """One line of the contract's ``metrics/*.jsonl`` (as tests/test_telemetry_events.py writes them)."""
    return json.dumps({"ts": T.format(hhmmss), "host": host, "gpu": gpu, "name": name, "value": value}, sort_keys=True)


# In file order, later samples before earlier ones. Offline (time order) and what a prefix gives:
OUT_OF_ORDER = [
    sample("10:02:00", "node-04", 1, FLIT, 500),   # counter: prefix crossing 10:05, offline 09:59 (earlier)
    sample("10:05:00", "node-04", 1, FLIT, 800),
    sample("10:03:30", "node-02", 3, XID, 149),    # Xid: prefix born late (previous 149), offline previous 0
    sample("10:05:00", "node-03", 0, XID, 79),     # Xid: prefix born late, offline none (79 since before the start)
    sample("10:06:00", "node-01", 0, TEMP, 95),    # above: prefix 10:06, offline 10:01
    sample("09:57:00", "node-01", 2, PCIE, 20),    # counter: same crossing 10:04, rise 130 -> 140
    sample("10:04:00", "node-01", 2, PCIE, 150),
    sample("10:03:00", "node-04", 5, XID, 79),     # Xid: prefix 10:03 (born late), offline 10:08 (later)
    sample("10:08:00", "node-04", 5, XID, 48),
    sample("09:55:00", "node-04", 1, FLIT, 0),
    sample("09:59:00", "node-04", 1, FLIT, 150),
    sample("09:55:00", "node-02", 3, XID, 0),
    sample("09:50:00", "node-03", 0, XID, 79),
    sample("10:01:00", "node-01", 0, TEMP, 92),
    sample("09:50:00", "node-01", 2, PCIE, 10),
    sample("09:57:00", "node-04", 5, XID, 79),
]
CATALOG = load_catalog()


def _bundle(tmp: Path, lines: list[str]) -> Path:
    dst = tmp / "bundle"
    shutil.copytree(next(p for p in sample_dirs() if p.name == "worked-example"), dst)
    (dst / "metrics").mkdir()
    (dst / "metrics" / "dcgm.jsonl").write_text("\n".join(lines) + "\n")
    return dst


def _stream_batches(bundle: Path, cuts: list[int]) -> list[EventBatch]:
    """The extractor's EventBatches for the bundle's workload, as the correlator decodes them off the
    events topic: its log lines, then the metrics lines in batches ending at ``cuts``, then the end event."""
    wl, records = bundle_records(bundle)
    core = ExtractorCore(StreamConfig(hold_s=3600), CATALOG)
    core.timeline.apply(SchedulerEvent(type="start", workload=start_record(wl), ts=wl.start_time))
    metrics = [(r, 0) for _, r in records if r.source == "metrics"]
    bounds = [0, *cuts, len(metrics)]
    outs = [core.handle([(r, 0) for _, r in records if r.source != "metrics"])]
    outs += [core.handle(metrics[a:b]) for a, b in zip(bounds, bounds[1:])]
    core.timeline.apply(SchedulerEvent(type="end", workload=wl, ts=wl.end_time))
    outs.append(core.retry_held()[0])
    key = (wl.workload_id, wl.attempt)
    return [decode_batch(encode(o[key])) for o in outs if key in o]


def _correlate(bundle: Path, arrivals: list[tuple[int, EventBatch]]):
    """The correlator's state after merging (offset, batch) in arrival order; its diagnosis."""
    wl = open_bundle(bundle).workload
    now = datetime.now(timezone.utc)
    st = new_state(wl.workload_id, wl.attempt, now)
    apply_scheduler(st, SchedulerEvent(type="start", workload=start_record(wl), ts=wl.start_time), now)
    for seq, batch in arrivals:
        merge_batch(st, batch, CATALOG, seq=seq)
    apply_scheduler(st, SchedulerEvent(type="end", workload=wl, ts=wl.end_time), now)
    return st, diagnose_state(st, CATALOG)


def _offline(bundle: Path):
    a = analyze_bundle(open_bundle(bundle), CATALOG, keep_events=True)
    return a.diagnosis, _metric_events({e.signature: e.to_schema() for e in a.events})


def _metric_events(events: dict) -> dict:
    return {sig: e.model_dump(mode="json") for sig, e in events.items() if e.source == "metrics"}


def _assert_same(bundle: Path, arrivals: list[tuple[int, EventBatch]], want, want_events, label: str) -> None:
    st, got = _correlate(bundle, arrivals)
    assert _metric_events(st.events) == want_events, label
    assert got.diagnosis_id == want.diagnosis_id, label
    assert got.to_json() == want.to_json(), label


def test_the_stream_sent_a_different_first_crossing_before(tmp_path):
    """The case itself: each series' later samples first, one batch each half. Without replacements
    the first batch's crossings would stand (10:05 for the counter, a born-late Xid on node-03)."""
    bundle = _bundle(tmp_path, OUT_OF_ORDER)
    half = len(OUT_OF_ORDER) // 2
    batches = _stream_batches(bundle, [half])
    sent = [e for b in batches for e in b.events if e.kind == "dcgm_threshold"]
    firsts = {(e.host, e.fields["metric"], e.gpu.index): e for e in sent if VERSION_FIELD not in e.fields}
    assert firsts[("node-04", FLIT, 1)].stamp.isoformat() == "2026-11-02T10:05:00+00:00"
    assert ("node-03", XID, 0) in firsts
    replaced = [e for e in sent if VERSION_FIELD in e.fields]
    assert sorted((e.host, e.gpu.index, bool(e.fields.get(RETRACTED_FIELD))) for e in replaced) == [
        ("node-01", 0, False), ("node-01", 2, False), ("node-02", 3, False), ("node-03", 0, True),
        ("node-04", 1, False), ("node-04", 5, False)]
    want, want_events = _offline(bundle)
    assert "node-03" not in json.dumps(want_events)            # offline: no Xid crossing on node-03
    _assert_same(bundle, list(enumerate(batches)), want, want_events, "split in the middle")


def test_every_split_any_arrival_order_and_redelivery_match_analyze(tmp_path):
    bundle = _bundle(tmp_path, OUT_OF_ORDER)
    want, want_events = _offline(bundle)
    for cut in range(len(OUT_OF_ORDER) + 1):
        logs, *metrics, end = _stream_batches(bundle, [cut])
        for order in itertools.permutations(metrics):
            arrivals = list(enumerate([logs, *order, end]))
            _assert_same(bundle, arrivals, want, want_events, f"cut {cut}, {len(order)} metrics batches")
        # At least once: every batch again (same offsets), then all of them again in reverse.
        arrivals = list(enumerate([logs, *metrics, end]))
        _assert_same(bundle, arrivals + arrivals + arrivals[::-1], want, want_events, f"cut {cut}, redelivered")


@pytest.mark.parametrize("seed", range(4))
def test_any_sample_order_and_batching_match_analyze(tmp_path, seed):
    rng = random.Random(seed)
    lines = OUT_OF_ORDER[:]
    rng.shuffle(lines)
    bundle = _bundle(tmp_path, lines)
    want, want_events = _offline(bundle)
    cuts = sorted(rng.sample(range(1, len(lines)), rng.randint(1, len(lines) - 1)))
    batches = _stream_batches(bundle, cuts)
    rng.shuffle(batches)                     # one partition: offsets follow the arrival order
    _assert_same(bundle, list(enumerate(batches)), want, want_events, f"seed {seed}, cuts {cuts}")


def test_in_order_samples_send_each_crossing_once(tmp_path):
    lines = sorted(OUT_OF_ORDER, key=lambda s: json.loads(s)["ts"])
    bundle = _bundle(tmp_path, lines)
    want, want_events = _offline(bundle)
    for cut in range(len(lines) + 1):
        batches = _stream_batches(bundle, [cut])
        sent = [e for b in batches for e in b.events if e.kind == "dcgm_threshold"]
        assert not [e for e in sent if VERSION_FIELD in e.fields], f"cut {cut}: a replacement"
        assert sorted(e.signature for e in sent) == sorted(want_events), f"cut {cut}"
        _assert_same(bundle, list(enumerate(batches)), want, want_events, f"in order, cut {cut}")


def test_merge_keeps_the_version_over_the_most_samples_in_any_order(tmp_path):
    """merge_events alone: the first (plain) version, two replacements and a retraction of one
    signature, in every order and repeated, leave the version over the most samples."""
    bundle = _bundle(tmp_path, OUT_OF_ORDER)
    sent = [e for b in _stream_batches(bundle, [1, 2, 3, 9, 10, 11, 12, 13, 14, 15]) for e in b.events
            if e.kind == "dcgm_threshold" and e.host == "node-03"]
    assert [(e.fields.get(VERSION_FIELD), bool(e.fields.get(RETRACTED_FIELD))) for e in sent] == \
        [(None, False), (2, True)]
    first, retracted = sent
    again = first.model_copy(update={"fields": {**first.fields, VERSION_FIELD: 3}})     # a later crossing
    for order in itertools.permutations([first, retracted, again]):
        events: dict = {}
        versions: dict = {}
        merge_events(events, versions, list(order) + list(order))
        assert versions == {first.signature: 3}
        assert events == {first.signature: first}
    for order in itertools.permutations([first, retracted]):
        events, versions = {}, {}
        merge_events(events, versions, list(order) * 2)
        assert (events, versions) == ({}, {first.signature: 2})


def test_two_names_of_one_node_fold_into_one_event_in_any_split(tmp_path):
    """Series of one node named short and fully qualified fold into one event (count 2), as the engine
    folds them, even when the second one's crossing comes in a later batch."""
    lines = [sample("09:55:00", "node-02", 3, XID, 0), sample("10:03:30", "node-02", 3, XID, 149),
             sample("09:55:00", "node-02.cluster.example", 3, XID, 0),
             sample("10:03:40", "node-02.cluster.example", 3, XID, 149)]
    bundle = _bundle(tmp_path, lines)
    want, want_events = _offline(bundle)
    assert [e["count"] for e in want_events.values()] == [2]
    for cut in range(len(lines) + 1):
        _assert_same(bundle, list(enumerate(_stream_batches(bundle, [cut]))), want, want_events, f"cut {cut}")
