"""The InfiniBand / RoCE stack of a GPU node (mlx5_core's health poller and recovery, libmlx5, the
verbs examples and perftest, UCX's locked-memory hint) through the real engine. Patterns:
rules/catalog/extract/ib_fabric.yaml; roles: rules/catalog/early/ib_fabric.yaml; one fault, one
cause: final/identity.yaml's final.same.mlx5_pci_loss_is_its_health_work; the enumeration of the sites:
rules/emitters/ib_fabric.yaml (checked with the others in tests/test_docs.py).

The lines are copied from public reports (named above each); where a report wrapped a line or gave
no syslog prefix, the test adds the job's syslog prefix and host. Echoes (completion errors, a queue
pair with no reason) never drain or exclude a node; a locked-memory limit is the job's configuration,
never a node's fault; a port event of a finished run, or before the job, is no cause."""

from pathlib import Path

import pytest
import yaml

from catalog_rx import CatalogRx
from conftest import diag
from firstfault.rules.engine import analyze_path

ROOT = Path(__file__).resolve().parents[1]
EXTRACT = yaml.safe_load((ROOT / "rules" / "catalog" / "extract" / "ib_fabric.yaml").read_text(encoding="utf-8"))["patterns"]
SEVERE = ("drain_nodes", "retry_excluding_nodes")

WD = "".join(f"{r}: [rank{r}]:[E1102 10:13:12.044871 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective operation "
             "timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for 600054 "
             "milliseconds before timing out.\n" for r in range(8))


def kern(*lines: str, t: str = "10:03:11", host: str = "node-02") -> str:
    return "".join(f"Nov  2 {t} {host} kernel: {line}\n" for line in lines)


def hang_with(syslog_node02: str):
    """node-02's kernel lines while node-01's eight ranks time out in one collective."""
    return diag({"logs/syslog/node-02.log": syslog_node02, "logs/app/node-01.log": WD})


def rules_of(d) -> set[str]:
    return {e.rule_id for e in d.evidence}


# linux-pci <20250707103014.1279262-1-andy.xu@hj-micro.com>: a DPC containment on the root port of a
# ConnectX-7 (arm64 N2 server); both functions go through PCI error recovery and the health flow.
DPC_MAIL = """\
[ 81.012463] pcieport 0004:00:00.0: DPC: containment event, status:0x1f01 source:0x0000
[ 81.014536] pcieport 0004:00:00.0: DPC: unmasked uncorrectable error detected
[ 81.029598] pcieport 0004:00:00.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer, (Receiver ID)
[ 81.040830] pcieport 0004:00:00.0: device [0823:0110] error status/mask=00008000/04d40000
[ 81.049870] pcieport 0004:00:00.0: [ 0] ERCR (First)
[ 81.053520] pcieport 0004:00:00.0: AER: TLP Header: 60008010 010000ff 00001000 9c4c0000
[ 81.065793] mlx5_core 0004:01:00.0: mlx5_pci_err_detected Device state = 1 health sensors: 1 pci_status: 1. Enter, pci channel state = 2
[ 81.076183] mlx5_core 0004:01:00.0: mlx5_error_sw_reset:231:(pid 1618): start
[ 81.083307] mlx5_core 0004:01:00.0: mlx5_error_sw_reset:252:(pid 1618): PCI channel offline, stop waiting for NIC IFC
[ 81.077428] mlx5_core 0004:01:00.0: E-Switch: Disable: mode(LEGACY), nvfs(0), neovfs(0), active vports(0)
[ 81.486693] mlx5_core 0004:01:00.0: mlx5_wait_for_pages:786:(pid 1618): Skipping wait for vf pages stage
[ 82.395040] mlx5_core 0004:01:00.1: print_health:819:(pid 0): Fatal error detected
[ 82.395493] mlx5_core 0004:01:00.1: print_health_info:423:(pid 0): PCI slot 1 is unavailable
[ 83.431094] mlx5_core 0004:01:00.0: mlx5_pci_err_detected Device state = 2 pci_status: 0. Exit, result = 3, need reset
[ 83.442100] mlx5_core 0004:01:00.1: mlx5_pci_err_detected Device state = 2 health sensors: 1 pci_status: 1. Enter, pci channel state = 2
[ 85.201433] pcieport 0004:00:00.0: pciehp: Slot(41): Link Down
[ 85.815016] mlx5_core 0004:01:00.1: mlx5_health_try_recover:335:(pid 2239): handling bad device here
[ 85.853799] mlx5_core 0004:01:00.1: mlx5_health_wait_pci_up:325:(pid 2239): PCI channel offline, stop waiting for PCI
[ 85.863494] mlx5_core 0004:01:00.1: mlx5_health_try_recover:338:(pid 2239): health recovery flow aborted, PCI reads still not working
[ 85.873231] mlx5_core 0004:01:00.1: mlx5_pci_err_detected Device state = 2 pci_status: 0. Exit, result = 3, need reset
[ 86.115940] pcieport 0004:00:00.0: AER: subordinate device reset failed
[ 86.122557] pcieport 0004:00:00.0: AER: device recovery failed
"""

# linux-rdma <20251009142326.3794769-1-wenjian1@xiaomi.com>: a surprise link down of the HCA's slot.
HOTPLUG = ("pcieport 0000:b9:01.0: pciehp: Slot(2-4): Link Down",
           "pcieport 0000:b9:01.0: pciehp: Slot(2-4): Card not present",
           "mlx5_core 0000:bb:00.0: E-Switch: Unload vfs: mode(LEGACY), nvfs(0), necvfs(0), active vports(0)",
           "mlx5_core 0000:bb:00.0: E-Switch: Disable: mode(LEGACY), nvfs(0), necvfs(0), active vports(0)",
           "mlx5_core 0000:bb:00.0: poll_health:1083:(pid 0): Fatal error 1 detected",
           "mlx5_core 0000:bb:00.0: print_health_info:491:(pid 0): PCI slot is unavailable")

# netdev <20211222211201.77469-6-saeed@kernel.org>: an SF's recovery that could not enable the HCA.
SF_RECOVERY = ("mlx5_core.sf mlx5_core.sf.25: mlx5_health_try_recover:387:(pid 40948): starting health recovery flow",
               "mlx5_core 0000:03:00.0: mlx5_pci_slot_reset was called",
               "mlx5_core 0000:03:00.0: wait vital counter value 0xab175 after 1 iterations",
               "mlx5_core.sf mlx5_core.sf.25: firmware version: 24.32.532",
               "mlx5_core.sf mlx5_core.sf.25: mlx5_function_setup:1292:(pid 40948): enable hca failed",
               "mlx5_core.sf mlx5_core.sf.25: mlx5_health_try_recover:389:(pid 40948): health recovery failed")

# huggingface/accelerate#2960: libmlx5's dump of an error CQE, then NCCL's flush completions.
CQE_2960 = ("mlx5: SH-IDC1-10-140-24-95: got completion with error:\n"
            "00000000 00000000 00000000 00000000\n"
            "00000000 00000000 00000000 00000000\n"
            "00000001 00000000 00000000 00000000\n"
            "00000000 00008914 100009e8 000045d2\n"
            "SH-IDC1-10-140-24-95:214034:214782 [3] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer "
            "10.140.24.106<37760> with status=11 opcode=129 len=0 vendor err 137 (Flush)\n")

# openucx/ucx#8684 (UCX 1.13.1, Open MPI 5.0.0rc8).
MEMLOCK_8684 = ("ib_log.c:246  UCX  ERROR mlx5_0: ibv_create_cq() failed: Cannot allocate memory. Please set max locked memory "
                "(ulimit -l) to 'unlimited' (current: 64 kbytes)\n")

# uccl-project/uccl#641: every QP of a RoCE job fails its move to RTR while the ports read ACTIVE.
UCCL_641 = ("Verifying port state:\n"
            "  link_layer: Ethernet (RoCE)\n"
            "  port_state: ACTIVE\n"
            "Failed to modify QP to RTR: Connection timed out\n"
            "errno: 110\n"
            "Failed to modify QP to RTR: Connection timed out\n")


# ------------------------------------------------------------------ the patterns' own examples (Python re)

@pytest.mark.parametrize("pat", EXTRACT, ids=lambda p: p["id"])
def test_every_pattern_reads_its_real_lines_and_not_its_neighbours(pat):
    assert pat["id"].startswith("ibfabric.") and pat["references"]
    rx = CatalogRx(pat)
    for ex in pat["examples"]["match"]:
        assert rx.search(ex["line"]), (pat["id"], ex["line"])
    for line in pat["examples"]["no_match"]:
        assert not rx.search(line), (pat["id"], line)


# ------------------------------------------------------------------ one HCA, one PCI fault

def test_a_dpc_containment_on_an_hca_is_one_pcie_fault_not_two_candidates():
    # Before the identity relation the health work on the same function made this pcie_error vs ib_link_error.
    d = hang_with(kern(*DPC_MAIL.splitlines()))
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "pcie_error", ["node-02"])
    assert d.candidates == []
    assert "final.same.mlx5_pci_loss_is_its_health_work" in rules_of(d)
    assert d.recovery.action == "drain_nodes"


def test_the_dpc_mail_as_a_bare_dmesg_names_the_pcie_fault_and_no_node(tmp_path):
    p = tmp_path / "dmesg.txt"
    p.write_text(DPC_MAIL)
    d = analyze_path(p).diagnosis
    assert (d.status, d.sub_domain) == ("attributed", "pcie_error")
    assert d.responsible_nodes == [] and d.recovery.action == "notify_owner"


def test_an_hca_that_fell_off_the_bus_is_a_pcie_fault_of_its_host():
    d = hang_with(kern(*HOTPLUG))
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "pcie_error", ["node-02"])
    assert "early.ibfabric.mlx5_pci_gone" in rules_of(d)


def test_the_fatal_sensor_alone_names_the_pci_loss():
    d = hang_with(kern(*HOTPLUG[4:]))
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "pcie_error", ["node-02"])


def test_the_health_of_one_function_does_not_fold_into_the_other_function_s_pci_error():
    # The identity relation joins on the PCI address: 0004:01:00.0's error does not explain 0004:01:00.1's health work.
    d = hang_with(kern("[ 81.065793] mlx5_core 0004:01:00.0: mlx5_pci_err_detected Device state = 1 health sensors: 1 "
                       "pci_status: 1. Enter, pci channel state = 2",
                       "[ 85.815016] mlx5_core 0004:01:00.1: mlx5_health_try_recover:335:(pid 2239): handling bad device here"))
    assert "final.same.mlx5_pci_loss_is_its_health_work" not in rules_of(d)


def test_a_failed_health_recovery_is_an_hca_fault_of_its_host():
    d = hang_with(kern(*SF_RECOVERY))
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "ib_link_error", ["node-02"])
    assert d.recovery.action == "retry_excluding_nodes" and d.recovery.nodes == ["node-02"]


def test_a_reload_s_nic_disabled_sensor_is_no_cause():
    # linux-rdma <20251225132717.358820-6-mbloch@nvidia.com>: "Fatal error 3" while reloading the driver.
    d = hang_with(kern("mlx5_core 0000:08:00.0: poll_health:803:(pid 3021): Fatal error 3 detected"))
    assert d.status == "unattributed" and d.responsible_nodes == []
    assert d.recovery.action not in SEVERE


# ------------------------------------------------------------------ echoes never drain

def test_a_libmlx5_completion_dump_is_an_echo_naming_its_host_as_suspect():
    d = diag({"logs/app/train.log": CQE_2960})
    assert d.status == "unattributed"
    assert "SH-IDC1-10-140-24-95" in d.suspect_nodes
    assert "early.ibfabric.verbs_error_cqe" in rules_of(d)
    assert d.recovery.action not in SEVERE and d.responsible_nodes == []


def test_a_dump_from_an_unnamed_host_blames_no_host_called_mlx5():
    # OpenRLHF/OpenRLHF#621: gethostname() failed in the Ray actor, libmlx5 wrote host_unknown.
    d = diag({"logs/app/ray.log": "(LLMRayActor pid=90738, ip=172.19.24.110) mlx5: host_unknown: got completion with error:\n"})
    assert "mlx5" not in d.suspect_nodes and d.responsible_nodes == []
    assert d.recovery.action not in SEVERE


def test_the_cqe_dump_beside_the_peer_s_gpu_loss_is_that_fault_s_echo():
    xid79 = "Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
    d = diag({"logs/app/node-01.log": "mlx5: node-01: got completion with error:\n", "logs/syslog/node-02.log": xid79})
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_fell_off_bus", ["node-02"])


def test_a_perftest_qp_that_never_reached_rtr_without_a_reason_is_an_echo():
    # linux-rdma/perftest#393: a port that requires a GRH; perftest prints no errno.
    d = diag({"logs/app/bw.log": "Failed to modify QP 122273 to RTR\n Unable to Connect the HCA's through the link\n"
                                 "Failed to modify QP 122272 to RTR\n Unable to Connect the HCA's through the link\n"})
    assert d.status == "unattributed" and d.recovery.action not in SEVERE


# ------------------------------------------------------------------ a path that cannot be set up: weak, named by the line

def test_qps_timing_out_on_their_way_to_rtr_are_an_ib_link_error_with_no_node_to_exclude():
    d = diag({"logs/app/uccl_ep.log": UCCL_641})
    assert (d.status, d.sub_domain) == ("attributed", "ib_link_error")
    assert "early.ibfabric.modify_qp_unreachable" in rules_of(d)
    assert d.responsible_nodes == [] and d.recovery.action == "notify_owner"


# ------------------------------------------------------------------ the locked-memory limit is the job's configuration

def test_a_memlock_refusal_is_the_job_s_configuration_and_drains_nothing():
    d = diag({"logs/app/node-01.log": MEMLOCK_8684})
    assert (d.status, d.domain, d.sub_domain) == ("attributed", "application", "nccl_config_error")
    assert d.sub_domain != "ib_link_error"
    assert d.recovery.action == "notify_owner" and d.recovery.nodes == []
    assert "ulimit -l" in d.recovery.next_step


def test_libibverbs_memlock_warning_alone_is_not_a_cause():
    # Open MPI users list: a single-node job printed it and ran well.
    d = diag({"logs/app/err.23.Helloworld-PRL": "libibverbs: Warning: RLIMIT_MEMLOCK is 32768 bytes.\n"
                                                "    This will severely limit memory registrations.\n"})
    assert d.status == "unattributed" and d.suspect_nodes == []


def test_nccl_s_own_registration_enomem_stays_an_echo():
    # NVIDIA/nccl-tests#206's line: ulimit -l was 8192, but NCCL's line does not say so.
    d = diag({"logs/app/node-01.log": "node-01:4711:4790 [0] misc/ibvwrap.cc:278 NCCL WARN Call to ibv_reg_mr_iova2 failed "
                                      "with error Cannot allocate memory\n"})
    assert d.status == "unattributed" and d.recovery.action not in SEVERE


# ------------------------------------------------------------------ boot time, finished runs, benign warnings

def test_insufficient_slot_power_at_load_is_not_read():
    # leptonai/gpud components/accelerator/nvidia/infiniband (a comment quoting a node's line).
    d = hang_with(kern("mlx5_core 0000:5c:00.0: mlx5_pcie_event:299:(pid 268269): Detected insufficient power on the PCIe slot (27W)."))
    assert d.status == "unattributed" and d.suspect_nodes == []


def test_a_cable_unplugged_before_the_job_started_is_no_cause():
    # leptonai/gpud pkg/pstore testdata: an unused port's module reported unplugged 2.9 s after boot,
    # here stamped two hours before the job's start.
    d = hang_with(kern("[    2.962781] mlx5_core 0000:41:00.1: Port module event: module 1, Cable unplugged", t="08:00:11"))
    assert d.sub_domain != "ib_link_error" and d.responsible_nodes == []


def test_a_port_event_of_a_run_that_completed_is_no_failure():
    d = diag({"logs/syslog/node-02.log": kern("[    2.962781] mlx5_core 0000:41:00.1: Port module event: module 1, Cable unplugged")},
             state="COMPLETED", exit_code="0:0")
    assert d.status == "no_failure" and d.recovery.action == "none"
