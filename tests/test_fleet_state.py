"""Fleet memory at a fleet's size: the incremental state against the reference, the clock, retention.

* Property: on random histories (arrivals up to the margin late, revisions, broad events, a
  topology or none), the incremental state's report is ``evaluate``'s over every episode ever
  recorded, at every instant asked, between arrivals and after; the same arrivals given again
  (a rebuild) give the same report, whatever their lateness.
* The time of judgement is the clock (injected), never the newest episode.
* The record keeps the policy window plus a margin; older episodes are dropped (store and state).
* The service reads the record's changes, a page of nodes at a time.

No timing: speed is bench/bench_fleet.py's.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from firstfault.connectors.api.app import create_app
from firstfault.connectors.api.settings import ServiceSettings
from firstfault.connectors.sinks.fleet_memory import FleetMemory
from firstfault.connectors.sinks.node_health import NodeHealthStore
from firstfault.connectors.sinks.recovery import RecoveryConfig, RecoverySink
from firstfault.rules.fleet import NETWORK_NOTE, Group, Policy, Topology, evaluate
from firstfault.rules.fleet_index import DIAGNOSIS_ID, FAMILY, HOST, REVISION, from_us, to_us
from firstfault.rules.fleet_state import FleetState

from conftest import redis_key_prefix

from fleet_bundles import T0, diagnose, ib_bundle, retarget, xid79_bundle
from fleet_histories import arrival_order, random_history, random_policy, records_of, with_revisions

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
ROOT = Path(__file__).resolve().parents[1]
HOSTS = [f"n{i:02d}" for i in range(12)]
TOPOLOGY = Topology(source="test", groups=[
    *(Group(kind="switch", name=f"leaf{j}", level=0, nodes=frozenset(HOSTS[3 * j:3 * j + 3])) for j in range(4)),
    Group(kind="switch", name="spine", level=1, nodes=frozenset(HOSTS))])
PROPERTY = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture
def prefix():
    with redis_key_prefix(REDIS_URL, "fleetstate") as p:
        yield p


@pytest.fixture
def anyio_backend():
    return "asyncio"


# ---------------------------------------------------------------- the reference, on random histories

def _kept(state: FleetState, report) -> dict:
    """evaluate's report over every episode ever recorded, as the state can know it: without the
    episodes and broad events it dropped (a node left with none must have been `ok`)."""
    kept = {(x[DIAGNOSIS_ID], x[HOST], x[FAMILY], x[REVISION])
            for h in state.index.hosts for x in state.index.episodes(h)}
    data = report.model_dump(mode="json")
    nodes = []
    for n in data["nodes"]:
        n["episodes"] = [e for e in n["episodes"] if (e["diagnosis_id"], e["host"], e["family"], e["revision"]) in kept]
        if n["host"] not in state.index.hosts:
            assert n["recommendation"] == "ok", n
            continue
        nodes.append(n)
    data["nodes"] = nodes
    if state.index.cut is not None:
        data["broad_events"] = [b for b in data["broad_events"] if to_us(
            datetime.fromisoformat(b["cycle_end"].replace("Z", "+00:00"))) > state.index.cut]
        data["notes"] = [x for x in data["notes"] if x != NETWORK_NOTE]
    return data


def _state_report(state: FleetState, at: datetime, topology: Topology | None) -> dict:
    data = state.report(at, topology)[0].model_dump(mode="json")
    assert state.report_data(at, topology)[0] == data          # the API's way, without a model per episode
    if state.index.cut is not None:          # the note may rest on a cycle the state dropped
        data["notes"] = [x for x in data["notes"] if x != NETWORK_NOTE]
    return data


def _feed(rng: random.Random, policy: Policy, order, late_s: float, topology: Topology | None,
          monotone: bool) -> tuple[FleetState, datetime, int]:
    """Absorb ``order`` as it arrives, asking for reports in between; each checked against evaluate."""
    state, arrived, clock, checked = FleetState(policy), [], T0, 0
    last_at = T0
    for a in order:
        base = a.when if a.episodes else clock
        clock = max([clock, base + timedelta(seconds=rng.uniform(0, late_s))] + [x.when for x in arrived if x.episodes])
        state.absorb(a.key, a.revision, a.episodes, clock)
        arrived.append(a)
        if rng.random() < 0.4:
            at = clock + timedelta(seconds=rng.uniform(0, 2 * policy.cycle_s))
            if monotone:
                at = last_at = max(at, last_at + timedelta(seconds=1))
            if state.final is not None and to_us(at) <= state.final:
                continue
            expected = evaluate(records_of(arrived), policy, topology, at)
            assert _state_report(state, at, topology) == _kept(state, expected)
            checked += 1
    return state, clock, checked


@PROPERTY
@given(st.integers(0, 2**32 - 1))
def test_the_incremental_state_gives_evaluates_verdicts_on_random_histories(seed):
    rng = random.Random(seed)
    policy = random_policy(rng)
    history = with_revisions(rng, random_history(rng, rng.randint(1, 45), hosts=rng.choice([3, 6, 12]),
                                                 span_s=rng.choice([0.2, 1.0, 3.0]) * 86400), rng.choice([0.0, 0.3]))
    margin_s = policy.retain_margin_days * 86400
    late_s = rng.choice([0.0, 0.5, 0.9]) * margin_s            # within the margin: replayed exactly
    topology = TOPOLOGY if rng.random() < 0.5 else None
    order = arrival_order(rng, history, late_s)
    state, clock, _ = _feed(rng, policy, order, late_s, topology, monotone=rng.random() < 0.5)
    ats = sorted(clock + timedelta(seconds=rng.uniform(-margin_s / 2, policy.window_days * 86400 * 1.5))
                 for _ in range(6))
    for at in ats:                                             # in time order: each report builds on the last
        if state.final is not None and to_us(at) <= state.final:
            continue
        assert _state_report(state, at, topology) == _kept(state, evaluate(records_of(order), policy, topology, at))


@PROPERTY
@given(st.integers(0, 2**32 - 1))
def test_the_same_arrivals_rebuilt_give_the_same_reports(seed):
    rng = random.Random(seed)
    policy = random_policy(rng)
    history = with_revisions(rng, random_history(rng, rng.randint(1, 45)), 0.2)
    late_s = rng.choice([0.0, 1.0, 4.0]) * policy.retain_margin_days * 86400      # some far past the margin
    order = arrival_order(rng, history, late_s)
    clocks, clock = [], T0
    for a in order:
        clock = max(clock, a.when if a.episodes else clock)
        clocks.append(clock)
    live = FleetState(policy)
    for a, now in zip(order, clocks):
        live.absorb(a.key, a.revision, a.episodes, now)
        if rng.random() < 0.3:                                 # reports in between take and undo steps
            live.report(now + timedelta(seconds=rng.uniform(0, policy.cycle_s)))
    rebuilt = FleetState(policy)
    for a, now in zip(order, clocks):
        rebuilt.absorb(a.key, a.revision, a.episodes, now)
    for k in range(3):
        at = clock + timedelta(seconds=k * policy.cycle_s * 2.5 + 1)
        assert live.report(at, TOPOLOGY)[0] == rebuilt.report(at, TOPOLOGY)[0]


def test_an_episode_later_than_the_margin_still_counts_from_then_on():
    policy = Policy(window_days=14, retain_margin_days=1)
    base = random_history(random.Random(7), 1)[0].episodes[0]

    def ep(host: str, wid: str, at: datetime):
        return base.model_copy(update={"host": host, "workload_id": wid, "attempt": 0,
                                       "at": at.strftime("%Y-%m-%dT%H:%M:%S.000Z"),
                                       "family": "gpu", "sub_domain": "gpu_fell_off_bus", "role": "attributed"})
    state = FleetState(policy)
    state.absorb("0:a1", None, [ep("a", "a1", T0)], T0)
    for day in range(1, 4):                    # another node's episodes move the record on, past the margin
        state.absorb(f"0:b{day}", None, [ep("b", f"b{day}", T0 + timedelta(days=day))], T0 + timedelta(days=day))
    assert state.final is not None and state.final > to_us(T0 + timedelta(hours=1))
    now = T0 + timedelta(days=3, hours=2)
    assert state.report(now, hosts=["a"])[0].nodes[0].recommendation == "watch"
    late = ep("a", "a2", T0 + timedelta(hours=1))   # a second gpu episode on a, three days late
    state.absorb("0:a2", None, [late], now)
    [a] = state.report(now, hosts=["a"])[0].nodes
    assert a.recommendation == "avoid" and a.counts == {"gpu": 2}, a


# ---------------------------------------------------------------- the clock, not the newest episode

def _at(t: datetime) -> float:
    return t.timestamp()


@pytest.mark.anyio
async def test_a_nodes_verdict_does_not_move_when_an_unrelated_later_episode_arrives(tmp_path, prefix):
    clock = [_at(T0 + timedelta(days=1))]
    app = create_app(ServiceSettings(redis_url=REDIS_URL, redis_prefix=prefix), clock=lambda: clock[0])
    store = app.state.ctx.nodes
    store.record(diagnose(xid79_bundle(tmp_path, "train-a", "node-07", T0)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        before = (await c.get("/v1/nodes/node-07")).json()
        assert before["node"]["recommendation"] == "watch" and before["at"].startswith("2026-11-03T10:03:11")
        # An unrelated node's bundle, stamped 20 days on (a wrong clock on that node): node-07 stays as it was.
        store.record(diagnose(ib_bundle(tmp_path, "skewed", "node-50", T0 + timedelta(days=20))))
        after = (await c.get("/v1/nodes/node-07")).json()
        assert after["node"] == before["node"] and after["at"] == before["at"]
        # Time passing, not a new episode, lets the episode leave the window.
        clock[0] = _at(T0 + timedelta(days=15))
        later = (await c.get("/v1/nodes/node-07")).json()
        assert later["node"]["recommendation"] == "ok" and later["at"].startswith("2026-11-17T10:03:11")


def test_nodes_judges_now_unless_told(tmp_path, prefix):
    store = NodeHealthStore(REDIS_URL, prefix)
    old = T0 - timedelta(days=400)
    store.record(diagnose(xid79_bundle(tmp_path, "long-ago", "node-07", old)))
    env = {**os.environ, "FIRSTFAULT_REDIS_URL": REDIS_URL, "FIRSTFAULT_REDIS_PREFIX": prefix}
    env.pop("FIRSTFAULT_TOPOLOGY", None)

    def run(*args: str) -> dict:
        out = subprocess.run([sys.executable, "-m", "firstfault", "nodes", "--json", *args], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    now = run()
    assert datetime.fromisoformat(now["at"].replace("Z", "+00:00")) > old + timedelta(days=300)
    assert now["nodes"][0]["recommendation"] == "ok"                   # 400 days old: out of the window
    then = run("--at", (old + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ"))
    assert then["nodes"][0]["recommendation"] == "watch"


# ---------------------------------------------------------------- retention

@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_the_record_drops_episodes_older_than_the_window_and_a_margin(tmp_path, prefix, backend):
    template = diagnose(xid79_bundle(tmp_path, "tpl", "node-01", T0))
    store = NodeHealthStore(REDIS_URL if backend == "redis" else None, prefix,
                            clock=lambda: _at(T0 + timedelta(days=40)))
    assert store.retention == timedelta(days=14 + 2 + 1)         # window, margin, a day for slow steps
    store.record(retarget(template, "old", "node-01", T0))
    store.record(retarget(template, "recent", "node-02", T0 + timedelta(days=10)))
    assert store.hosts() == ["node-01", "node-02"]
    store.record(retarget(template, "new", "node-03", T0 + timedelta(days=20)))       # 20 days on: node-01's goes
    assert store.hosts() == ["node-02", "node-03"]
    assert store.record(retarget(template, "late", "node-04", T0 + timedelta(days=2))) == []   # older than kept
    if backend == "redis":
        import redis

        r = redis.Redis.from_url(REDIS_URL)
        assert not r.exists(f"{prefix}node:node-01") and not r.exists(f"{prefix}node-episodes:0:old")
        assert r.zcard(f"{prefix}node-times") == 2
    report, _ = FleetMemory(store, clock=lambda: _at(T0 + timedelta(days=21))).report(Policy())
    assert [n.host for n in report.nodes] == ["node-02", "node-03"]


def test_an_episode_stamped_in_the_future_does_not_drop_the_present(tmp_path):
    template = diagnose(xid79_bundle(tmp_path, "tpl", "node-01", T0))
    store = NodeHealthStore(None, clock=lambda: _at(T0 + timedelta(days=1)))
    store.record(retarget(template, "today", "node-01", T0))
    store.record(retarget(template, "year-2099", "node-02", T0 + timedelta(days=400)))
    assert store.hosts() == ["node-01", "node-02"]
    state = FleetState(Policy())            # the state's watermark is capped by the now it is given, too
    state.absorb_diagnosis(retarget(template, "a", "node-01", T0), T0 + timedelta(hours=1))
    state.absorb_diagnosis(retarget(template, "b", "node-02", T0 + timedelta(days=400)), T0 + timedelta(hours=1))
    assert state.hosts() == ["node-01", "node-02"] and state.final is not None and state.final < to_us(T0)


def test_the_state_keeps_the_window_and_margin_whatever_it_has_seen():
    policy = Policy(window_days=2, retain_margin_days=1, cycle_s=600)
    base = random_history(random.Random(3), 1)[0].episodes[0]
    state = FleetState(policy)
    kept = []
    for i in range(60 * 48):                   # one episode every half hour for 60 days
        at = T0 + timedelta(minutes=30 * i)
        e = base.model_copy(update={"host": f"n{i % 40:02d}", "workload_id": f"w{i}", "at": at.strftime(
            "%Y-%m-%dT%H:%M:%S.000Z")})
        state.absorb(f"0:w{i}", None, [e], at)
        kept.append(len(state.index))
    # window + margin + a cycle or two of slack, at two an hour; never more, however long it runs
    assert max(kept[48 * 10:]) <= (2 + 1) * 48 + 8 and len(state.index.attempts) <= (2 + 1) * 48 + 8
    assert len(state.replay.journal) <= 1 * 24 * 6 + 2                 # steps within the margin only


# ---------------------------------------------------------------- the service: pages, changes not the record

@pytest.mark.anyio
async def test_nodes_come_a_page_at_a_time(tmp_path):
    template = diagnose(xid79_bundle(tmp_path, "tpl", "node-01", T0))
    clock = _at(T0 + timedelta(days=1))
    app = create_app(ServiceSettings(), clock=lambda: clock)
    hosts = [f"node-{i:03d}" for i in range(103)]
    for i, h in enumerate(hosts):
        app.state.ctx.nodes.record(retarget(template, f"w{i}", h, T0 + timedelta(minutes=7 * i)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        seen, cursor, pages = [], None, 0
        while True:
            page = (await c.get("/v1/nodes", params={"limit": 40, **({"cursor": cursor} if cursor else {})})).json()
            assert len(page["nodes"]) <= 40 and page["policy"]["window_days"] == 14
            seen += [n["host"] for n in page["nodes"]]
            cursor, pages = page["next_cursor"], pages + 1
            if cursor is None:
                break
        assert seen == hosts and pages == 3
        one = (await c.get("/v1/nodes/node-102")).json()["node"]
        assert one["recommendation"] == "watch" and one["episodes"][0]["workload_id"] == "w102"
        assert (await c.get("/v1/nodes", params={"limit": 0})).status_code == 422
        first = await c.get("/ui/nodes")            # 100 a page
        assert first.status_code == 200 and "node-099" in first.text and "node-100" not in first.text
        assert 'href="/ui/nodes?cursor=node-099"' in first.text
        assert "node-102" in (await c.get("/ui/nodes", params={"cursor": "node-099"})).text


@pytest.mark.anyio
async def test_requests_read_what_changed_not_the_whole_record(tmp_path, prefix, monkeypatch):
    template = diagnose(xid79_bundle(tmp_path, "tpl", "node-01", T0))
    app = create_app(ServiceSettings(redis_url=REDIS_URL, redis_prefix=prefix),
                     clock=lambda: _at(T0 + timedelta(days=1)))
    ctx = app.state.ctx
    ctx.nodes.record(retarget(template, "a", "node-01", T0))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        assert [n["host"] for n in (await c.get("/v1/nodes")).json()["nodes"]] == ["node-01"]
        monkeypatch.setattr(NodeHealthStore, "records", lambda *a, **k: pytest.fail("the whole record was read"))
        for i in range(2, 5):
            ctx.nodes.record(retarget(template, f"w{i}", f"node-{i:02d}", T0 + timedelta(hours=i)))
            got = (await c.get("/v1/nodes")).json()["nodes"]
            assert [n["host"] for n in got][-1] == f"node-{i:02d}"
        assert (await c.get("/v1/nodes/node-04")).json()["node"]["recommendation"] == "watch"
        assert ctx.fleet.reloads == 1
        ctx.nodes.clear()                     # a rebuild starts: the changelog's gap sends the reader back
        assert (await c.get("/v1/nodes")).json()["nodes"] == [] and ctx.fleet.reloads == 2


def test_the_recovery_sink_judges_the_diagnosis_nodes_and_keeps_no_diagnosis_of_its_own(tmp_path, prefix,
                                                                                        monkeypatch):
    fleet = NodeHealthStore(REDIS_URL, prefix)
    cfg = RecoveryConfig(fleet_size=512, audit_log=tmp_path / "audit.jsonl", max_fleet_fraction=0.5)
    clock = iter(range(1_800_000_000, 1_800_100_000, 10))
    sink = RecoverySink(cfg, out=open(os.devnull, "w"), clock=lambda: float(next(clock)), fleet=fleet)
    monkeypatch.setattr(NodeHealthStore, "records", lambda *a, **k: pytest.fail("the whole record was read"))
    first = diagnose(ib_bundle(tmp_path, "job-1", "node-03", T0))
    second = diagnose(ib_bundle(tmp_path, "job-2", "node-03", T0 + timedelta(days=2)))
    assert sink.handle(first).decision == "refused"
    # `first` was judged, not recorded: `second` is still a first weak episode on node-03.
    rec = sink.handle(second)
    assert rec.decision == "refused" and "a first weak episode never drains" in rec.reason
    fleet.record(first)                       # now the record holds it: the next one repeats
    third = diagnose(ib_bundle(tmp_path, "job-3", "node-03", T0 + timedelta(days=3)))
    rec = sink.handle(third)
    assert rec.decision == "dry_run" and rec.nodes == ["node-03"], rec


def test_a_report_before_the_final_steps_is_replayed_afresh_and_says_so():
    policy = Policy(window_days=1, retain_margin_days=0.1, cycle_s=600, broad_threshold=3)
    history = random_history(random.Random(5), 40, span_s=86400)
    state = FleetState(policy)
    for a in history:
        state.absorb(a.key, a.revision, a.episodes, a.when)
    assert state.final is not None and len(state.index) == sum(len(a.episodes) for a in history)   # none dropped
    at = from_us(state.final) - timedelta(hours=3)
    report, _ = state.report(at)
    assert report.notes[-1].startswith(f"evaluated at {report.at}, before this record's final steps")
    expected = evaluate(records_of(history), policy, None, at)
    assert report.model_copy(update={"notes": report.notes[:-1]}) == expected
