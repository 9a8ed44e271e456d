"""NVML / nvidia-smi / DCGM lines and CUDA/HIP runtime strings through the real engine.

Lines are in the formats the software prints (nvidia-smi, pynvml, DCGM's dcgm_errors.h, PyTorch
on ROCm); the scenarios check what may and may not be concluded from them.
"""

from conftest import diag

XID79 = "Nov  2 {t} {host} kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
WD = ("{rank}: [rank{rank}]:[E1102 {t} ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective operation timeout: "
      "WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for {ran} milliseconds before timing out.")
STEP = "8: [2026-11-02 10:02:40,000] INFO step 1200 loss 2.3411\n"
SMI_LOST = "Unable to determine the device handle for GPU 00000000:1B:00.0: GPU is lost.  Reboot the system to recover this GPU\n"
SMI_UNKNOWN = "Unable to determine the device handle for GPU0000:1B:00.0: Unknown Error\n"


def wd_file(ranks, t="10:13:12.044871", ran=600054):
    return "\n".join(WD.format(rank=r, t=t, ran=ran) for r in ranks) + "\n"


def test_nvidia_smi_gpu_is_lost_alone_is_a_weak_bus_loss_that_does_not_drain():
    d = diag({"logs/app/node-02.log": STEP + SMI_LOST, "logs/app/node-01.log": wd_file(range(0, 8))})
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_fell_off_bus", ["node-02"])
    assert d.recovery.action != "drain_nodes"          # user space's word alone never drains


def test_kernel_xid79_and_nvidia_smi_on_one_host_are_one_bus_loss():
    d = diag({
        "logs/syslog/node-02.log": XID79.format(t="10:03:11", host="node-02"),
        "logs/app/node-02.log": STEP + SMI_LOST,
        "logs/app/node-01.log": wd_file(range(0, 8)),
    })
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_fell_off_bus", ["node-02"])
    assert d.recovery.action == "drain_nodes"          # the kernel's Xid 79 names it firmly


def test_nvidia_smi_unknown_error_only_names_a_suspect():
    # As rwth-i6/returnn#1486: nvidia-smi cannot reach one GPU, nothing says why.
    d = diag({"logs/app/node-02.log": STEP + SMI_UNKNOWN, "logs/app/node-01.log": wd_file(range(0, 8))})
    assert d.status == "unattributed"
    assert "node-02" in d.suspect_nodes and d.responsible_nodes == []


def test_container_losing_nvml_is_not_a_gpu_fault():
    # NVIDIA/nvidia-docker#1730: a systemd reload detaches the container from healthy GPUs.
    d = diag({"logs/app/node-02.log": STEP + "Failed to initialize NVML: Unknown Error\n",
              "logs/app/node-01.log": wd_file(range(0, 8))})
    assert d.status != "attributed" and d.responsible_nodes == []


def test_pynvml_not_supported_is_not_a_fault():
    d = diag({"logs/app/node-02.log": STEP + "8: pynvml.nvml.NVMLError_NotSupported: Not Supported\n",
              "logs/app/node-01.log": wd_file(range(0, 8))})
    assert d.status != "attributed" and d.responsible_nodes == []


def test_hip_illegal_address_is_echo_and_its_boilerplate_is_noise():
    d = diag({"logs/app/node-02.log": STEP
              + "8: torch.AcceleratorError: HIP error: an illegal memory access was encountered\n"
              + "8: Search for `hipErrorIllegalAddress' in https://rocm.docs.amd.com/projects/HIP/en/latest/index.html for more information.\n"
              + "8: HIP kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.\n"})
    assert d.status == "unattributed" and d.responsible_nodes == []
    assert "node-02" in d.suspect_nodes


def test_hip_uncorrectable_ecc_is_a_memory_error_like_cuda():
    d = diag({"logs/app/node-02.log": STEP + "8: RuntimeError: HIP error: uncorrectable ECC error encountered\n"})
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_memory_ecc", ["node-02"])


def test_hardware_stack_error_alone_is_not_attributed():
    d = diag({"logs/app/node-02.log": STEP + "8: RuntimeError: CUDA error: hardware stack error\n"})
    assert d.status == "unattributed" and d.responsible_nodes == []


def test_dcgm_row_remap_failure_names_the_gpu_memory():
    d = diag({"logs/app/node-03.log": "[2026-11-02 10:02:40,000] INFO step 1200 loss 2.3411\n"
              "GPU 1 had uncorrectable memory errors and row remapping failed.\n",
              "logs/app/node-01.log": wd_file(range(0, 8))})
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_memory_ecc", ["node-03"])


def test_weak_dcgm_nvlink_report_does_not_outrank_a_kernel_ecc_xid():
    # A strong ECC Xid on node-02 and DCGM's weak "link down" on node-03: the weak report never
    # becomes the confident answer on its own host.
    d = diag({
        "logs/syslog/node-02.log": "Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:1b:00): 48, pid=89695, name=python3, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
        "logs/app/node-03.log": "[2026-11-02 10:03:12,000] INFO step 1200 loss 2.3411\nGPU 2's NvLink link 7 is currently down\n",
        "logs/app/node-01.log": wd_file(range(0, 8)),
    })
    assert d.status in ("attributed", "ambiguous")
    assert "node-03" not in d.responsible_nodes or d.status == "ambiguous"
    if d.status == "attributed":
        assert (d.sub_domain, d.responsible_nodes) == ("gpu_memory_ecc", ["node-02"])
