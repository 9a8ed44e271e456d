#!/usr/bin/env python3
"""Benchmark: the fleet memory at a fleet's size, against the old whole-recompute path.

    python bench/bench_fleet.py [--episodes 100000] [--nodes 10000] [--days 14] [--requests 600]
                                [--redis URL] [--json]

Diagnoses are made from one real one (samples/gpu-fell-off-bus-32node, re-aimed at other
nodes and times): one-node failures on random nodes, 2% of nodes taking 10% of them,
some ambiguous ones naming two nodes, and a burst on 150 nodes every few days (a broad event).
The policy is FACT's but for a 10-minute cycle and a broad threshold of 100 nodes: with 16
nodes an hour, every cycle of a fleet this busy would be a broad event.

1. absorb: each diagnosis into a fleet state, in arrival order (up to 6 h late); then each
   through the store and the service's fleet memory (record, then sync), as POST /v1/analyze
   and the node-health worker do.
2. requests: the service (in process, its ASGI app, clock injected) with every diagnosis
   recorded: GET /v1/nodes?limit=100&cursor=..., GET /v1/nodes/{node} and /ui/nodes, one
   new diagnosis recorded and 12 s of clock between requests (the fleet's rate). The first
   request reads the record (cold); the figures are the rest.
3. memory: the state's allocations (tracemalloc) at a quarter, half and all of the nodes
   (10 episodes each), and after as many days again of diagnoses (retention).
4. rebuild: a fresh state given the same diagnoses in the same order gives the same report
   at the same instant, every node; and a state loaded from the store's snapshot (every kept
   episode, oldest first, as a restarted service reads it): how many nodes differ.
5. yardstick: the old path (every node's record read, then ``evaluate`` over it, per request)
   against the new one on the same small record (2,000 one-node episodes, 61 minutes apart,
   as the issue measured), with the verdicts compared.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import sys
import time
import tracemalloc
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
T0 = datetime(2026, 9, 1, tzinfo=timezone.utc)
STEP_S = 12.0              # clock between two requests in the request phase
FAMILY_SUBS = {"gpu": "gpu_fell_off_bus", "interconnect": "nvlink_error", "network": "ib_link_error",
               "host": "pcie_error", "storage": "storage_io_error"}


def template():
    from firstfault.rules.engine import analyze_path

    return analyze_path(str(ROOT / "samples" / "gpu-fell-off-bus-32node")).diagnosis


def make(tpl, i: int, hosts: list[str], at: datetime, family: str, ambiguous: bool = False):
    """A diagnosis of workload ``i`` blaming ``hosts[0]`` at ``at`` (ambiguous: suspecting each of ``hosts``)."""
    from firstfault.rules.fleet import iso
    from firstfault.schemas.diagnosis import Candidate

    stamp = iso(at)
    sub = FAMILY_SUBS[family]
    if ambiguous:
        cands = [Candidate(domain=family, sub_domain=sub, nodes=[h], coverage=0.5, evidence=[], message=sub,
                           onset=stamp) for h in hosts]
        return tpl.model_copy(update={"workload_id": f"job-{i}", "diagnosis_id": f"d-{i}", "status": "ambiguous",
                                      "root_cause": None, "responsible_nodes": [], "candidates": cands,
                                      "summary": f"workload {i}: {sub} on {' or '.join(hosts)}"})
    rc = tpl.root_cause.model_copy(update={"host": hosts[0], "onset": stamp, "timestamp": stamp, "domain": family,
                                           "sub_domain": sub})
    return tpl.model_copy(update={"workload_id": f"job-{i}", "diagnosis_id": f"d-{i}", "domain": family,
                                  "sub_domain": sub, "root_cause": rc, "responsible_nodes": hosts[:1],
                                  "recovery": tpl.recovery.model_copy(update={"nodes": hosts[:1]}),
                                  "summary": f"workload {i}: {sub} on {hosts[0]}"})


def workload(tpl, n: int, nodes: int, days: float, start: datetime, seed: int = 1, first: int = 0):
    """``n`` diagnoses over ``days`` from ``start``, in arrival order: [(arrival, diagnosis)].

    One-node failures (2% of the nodes take 10% of them), 5% ambiguous between two nodes, and
    every 3 days a burst on 150 nodes at once (a broad event). Most arrive within 10 minutes of
    the failure, 30% up to 6 hours later."""
    rng = random.Random(seed)
    hosts = [f"gpu{i:05d}" for i in range(nodes)]
    bad = hosts[: max(1, nodes // 50)]
    span = days * 86400.0
    bursts = {int(n * b / span) for b in range(3 * 86400, int(span), 3 * 86400)} if n > 1000 else set()
    out: list = []
    while len(out) < n:
        k = len(out)
        t = start + timedelta(seconds=span * k / n)
        fam = rng.choice(list(FAMILY_SUBS))
        i = first + k
        if k in bursts and k + 150 <= n:
            out += [(t.timestamp() + rng.uniform(0, 1800), make(tpl, i + j, [h], t, fam))
                    for j, h in enumerate(rng.sample(hosts, 150))]
            continue
        if rng.random() < 0.05:
            d = make(tpl, i, sorted(rng.sample(hosts, 2)), t, fam, ambiguous=True)
        else:
            d = make(tpl, i, [rng.choice(bad) if rng.random() < 0.1 else rng.choice(hosts)], t, fam)
        out.append((t.timestamp() + (rng.uniform(0, 6 * 3600) if rng.random() < 0.3 else rng.uniform(0, 600)), d))
    out.sort(key=lambda p: p[0])
    return out


class gc_watch:
    """How often the garbage collector ran while requests were measured, and for how long."""

    def __init__(self) -> None:
        self.runs: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._t = 0.0
        gc.callbacks.append(self.callback)

    def callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.runs[info["generation"]].append(time.perf_counter() - self._t)

    def summary(self) -> dict:
        return {f"gen{g}": {"runs": len(v), "max_ms": round(max(v, default=0) * 1e3, 1)} for g, v in self.runs.items()}


def drop(store) -> None:
    """Forget a store the bench made (in Redis: every key under its prefix)."""
    store.clear()
    if store._r is not None:
        keys = list(store._r.scan_iter(match=f"{store.prefix}*", count=1000))
        for i in range(0, len(keys), 500):
            store._r.delete(*keys[i:i + 500])


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))] if xs else float("nan")


def ms(xs: list[float]) -> dict:
    return {"n": len(xs), "p50_ms": round(pct(xs, 0.5) * 1e3, 3), "p99_ms": round(pct(xs, 0.99) * 1e3, 3),
            "max_ms": round(max(xs) * 1e3, 1) if xs else None,
            "mean_ms": round(statistics.fmean(xs) * 1e3, 3) if xs else None}


def absorb_phase(policy, arrivals) -> tuple[object, dict]:
    from firstfault.rules.fleet_state import FleetState

    state = FleetState(policy)
    lat = []
    for arr, d in arrivals:
        now = datetime.fromtimestamp(arr, timezone.utc)
        t = time.perf_counter()
        state.absorb_diagnosis(d, now)
        lat.append(time.perf_counter() - t)
    return state, ms(lat)


def store_phase(policy, arrivals, redis_url: str | None, count: int) -> dict:
    """record + sync per diagnosis through a store (memory, or Redis), as the service does."""
    from firstfault.connectors.sinks.fleet_memory import FleetMemory
    from firstfault.connectors.sinks.node_health import NodeHealthStore, retention_of

    clock = [arrivals[0][0]]
    store = NodeHealthStore(redis_url, f"ffbench-{random.getrandbits(32):08x}:", retention=retention_of(policy),
                            clock=lambda: clock[0])
    memory = FleetMemory(store, clock=lambda: clock[0])
    memory.report(policy, limit=1)
    rec, sync = [], []
    try:
        for arr, d in arrivals[:count]:
            clock[0] = arr
            t = time.perf_counter()
            store.record(d)
            t1 = time.perf_counter()
            with memory._lock:
                memory._sync(policy)
            t2 = time.perf_counter()
            rec.append(t1 - t)
            sync.append(t2 - t1)
    finally:
        drop(store)
    return {"backend": store.backend, "record": ms(rec), "sync": ms(sync),
            "record_and_sync": ms([a + b for a, b in zip(rec, sync)])}


async def request_phase(policy, arrivals, extra, requests: int, redis_url: str | None = None, seed: int = 2) -> dict:
    from firstfault.connectors.api.app import create_app
    from firstfault.connectors.api.settings import ServiceSettings

    for k, v in {"AVOID_CYCLE_S": str(policy.cycle_s), "AVOID_BROAD_THRESHOLD": str(policy.broad_threshold)}.items():
        os.environ[f"FIRSTFAULT_{k}"] = v
    os.environ.pop("FIRSTFAULT_TOPOLOGY", None)
    clock = [arrivals[0][0]]
    # With Redis the service holds only its fleet state, as deployed; without, the record is in process too.
    settings = (ServiceSettings(redis_url=redis_url, redis_prefix=f"ffbench-{random.getrandbits(32):08x}:")
                if redis_url else ServiceSettings())
    app = create_app(settings, clock=lambda: clock[0])
    ctx = app.state.ctx
    for arr, d in arrivals:
        clock[0] = arr
        ctx.nodes.record(d)
    try:
        return await _requests(app, ctx, clock, extra, requests, seed)
    finally:
        drop(ctx.nodes)


async def _requests(app, ctx, clock: list[float], extra, requests: int, seed: int) -> dict:
    import httpx

    rng = random.Random(seed)
    hosts = ctx.nodes.hosts()
    routes: dict[str, list[float]] = {"/v1/nodes": [], "/v1/nodes/{node}": [], "/ui/nodes": []}
    out: dict = {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://b", timeout=600) as c:
        t = time.perf_counter()
        r = await c.get("/v1/nodes", params={"limit": 100})
        out["cold_first_request_s"] = round(time.perf_counter() - t, 2)
        assert r.status_code == 200, r.text[:300]
        body = r.json()
        out["page_nodes"], out["broad_events"] = len(body["nodes"]), len(body["broad_events"])
        collections = gc_watch()
        for i in range(requests):
            clock[0] += STEP_S
            if i < len(extra):
                ctx.nodes.record(extra[i][1])
            kind = ("/v1/nodes", "/v1/nodes/{node}", "/ui/nodes")[i % 3]
            if kind == "/v1/nodes":
                path, params = "/v1/nodes", {"limit": 100, "cursor": rng.choice(hosts)}
            elif kind == "/ui/nodes":
                path, params = "/ui/nodes", {"cursor": rng.choice(hosts)}
            else:
                path, params = f"/v1/nodes/{rng.choice(hosts)}", {}
            t = time.perf_counter()
            r = await c.get(path, params=params)
            routes[kind].append(time.perf_counter() - t)
            assert r.status_code == 200, (path, r.text[:300])
        gc.callbacks.remove(collections.callback)
        out["gc_during_requests"] = collections.summary()
        full = await c.get("/v1/nodes", params={"limit": 1000})
        out["recommendations_first_1000"] = {k: sum(n["recommendation"] == k for n in full.json()["nodes"])
                                             for k in ("avoid", "watch", "ok")}
    out["reloads"] = ctx.fleet.reloads
    out.update({k: ms(v) for k, v in routes.items()})
    return out


def memory_phase(tpl, policy, nodes: int, days: float) -> dict:
    """The state's allocations at 1/4, 1/2 and all of the nodes (10 episodes each, over ``days``),
    then, traced from the start, after ``days`` more days of diagnoses at the same rate (retention)."""
    from firstfault.rules.fleet_state import FleetState

    out: dict = {}
    for share in (4, 2, 1):
        n = nodes // share
        arrivals = workload(tpl, 10 * n, n, days, T0, seed=3)
        more = (workload(tpl, 10 * n, n, days, T0 + timedelta(days=days), seed=4, first=10 * n + 10)
                if share == 1 else [])
        gc.collect()
        tracemalloc.start()
        state = FleetState(policy)
        for arr, d in arrivals:
            state.absorb_diagnosis(d, datetime.fromtimestamp(arr, timezone.utc))
        gc.collect()
        cur, _ = tracemalloc.get_traced_memory()
        out[f"nodes_{n}"] = {"episodes": len(state.index), "mb": round(cur / 1e6, 1),
                             "bytes_per_node": int(cur / max(1, len(state.index.hosts)))}
        if more:
            for arr, d in more:
                state.absorb_diagnosis(d, datetime.fromtimestamp(arr, timezone.utc))
            gc.collect()
            later, _ = tracemalloc.get_traced_memory()
            out["after_more_days"] = {"days_absorbed": 2 * days, "diagnoses_absorbed": len(arrivals) + len(more),
                                      "episodes_kept": len(state.index), "kept_since": state.stats()["kept_since"],
                                      "mb": round(later / 1e6, 1)}
        tracemalloc.stop()
        del state
    return out


def rebuild_phase(policy, arrivals, state, redis_url: str | None) -> dict:
    """The same diagnoses in the same order give the same report; a snapshot load, how close."""
    from firstfault.connectors.sinks.fleet_memory import FleetMemory
    from firstfault.connectors.sinks.node_health import NodeHealthStore, retention_of
    from firstfault.rules.fleet_state import FleetState

    at = datetime.fromtimestamp(arrivals[-1][0] + 600, timezone.utc)
    live, _ = state.report(at)
    t = time.perf_counter()
    again = FleetState(policy)
    for arr, d in arrivals:
        again.absorb_diagnosis(d, datetime.fromtimestamp(arr, timezone.utc))
    rebuilt, _ = again.report(at)
    took = time.perf_counter() - t
    same = live.model_dump() == rebuilt.model_dump()
    clock = [arrivals[-1][0]]
    store = NodeHealthStore(redis_url, f"ffbench-{random.getrandbits(32):08x}:", retention=retention_of(policy),
                            clock=lambda: clock[0])
    try:
        for arr, d in arrivals:
            clock[0] = arr
            store.record(d)
        t = time.perf_counter()
        loaded, _ = FleetMemory(store, clock=lambda: clock[0]).report(policy, at=at)
        load_s = time.perf_counter() - t
    finally:
        drop(store)
    a = {n.host: (n.recommendation, n.since) for n in live.nodes}
    b = {n.host: (n.recommendation, n.since) for n in loaded.nodes}
    recs = sum(a.get(h, (None,))[0] != b.get(h, (None,))[0] for h in set(a) | set(b))
    return {"same_order_identical": same, "same_order_rebuild_s": round(took, 1), "nodes": len(live.nodes),
            "snapshot_load_s": round(load_s, 1), "snapshot_backend": store.backend,
            "snapshot_recommendation_differs": recs,
            "snapshot_since_differs": sum(a.get(h) != b.get(h) for h in set(a) | set(b)) - recs}


async def yardstick(tpl, n: int = 2000) -> dict:
    """The old whole-recompute request against the new one, on one small record."""
    from firstfault.connectors.sinks.fleet_memory import FleetMemory
    from firstfault.connectors.sinks.node_health import NodeHealthStore
    from firstfault.rules.fleet import Policy, evaluate

    policy = Policy()
    store = NodeHealthStore(None, retention=timedelta(days=3650))
    for i in range(n):
        store.record(make(tpl, i, [f"n{i:05d}"], T0 + timedelta(minutes=61 * i), "host"))
    at = T0 + timedelta(minutes=61 * n + 60)
    t = time.perf_counter()
    old = evaluate(store.records(), policy, None, at)
    old.model_dump(mode="json")
    old_s = time.perf_counter() - t
    memory = FleetMemory(store, clock=lambda: at.timestamp())
    t = time.perf_counter()
    memory.report(policy, limit=100)
    cold_s = time.perf_counter() - t
    warm = []
    for i in range(30):
        t = time.perf_counter()
        r, _ = memory.report(policy, at=at + timedelta(seconds=i), limit=100)
        r.model_dump(mode="json")
        warm.append(time.perf_counter() - t)
    new_all, _ = memory.report(policy, at=at)
    # The new record keeps the window and a margin: a node it dropped must be `ok` in the old report.
    kept = {v.host: v for v in new_all.nodes}
    same = all(v.model_dump(exclude={"episodes"}) == kept[v.host].model_dump(exclude={"episodes"})
               if v.host in kept else v.recommendation == "ok" for v in old.nodes)
    return {"episodes": n, "old_request_s": round(old_s, 2), "new_cold_s": round(cold_s, 3),
            "new_page_p50_ms": round(pct(warm, 0.5) * 1e3, 2),
            "speedup_vs_old": round(old_s / pct(warm, 0.5)), "verdicts_identical": same,
            "nodes_old": len(old.nodes), "nodes_kept": len(kept)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--episodes", type=int, default=100_000)
    p.add_argument("--nodes", type=int, default=10_000)
    p.add_argument("--days", type=float, default=14.0)
    p.add_argument("--requests", type=int, default=600)
    p.add_argument("--redis", default=None, help="also measure the Redis store (URL); keys under a prefix of its own")
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    from firstfault.rules.fleet import Policy

    load = os.getloadavg()
    policy = Policy(cycle_s=600.0, broad_threshold=100)
    tpl = template()
    result: dict = {"episodes": args.episodes, "nodes": args.nodes, "days": args.days,
                    "policy": {"cycle_s": policy.cycle_s, "broad_threshold": policy.broad_threshold,
                               "window_days": policy.window_days, "retain_margin_days": policy.retain_margin_days},
                    "load_average_at_start": [round(x, 2) for x in load]}
    t0 = time.perf_counter()
    arrivals = workload(tpl, args.episodes, args.nodes, args.days, T0)
    # One new diagnosis per request, 12 s of clock apart: the fleet's rate (7,142 a day).
    extra = workload(tpl, args.requests, args.nodes, args.requests * STEP_S / 86400,
                     datetime.fromtimestamp(arrivals[-1][0], timezone.utc), seed=9, first=args.episodes + 10)
    result["generate_s"] = round(time.perf_counter() - t0, 1)
    # The generated diagnoses are the harness's, not the fleet memory's: keep the garbage collector
    # from walking them (a service holds no such list). The state's own objects are not frozen.
    gc.collect()
    gc.freeze()
    state, result["absorb_state"] = absorb_phase(policy, arrivals)
    result["state"] = state.stats()
    result["absorb_store_memory"] = store_phase(policy, arrivals, None, 20_000)
    if args.redis:
        result["absorb_store_redis"] = store_phase(policy, arrivals, args.redis, 5_000)
    result["requests"] = asyncio.run(request_phase(policy, arrivals, extra, args.requests, args.redis))
    result["requests"]["store"] = "redis" if args.redis else "memory"
    result["rebuild"] = rebuild_phase(policy, arrivals, state, None)
    del state
    if not args.skip_memory:
        result["memory"] = memory_phase(tpl, policy, args.nodes, args.days)
    result["yardstick"] = asyncio.run(yardstick(tpl))
    result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result["total_s"] = round(time.perf_counter() - t0, 1)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    rq, ab = result["requests"], result["absorb_state"]
    print(f"fleet memory: {args.episodes:,} diagnoses on {args.nodes:,} nodes over {args.days:g} days "
          f"(load average {load[0]:.2f} at start, {result['load_average_at_end'][0]:.2f} at end)")
    print(f"  absorb, state:        p50 {ab['p50_ms']} ms  p99 {ab['p99_ms']} ms  max {ab['max_ms']} ms "
          f"(mean {ab['mean_ms']} ms)")
    for key in ("absorb_store_memory", "absorb_store_redis"):
        if key in result:
            s = result[key]
            print(f"  record+sync, {s['backend']:<7} p50 {s['record_and_sync']['p50_ms']} ms  "
                  f"p99 {s['record_and_sync']['p99_ms']} ms  max {s['record_and_sync']['max_ms']} ms")
    print(f"  kept: {result['state']['episodes']:,} episodes, {result['state']['nodes']:,} nodes; "
          f"{result['state']['avoided']} avoid, {result['state']['waiting']} waiting for their turn")
    print(f"  service on the {rq['store']} store; first request (reads the record): {rq['cold_first_request_s']} s")
    for route in ("/v1/nodes", "/v1/nodes/{node}", "/ui/nodes"):
        print(f"  GET {route:<18} p50 {rq[route]['p50_ms']} ms  p99 {rq[route]['p99_ms']} ms  "
              f"max {rq[route]['max_ms']} ms  ({rq[route]['n']} requests)")
    g = rq["gc_during_requests"]
    print("  garbage collections meanwhile: "
          + ", ".join(f"{k} {v['runs']} (max {v['max_ms']} ms)" for k, v in g.items()))
    rb = result["rebuild"]
    print(f"  rebuild, same order: identical={rb['same_order_identical']} ({rb['nodes']:,} nodes, "
          f"{rb['same_order_rebuild_s']} s); from the store's snapshot: {rb['snapshot_recommendation_differs']} "
          f"recommendations and {rb['snapshot_since_differs']} 'since' differ ({rb['snapshot_load_s']} s)")
    if "memory" in result:
        m = result["memory"]
        for k, v in m.items():
            if k.startswith("nodes_"):
                print(f"  memory {k[6:]:>6} nodes: {v['mb']} MB ({v['bytes_per_node']} B/node, "
                      f"{v['episodes']:,} episodes)")
        a = m["after_more_days"]
        print(f"  after {a['diagnoses_absorbed']:,} diagnoses over {a['days_absorbed']:g} days: {a['episodes_kept']:,} "
              f"episodes kept (since {a['kept_since']}), {a['mb']} MB")
    y = result["yardstick"]
    print(f"  yardstick, {y['episodes']:,} one-node episodes: old request {y['old_request_s']} s, new page "
          f"{y['new_page_p50_ms']} ms (x{y['speedup_vs_old']:,}), first {y['new_cold_s']} s; verdicts identical: "
          f"{y['verdicts_identical']} ({y['nodes_kept']:,} of {y['nodes_old']:,} nodes kept, the rest `ok`)")
    print(f"  total {result['total_s']} s")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
