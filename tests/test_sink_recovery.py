"""Recovery sink: dry-run commands, guards, the audit log, execution through a stand-in scontrol."""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from firstfault.connectors.sinks import recovery
from firstfault.connectors.sinks.recovery import AuditRecord, RecoveryConfig, RecoverySink
from firstfault.rules.engine import analyze_path

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
STANDINS = Path(__file__).parent / "fixtures" / "slurm" / "bin"


@pytest.fixture(scope="module")
def diag():
    return {n: analyze_path(SAMPLES / n).diagnosis for n in
            ("worked-example", "ambiguous-two-faults", "unattributed-straggler", "gpu-fell-off-bus-32node",
             "host-oom-killer")}


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make(tmp_path, clock=None, **cfg) -> tuple[RecoverySink, io.StringIO]:
    out = io.StringIO()
    cfg.setdefault("fleet_size", 512)
    cfg.setdefault("audit_log", tmp_path / "audit.jsonl")
    return RecoverySink(RecoveryConfig(**cfg), out=out, clock=clock or Clock()), out


def audit(tmp_path) -> list[AuditRecord]:
    return [AuditRecord.model_validate_json(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]


def on(d, node: str, i: int):
    """The same fault on another node: a different diagnosis."""
    return d.model_copy(update={"workload_id": f"slurm-{7000 + i}", "diagnosis_id": f"sha256:{i:032x}",
                                "responsible_nodes": [node],
                                "recovery": d.recovery.model_copy(update={"nodes": [node]})})


def test_worked_example_prints_the_drain_command(tmp_path, diag):
    sink, out = make(tmp_path)
    d = diag["worked-example"]
    rec = sink.handle(d)
    assert out.getvalue() == (f'DRY-RUN scontrol update NodeName=node-02 State=DRAIN '
                              f'Reason="firstfault: nvlink_signal_integrity {d.diagnosis_id}"\n')
    assert rec.decision == "dry_run" and rec.nodes == ["node-02"]
    [logged] = audit(tmp_path)
    assert logged == rec and logged.dry_run is True and logged.workload_id == "slurm-4471823"


def test_ambiguous_and_unattributed_print_nothing(tmp_path, diag):
    sink, out = make(tmp_path)
    a = sink.handle(diag["ambiguous-two-faults"])
    u = sink.handle(diag["unattributed-straggler"])
    assert out.getvalue() == ""
    assert (a.decision, u.decision) == ("refused", "refused")
    assert "status ambiguous" in a.reason and "status unattributed" in u.reason
    assert [r.decision for r in audit(tmp_path)] == ["refused", "refused"]


def test_allow_list_and_hints_without_a_node_action(tmp_path, diag):
    sink, out = make(tmp_path, allow_sub_domains=["pcie_error"])
    assert "not on the allow-list" in sink.handle(diag["worked-example"]).reason
    assert sink.handle(diag["gpu-fell-off-bus-32node"]).decision == "dry_run"
    assert "asks for no node action" in sink.handle(diag["host-oom-killer"]).reason     # notify_owner
    prov = on(diag["gpu-fell-off-bus-32node"], "gpu-100", 1).model_copy(update={"provisional": True, "revision": 0})
    assert "provisional" in sink.handle(prov).reason
    assert out.getvalue().count("DRY-RUN") == 1


def test_the_final_diagnosis_acts_after_its_provisional_twin_was_refused(tmp_path, diag):
    # The correlator publishes a provisional diagnosis at the end event; when no late line
    # changes the evidence, the final one carries the same diagnosis_id.
    sink, out = make(tmp_path)
    final = diag["worked-example"]
    prov = final.model_copy(update={"provisional": True})
    assert "provisional" in sink.handle(prov).reason
    assert sink.handle(final).decision == "dry_run"
    assert out.getvalue().count("DRY-RUN") == 1


def test_at_most_n_nodes_per_hour(tmp_path, diag):
    clock = Clock()
    sink, out = make(tmp_path, clock, max_nodes_per_hour=2)
    d = diag["gpu-fell-off-bus-32node"]
    decisions = [sink.handle(on(d, f"gpu-{n:03d}", n)).decision for n in (1, 2, 3)]
    assert decisions == ["dry_run", "dry_run", "refused"]
    assert audit(tmp_path)[-1].reason.startswith("rate limit: 2 node(s) in the last hour")
    clock.t += 3601
    assert sink.handle(on(d, "gpu-004", 4)).decision == "dry_run"
    assert out.getvalue().count("DRY-RUN") == 3


def test_never_more_than_a_fraction_of_the_fleet(tmp_path, diag):
    clock = Clock()
    sink, _ = make(tmp_path, clock, fleet_size=100, max_fleet_fraction=0.02, max_nodes_per_hour=100)
    d = diag["gpu-fell-off-bus-32node"]
    assert [sink.handle(on(d, f"gpu-{n:03d}", n)).decision for n in (1, 2, 3)] == ["dry_run", "dry_run", "refused"]
    assert "fleet fraction: 3 of 100" in audit(tmp_path)[-1].reason
    clock.t += 86401                                         # the window slides
    assert sink.handle(on(d, "gpu-003", 5)).decision == "dry_run"
    unknown, _ = make(tmp_path / "u", fleet_size=None)
    assert "fleet size unknown" in unknown.handle(d).reason


def test_limits_and_once_only_survive_a_restart(tmp_path, diag):
    clock = Clock()
    d = diag["gpu-fell-off-bus-32node"]
    first, _ = make(tmp_path, clock, max_nodes_per_hour=2)
    first.handle(on(d, "gpu-001", 1))
    first.handle(on(d, "gpu-002", 2))
    again, out = make(tmp_path, clock, max_nodes_per_hour=2)    # a new process reads the audit log
    assert again.handle(on(d, "gpu-001", 1)).reason == "duplicate"
    assert again.handle(on(d, "gpu-003", 3)).reason.startswith("rate limit")
    assert again.handle(on(d, "gpu-002", 9)).reason == "every node was already drained by firstfault"
    assert out.getvalue() == ""
    with (tmp_path / "audit.jsonl").open("a") as fh:            # a torn line from a crash is skipped
        fh.write('{"ts": "2026-')
    make(tmp_path, clock)


def test_execute_runs_scontrol(tmp_path, diag, monkeypatch):
    monkeypatch.setenv("PATH", f"{STANDINS}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_STANDIN_LOG", str(tmp_path / "scontrol.log"))
    sink, out = make(tmp_path, execute=True)
    d = diag["worked-example"]
    rec = sink.handle(d)
    assert rec.decision == "acted" and out.getvalue() == ""
    # first the node's state (an already drained node is left alone), then the drain
    asked, argv = [json.loads(x) for x in (tmp_path / "scontrol.log").read_text().splitlines()]
    assert asked == ["scontrol", "-o", "show", "node", "node-02"]
    assert argv == ["scontrol", "update", "NodeName=node-02", "State=DRAIN",
                    f"Reason=firstfault: nvlink_signal_integrity {d.diagnosis_id}"]
    monkeypatch.setenv("SLURM_STANDIN_FAIL", "1")
    failed = sink.handle(on(diag["gpu-fell-off-bus-32node"], "gpu-017", 1))
    assert failed.decision == "failed" and "Invalid node name" in failed.detail["failed"]["gpu-017"]
    assert [r.decision for r in audit(tmp_path)] == ["acted", "failed"]
    assert sink.registry.get_sample_value("firstfault_recovery_decisions_total", {"decision": "failed"}) == 1


def test_kubernetes_cordon_and_the_command_line(tmp_path, diag, capsys):
    sink, out = make(tmp_path, scheduler="kubernetes")
    sink.handle(diag["gpu-fell-off-bus-32node"])
    assert out.getvalue() == "DRY-RUN kubectl cordon gpu-017\n"
    files = []
    for name in ("worked-example", "ambiguous-two-faults"):
        f = tmp_path / f"{name}.json"
        f.write_text(diag[name].to_json())
        files.append(str(f))
    code = recovery.main([*files, "--fleet-size", "64", "--audit-log", str(tmp_path / "cli-audit.jsonl")])
    captured = capsys.readouterr()
    assert code == 0
    assert captured.out.startswith("DRY-RUN scontrol update NodeName=node-02 State=DRAIN Reason=\"firstfault: ")
    assert captured.out.count("\n") == 1 and "REFUSED slurm-4472230#0: status ambiguous" in captured.err


def hint(d, nodes: list[str], i: int):
    """The same fault whose recovery hint names ``nodes`` (hostlist expressions allowed)."""
    return d.model_copy(update={"workload_id": f"slurm-{8000 + i}", "diagnosis_id": f"sha256:{0xfeed00 + i:032x}",
                                "recovery": d.recovery.model_copy(update={"nodes": nodes})})


def test_a_hostlist_counts_every_node_it_names(tmp_path, diag):
    # Finding 4 of issue 10: gpu[001-512] counted as one node and drained 512 past a cap of 4.
    sink, out = make(tmp_path, max_nodes_per_hour=4)
    d = diag["gpu-fell-off-bus-32node"]
    rec = sink.handle(hint(d, ["gpu[001-512]"], 1))
    assert rec.decision == "refused" and rec.commands == [] and out.getvalue() == ""
    assert rec.reason.startswith("rate limit: 0 node(s) in the last hour, at most 4")
    assert len(rec.nodes) == 512 and rec.nodes[0] == "gpu001" and rec.nodes[-1] == "gpu512"


def test_a_small_hostlist_gets_one_command_per_node_and_counts_them(tmp_path, diag):
    sink, out = make(tmp_path, max_nodes_per_hour=4)
    d = diag["gpu-fell-off-bus-32node"]
    rec = sink.handle(hint(d, ["gpu[001-002],gpu007", "gpu002"], 1))
    assert rec.decision == "dry_run" and rec.nodes == ["gpu001", "gpu002", "gpu007"]
    assert [line.split()[3] for line in out.getvalue().splitlines()] == [
        "NodeName=gpu001", "NodeName=gpu002", "NodeName=gpu007"]
    assert "[" not in out.getvalue()
    # 3 real nodes in the hour: one more fits the cap of 4, two more do not.
    assert sink.handle(hint(d, ["gpu[008-009]"], 2)).reason.startswith("rate limit: 3 node(s)")
    assert sink.handle(hint(d, ["gpu[007-008]"], 3)).nodes == ["gpu008"]       # gpu007 was already drained
    again, _ = make(tmp_path, max_nodes_per_hour=4)                              # restart: the log counts 4
    assert again.handle(hint(d, ["gpu010"], 4)).reason.startswith("rate limit: 4 node(s)")


@pytest.mark.parametrize("nodes, why", [
    (["gpu[001-"], "cannot expand the node list 'gpu[001-'"),
    (["gpu[5-1]"], "cannot expand"),
    (["gpu[0-999999999999]"], "expands to more than 1024 hosts"),
    (["gpu[0001-0600]", "cpu[0001-0600]"], "names more than 1024 nodes"),
    (["node-01 State=RESUME"], "not a slurm node name: 'State=RESUME'"),   # whitespace splits a hostlist
    (["node=01"], "not a slurm node name: 'node=01'"),
])
def test_a_node_list_that_cannot_be_expanded_is_refused_with_no_command(tmp_path, diag, nodes, why):
    sink, out = make(tmp_path, max_nodes_per_hour=10_000, max_fleet_fraction=1.0, fleet_size=100_000)
    rec = sink.handle(hint(diag["gpu-fell-off-bus-32node"], nodes, 1))
    assert rec.decision == "refused" and why in rec.reason and rec.commands == [] and out.getvalue() == ""
    [logged] = audit(tmp_path)
    assert logged.reason == rec.reason and logged.detail["hint"] == nodes


def test_kubernetes_refuses_a_name_that_is_not_a_node(tmp_path, diag):
    sink, out = make(tmp_path, scheduler="kubernetes")
    rec = sink.handle(hint(diag["gpu-fell-off-bus-32node"], ["gpu[001-512]"], 1))
    assert rec.decision == "refused" and "not a kubernetes node name" in rec.reason and out.getvalue() == ""
