"""Lines that benchmarks, node agents and job controllers print about a run, through the real
engine (the ho14 round): MLPerf's logging library's successful run_stop, GPUd's Xid health state,
SkyPilot's managed-job controller finding its cluster preempted, lspci reading a GPU's revision as
ff, IOR/mdtest failing a call with a storage errno, and an alert quoting a kernel Xid line whole.
Patterns: rules/catalog/extract/runtime.yaml (run.completed.mlperf, skypilot.cluster_preempted,
ior.errno_error), extract/nvidia.yaml (gpud.xid_health, lspci.nvidia_gpu_rev_ff, nvidia.xid's
syslog_host); EARLY: early/nvidia.yaml (early.nvidia.gpu_unresponsive_on_pcie)."""

from conftest import diag


# mlcommons/training_results_v2.0 (Azure rnnt result_0.txt): SHArP's and NCCL's start-up errors,
# NCCL's own fallback, then the benchmark's successful stop.
MLPERF = """[ip-0A23040D:0:57050 - context.c:601] ERROR sharp_create_job failed: No Aggregation Manager (sharp_am) detected(-52)
ip-0A23041A:46903:47492 [0] sharp_plugin.c:288 NCCL WARN NET/IB :SHARP coll init error: Cannot create SHArP job(-11)
:::MLLOG {"namespace": "", "time_ms": 1652941015614, "event_type": "INTERVAL_END", "key": "run_stop", "value": null, "metadata": {"file": "train.py", "lineno": 975, "status": "success"}}
ENDING TIMING RUN AT 2022-05-19 06:17:01 AM
"""


def test_an_mlperf_run_that_logged_its_successful_stop_has_no_failure():
    d = diag({"logs/app/result_0.txt": MLPERF}, state="UNKNOWN")
    assert d.status == "no_failure"


def test_an_mlperf_status_event_alone_is_not_the_end_of_the_run():
    # the per-rank "status" POINT_IN_TIME event (mlcommons/training_results_v4.0, HPE ssd) says nothing of the stop
    d = diag({"logs/app/result_1.txt": ':::MLLOG {"namespace": "", "time_ms": 1714978963120, "event_type": '
                                      '"POINT_IN_TIME", "key": "status", "value": "success", "metadata": {"file": '
                                      '"/workspace/ssd/train.py", "lineno": 775}}\n'}, state="UNKNOWN")
    assert d.status != "no_failure"


# leptonai/gpud#604: GPUd's Xid health-state reason, then NVML's lost GPU.
GPUD = """XID 79(GPU has fallen off the bus) detected on PCI:0000:ae:00
failed to get remapped rows for GPU-ac896b35-5782-c478-4b2a-a661de07770f: failed to get device remapped rows: ERROR_GPU_IS_LOST
"""


def test_gpud_s_xid_reason_is_decoded_like_the_kernel_s_xid():
    d = diag({"logs/app/gpud.log": GPUD})
    assert (d.status, d.sub_domain) == ("attributed", "gpu_fell_off_bus")
    assert d.root_cause.gpu == "0000:ae:00.0"


# skypilot-org/skypilot#804: the 2022 managed-spot controller, lines as the PR author pasted them.
SKY = """# (bert-qa pid=920210) I 05-04 00:52:46 controller.py:100] The cluster is preempted.
# (bert-qa pid=920210) I 05-04 00:52:46 spot_state.py:99] === Recovering... ===
# (bert-qa pid=920210) E 05-04 00:53:16 backend_utils.py:999] Failed to cancel jobs on cluster bert-qa-39.
"""


def test_skypilot_s_controller_finding_its_cluster_preempted_is_a_preemption():
    d = diag({"logs/app/spot-controller.log": SKY})
    assert (d.status, d.sub_domain) == ("attributed", "preempted")
    assert d.recovery.action == "retry"


def test_a_controller_that_cannot_tell_preemption_from_failure_is_not_read_as_one():
    # skypilot-org/skypilot:sky/jobs/controller.py's logger.info(f'Cluster is preempted or failed{cluster_status_str}. '
    # 'Recovering...'), filled as it fills it with a ClusterStatus
    d = diag({"logs/app/controller.log": "Cluster is preempted or failed (status: STOPPED). Recovering...\n"})
    assert d.sub_domain != "preempted"


# lyulyul/shine-cluster#171: lspci with one GPU's functions reading rev ff among healthy siblings.
LSPCI = """1a:00.0 VGA compatible controller: NVIDIA Corporation TU102GL [Quadro RTX 6000/8000] (rev a1)
1a:00.1 Audio device: NVIDIA Corporation TU102 High Definition Audio Controller (rev a1)
1c:00.0 VGA compatible controller: NVIDIA Corporation TU102GL [Quadro RTX 6000/8000] (rev ff)
1c:00.1 Audio device: NVIDIA Corporation TU102 High Definition Audio Controller (rev ff)
1c:00.2 USB controller: NVIDIA Corporation TU102 USB 3.1 Host Controller (rev ff)
"""


def test_a_gpu_reading_rev_ff_is_a_gpu_off_the_bus_that_never_drains_by_itself():
    d = diag({"logs/app/lspci.txt": LSPCI}, nodes=["hoth"])
    assert (d.status, d.sub_domain) == ("attributed", "gpu_fell_off_bus")
    assert d.root_cause.gpu == "0000:1c:00.0"
    assert d.recovery.action != "drain_nodes"


def test_healthy_revisions_name_no_cause():
    d = diag({"logs/app/lspci.txt": "".join(LSPCI.splitlines(keepends=True)[:2])})
    assert d.status == "unattributed"


# VI4IO/io-500-dev#63: mdtest's create on Lustre fails with ENOSPC, then MPI_Abort.
IOR = """ior ERROR: open64("/lustre/stor1/rsc/io500/2020-spring/io500.2020.05.17-01.48.52/mdt_hard/test-dir.0-0/mdtest_tree.0/file.mdtest.727.10410", 66, 0664) failed, errno 28, No space left on device (aiori-POSIX.c:413)
Abort(-1) on node 727 (rank 727 in comm 0): application called MPI_Abort(MPI_COMM_WORLD, -1) - process 727
"""


def test_ior_s_enospc_is_the_file_system():
    d = diag({"logs/app/io500.log": IOR})
    assert (d.status, d.domain, d.sub_domain) == ("attributed", "storage", "storage_io_error")


def test_mpi_abort_alone_is_no_storage_fault():
    d = diag({"logs/app/io500.log": IOR.splitlines(keepends=True)[1]})
    assert d.sub_domain != "storage_io_error"


# huggingface/m4-logs (tr-190-80b chronicles): the team's alert quotes the node's syslog line whole; its
# header names the host (extract/nvidia.yaml nvidia.xid's syslog_host).
ALERT = ("Xid errors on instance: ip-26-0-147-135, Error: May 29 01:37:38 ip-26-0-147-135 kernel: [257087.812628] "
         "NVRM: Xid (PCI:0000:90:1c): 64, ...\n")


def test_a_quoted_syslog_xid_line_names_its_host_and_drains_it():
    d = diag({"logs/app/xid-alert.log": ALERT}, nodes=["ip-26-0-147-135", "ip-26-0-147-136"])
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_memory_ecc", ["ip-26-0-147-135"])
    assert d.recovery.action == "drain_nodes"


def test_the_alert_s_own_instance_name_alone_does_not_place_an_unquoted_xid():
    # the same Xid as the driver prints it, with no header before it: no host is made up
    d = diag({"logs/app/xid-alert.log": "NVRM: Xid (PCI:0000:90:1c): 64, ...\n"},
             nodes=["ip-26-0-147-135", "ip-26-0-147-136"])
    assert d.responsible_nodes == []
