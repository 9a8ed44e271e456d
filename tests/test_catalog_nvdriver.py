"""NVIDIA driver (NVRM beyond the Xid line) and Fabric Manager patterns, through the real engine.

Lines are real (threads named in rules/catalog/extract/nvdriver.yaml) or, where noted there, built
from the driver's format strings; the hosts and stamps of the scenarios are the test's own.
"""
from firstfault.rules.engine import analyze_files

from conftest import BASE_WORKLOAD

WD = ("{rank}: [rank{rank}]:[E1102 10:13:12.044871 ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective "
      "operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) "
      "ran for 600054 milliseconds before timing out.")
WATCHDOG = "\n".join(WD.format(rank=r) for r in range(8)) + "\n"

GPU_LOST = ("Nov  2 10:03:11 node-02 kernel: NVRM: nvAssertOkFailedNoLog: Assertion failed: GPU lost from the bus "
            "[NV_ERR_GPU_IS_LOST] (0x0000000F) returned from rmStatus @ kernel_ce_gv100.c:106")
RPC_FAILED = "Nov  2 10:03:11 node-02 kernel: NVRM: _issueRpcAndWait: rpcSendMessage failed with status 0x0000000f for fn 76!"
XID79 = "Nov  2 10:03:10 node-02 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."

FM_NOTHING = ("Nov  2 10:01:01 node-02 nvidia-fabricmanager-start.sh[4756]: request to query NVSwitch device information "
              "from NVSwitch driver failed with error:WARNING Nothing to do [NV_WARN_NOTHING_TO_DO]")
FM_EXIT = ('Nov  2 10:01:01 node-02 nvidia-fabricmanager-start.sh[4753]: "/usr/bin/nv-fabricmanager -c '
           '/usr/share/nvidia/nvswitch/fabricmanager.cfg" failed! Exit code: 1')
FM_MISMATCH = ("Nov  2 09:59:26 node-02 nv-fabricmanager[104230]: fabric manager NVIDIA GPU driver interface version "
               "550.127.05 don't match with driver version 550.120. Please update with matching NVIDIA driver package.")


def diag(files):
    return analyze_files(dict(BASE_WORKLOAD), files).diagnosis


def lines(*ls):
    return "\n".join(ls) + "\n"


def test_gsp_boot_failure_is_a_gpu_fault_of_that_node():
    d = diag({"logs/syslog/node-02.log": lines(
        "Nov  2 10:03:11 node-02 kernel: [   88.582894] NVRM: GPU6 RmInitAdapter: Cannot initialize GSP firmware RM",
        "Nov  2 10:03:11 node-02 kernel: [   88.583480] NVRM: GPU 0000:a1:00.0: RmInitAdapter failed! (0x62:0x40:2168)",
        "Nov  2 10:03:11 node-02 kernel: [   88.585226] NVRM: GPU 0000:a1:00.0: rm_init_adapter failed, device minor number 7",
        "Nov  2 10:03:11 node-02 kernel: [   88.669319] NVRM: GPU6 _kgspBootGspRm: unexpected WPR2 already up, cannot proceed with booting GSP",
    )})
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_hardware_fault", ["node-02"])


def test_gpu_lost_status_alone_excludes_the_node_but_does_not_drain_it():
    d = diag({"logs/syslog/node-02.log": lines(GPU_LOST, RPC_FAILED), "logs/app/node-01.log": WATCHDOG})
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_fell_off_bus", ["node-02"])
    assert d.recovery.action == "retry_excluding_nodes"     # weak: no Xid 79 in sight


def test_gpu_lost_status_beside_xid79_is_one_fault_and_drains():
    d = diag({"logs/syslog/node-02.log": lines(XID79, GPU_LOST), "logs/app/node-01.log": WATCHDOG})
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_fell_off_bus", ["node-02"])
    assert d.recovery.action == "drain_nodes"


def test_fabric_manager_failing_on_a_host_without_nvswitch_is_no_confident_answer():
    # NV_WARN_NOTHING_TO_DO, then the start script's exit: the usual harmless case on PCIe GPUs.
    d = diag({"logs/syslog/node-02.log": lines(FM_NOTHING, FM_EXIT), "logs/app/node-01.log": WATCHDOG})
    assert d.status != "attributed"
    assert d.responsible_nodes == []
    assert d.recovery.action not in ("drain_nodes", "retry_excluding_nodes")


def test_fabric_manager_version_mismatch_and_cuda_802_are_one_nvswitch_fault():
    d = diag({"logs/syslog/node-02.log": lines(FM_MISMATCH),
              "logs/app/node-02.log": "[default0]:RuntimeError: CUDA error: system not yet initialized\n"})
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "nvswitch_fatal", ["node-02"])


def test_fabric_manager_version_mismatch_alone_names_the_version_fix_without_draining():
    d = diag({"logs/syslog/node-02.log": lines(FM_MISMATCH)})
    assert (d.status, d.sub_domain) == ("attributed", "nvswitch_fatal")
    assert d.recovery.action == "retry_excluding_nodes"
    assert "Fabric Manager package" in d.recovery.next_step


def test_gpu_not_supported_by_the_driver_is_a_driver_fault_not_a_gpu_fault():
    d = diag({"logs/syslog/node-03.log": lines(
        "Nov  2 09:58:30 node-03 kernel: NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:2330)",
        "Nov  2 09:58:30 node-03 kernel: NVRM: installed in this system is not supported by the",
        "Nov  2 09:58:30 node-03 kernel: NVRM: NVIDIA 550.90.07 driver release.",
        "Nov  2 09:58:30 node-03 kernel: NVRM: The NVIDIA probe routine failed for 1 device(s).",
    )})
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "driver_library_mismatch", ["node-03"])
    assert d.recovery.action == "retry_excluding_nodes"
    assert "supports the GPUs" in d.recovery.next_step


def test_probe_summary_and_gsp_banner_alone_blame_nothing():
    d = diag({"logs/syslog/node-02.log": lines(
        "Nov  2 10:03:11 node-02 kernel: NVRM: The NVIDIA probe routine failed for 1 device(s).",
        "Nov  2 10:03:11 node-02 kernel: NVRM: _kgspLogXid119: ********************************* GSP Timeout **********************************",
    ), "logs/app/node-01.log": WATCHDOG})
    assert d.status != "attributed"
    assert d.responsible_nodes == []


# sirzzang.github.io's 2026-07-29 note: a GSP exception (Xid 120, weak: NVIDIA files its investigation under
# software), then the driver's Xid 154 asking for a reset of the same GPU (final.lone_recovery_action).
GSP_120 = "Jul 11 05:51:26 gpu-node-01 kernel: NVRM: Xid (PCI:0000:2a:00): 120, GSP kernel exception: load access page fault (cause:0xd) @ pc:0xffffffff9300188a, partition:4#0\n"
RESET_154 = "Jul 11 05:51:26 gpu-node-01 kernel: NVRM: Xid (PCI:0000:{pci}:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)\n"
JULY = {"start_time": "2026-07-11T05:00:00Z", "end_time": "2026-07-11T06:00:00Z", "nodes": ["gpu-node-01"]}


def _gsp(text):
    return analyze_files({**BASE_WORKLOAD, **JULY}, {"logs/syslog/gpu-node-01.log": text}).diagnosis


def test_the_driver_asking_to_reset_the_gpu_of_a_gsp_exception_drains_the_node():
    d = _gsp(GSP_120 + RESET_154.format(pci="2a"))
    assert (d.sub_domain, d.responsible_nodes, d.recovery.action) == ("gpu_hardware_fault", ["gpu-node-01"], "drain_nodes")


def test_a_gsp_exception_alone_or_a_reset_asked_for_another_gpu_only_excludes_the_node():
    for text in (GSP_120, GSP_120 + RESET_154.format(pci="3b")):
        d = _gsp(text)
        assert (d.sub_domain, d.recovery.action) == ("gpu_hardware_fault", "retry_excluding_nodes")
