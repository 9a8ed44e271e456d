"""The diagnoses store: one test body, run against real Redis and the in-process fallback."""
from __future__ import annotations

import json
import logging
import threading
import uuid
from datetime import datetime, timedelta, timezone
from functools import lru_cache

import pytest
import redis

from firstfault.connectors.sinks.redis_store import (MAX_REVISIONS, DiagnosisStore, InvalidCursor, Retention,
                                                     StoreUnavailable)
from firstfault.rules.engine import analyze_path
from firstfault.schemas import Candidate, Diagnosis, Ref

from conftest import SAMPLES

REDIS_URL = "redis://127.0.0.1:6379/0"
T0 = datetime(2026, 11, 2, 10, 0, tzinfo=timezone.utc)


@lru_cache(maxsize=None)
def _sample(name: str) -> Diagnosis:
    return analyze_path(SAMPLES / name).diagnosis


def diag(workload_id: str, attempt: int = 0, revision: int | None = None, tag: str = "", **update) -> Diagnosis:
    """A real engine diagnosis (worked example: attributed to node-02), re-keyed for the test."""
    base = _sample("worked-example")
    fields = {"workload_id": workload_id, "attempt": attempt, "revision": revision,
              "diagnosis_id": f"sha256:{workload_id}-{attempt}-{revision}-{tag}"}
    fields.update(update)
    return base.model_copy(update=fields)


def unattributed(workload_id: str, suspects: list[str], **kw) -> Diagnosis:
    return diag(workload_id, status="unattributed", domain="unknown", sub_domain="unattributed",
                root_cause=None, responsible_nodes=[], suspect_nodes=suspects, **kw)


def wipe(prefix: str) -> None:
    r = redis.Redis.from_url(REDIS_URL)
    keys = list(r.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        r.delete(*keys)


@pytest.fixture(params=["redis", "memory"])
def store(request):
    if request.param == "memory":
        yield DiagnosisStore(None)
        return
    prefix = f"fftest:{uuid.uuid4().hex}:"
    yield DiagnosisStore(REDIS_URL, prefix=prefix)
    wipe(prefix)


def ids(items: list[Diagnosis]) -> list[tuple[str, int]]:
    return [(d.workload_id, d.attempt) for d in items]


def test_backend_is_named_and_memory_fallback_warns(caplog):
    with caplog.at_level(logging.WARNING):
        mem = DiagnosisStore(None)
    assert mem.backend == "memory"
    assert any("memory" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    assert DiagnosisStore(REDIS_URL, prefix=f"fftest:{uuid.uuid4().hex}:").backend == "redis"


def test_saving_the_same_diagnosis_twice_is_a_no_op(store):
    d = diag("job-1")
    assert store.save(d, T0) is True
    assert store.save(d, T0 + timedelta(hours=1)) is False
    assert store.latest("job-1") == d
    assert store.revisions("job-1", 0) == []
    items, cursor = store.query()
    assert ids(items) == [("job-1", 0)] and cursor is None
    # The no-op did not move the attempt in time either.
    assert ids(store.query(since=T0 + timedelta(minutes=30))[0]) == []


def test_round_trip_is_the_exact_contract_json(store):
    d = diag("job-json", revision=2, provisional=True)
    store.save(d, T0)
    got = store.latest("job-json")
    assert got is not None and got.to_json() == d.to_json()
    if store.backend == "redis":   # stored as the JSON text of Diagnosis.to_json()
        raw = redis.Redis.from_url(REDIS_URL, decode_responses=True).get(f"{store.prefix}doc:2:{d.diagnosis_id}")
        assert raw == d.to_json()


def test_higher_revision_replaces_latest_and_older_ones_become_revisions(store):
    r0, r1, r2 = (diag("job-r", revision=i) for i in range(3))
    for d in (r0, r1, r2):
        assert store.save(d, T0)
    assert store.latest("job-r").revision == 2
    assert [d.revision for d in store.revisions("job-r", 0)] == [0, 1]
    # A late replay of a lower revision (new content) does not take over.
    late = diag("job-r", revision=1, tag="late")
    assert store.save(late, T0)
    assert store.latest("job-r").revision == 2
    assert [d.revision for d in store.revisions("job-r", 0)] == [0, 1, 1]
    assert store.save(late, T0) is False


def test_later_save_without_revision_replaces_latest(store):
    first, second = diag("job-s", tag="a"), diag("job-s", tag="b")
    store.save(first, T0)
    store.save(second, T0)
    assert store.latest("job-s").diagnosis_id == second.diagnosis_id
    assert [d.diagnosis_id for d in store.revisions("job-s", 0)] == [first.diagnosis_id]


def test_latest_picks_the_highest_attempt_unless_asked(store):
    for attempt in (0, 2, 1):
        store.save(diag("job-a", attempt=attempt), T0 + timedelta(minutes=attempt))
    assert store.latest("job-a").attempt == 2
    assert store.latest("job-a", 1).attempt == 1
    assert store.latest("job-a", 7) is None
    assert store.latest("nope") is None
    assert store.attempts("job-a") == [2, 1, 0]
    assert store.revisions("job-a", 1) == []


def test_query_orders_newest_first_and_filters(store):
    store.save(diag("j-old"), T0)
    store.save(unattributed("j-mid", ["node-07"]), T0 + timedelta(minutes=10))
    store.save(diag("j-new"), T0 + timedelta(minutes=20))
    store.save(diag("j-gpu", domain="gpu", sub_domain="gpu_fell_off_bus", responsible_nodes=["gpu-9"],
                    root_cause=_sample("worked-example").root_cause.model_copy(update={"host": "gpu-9"})),
               T0 + timedelta(minutes=5))
    assert [w for w, _ in ids(store.query()[0])] == ["j-new", "j-mid", "j-gpu", "j-old"]
    assert [w for w, _ in ids(store.query(status="unattributed")[0])] == ["j-mid"]
    assert [w for w, _ in ids(store.query(domain="interconnect")[0])] == ["j-new", "j-old"]
    assert [w for w, _ in ids(store.query(node="node-02")[0])] == ["j-new", "j-old"]
    assert [w for w, _ in ids(store.query(node="node-07")[0])] == ["j-mid"]
    assert [w for w, _ in ids(store.query(node="gpu-9", domain="gpu")[0])] == ["j-gpu"]
    assert ids(store.query(node="gpu-9", domain="interconnect")[0]) == []
    # since and until are inclusive bounds on the end time.
    window = store.query(since=T0 + timedelta(minutes=5), until=T0 + timedelta(minutes=10))[0]
    assert [w for w, _ in ids(window)] == ["j-mid", "j-gpu"]
    naive = store.query(since=(T0 + timedelta(minutes=20)).replace(tzinfo=None))[0]   # naive = UTC
    assert [w for w, _ in ids(naive)] == ["j-new"]


def test_pagination_visits_every_attempt_once_even_with_equal_times(store):
    # Seven attempts, four of them ending in the same millisecond: ties must not repeat or vanish.
    times = [T0, T0 + timedelta(minutes=1)] + [T0 + timedelta(minutes=2)] * 4 + [T0 + timedelta(minutes=3)]
    for i, t in enumerate(times):
        store.save(diag(f"page-{i}"), t)
    seen, cursor, pages = [], None, 0
    while True:
        items, cursor = store.query(limit=3, cursor=cursor)
        pages += 1
        seen += ids(items)
        if cursor is None:
            break
    assert pages == 3
    assert sorted(seen) == sorted((f"page-{i}", 0) for i in range(7)) and len(seen) == 7
    assert seen[0] == ("page-6", 0) and seen[-1] == ("page-0", 0)
    # An exact multiple of the page size ends with no cursor, not with an empty page.
    items, cursor = store.query(limit=7)
    assert len(items) == 7 and cursor is None


def test_indexes_follow_the_latest_revision(store):
    store.save(diag("job-x", revision=0), T0)
    store.save(unattributed("job-x", ["node-03"], revision=1), T0 + timedelta(minutes=1))
    assert ids(store.query(status="attributed")[0]) == []
    assert ids(store.query(status="unattributed")[0]) == [("job-x", 0)]
    assert ids(store.for_node("node-02")[0]) == []
    assert ids(store.for_node("node-03")[0]) == [("job-x", 0)]
    assert len(store.query()[0]) == 1            # one attempt, listed once


def test_node_index_covers_blamed_suspected_and_candidate_nodes(store):
    cand = [Candidate(domain="network", sub_domain="ib_link_error", nodes=["node-05", "node-06"], coverage=0.5,
                      evidence=[Ref(path="logs/app/node-05.log", line=3)], message="IB"),
            Candidate(domain="gpu", sub_domain="gpu_memory_ecc", nodes=["node-03"], coverage=0.5,
                      evidence=[Ref(path="logs/syslog/node-03.log", line=9)], message="ECC")]
    store.save(diag("amb", status="ambiguous", domain="ambiguous", sub_domain="ambiguous", root_cause=None,
                    responsible_nodes=[], suspect_nodes=["node-08"], candidates=cand), T0)
    for host in ("node-05", "node-06", "node-03", "node-08"):
        assert ids(store.for_node(host)[0]) == [("amb", 0)], host
    assert ids(store.for_node("node-02")[0]) == []


def test_for_node_pages(store):
    for i in range(5):
        store.save(diag(f"n-{i}"), T0 + timedelta(minutes=i))
    first, cursor = store.for_node("node-02", limit=2)
    assert [w for w, _ in ids(first)] == ["n-4", "n-3"] and cursor
    rest, cursor2 = store.for_node("node-02", limit=10, cursor=cursor)
    assert [w for w, _ in ids(rest)] == ["n-2", "n-1", "n-0"] and cursor2 is None


@pytest.mark.parametrize("bad", ["not-base64!!", "bm90IGpzb24", "WzEsMl0", ""])
def test_a_cursor_it_did_not_issue_is_refused(store, bad):
    store.save(diag("c"), T0)
    if bad == "":                       # an empty cursor means "first page"
        assert ids(store.query(cursor=bad)[0]) == [("c", 0)]
        return
    with pytest.raises(InvalidCursor):
        store.query(cursor=bad)


def test_concurrent_saves_of_one_attempt_keep_exactly_one_latest(store):
    docs = [diag("race", revision=i) for i in range(16)]
    barrier = threading.Barrier(len(docs))

    def save(d: Diagnosis) -> None:
        barrier.wait()
        store.save(d, T0)

    threads = [threading.Thread(target=save, args=(d,)) for d in docs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.latest("race").revision == 15
    assert sorted(d.revision for d in store.revisions("race", 0)) == list(range(15))
    assert len(store.query()[0]) == 1


def test_ping(store):
    assert store.ping() is True


def test_both_backends_answer_alike():
    """Parity: the same saves give the same answers, cursors included."""
    prefix = f"fftest:{uuid.uuid4().hex}:"
    stores = [DiagnosisStore(REDIS_URL, prefix=prefix), DiagnosisStore(None)]
    try:
        ops = [(diag("p1", revision=0), T0), (diag("p2"), T0 + timedelta(minutes=1)),
               (unattributed("p1", ["node-04"], revision=1), T0 + timedelta(minutes=2)),
               (diag("p3", attempt=1), T0 + timedelta(minutes=1)), (diag("p2"), T0),
               (diag("p1", revision=0, tag="late"), T0)]
        results = []
        for s in stores:
            saved = [s.save(d, t) for d, t in ops]
            page1, cur = s.query(limit=2)
            page2, _ = s.query(limit=2, cursor=cur)
            results.append((saved, [d.to_json() for d in page1 + page2], cur,
                            [d.to_json() for d in s.revisions("p1", 0)], ids(s.for_node("node-04")[0])))
        assert results[0] == results[1]
    finally:
        wipe(prefix)


def test_unreachable_redis_raises_store_unavailable_and_ping_is_false():
    down = DiagnosisStore("redis://127.0.0.1:1/0", prefix="fftest:down:")
    assert down.ping() is False
    with pytest.raises(StoreUnavailable):
        down.save(diag("down"), T0)
    with pytest.raises(StoreUnavailable):
        down.query()


# ---------------------------------------------------------------- retention (issue 22, item 4)

class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def tick(self, seconds: float = 1.0) -> None:
        self.t += seconds


@pytest.fixture(params=["redis", "memory"])
def kept(request):
    """make(retention) -> (store, clock): a store with these caps on a clock the test moves."""
    prefixes = []

    def make(**caps):
        clock = Clock()
        retention = Retention(**caps)
        if request.param == "memory":
            return DiagnosisStore(None, retention=retention, clock=clock), clock
        prefixes.append(f"fftest:{uuid.uuid4().hex}:")
        return DiagnosisStore(REDIS_URL, prefix=prefixes[-1], retention=retention, clock=clock), clock

    yield make
    for p in prefixes:
        wipe(p)


LINES = {"logs/syslog/node-02.log": {str(n): "x" * 200 for n in range(1, 41)}}


def gone(store: DiagnosisStore, workload_id: str, diagnosis_id: str) -> bool:
    return (store.latest(workload_id) is None and store.attempts(workload_id) == []
            and store.revisions(workload_id, 0) == [] and store.lines(diagnosis_id) is None)


def test_the_count_cap_drops_the_oldest_write_first_and_the_listing_says_so(kept):
    store, clock = kept(max_diagnoses=3)
    for i in range(5):
        clock.tick()
        store.save(diag(f"job-{i}"), T0 + timedelta(minutes=10 - i), lines=LINES)   # listed newest-ended first
    assert sorted(w for w, _ in ids(store.query()[0])) == ["job-2", "job-3", "job-4"]
    for i in (0, 1):
        assert gone(store, f"job-{i}", f"sha256:job-{i}-0-None-")
    assert store.lines("sha256:job-4-0-None-") == LINES
    st = store.retention_status()
    assert (st["kept"], st["dropped"], st["dropped_by"]) == (3, 2, {"count": 2, "bytes": 0, "ttl": 0})
    assert st["newest_dropped_stored_at"] < st["oldest_kept_stored_at"]
    assert st["max_diagnoses"] == 3 and st["dropped_bytes"] > 0


def test_the_byte_cap_counts_documents_and_lines_and_never_drops_the_one_just_written(kept):
    probe, _ = kept()
    probe.save(diag("probe"), T0, lines=LINES)
    one = probe.retention_status()["bytes"]
    assert one > len(diag("probe").to_json())            # the lines count too
    store, clock = kept(max_bytes=int(one * 2.5))
    for i in range(4):
        clock.tick()
        store.save(diag(f"b-{i}"), T0, lines=LINES)
    st = store.retention_status()
    assert [w for w, _ in ids(store.query()[0])] == ["b-3", "b-2"] and st["dropped_by"]["bytes"] == 2
    assert st["bytes"] <= one * 2.5
    small, clock = kept(max_bytes=10)                    # smaller than any one diagnosis: the newest stays
    for i in range(3):
        clock.tick()
        assert small.save(diag(f"s-{i}"), T0) is True
        assert ids(small.query()[0]) == [(f"s-{i}", 0)]


def test_the_ttl_expires_by_last_write_even_when_nothing_new_is_saved(kept):
    store, clock = kept(ttl_days=1)
    store.save(diag("old"), T0)
    clock.tick(3600)
    store.save(diag("newer"), T0 - timedelta(days=400))     # ended long ago, stored now: the store's time counts
    clock.tick(86_400 - 1800)                                # "old" was written 25 h ago, "newer" 23.5 h ago
    assert ids(store.query()[0]) == [("newer", 0)]           # a read sweeps
    st = store.retention_status()
    assert st["dropped_by"] == {"count": 0, "bytes": 0, "ttl": 1} and st["kept"] == 1
    clock.tick(3600)
    assert store.sweep(force=True) == 1 and store.query()[0] == []
    never, clock = kept(ttl_days=0)
    never.save(diag("kept"), T0)
    clock.tick(10 * 365 * 86_400)
    assert ids(never.query()[0]) == [("kept", 0)]


def test_an_attempt_keeps_a_bounded_number_of_revisions_and_its_bytes_stay_exact(kept):
    store, clock = kept()
    for rev in range(MAX_REVISIONS + 6):
        clock.tick()
        store.save(diag("busy", revision=rev), T0, lines={"logs/a.log": {"1": f"rev {rev}"}})
    revs = store.revisions("busy", 0)
    assert len(revs) == MAX_REVISIONS and revs[0].revision == 5 and store.latest("busy").revision == MAX_REVISIONS + 5
    assert store.lines(diag("busy", revision=0).diagnosis_id) is None
    docs = [store.latest("busy"), *revs]
    expect = sum(len(d.to_json().encode()) for d in docs)
    expect += sum(len(json.dumps(store.lines(d.diagnosis_id), sort_keys=True, ensure_ascii=False).encode())
                  for d in docs)
    assert store.retention_status()["bytes"] == expect


def test_retention_settings_are_read_and_refused_by_name(monkeypatch):
    r = Retention.from_env({"FIRSTFAULT_STORE_MAX_DIAGNOSES": "500", "FIRSTFAULT_STORE_MAX_BYTES": "64M",
                            "FIRSTFAULT_STORE_TTL_DAYS": "7.5"})
    assert (r.max_diagnoses, r.max_bytes, r.ttl_days) == (500, 64 * 1024 * 1024, 7.5)
    for var, bad in (("FIRSTFAULT_STORE_MAX_DIAGNOSES", "0"), ("FIRSTFAULT_STORE_MAX_BYTES", "lots"),
                     ("FIRSTFAULT_STORE_TTL_DAYS", "-1")):
        with pytest.raises(ValueError, match=var):
            Retention.from_env({var: bad})
    monkeypatch.setenv("FIRSTFAULT_STORE_MAX_DIAGNOSES", "7")
    assert DiagnosisStore(None).retention.max_diagnoses == 7        # the stream's writers read it too
