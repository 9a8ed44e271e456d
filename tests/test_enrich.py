"""Enrichment: inventory validation, scheduler context and topology, correlation across workloads."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from firstfault.connectors.enrich import EnrichedDiagnosis, Inventory, correlate, enrich
from firstfault.rules.engine import analyze_path
from firstfault.schemas import WorkloadRecord

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"

INVENTORY = """
version: 1
hosts:
  node-06: {rack: r13, leaf_switch: leaf-13a}
groups:
  - hosts: "node-[01-04]"
    rack: r12
    leaf_switch: leaf-12a
    nvlink_domain: nvl72-03
  - hosts: "node-[10-12]"
    rack: r12
    leaf_switch: leaf-12b
"""


@pytest.fixture(scope="module")
def worked():
    return analyze_path(SAMPLES / "worked-example").diagnosis


@pytest.fixture(scope="module")
def inventory() -> Inventory:
    return Inventory.model_validate(yaml.safe_load(INVENTORY))


def slurm_record(wid: str, nodes: list[str], end: datetime) -> WorkloadRecord:
    return WorkloadRecord(workload_id=wid, attempt=0, scheduler="slurm", state="FAILED", exit_code="1:0",
                          start_time=end - timedelta(minutes=20), end_time=end, nodes=nodes, gpus_per_node=8,
                          user="mchen", job_name="llama-pretrain", partition="gpu", account="ml-research")


def test_inventory_expands_groups_and_rejects_mistakes(inventory, tmp_path):
    table = inventory.table()
    assert table["node-03"].rack == "r12" and table["node-03"].nvlink_domain == "nvl72-03"
    assert table["node-11"].leaf_switch == "leaf-12b" and table["node-06"].nvlink_domain is None
    with pytest.raises(ValueError, match="listed twice"):
        Inventory.model_validate({"hosts": {"node-02": {"rack": "r1"}}, "groups": [{"hosts": "node-[01-02]", "rack": "r2"}]})
    with pytest.raises(ValueError):
        Inventory.model_validate({"hosts": {"node-02": {"rak": "r1"}}})        # a typo is an error
    with pytest.raises(ValueError):
        Inventory.model_validate({"version": 2})
    with pytest.raises(ValueError):
        Inventory.model_validate({"groups": [{"hosts": "node-[05-01]", "rack": "r1"}]})
    f = tmp_path / "inv.yaml"
    f.write_text(INVENTORY)
    assert Inventory.load(f).table() == table


def test_enrich_adds_scheduler_context_and_topology(worked, inventory):
    wl = slurm_record("slurm-4471823", ["node-01", "node-02", "node-03", "node-04"],
                      datetime(2026, 11, 2, 10, 13, 19, tzinfo=timezone.utc))
    e = enrich(worked, wl, inventory)
    assert (e.workload.user, e.workload.job_name, e.workload.partition, e.workload.gpu_count) == \
        ("mchen", "llama-pretrain", "gpu", 32)
    assert [(h.host, h.role, h.rack, h.leaf_switch, h.nvlink_domain) for h in e.topology.hosts] == \
        [("node-02", "responsible", "r12", "leaf-12a", "nvl72-03")]
    assert e.topology.racks == ["r12"]
    assert e.diagnosis.to_dict() == worked.to_dict()             # the contract object is untouched
    assert e.to_dict()["diagnosis"] == worked.to_dict()
    # Kubernetes: the namespace stands where the partition would
    k8s = WorkloadRecord(workload_id="k8s-ml-team.llama-ft", scheduler="kubernetes", state="Failed/OOMKilled",
                         start_time=wl.start_time, nodes=["gpu-a01"], gpus_per_node=8, namespace="ml-team")
    info = enrich(worked, k8s).workload
    assert info.namespace == "ml-team" and info.partition is None and info.gpu_count == 8
    assert enrich(worked).topology.hosts[0].known is False


def test_ambiguous_candidates_are_placed(inventory):
    amb = analyze_path(SAMPLES / "ambiguous-two-faults").diagnosis
    e = enrich(amb, None, inventory)
    roles = {(h.host, h.role) for h in e.topology.hosts}
    assert roles == {("node-06", "candidate"), ("node-03", "candidate")}
    assert e.topology.racks == ["r12", "r13"]


def test_failures_sharing_a_rack_within_the_window_say_so(worked, inventory):
    t = datetime(2026, 11, 2, 10, 13, 19, tzinfo=timezone.utc)
    a = enrich(worked.model_copy(update={"workload_id": "slurm-1"}), slurm_record("slurm-1", ["node-01", "node-02"], t),
               inventory)
    other = worked.model_copy(update={"workload_id": "slurm-2", "responsible_nodes": ["node-11"],
                                      "diagnosis_id": "sha256:other"})
    b = enrich(other, slurm_record("slurm-2", ["node-11"], t + timedelta(minutes=25)), inventory)
    late = worked.model_copy(update={"workload_id": "slurm-3", "responsible_nodes": ["node-12"],
                                     "diagnosis_id": "sha256:late"})
    c = enrich(late, slurm_record("slurm-3", ["node-12"], t + timedelta(hours=3)), inventory)
    clean = analyze_path(SAMPLES / "clean-completion").diagnosis.model_copy(update={"suspect_nodes": ["node-03"]})
    d = enrich(clean, slurm_record("slurm-4", ["node-03"], t), inventory)
    out = correlate([a, b, c, d], window_s=3600)
    ca, cb, cc, cd = (x.correlated for x in out)
    assert [(x.dimension, x.value, [p.workload_id for p in x.others]) for x in ca] == [("rack", "r12", ["slurm-2"])]
    assert [(x.dimension, x.value, [p.workload_id for p in x.others]) for x in cb] == [("rack", "r12", ["slurm-1"])]
    assert cb[0].others[0].hosts == ["node-02"] and "share rack r12" in cb[0].message
    assert cc == [] and cd == []                       # three hours later; a job that completed
    assert correlate([a, b], window_s=60)[0].correlated == []
    assert isinstance(out[0], EnrichedDiagnosis) and out[0].diagnosis == a.diagnosis
    # the same workload attempt seen twice (a revision) is not its own neighbour
    assert correlate([a, a.model_copy()], window_s=3600)[0].correlated == []
