"""The recovery a diagnosis proposes follows the vendor's resolution and never acts on the wrong node.

Issue 13: a contained Xid 94 restarts the application, an Xid 79 drains the node, a CUDA OOM
notifies the owner with no node, and a node fault whose host no line names goes to a person.
Lines: the Xid 94 example of NVIDIA's Xid catalog (as in rules/catalog/extract/nvidia.yaml), the
Xid 79 line of a gpu-burn report (NVIDIA/open-gpu-kernel-modules), behind a syslog header; the
OOM traceback of OFA-Sys/OFA#271.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from firstfault.rules.engine import analyze_path

from conftest import BASE_WORKLOAD

ROOT = Path(__file__).resolve().parent.parent
XID94 = ("Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, "
         "Contained: CE User Channel (0x9). RST: No, D-RST: No\n")
XID79 = "Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.\n"
OOM = ("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
       "capacity of 79.15 GiB of which 1.02 GiB is free.\n")


def test_contained_xid_94_restarts_the_application_and_drains_nothing(make_bundle):
    d = analyze_path(make_bundle(BASE_WORKLOAD, {"logs/syslog/node-02.log": XID94})).diagnosis
    assert d.status == "attributed" and d.sub_domain == "gpu_memory_ecc"
    assert d.recovery.action == "retry" and d.recovery.nodes == []
    assert "RESTART_APP" in d.recovery.reason


def test_xid_79_drains_the_node_that_logged_it(make_bundle):
    d = analyze_path(make_bundle(BASE_WORKLOAD, {"logs/syslog/node-02.log": XID79})).diagnosis
    assert d.sub_domain == "gpu_fell_off_bus"
    assert d.recovery.action == "drain_nodes" and d.recovery.nodes == ["node-02"]
    assert d.recovery.next_step and "node-02" in d.recovery.reason


def test_cuda_oom_notifies_the_owner_with_no_node(make_bundle):
    d = analyze_path(make_bundle(BASE_WORKLOAD, {"logs/app/node-01.log": OOM})).diagnosis
    assert d.sub_domain == "cuda_oom"
    assert d.recovery.action == "notify_owner" and d.recovery.nodes == []
    assert "not at fault" in d.recovery.reason


def test_a_node_fault_with_no_host_named_goes_to_a_person_not_a_blind_retry(tmp_path):
    log = tmp_path / "dmesg.txt"
    log.write_text("[74889.644138] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.\n")
    d = analyze_path(log).diagnosis
    assert d.sub_domain == "gpu_fell_off_bus" and d.responsible_nodes == []
    assert d.recovery.action == "notify_owner" and d.recovery.nodes == []
    assert d.recovery.next_step.startswith("find the host")


def test_corpus_recovery_labels_follow_the_written_policy():
    """corpus/label_recovery.py --check: every case carries the action its label implies."""
    run = subprocess.run([sys.executable, str(ROOT / "corpus" / "label_recovery.py"), "--check"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
