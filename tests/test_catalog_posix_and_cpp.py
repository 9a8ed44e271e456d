"""Readings added from held-out rounds ho33/ho34, each from its emitter's source, through the real engine:
a tool's "<what>: No space left on device" (glibc error(), bash), an uncaught C++ std::logic_error, an
exception whose whole message is a transient errno, sacct's own COMPLETED row for the job, and an
MPI_ABORT tearing the step down. Real lines from the cited public logs."""
from conftest import diag

# TUM-DAML/seml#94
TMP_FULL = ("/var/spool/slurmd/job5944119/slurm_script: line 34: cannot create temp file for here-document: No space left on device\n"
            "mkdir: cannot create directory ‘/tmp/8e303830-9b96-4a67-87a7-c16a400f6705’: No space left on device\n")


def test_a_tool_that_cannot_write_to_a_full_disk_is_a_storage_fault():
    d = diag({"logs/app/slurm-5944119.out": TMP_FULL})
    assert (d.status, d.sub_domain) == ("attributed", "storage_io_error")
    assert d.recovery.nodes == []


def test_a_full_dev_shm_is_not_read_as_the_file_system():
    # the shared-memory wording is torch.shm_write_failed's; this generic reading leaves /dev/shm alone
    # (OpenELEC/OpenELEC.tv#1544's line)
    d = diag({"logs/app/x.log": "cp: writing `/dev/shm/openelec_install/SYSTEM': No space left on device\n"})
    assert d.sub_domain != "storage_io_error"


def test_a_cuda_oom_beside_a_full_tmp_at_one_instant_is_two_causes_that_drain_nothing():
    # both inherit the one stamp above them: nothing orders them, and neither names a node to act on
    oom = ("0: [rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB. GPU 0 has a total capacity of "
           "79.15 GiB of which 12.73 GiB is free.\n")
    d = diag({"logs/app/node-01.log": "[2026-11-02 10:03:00] step 10\n" + oom + TMP_FULL})
    assert d.status == "ambiguous"
    assert {c.sub_domain for c in d.candidates} == {"cuda_oom", "storage_io_error"}
    assert d.recovery.action == "notify_owner" and d.recovery.nodes == []


# E3SM-Project/scream#1661 (srun --label output)
LOGIC = ("1: terminate called after throwing an instance of 'std::logic_error'\n"
         "1:   what():  /pscratch/sd/n/ndk/wacmy/s21-may19/components/scream/src/control/atmosphere_driver.cpp:540: FAIL:\n"
         "1: found\n"
         "1: Error! Output restart requested, but no model restart file found in 'rpointer.atm'.\n")


def test_an_uncaught_cpp_logic_error_is_the_programs_own_check():
    d = diag({"logs/app/e3sm.log": LOGIC})
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")
    assert d.recovery.action == "notify_owner" and d.recovery.nodes == []


def test_a_dist_backend_error_terminate_is_still_an_echo():
    d = diag({"logs/app/x.log": "terminate called after throwing an instance of 'c10::DistBackendError'\n"})
    assert d.status != "attributed"


def test_a_broken_promise_in_a_tear_down_is_still_an_echo():
    d = diag({"logs/app/x.log": "terminate called after throwing an instance of 'std::future_error'\n"})
    assert d.status != "attributed"


# brendansu/CAV-Agent-Defense@4d72b9d (doc/transcripts/2026-04-21_...handoff.md): every rank, inside run_backward
EAGAIN = "[rank1]: RuntimeError: Resource temporarily unavailable\n"


def test_a_bare_eagain_is_no_user_bug():
    d = diag({"logs/app/job.err": EAGAIN + EAGAIN.replace("rank1", "rank2")})
    assert d.status == "unattributed" and d.sub_domain != "user_code_exception"


def test_an_exception_that_says_more_than_the_errno_is_still_the_programs():
    d = diag({"logs/app/job.err": "UnboundLocalError: local variable 'model' referenced before assignment\n"})
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")


# timfelle/neko-top@1511f53: mem_test/pass/128x16x16/output.log (sacct --delimiter=, after the run)
SACCT = ("JobID,JobName,State,ExitCode,NNodes,NTasks,ReqMem,Elapsed,MaxRSS,MaxRSSTask,MaxRSSNode,AveRSS,MaxVMSize,TRESUsageInMax\n"
         "22095745,mem_test/128x16x16,COMPLETED,0:0,1,,491520M,00:02:19,,,,,,\n"
         "22095745.1,select_gpu,COMPLETED,0:0,1,8,,00:01:25,4993290240,0,nid006115,4783978496,19302346752,cpu=00:08:15,energy=89292,fs/disk=13472554,mem=4993290240,pages=1733,vmem=19302346752\n")
WARN = " *** WARNING: Optimizer stopped, design change below threshold of:     0.00.  ***\n"


def test_sacct_saying_the_job_completed_is_the_end_of_the_run():
    d = diag({"logs/app/output.log": WARN + SACCT}, state="UNKNOWN")
    assert d.status == "no_failure"


def test_a_completed_step_row_alone_says_nothing_of_the_job():
    d = diag({"logs/app/output.log": WARN + SACCT.splitlines(keepends=True)[2]}, state="UNKNOWN")
    assert d.status != "no_failure"


def test_a_cause_before_the_completed_row_still_failed_the_run():
    d = diag({"logs/app/output.log": LOGIC + SACCT}, state="UNKNOWN")
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")


# BLAST-WarpX/warpx#4638: amrex aborts, Open MPI's MPI_ABORT banner, srun's abort, the plain STEP banner
WARPX = """amrex::Abort::0::CUDA error 3 in file /home/myuser/warpx2D_A100/build/_deps/fetchedamrex-src/Src/Base/AMReX_GpuDevice.cpp line 164: initialization error !!!
SIGABRT
See Backtrace.0 file for details
--------------------------------------------------------------------------
MPI_ABORT was invoked on rank 0 in communicator MPI COMMUNICATOR 3 DUP FROM 0
with errorcode 6.

NOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.
You may or may not see output from other processes, depending on
exactly when Open MPI kills them.
--------------------------------------------------------------------------
srun: Job step aborted: Waiting up to 32 seconds for job step to finish.
slurmstepd: error: *** STEP 142611.0 ON i8024 CANCELLED AT 2024-01-25T12:30:14 ***
srun: error: i8024: task 0: Exited with exit code 6
"""


def test_a_step_banner_after_mpi_abort_is_the_aborts_tear_down_not_a_cancel():
    d = diag({"logs/app/stderr.log": WARPX}, nodes=["i8024"], start_time="2024-01-25T12:20:00Z",
             end_time="2024-01-25T12:31:00Z")
    assert d.sub_domain != "user_cancelled"
    assert "early.slurm.srun_teardown_cancel" in {s.rule_id for s in d.evidence}


def test_a_step_banner_alone_is_still_read_as_a_cancel():
    d = diag({"logs/app/stderr.log": "slurmstepd: error: *** STEP 142611.0 ON i8024 CANCELLED AT 2024-01-25T12:30:14 ***\n"},
             nodes=["i8024"], start_time="2024-01-25T12:20:00Z", end_time="2024-01-25T12:31:00Z")
    assert (d.status, d.sub_domain) == ("attributed", "user_cancelled")


def test_fork_failing_with_eagain_in_a_checkpoint_writer_is_no_user_bug():
    # modal-projects/training-gym#506: Megatron's async checkpoint writer could not fork
    text = ('File "/usr/lib/python3.12/multiprocessing/popen_fork.py", line 66, in _launch\n'
            "    self.pid = os.fork()\n"
            "BlockingIOError: [Errno 11] Resource temporarily unavailable\n")
    d = diag({"logs/app/train.log": text})
    assert d.status == "unattributed"


def test_a_bad_address_from_a_write_is_no_user_bug():
    # facebookresearch/metaseq#497: iopath's async writer
    text = ("line 254, in <lambda>\n"
            "    self._notify_manager(lambda: self._io.write(b))\n"
            "OSError: [Errno 14] Bad address\n")
    d = diag({"logs/app/train.log": text})
    assert d.status == "unattributed"


def test_a_build_without_code_for_this_gpu_is_the_jobs_software_never_the_node():
    # ademakdogan/nails_segmentation#8 (CUDA) and ROCm/ROCm#2061 (HIP's form of it)
    for line in ("RuntimeError: CUDA error: no kernel image is available for execution on the device",
                 '"hipErrorNoBinaryForGpu: Unable to find code object for all current devices!"'):
        d = diag({"logs/app/node-01.log": line + "\n"})
        assert (d.status, d.sub_domain) == ("attributed", "user_code_exception"), line
        assert d.recovery.action == "notify_owner"


def test_a_libraries_failed_cuda_call_is_read_by_its_cuda_error_not_as_the_programs_bug():
    # deepseek-ai/DeepEP#584: the post broke the line before the error string; #104: on one line.
    cut = diag({"logs/app/node-01.log": "RuntimeError: Failed: CUDA error /sgl-workspace/DeepEP/csrc/deep_ep.cpp:200\n"
                                        "'peer access is not supported between these two devices'\n"})
    assert cut.status == "unattributed"
    whole = diag({"logs/app/node-01.log": "RuntimeError: Failed: CUDA error /sgl-workspace/DeepEP/csrc/deep_ep.cpp:200 "
                                          "'peer access is not supported between these two devices'\n"})
    assert (whole.status, whole.sub_domain) == ("attributed", "nccl_config_error")     # early.cuda.peer_access_unsupported
