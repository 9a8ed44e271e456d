"""AMD's GPU stack read from its source (ROCr, the HIP runtime, the amdgpu driver): real-format lines
through the real engine. Patterns: rules/catalog/extract/amd_rocm.yaml; roles:
rules/catalog/early/amd_rocm.yaml; the enumeration of the sites: rules/emitters/amd_rocm.yaml.

Message bodies are copied from public reports (named per line); syslog lines get a host and time
prefix (node-01 / node-02, inside BASE_WORKLOAD's window) so the engine can place them. Lines built
from a format string because no public report shows one say so, with the source location."""

from conftest import diag

K1 = "Nov  2 10:03:11 node-01 kernel: "
K2 = "Nov  2 10:03:11 node-02 kernel: "

# ROCm/tensorflow-upstream#1959
PAGE_FAULT = "Memory access fault by GPU node-2 (Agent handle: 0x38b6960) on address 0x1000. Reason: Page not present or supervisor privilege."
# ROCm/legacy-rocm-build#5259 (MI300X, PyTorch, four processes on one GPU)
HANG = ("HW Exception by GPU node-4 (Agent handle: 0x1ebc04e0) reason :GPU Hang\n"
        "HW Exception by GPU node-4 (Agent handle: 0x2df30600) reason :GPU Hang\n")
# ROCm/legacy-rocm-build#4021 (MI300X axolotl; the ATHUB RAS event of the same hang)
ATHUB = K1 + "[13850.912648] amdgpu 0000:1c:00.0: {1}uncorrectable hardware error(ERREVENT_ATHUB_INTERRUPT) detected!\n"
# parthenon-hpc-lab/parthenon#1101 (Frontier)
APERTURE = (":0:rocdevice.cpp            :2660: 556940992572 us: 32834: [tid:0x7f9e41945700] Device::callbackQueue aborting "
            "with error : HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION: The agent attempted to access memory beyond the largest "
            "legal address. code: 0x29")
# Alexander-Barth/lumi-lux-mem-issues (LUMI): no GPU memory left
OOR_FULL = (":0:rocdevice.cpp            :2724: 10459743014355 us: [pid:2564  tid:0x150c4f3ff700] Callback: Queue 0x150b4de00000 "
            "Aborting with error : HSA_STATUS_ERROR_OUT_OF_RESOURCES: The runtime failed to allocate the necessary resources. "
            "This error may also occur when the core runtime library needs to spawn threads or create internal OS-specific "
            "events. Code: 0x1008 Available Free mem : 0 MB")
# a Stable Diffusion web UI report (code index id 48282044520): out of resources with 13 GB still free
OOR_FREE = OOR_FULL.replace("Available Free mem : 0 MB", "Available Free mem : 13386 MB")
# a dri-devel report: the PSP did not resume, the reset failed
RESET_FAILED = (K1 + "[  921.475303] amdgpu 0000:0f:00.0: amdgpu: GPU reset(1) failed\n"
                + K1 + "[  921.477625] amdgpu 0000:0f:00.0: amdgpu: GPU reset end with ret = -62\n")
# ROCm/TheRock#2591
VM_FAULT = K1 + ("[5621708.516764] amdgpu 0000:83:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:88 vmid:6 pasid:32809, "
                 "for process  pid 1641209 thread QuakeChamp:cs0 pid 1642246)\n")
# a dri-devel report: gfx_v9_0's KCQ enable failed (-110) and the driver gave the GPU up
INIT_FAILED = K2 + "[   77.749358] amdgpu 0000:03:00.0: Fatal error during GPU init\n"
HIP_OOM = ("0: [rank0]: torch.OutOfMemoryError: HIP out of memory. Tried to allocate 22.78 GiB. GPU 0 has a total capacity "
           "of 191.98 GiB of which 12.73 GiB is free.\n")
WD = ("{rank}: [rank{rank}]:[E1102 10:13:12.044871 ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective "
      "operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for "
      "600054 milliseconds before timing out.\n")

NODES = ["node-01", "node-02"]


def wd(ranks):
    return "".join(WD.format(rank=r) for r in ranks)


# ---------------------------------------------------------------- illegal accesses: echo, never alone

def test_a_rocr_page_fault_alone_is_weak_evidence_of_the_program():
    d = diag({"logs/app/node-01.log": PAGE_FAULT + "\n"}, nodes=NODES)
    assert d.status == "unattributed"
    assert d.recovery.action == "notify_owner"
    assert "illegal_memory_access" in d.summary


def test_the_kernel_page_fault_beside_it_proves_no_more():
    d = diag({"logs/app/node-01.log": PAGE_FAULT + "\n", "logs/syslog/node-01.log": VM_FAULT}, nodes=NODES)
    assert d.status == "unattributed"
    assert d.responsible_nodes == []


def test_a_hip_aperture_violation_alone_is_weak_evidence():
    d = diag({"logs/app/node-01.log": APERTURE + "\n"}, nodes=NODES)
    assert d.status == "unattributed"
    assert d.recovery.action == "notify_owner"


def test_a_page_fault_after_a_ras_error_is_the_gpu():
    d = diag({"logs/app/node-01.log": PAGE_FAULT + "\n", "logs/syslog/node-01.log": ATHUB}, nodes=NODES)
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_hardware_fault", ["node-01"])


# ---------------------------------------------------------------- GPU hang / reset

def test_a_gpu_hang_reset_alone_keeps_the_node_out_but_never_drains_it():
    d = diag({"logs/app/node-02.log": HANG}, nodes=NODES)
    assert (d.status, d.sub_domain) == ("attributed", "gpu_hardware_fault")
    assert d.recovery.action == "retry_excluding_nodes"
    assert d.recovery.nodes == ["node-02"]


def test_a_gpu_hang_with_the_ras_event_on_that_node_drains_it():
    d = diag({"logs/app/node-01.log": HANG, "logs/syslog/node-01.log": ATHUB}, nodes=NODES)
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_hardware_fault", ["node-01"])
    assert d.recovery.action == "drain_nodes"


def test_a_gpu_hang_among_watchdog_timeouts_is_the_root_of_the_echoes():
    d = diag({"logs/app/node-02.log": wd(range(8, 12)) + HANG.replace("HW", "9: HW")}, nodes=NODES)
    assert (d.status, d.sub_domain) == ("attributed", "gpu_hardware_fault")
    assert d.recovery.action != "drain_nodes"


def test_the_gpu_hang_of_a_teardown_after_an_oom_is_the_oom():
    # Rank 0 ran out of memory; the peers were killed while stuck in a collective and their GPU was reset.
    d = diag({"logs/app/node-01.log": HIP_OOM, "logs/app/node-02.log": HANG}, nodes=NODES)
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom")
    assert d.recovery.action == "notify_owner"


def test_a_failed_gpu_reset_drains_the_node():
    d = diag({"logs/syslog/node-01.log": RESET_FAILED, "logs/app/node-01.log": HANG}, nodes=NODES)
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_hardware_fault", ["node-01"])
    assert d.recovery.action == "drain_nodes"
    assert "reboot" in d.recovery.next_step


def test_a_reset_that_succeeded_or_began_is_no_cause():
    # amdgpu_device.c: "GPU reset begin!" / "GPU reset(%d) succeeded!" (rocm-arch and ROCm issue logs)
    lines = (K1 + "[ 2679.300601] amdgpu 0000:0c:00.0: amdgpu: GPU reset begin!\n"
             + K1 + "[ 2680.113402] amdgpu 0000:0c:00.0: amdgpu: GPU reset(1) succeeded!\n")
    d = diag({"logs/syslog/node-01.log": lines}, nodes=NODES)
    assert d.status != "attributed"


def test_a_gpu_that_failed_to_initialize_is_weak():
    d = diag({"logs/syslog/node-02.log": INIT_FAILED}, nodes=NODES)
    assert (d.status, d.sub_domain) == ("attributed", "gpu_hardware_fault")
    assert d.recovery.action == "retry_excluding_nodes"


def test_panfrost_failing_to_initialize_is_not_an_amd_gpu():
    d = diag({"logs/syslog/node-02.log": K2 + "panfrost ff9a0000.gpu: Fatal error during GPU init\n"}, nodes=NODES)
    assert d.sub_domain != "gpu_hardware_fault"


# ---------------------------------------------------------------- memory errors

def test_rocr_s_dram_ecc_reason_is_the_gpu_s_memory():
    # Built from runtime.cpp Runtime::VMFaultHandler's format ("Memory access fault by GPU node-%u (Agent handle: %p)
    # on address %p%s. Reason: %s.\n", Imprecise -> "(may not be exact address)", ErrorType 2 -> "DRAM ECC failure"):
    # no public report shows the line.
    line = ("0: Memory access fault by GPU node-2 (Agent handle: 0x55d6b1a2c0e0) on address (nil)(may not be exact address). "
            "Reason: DRAM ECC failure.\n")
    d = diag({"logs/app/node-02.log": line}, nodes=NODES)
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_memory_ecc", ["node-02"])
    assert d.recovery.action == "drain_nodes"


def test_poison_consumed_and_rocr_s_report_of_it_are_one_memory_error():
    # Built from kfd_int_process_v9.c event_interrupt_poison_consumption_v9 ("poison is consumed by client %d, kick off
    # gpu reset flow", RAS_EVENT_LOG's "{%llu}" event id) and ROCr's VMFaultHandler format, as above.
    poison = K1 + "[ 7311.902118] amdgpu 0000:68:00.0: amdgpu: {14}poison is consumed by client 12, kick off gpu reset flow\n"
    rocr = ("0: Memory access fault by GPU node-2 (Agent handle: 0x55d6b1a2c0e0) on address (nil)(may not be exact address). "
            "Reason: DRAM ECC failure.\n")
    d = diag({"logs/syslog/node-01.log": poison, "logs/app/node-01.log": rocr}, nodes=NODES)
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_memory_ecc", ["node-01"])


def test_new_uncorrectable_memory_errors_drain_but_an_old_count_never_does():
    # Built from amdgpu_ras.c amdgpu_ras_error_print_error_data ("socket: %d, die: %d, %lld new uncorrectable hardware
    # errors detected in %s block" behind RAS_EVENT_LOG's "{%llu}"): no public report shows it.
    new = K1 + "[ 5012.331205] amdgpu 0000:75:00.0: amdgpu: {3}socket: 0, die: 1, 1 new uncorrectable hardware errors detected in umc block\n"
    d = diag({"logs/syslog/node-01.log": new}, nodes=NODES)
    assert (d.status, d.sub_domain, d.recovery.action) == ("attributed", "gpu_memory_ecc", "drain_nodes")
    # a ROCm user's notes (code index id 58082716182): the older wording, a bogus count rising on every query
    old = K1 + "amdgpu 0000:0b:00.0: 1048560 uncorrectable hardware errors detected in umc block\n"
    d = diag({"logs/syslog/node-01.log": old}, nodes=NODES)
    assert d.recovery.action != "drain_nodes"


def test_a_full_retired_page_table_drains_the_node():
    # Built from amdgpu_ras_eeprom.c ("Saved bad pages %d reaches threshold value %d"): no public report shows it.
    line = K2 + "[ 8812.004311] amdgpu 0000:05:00.0: amdgpu: Saved bad pages 129 reaches threshold value 128\n"
    d = diag({"logs/syslog/node-02.log": line}, nodes=NODES)
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_memory_ecc", ["node-02"])


# ---------------------------------------------------------------- HIP out of resources

def test_out_of_resources_with_no_gpu_memory_left_is_the_program_s_oom():
    d = diag({"logs/app/node-01.log": OOR_FULL + "\n"}, nodes=NODES)
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom")
    assert d.recovery.action == "notify_owner"


def test_out_of_resources_with_memory_free_is_only_a_symptom():
    d = diag({"logs/app/node-01.log": OOR_FREE + "\n"}, nodes=NODES)
    assert d.status != "attributed"


# ---------------------------------------------------------------- what is not a failure

def test_advisories_of_rccl_and_the_smi_tools_are_not_causes():
    lines = ("ERROR:root:Driver not initialized (amdgpu not found in modules)\n"            # W&B's monitor on a non-AMD host
             "g1072:1263985:1263985 [0] /long_pathname_so_that_rpms_can_package_the_debug_info/src/extlibs/rccl/build/src/"
             "init.cpp:122 NCCL WARN Missing \"iommu=pt\" from kernel command line which can lead to system instablity or hang!\n"
             "g1072:1263988:1263988 [3] /long_pathname_so_that_rpms_can_package_the_debug_info/src/extlibs/rccl/build/src/"
             "init.cpp:126 NCCL WARN Missing \"HSA_FORCE_FINE_GRAIN_PCIE=1\" from environment which can lead to low RCCL "
             "performance, system instablity or hang!\n")                                 # ROCm/rccl#1026
    d = diag({"logs/app/node-01.log": lines}, nodes=NODES)
    assert d.status != "attributed"
    assert d.recovery.action == "notify_owner"
