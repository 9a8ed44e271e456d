"""Fleet memory: episodes from real diagnoses, the FACT policy, shared causes, repeating attempts.

The diagnoses come from the engine on real log lines (tests/fleet_bundles.py); the record
lives in the real Redis under a prefix of this test's own, deleted afterwards; the command
runs as a user runs it (a subprocess of `firstfault nodes`), the service through its ASGI app.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest

from firstfault.connectors.api.app import create_app
from firstfault.connectors.api.settings import ServiceSettings
from firstfault.connectors.sinks.node_health import NodeHealthStore
from firstfault.connectors.sinks.recovery import RecoveryConfig, RecoverySink
from firstfault.connectors.sinks.redis_store import DiagnosisStore
from firstfault.connectors.topology_map import TopologyError, load_topology
from firstfault.rules.attempts import escalate
from firstfault.rules.fleet import Policy, episodes_from, evaluate

from conftest import redis_key_prefix

from fleet_bundles import T0, diagnose, ib_bundle, xid79_bundle

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
ROOT = Path(__file__).resolve().parents[1]
TOPOLOGY_CONF = """# leaf switches first, then the spine (Slurm topology/tree)
SwitchName=leaf1 Nodes=node[01-04]
SwitchName=leaf2 Nodes=node[05-08]
SwitchName=leaf3 Nodes=node[09-24]
SwitchName=spine1 Switches=leaf[1-3]
"""


@pytest.fixture
def prefix():
    with redis_key_prefix(REDIS_URL, "fleet") as p:
        yield p


@pytest.fixture
def anyio_backend():
    return "asyncio"


# The record's tests judge at a fixed instant, not the clock: the end of the cycle of their newest episode.
JUDGED = {"day0": "2026-11-02T11:00:00Z", "day3": "2026-11-05T11:00:00Z"}


def nodes_cli(prefix: str, *args: str) -> dict:
    env = {**os.environ, "FIRSTFAULT_REDIS_URL": REDIS_URL, "FIRSTFAULT_REDIS_PREFIX": prefix}
    env.pop("FIRSTFAULT_TOPOLOGY", None)
    out = subprocess.run([sys.executable, "-m", "firstfault", "nodes", "--json", *args], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def view(report: dict, host: str) -> dict:
    return next(n for n in report["nodes"] if n["host"] == host)


# ---------------------------------------------------------------- episodes

def test_an_attributed_xid79_makes_one_gpu_episode_at_its_onset(tmp_path):
    d = diagnose(xid79_bundle(tmp_path, "train-a", "node-07", T0))
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_fell_off_bus", ["node-07"])
    [e] = episodes_from(d, fallback_at="2030-01-01T00:00:00Z")
    assert (e.host, e.family, e.role, e.sub_domain, e.workload_id) == ("node-07", "gpu", "attributed",
                                                                      "gpu_fell_off_bus", "train-a")
    assert e.at.startswith("2026-11-02T10:03:1")       # the root onset, not the fallback, not the clock


def test_weak_ib_evidence_makes_suspect_network_episodes_and_application_faults_none():
    weak = diagnose(ROOT / "corpus" / "real" / "net-unattr-ibstatus12-nccl-1405" / "input")
    assert weak.status == "unattributed" and weak.suspect_nodes
    eps = episodes_from(weak, fallback_at="2026-11-02T10:00:00Z")
    assert {(e.host, e.family, e.role) for e in eps} == {(h, "network", "suspect") for h in weak.suspect_nodes}
    app = diagnose(ROOT / "samples" / "cuda-oom-one-rank")
    assert app.domain == "application" and episodes_from(app, fallback_at="2026-11-02T10:00:00Z") == []


# ---------------------------------------------------------------- the acceptance cases

@pytest.mark.anyio
async def test_two_xid79_workloads_on_one_node_make_it_avoid(tmp_path, prefix):
    judged = datetime.fromisoformat(JUDGED["day3"]).timestamp()
    app = create_app(ServiceSettings(redis_url=REDIS_URL, redis_prefix=prefix), clock=lambda: judged)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        for wid, at in (("train-a", T0), ("train-b", T0 + timedelta(days=3))):
            bundle = xid79_bundle(tmp_path, wid, "node-07", at)
            tar = subprocess.run(["tar", "-czf", "-", "-C", str(bundle), "."], capture_output=True, check=True).stdout
            r = await c.post("/v1/analyze", content=tar, headers={"content-type": "application/gzip"})
            assert r.status_code == 200 and r.json()["sub_domain"] == "gpu_fell_off_bus", r.text[:300]
        report = nodes_cli(prefix, "--at", JUDGED["day3"])
        node = view(report, "node-07")
        assert node["recommendation"] == "avoid", node
        assert node["counts"] == {"gpu": 2} and "2 gpu episodes within 14 days" in node["why"]
        assert {e["workload_id"] for e in node["episodes"]} == {"train-a", "train-b"}
        # The same over HTTP and on the page; the older per-host route still answers.
        one = (await c.get("/v1/nodes/node-07")).json()
        assert one["node"]["recommendation"] == "avoid"
        assert (await c.get("/v1/nodes")).json()["nodes"][0]["host"] == "node-07"
        assert (await c.get("/v1/nodes/node-42")).json()["node"]["recommendation"] == "ok"
        page = await c.get("/ui/nodes")
        assert page.status_code == 200 and "avoid" in page.text and "node-07" in page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert (await c.get("/ui/nodes/node-07")).text.count("gpu_fell_off_bus") >= 2
        old = (await c.get("/v1/nodes/node-07/diagnoses")).json()
        assert [i["role"] for i in old["items"]] == ["responsible", "responsible"]
    # Outside the window (evaluated 20 days later) the avoid lapses: the record fails open.
    later = nodes_cli(prefix, "--at", "2026-11-25T00:00:00Z")
    assert view(later, "node-07")["recommendation"] == "ok"


def test_at_most_one_new_avoid_per_cycle(tmp_path, prefix):
    store = NodeHealthStore(REDIS_URL, prefix)
    for host in ("node-07", "node-08"):
        for wid, at in ((f"{host}-a", T0), (f"{host}-b", T0 + timedelta(minutes=10))):
            store.record(diagnose(xid79_bundle(tmp_path, wid, host, at)))
    report = nodes_cli(prefix, "--at", JUDGED["day0"])
    recs = {n["host"]: n["recommendation"] for n in report["nodes"]}
    assert sorted(recs.values()) == ["avoid", "watch"], recs
    waiting = next(n for n in report["nodes"] if n["recommendation"] == "watch")
    assert "at most 1 new avoid per cycle" in waiting["why"]
    # The next cycle avoids the other one.
    nxt = nodes_cli(prefix, "--at", "2026-11-02T12:30:00Z")
    assert {n["recommendation"] for n in nxt["nodes"]} == {"avoid"}


def test_twenty_nodes_suspect_at_once_are_a_broad_event_with_no_avoid(tmp_path, prefix):
    store = NodeHealthStore(REDIS_URL, prefix)
    # node09 had an IB episode the day before: with the broad event counted it would be avoided.
    store.record(diagnose(ib_bundle(tmp_path, "early", "node09", T0 - timedelta(days=1))))
    hosts = [f"node{i:02d}" for i in range(5, 25)]          # 20 nodes, leaf2 and leaf3
    for i, h in enumerate(hosts):
        store.record(diagnose(ib_bundle(tmp_path, f"job-{h}", h, T0 + timedelta(seconds=30 * i))))
    topo = tmp_path / "topology.conf"
    topo.write_text(TOPOLOGY_CONF)
    report = nodes_cli(prefix, "--topology", str(topo), "--at", JUDGED["day0"])
    [broad] = report["broad_events"]
    assert broad["nodes"] == hosts and "broad event" in broad["note"]
    assert all(n["recommendation"] != "avoid" for n in report["nodes"]), report["nodes"]
    assert "broad event" in view(report, "node09")["why"]
    # The 20 span two leaves under one spine: the spine is the switch they all share.
    assert [(c["kind"], c["name"], len(c["nodes"])) for c in broad["shared_causes"]] == [("switch", "spine1", 20)]
    # Control: with a higher threshold the same record does avoid node09 (the check can fail).
    env_report = evaluate(store.records(), Policy(broad_threshold=25))
    assert [n.host for n in env_report.nodes if n.recommendation == "avoid"] == ["node09"]


def test_ib_link_errors_on_four_nodes_under_one_leaf_name_the_switch(tmp_path, prefix):
    store = NodeHealthStore(REDIS_URL, prefix)
    for i, h in enumerate(["node01", "node02", "node03", "node04"]):
        d = diagnose(ib_bundle(tmp_path, f"job-{h}", h, T0 + timedelta(minutes=2 * i)))
        assert (d.status, d.sub_domain) == ("attributed", "ib_link_error")
        store.record(d)
    store.record(diagnose(ib_bundle(tmp_path, "elsewhere", "node06", T0 + timedelta(minutes=1))))
    topo = tmp_path / "topology.conf"
    topo.write_text(TOPOLOGY_CONF)
    report = nodes_cli(prefix, "--topology", str(topo), "--at", JUDGED["day0"])
    [cause] = report["shared_causes"]
    assert (cause["kind"], cause["name"], cause["level"]) == ("switch", "leaf1", 0)
    assert cause["nodes"] == ["node01", "node02", "node03", "node04"] and cause["of"] == 5
    assert len(cause["episodes"]) == 4 and all("ib_link_error" in e for e in cause["episodes"])
    assert "leaf switch leaf1" in cause["why"]
    # Without the topology the report says a topology would help.
    bare = nodes_cli(prefix, "--at", JUDGED["day0"])
    assert bare["shared_causes"] == [] and any("topology" in n for n in bare["notes"])


@pytest.mark.anyio
async def test_attempt_1_failing_like_attempt_0_on_the_same_node_escalates(tmp_path, prefix):
    app = create_app(ServiceSettings(redis_url=REDIS_URL, redis_prefix=prefix))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        got = []
        for attempt in (0, 1, 2):
            bundle = ib_bundle(tmp_path, "train-x", "node-02", T0 + timedelta(hours=attempt), attempt=attempt)
            tar = subprocess.run(["tar", "-czf", "-", "-C", str(bundle), "."], capture_output=True, check=True).stdout
            r = await c.post("/v1/analyze", content=tar, headers={"content-type": "application/gzip"})
            assert r.status_code == 200, r.text[:300]
            got.append(r.json())
    assert got[0]["recovery"]["action"] == "retry_excluding_nodes"          # the catalog's own action
    assert got[1]["recovery"]["action"] == "drain_nodes" and got[1]["recovery"]["nodes"] == ["node-02"]
    assert got[1]["recovery"]["reason"].startswith("repeats attempt 0 (the same ib_link_error on node-02)")
    assert "Attempt 1 failed like attempt 0" in got[1]["summary"]
    assert got[2]["recovery"]["action"] == "drain_nodes" and "repeats attempt 1" in got[2]["recovery"]["reason"]
    # What was stored is what was answered.
    stored = DiagnosisStore(REDIS_URL, prefix).latest("train-x", 1)
    assert stored is not None and stored.recovery.action == "drain_nodes"


def test_escalation_ladder_is_pure_and_idempotent(tmp_path):
    a0 = diagnose(ib_bundle(tmp_path, "w", "node-02", T0))
    a1 = diagnose(ib_bundle(tmp_path, "w", "node-02", T0 + timedelta(hours=1), attempt=1))
    once = escalate(a1, a0)
    assert once.recovery.action == "drain_nodes" and escalate(once, a0) == once
    assert escalate(a1, None) == a1
    other = diagnose(xid79_bundle(tmp_path, "w2", "node-05", T0))            # different node, different family
    assert escalate(a1, other.model_copy(update={"workload_id": "w", "attempt": 0})) == a1
    # An application fault that repeats stops retrying: it is never drained.
    oom = diagnose(ROOT / "samples" / "cuda-oom-one-rank")
    nxt = oom.model_copy(update={"attempt": oom.attempt + 1})
    assert escalate(nxt, oom).recovery.action == oom.recovery.action == "notify_owner"
    assert "repeats attempt" in escalate(nxt, oom).recovery.reason


def test_recovery_sink_escalates_and_drains_only_repeat_offenders(tmp_path, prefix):
    fleet, history = NodeHealthStore(REDIS_URL, prefix), DiagnosisStore(REDIS_URL, prefix)
    cfg = RecoveryConfig(fleet_size=512, audit_log=tmp_path / "audit.jsonl", max_fleet_fraction=0.5)
    clock = iter(range(1_800_000_000, 1_800_100_000, 10))
    sink = RecoverySink(cfg, out=open(os.devnull, "w"), clock=lambda: float(next(clock)), fleet=fleet,
                        history=history)
    # A first IB episode on node-03: the hint is to retry without it; it is not drained.
    first = diagnose(ib_bundle(tmp_path, "job-1", "node-03", T0))
    rec = sink.handle(first)
    assert rec.decision == "refused" and "a first weak episode never drains" in rec.reason
    fleet.record(first)
    # A second workload's IB episode on the same node: a repeat offender, drained (dry run).
    second = diagnose(ib_bundle(tmp_path, "job-2", "node-03", T0 + timedelta(days=2)))
    rec = sink.handle(second)
    assert rec.decision == "dry_run" and rec.nodes == ["node-03"], rec
    assert rec.detail["escalated"].startswith("repeat offender: node-03: 2 network episodes")
    # Attempt 1 of a workload failing like its stored attempt 0 escalates inside the sink too.
    a0 = diagnose(ib_bundle(tmp_path, "job-3", "node-04", T0, attempt=0))
    history.save(a0)
    a1 = diagnose(ib_bundle(tmp_path, "job-3", "node-04", T0 + timedelta(hours=1), attempt=1))
    rec = sink.handle(a1)
    assert rec.recovery_action == "drain_nodes" and rec.decision == "dry_run" and rec.nodes == ["node-04"]


def test_rebuilding_the_record_replaces_a_revision_and_ignores_a_late_lower_one(tmp_path, prefix):
    store = NodeHealthStore(REDIS_URL, prefix)
    d = diagnose(xid79_bundle(tmp_path, "w", "node-07", T0))
    assert store.record(d.model_copy(update={"revision": 1})) and store.hosts() == ["node-07"]
    assert store.record(d.model_copy(update={"revision": 0})) == []           # late and lower: ignored
    moved = d.model_copy(update={"revision": 2, "responsible_nodes": ["node-08"],
                                 "root_cause": d.root_cause.model_copy(update={"host": "node-08"})})
    store.record(moved)
    assert list(store.records()) == ["node-08"]
    assert store.record(d.model_copy(update={"provisional": True})) == []
    assert store.clear() > 0 and store.records() == {}


def test_topology_forms(tmp_path):
    conf = tmp_path / "topology.conf"
    conf.write_text(TOPOLOGY_CONF)
    t = load_topology(conf)
    groups = {g.name: g for g in t.groups}
    assert groups["leaf1"].nodes == {"node01", "node02", "node03", "node04"} and groups["leaf1"].level == 0
    assert groups["spine1"].level == 1 and len(groups["spine1"].nodes) == 24
    y = tmp_path / "racks.yaml"
    y.write_text("racks:\n  r12: node[01-02]\n  r13: [node03, node04]\n")
    assert {g.name: sorted(g.nodes) for g in load_topology(y).groups} == {"r12": ["node01", "node02"],
                                                                          "r13": ["node03", "node04"]}
    k = tmp_path / "nodes.json"
    k.write_text(json.dumps({"kind": "NodeList", "items": [
        {"metadata": {"name": n, "labels": {"network.topology.nvidia.com/block": "b1",
                                            "topology.kubernetes.io/zone": "z1"}}} for n in ("n1", "n2")]}))
    assert {(g.kind, g.name, g.level) for g in load_topology(k).groups} == {("switch", "b1", 0), ("zone", "z1", 3)}
    bad = tmp_path / "bad.conf"
    bad.write_text("SwitchName=s1 Nodes=node[3-1]\n")
    with pytest.raises(TopologyError, match="bad.conf:1"):
        load_topology(bad)


def test_no_data_fails_open_and_bad_settings_are_one_line(prefix, tmp_path):
    report = nodes_cli(prefix)
    assert report["nodes"] == [] and any("fails open" in n for n in report["notes"])
    env = {**os.environ, "FIRSTFAULT_REDIS_URL": REDIS_URL, "FIRSTFAULT_REDIS_PREFIX": prefix,
           "FIRSTFAULT_AVOID_WINDOW_DAYS": "-3"}
    out = subprocess.run([sys.executable, "-m", "firstfault", "nodes"], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.startswith("firstfault: FIRSTFAULT_AVOID_WINDOW_DAYS")
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    missing = subprocess.run([sys.executable, "-m", "firstfault", "nodes", "--topology", str(tmp_path / "nope")],
                             env={**env, "FIRSTFAULT_AVOID_WINDOW_DAYS": "14"}, cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 2 and "cannot read topology" in missing.stderr


def test_a_broad_event_in_the_cycle_still_running_avoids_no_node(tmp_path):
    diags = [diagnose(ib_bundle(tmp_path, f"job-{i}", f"n{i:02d}", T0 + timedelta(seconds=i))) for i in range(20)]
    diags += [diagnose(ib_bundle(tmp_path, "again", "n00", T0 + timedelta(seconds=40)))]
    records: dict = {}
    for d in diags:
        for e in episodes_from(d):
            records.setdefault(e.host, []).append(e)
    mid = T0 + timedelta(minutes=20)                 # evaluated inside the cycle of the event
    report = evaluate(records, Policy(), at=mid)
    assert len(report.broad_events) == 1 and not [n for n in report.nodes if n.recommendation == "avoid"]
    calm = evaluate({"n00": records["n00"]}, Policy(), at=mid)          # n00 alone: a repeat offender
    assert [n.recommendation for n in calm.nodes] == ["avoid"]
