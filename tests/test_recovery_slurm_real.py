"""The recovery sink against a real slurmctld (tests/slurm_cluster.py, nodes n1..n3 on one host).

In act mode the drain is a real ``scontrol update NodeName=... State=DRAIN Reason=...``, and
``sinfo`` shows what it did; a dry run (the default) leaves the node as it was; each guard
refuses for real, and the audit log says what was decided and why. Every test leaves the
nodes idle again (``State=RESUME``), so the tests stay independent of each other and of the
other Slurm tests of the session.
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from firstfault.connectors.sinks.recovery import AuditRecord, RecoveryConfig, RecoverySink
from firstfault.connectors.sinks.slurm_nodes import NodeState, parse_show_node
from firstfault.rules.engine import analyze_path
from firstfault.schemas import Diagnosis
from slurm_cluster import SlurmCluster, wait_for

pytest_plugins = ["conftest_slurm"]

NODES = ("n1", "n2", "n3")
WORKLOAD = {"workload_id": "slurm-9100", "attempt": 0, "scheduler": "slurm", "state": "FAILED", "exit_code": "1:0",
            "start_time": "2026-11-02T09:58:00Z", "end_time": "2026-11-02T10:21:14Z", "nodes": list(NODES)}
# The Xid 79 line of a gpu-burn report (NVIDIA/open-gpu-kernel-modules) behind a syslog header, as in
# tests/test_recovery_actions.py: the engine drains the host that logged it.
XID79 = "Nov  2 10:03:11 {host} kernel: NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.\n"


@pytest.fixture(scope="module")
def fell_off_bus(tmp_path_factory) -> dict[str, Diagnosis]:
    """The engine's diagnosis of an Xid 79 on each node: attributed, gpu_fell_off_bus, drain that node."""
    out = {}
    for node in NODES:
        root = tmp_path_factory.mktemp(f"xid79-{node}")
        (root / "workload.json").write_text(json.dumps(WORKLOAD))
        (root / "logs" / "syslog").mkdir(parents=True)
        (root / "logs" / "syslog" / f"{node}.log").write_text(XID79.format(host=node))
        d = analyze_path(root).diagnosis
        assert (d.status, d.sub_domain, d.recovery.action, d.recovery.nodes) == (
            "attributed", "gpu_fell_off_bus", "drain_nodes", [node]), d
        out[node] = d
    return out


def sinfo(c: SlurmCluster, node: str) -> tuple[str, str, str]:
    """(state, who set the reason, reason) as sinfo prints them: slurmctld's view, not the sink's."""
    line = c.run("sinfo", "--noheader", "--Node", f"--nodes={node}", "--format=%N|%T|%u|%E").stdout.strip()
    name, state, user, reason = line.split("|", 3)
    assert name == node, line
    return state, user, reason


@pytest.fixture
def cluster(slurm_cluster):
    """The session cluster with every node idle before the test and again after it."""
    c = slurm_cluster

    def all_idle() -> bool:
        return all(c.node_states().get(n) == "idle" for n in NODES)

    wait_for("nodes idle before the test", all_idle, 120, every_s=0.2)
    yield c
    for node, state in c.node_states().items():
        if state != "idle":
            c.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
    wait_for("nodes idle again after RESUME", all_idle, 120, every_s=0.2)


def make(tmp_path: Path, **cfg) -> tuple[RecoverySink, io.StringIO]:
    """A sink on this test's audit log; three nodes, limits wide open unless the test narrows them."""
    out = io.StringIO()
    cfg = {"fleet_size": len(NODES), "max_fleet_fraction": 1.0, "max_nodes_per_hour": len(NODES),
           "audit_log": tmp_path / "audit.jsonl", **cfg}
    return RecoverySink(RecoveryConfig(**cfg), out=out), out


def audit(tmp_path: Path) -> list[AuditRecord]:
    return [AuditRecord.model_validate_json(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]


def another(d: Diagnosis, i: int, nodes: list[str] | None = None) -> Diagnosis:
    """The same fault in another job (a different diagnosis), its hint naming ``nodes`` if given."""
    upd: dict = {"workload_id": f"slurm-{9200 + i}", "diagnosis_id": f"sha256:{0xd1a900 + i:032x}"}
    if nodes is not None:
        upd["recovery"] = d.recovery.model_copy(update={"nodes": nodes})
    return d.model_copy(update=upd)


def test_act_mode_drains_the_responsible_node(cluster, fell_off_bus, tmp_path):
    sink, out = make(tmp_path, execute=True)
    d = fell_off_bus["n2"]
    rec = sink.handle(d)
    reason = f"firstfault: gpu_fell_off_bus {d.diagnosis_id}"
    assert (rec.decision, rec.reason, rec.nodes, rec.dry_run) == ("acted", "all guards passed", ["n2"], False), rec
    assert rec.commands == [f'scontrol update NodeName=n2 State=DRAIN Reason="{reason}"']
    assert out.getvalue() == ""
    # slurmctld drained it, with our reason, set by the user the sink runs as
    assert sinfo(cluster, "n2") == ("drained", "root", reason)
    assert "State=IDLE+DRAIN " in cluster.run("scontrol", "-o", "show", "node", "n2").stdout
    assert cluster.node_states() == {"n1": "idle", "n2": "drained", "n3": "idle"}
    assert audit(tmp_path) == [rec]


def test_dry_run_is_the_default_and_leaves_the_node_idle(cluster, fell_off_bus, tmp_path):
    d = fell_off_bus["n1"]
    sink, out = make(tmp_path)
    rec = sink.handle(d)
    line = f'scontrol update NodeName=n1 State=DRAIN Reason="firstfault: gpu_fell_off_bus {d.diagnosis_id}"'
    assert (rec.decision, rec.dry_run, rec.commands) == ("dry_run", True, [line])
    assert out.getvalue() == f"DRY-RUN {line}\n"
    # The command line a user runs, on the same cluster (SLURM_CONF): it prints, and runs nothing.
    (tmp_path / "d.json").write_text(d.to_json())
    cli = subprocess.run([sys.executable, "-m", "firstfault.connectors.sinks.recovery", "--fleet-size", "3",
                          "--max-fleet-fraction", "1", "--audit-log", str(tmp_path / "cli.jsonl"),
                          str(tmp_path / "d.json")],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "SLURM_CONF": str(cluster.conf)})
    assert cli.returncode == 0 and cli.stdout == f"DRY-RUN {line}\n", cli.stderr
    assert sinfo(cluster, "n1") == ("idle", "Unknown", "none")
    assert set(cluster.node_states().values()) == {"idle"}


def test_fleet_fraction_refuses_for_real(cluster, fell_off_bus, tmp_path):
    sink, _ = make(tmp_path, execute=True, max_fleet_fraction=0.5)       # 1.5 of 3 nodes
    assert sink.handle(fell_off_bus["n1"]).decision == "acted"
    refused = sink.handle(fell_off_bus["n2"])
    assert (refused.decision, refused.reason) == ("refused", "fleet fraction: 2 of 3 nodes would exceed 50.0%")
    assert (refused.nodes, refused.commands, refused.detail) == (["n2"], [], {"drained": 2})
    assert cluster.node_states() == {"n1": "drained", "n2": "idle", "n3": "idle"}
    assert [r.decision for r in audit(tmp_path)] == ["acted", "refused"]


def test_rate_limit_refuses_for_real_and_across_a_restart(cluster, fell_off_bus, tmp_path):
    sink, _ = make(tmp_path, execute=True, max_nodes_per_hour=1)
    assert sink.handle(fell_off_bus["n1"]).decision == "acted"
    refused = sink.handle(fell_off_bus["n2"])
    assert (refused.decision, refused.reason) == ("refused", "rate limit: 1 node(s) in the last hour, at most 1")
    # a new process reads the audit log back: the hour is still full
    again, _ = make(tmp_path, execute=True, max_nodes_per_hour=1)
    assert again.handle(fell_off_bus["n3"]).reason.startswith("rate limit: 1 node(s)")
    assert cluster.node_states() == {"n1": "drained", "n2": "idle", "n3": "idle"}
    assert [r.decision for r in audit(tmp_path)] == ["acted", "refused", "refused"]


def test_a_node_firstfault_drained_is_not_drained_again(cluster, fell_off_bus, tmp_path):
    sink, _ = make(tmp_path, execute=True)
    d = fell_off_bus["n3"]
    assert sink.handle(d).decision == "acted"
    first = f"firstfault: gpu_fell_off_bus {d.diagnosis_id}"
    assert sink.handle(d).reason == "duplicate"
    later = sink.handle(another(d, 1))                           # a new diagnosis naming the same node
    assert (later.decision, later.reason) == ("refused", "every node was already drained by firstfault")
    assert later.commands == []
    assert sinfo(cluster, "n3") == ("drained", "root", first)     # the first diagnosis' reason stays


def test_a_node_slurm_already_took_out_keeps_its_reason(cluster, fell_off_bus, tmp_path):
    # An operator drained n2, and n3 went down: a drain would replace their reasons with ours.
    cluster.run("scontrol", "update", "NodeName=n2", "State=DRAIN", "Reason=ecc errors, RMA ticket 4411")
    cluster.run("scontrol", "update", "NodeName=n3", "State=DOWN", "Reason=no heartbeat")
    sink, _ = make(tmp_path, execute=True)
    alone = sink.handle(fell_off_bus["n2"])
    assert (alone.decision, alone.reason, alone.nodes, alone.commands) == (
        "refused", "every node is already drained or down in Slurm: its reason is kept", ["n2"], [])
    assert alone.detail == {"out_of_service": {"n2": {"state": "IDLE+DRAIN", "reason": "ecc errors, RMA ticket 4411",
                                                      "reason_by": "root"}}}
    # A hint naming all three (as a hostlist): only the node still in service is drained.
    d = another(fell_off_bus["n1"], 2, ["n[1-3]"])
    rec = sink.handle(d)
    assert (rec.decision, rec.nodes) == ("acted", ["n1"]), rec
    assert rec.commands == [
        f'scontrol update NodeName=n1 State=DRAIN Reason="firstfault: gpu_fell_off_bus {d.diagnosis_id}"']
    assert rec.detail["out_of_service"]["n3"]["state"].split("+")[0] == "DOWN"
    assert sinfo(cluster, "n2") == ("drained", "root", "ecc errors, RMA ticket 4411")
    assert sinfo(cluster, "n3")[2] == "no heartbeat"
    assert sinfo(cluster, "n1")[0] == "drained"
    # what was left alone does not count against the limits: one node acted on
    assert [n for _, n in sink.actions] == ["n1"]


def test_a_node_unknown_to_slurm_fails_and_the_audit_says_so(cluster, fell_off_bus, tmp_path):
    sink, _ = make(tmp_path, execute=True)
    d = another(fell_off_bus["n1"], 3, ["gpu-999"])
    rec = sink.handle(d)
    assert (rec.decision, rec.reason, rec.nodes) == ("failed", "a command failed", ["gpu-999"])
    # scontrol's own words (slurm_update error: ... ESLURM_INVALID_NODE_NAME)
    assert rec.detail == {"failed": {"gpu-999": "slurm_update error: Invalid node name specified"}}
    assert audit(tmp_path) == [rec]
    assert sink.registry.get_sample_value("firstfault_recovery_decisions_total", {"decision": "failed"}) == 1
    assert sink.actions == [] and set(cluster.node_states().values()) == {"idle"}


# Lines as Slurm 22.05's `scontrol -o show node` printed them on the test cluster (fields cut in the
# middle), and one with the Comment= that src/api/node_info.c prints after the reason when a node has one.
SHOW_NODE = (
    "NodeName=n1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=8 CPUTot=8 NodeAddr=127.0.0.1 "
    "NodeHostName=vm Port=54811 Version=22.05.8 RealMemory=1000 State=IDLE+DRAIN ThreadsPerCore=1 "
    "Partitions=main  CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 "
    "ExtSensorsTemp=n/s Reason=ecc errors [root@2026-12-06T11:48:56]\n"
    "NodeName=n2 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 State=IDLE ThreadsPerCore=1 ExtSensorsTemp=n/s\n"
    "NodeName=n3 Arch=x86_64 State=DOWN+NOT_RESPONDING ThreadsPerCore=1 Reason=Not responding "
    "[slurm@2026-12-06T11:50:02] Comment=rack 4\n"
    "Node nope not found\n")


def test_show_node_lines_are_read_as_slurm_prints_them():
    got = parse_show_node(SHOW_NODE)
    assert got == {"n1": NodeState("n1", "IDLE+DRAIN", "ecc errors", "root"), "n2": NodeState("n2", "IDLE"),
                   "n3": NodeState("n3", "DOWN+NOT_RESPONDING", "Not responding", "slurm")}
    assert [n for n, s in got.items() if s.out_of_service] == ["n1", "n3"]
    assert not NodeState("n4", "MIXED").out_of_service and NodeState("n4", "MIXED+DRAIN").out_of_service
