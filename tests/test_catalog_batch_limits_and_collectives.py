"""What the ho18-ho29 rounds changed, through the real engine: Horovod's and TensorFlow's own checks
that ranks disagree on a collective, ENOSPC in Rust's io::Error words (safetensors), the memory limits
of HTCondor and Moab, amdgpu's ring timeout (an AMD GPU hang), syslog stamps whose month is in
the writer's locale (journalctl's %b); two frameworks' own end-of-training lines (Caffe, Megatron's
test set); out-of-memory in cuBLAS's, TensorFlow's and XLA's words; torch.save's short write; a GPU
driver older than the job's CUDA, printed below the exception it raised; Intel GPUs' device
out-of-memory; an OOM re-raised from a replica; CUDA failing to start; Ascend's HCCL errors.
Patterns: rules/catalog/extract/runtime.yaml (horovod.mismatched_request, tf.collective_shape_mismatch,
storage.rust_io_error, pbs.moab_resource_limit, condor.memory_limit_hold, run.completed.caffe,
run.completed.megatron_test_set, tf.oom_allocating_tensor, xla.device_oom, xpu.device_out_of_memory),
extract/app.yaml (cuda.library_alloc_failed, cuda.library_not_initialized, cuda.driver_too_old,
torch.checkpoint_write_failed, torch.cuda_oom, torch.cuda_oom_rewrapped, cuda.init_unknown_error,
torch.hccl_error), extract/linux.yaml
(linux.amdgpu.ring_timeout); EARLY: early/runtime.yaml (early.condor.memory_hold, early.pbs.memory),
early/linux.yaml (early.linux.amdgpu_ring_timeout), early/app.yaml (early.cuda.driver_too_old); FINAL:
final/identity.yaml (final.same.exception_message_below); prefixes: rules/prefixes.py (rfc3164_local) with
rules/stamps.py (LOCAL_MONTHS, glibc's abmon)."""
from datetime import datetime, timezone

from firstfault.rules.prefixes import StampContext, read_head

from conftest import diag


# horovod/horovod#398: one node's TensorFlow had no GPU support
HOROVOD = ("[1,3]<stderr>:FailedPreconditionError (see above for traceback): Mismatched ALLREDUCE CPU/GPU device "
           "selection: One rank specified device GPU, but another rank specified device CPU.\n")


def test_horovod_s_mismatch_check_is_a_collective_mismatch():
    d = diag({"logs/app/mpirun.log": HOROVOD})
    assert (d.status, d.sub_domain) == ("attributed", "collective_mismatch")
    assert d.recovery.action == "notify_owner"


# tensorflow/tensorflow#56885: MultiWorkerMirroredStrategy
TF_SHAPES = ("2022-07-25 11:57:07.265079: E tensorflow/core/common_runtime/ring_alg.cc:276] Aborting RingGather with "
             "Invalid argument: [_Derived_]Collective ops is aborted by: Shape mismatch in the collective instance 244. "
             "Op at device /job:worker/replica:0/task:1/device:CPU:0 expected shape [98] but another member in the group "
             "expected shape [102]. This is likely due to different input shapes at different members of the collective op.\n"
             "The error could be from a previous operation. Restart your program to reset.\n")


def test_tensorflow_s_shape_check_is_a_collective_mismatch():
    d = diag({"logs/app/worker0.log": TF_SHAPES}, start_time="2022-07-25T11:50:00Z", end_time="2022-07-25T12:00:00Z")
    assert (d.status, d.sub_domain) == ("attributed", "collective_mismatch")


def test_tensorflow_s_restart_advice_alone_names_nothing():
    d = diag({"logs/app/worker0.log": TF_SHAPES.splitlines(keepends=True)[1]})
    assert d.sub_domain != "collective_mismatch"


# bghira/SimpleTuner#2353: safetensors saving a checkpoint
RUST_ENOSPC = ("Error while serializing: I/O error: No space left on device (os error 28)\n"
               "Traceback (most recent call last):\n"
               "safetensors_rust.SafetensorError: Error while serializing: I/O error: No space left on device (os error 28)\n")


def test_enospc_in_rust_s_words_is_a_storage_error():
    d = diag({"logs/app/train.log": RUST_ENOSPC})
    assert (d.status, d.sub_domain) == ("attributed", "storage_io_error")


# CHTC/templates-GPUs#7: the hold reason names the execute host
CONDOR = "Hold reason: Error from slot1_7@gpulab2002.chtc.wisc.edu: Docker job has gone over memory limit of 1024 Mb\n"


def test_htcondor_s_memory_hold_is_host_memory_on_the_named_host():
    d = diag({"logs/app/condor_q-hold.txt": CONDOR})
    assert (d.status, d.sub_domain) == ("attributed", "host_oom")
    assert d.responsible_nodes == ["gpulab2002.chtc.wisc.edu"]
    assert d.recovery.action == "notify_owner"      # the job asked for too little: nothing to drain


# cBio/cbio-cluster#251: a TORQUE/Moab job's mail
MOAB_MEM = """PBS Job Id: 3132467.mskcc-fe1.local
Job Name:   STDIN
Exec host:  gpu-1-4/0
job deleted
Job deleted at request of root@mskcc-fe1.local
job 3132467 exceeded MEM usage hard limit (2528 > 1126)
"""


def test_moab_s_memory_hard_limit_is_host_memory():
    d = diag({"logs/app/pbs-mail.txt": MOAB_MEM})
    assert (d.status, d.sub_domain) == ("attributed", "host_oom")


def test_the_mail_without_moab_s_reason_names_no_memory():
    d = diag({"logs/app/pbs-mail.txt": "".join(MOAB_MEM.splitlines(keepends=True)[:5])})
    assert d.sub_domain != "host_oom"


# ROCm/legacy-rocm-build#2533 (an RDNA3 desktop) and rocm-arch/rocm-arch#829 (dmesg)
AMD_SYSLOG = """Oct  7 12:58:23 Ubuntu-Desktop kernel: [ 2237.944235] [drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring sdma0 timeout, signaled seq=16060, emitted seq=16062
Oct  7 12:58:23 Ubuntu-Desktop kernel: [ 2237.944505] [drm:amdgpu_job_timedout [amdgpu]] *ERROR* Process information: process  pid 0 thread  pid 0
Oct  7 12:58:23 Ubuntu-Desktop kernel: [ 2237.944732] amdgpu 0000:0a:00.0: amdgpu: GPU reset begin!
"""
OCT7 = {"start_time": "2026-10-07T12:00:00Z", "end_time": "2026-10-07T13:05:00Z"}


def test_an_amd_ring_timeout_is_a_weak_gpu_fault_that_keeps_the_node_out():
    d = diag({"logs/syslog/Ubuntu-Desktop.log": AMD_SYSLOG}, nodes=["Ubuntu-Desktop"], **OCT7)
    assert (d.status, d.sub_domain) == ("attributed", "gpu_hardware_fault")
    assert d.responsible_nodes == ["Ubuntu-Desktop"]
    # a driver or program bug wedges a GPU the same way: never drained on this line alone
    assert d.recovery.action == "retry_excluding_nodes"


def test_the_reset_alone_is_not_read_as_a_fault():
    d = diag({"logs/syslog/Ubuntu-Desktop.log": AMD_SYSLOG.splitlines(keepends=True)[2]}, nodes=["Ubuntu-Desktop"],
             **OCT7)
    assert d.sub_domain != "gpu_hardware_fault"


# Journal lines of a Polish machine (an NVIDIA Xid 109 reported on the forum): journalctl's %b is "kwi"
POLISH = ("kwi 15 07:56:59 testowy kernel: NVRM: Xid (PCI:0000:07:00): 109, pid=326, name=modprobe, channel 0x00000007, "
          "errorString CTX SWITCH TIMEOUT, Info 0x74007\n")
CTX = StampContext(zone=timezone.utc, anchor=datetime(2024, 4, 10, tzinfo=timezone.utc))


def test_a_localized_month_reads_the_stamp_and_the_host():
    head = read_head(POLISH.rstrip("\n"), CTX)
    assert head.stamp == datetime(2024, 4, 15, 7, 56, 59, tzinfo=timezone.utc)
    assert head.host == "testowy"
    assert head.message.startswith("NVRM: Xid")


def test_the_localized_journal_names_its_host():
    d = diag({"logs/app/journal.txt": POLISH})
    # a lone Xid 109 is a hang of any origin (catalog/data/xid.yaml): no cause, its host on the symptom
    assert d.status == "unattributed"
    assert [(s.kind, s.hosts) for s in d.symptoms] == [("xid", ["testowy"])]


def test_a_word_that_is_no_month_is_not_a_stamp():
    # the shape's applier declines any word outside glibc's abmon tables
    head = read_head("done 15 07:56:59 testowy kernel: NVRM: something", CTX)
    assert head.stamp is None


# NVIDIA/open-gpu-kernel-modules#626 (ho88): journalctl under zh_CN writes glibc's abmon "4月"
CHINESE = ("4月 20 19:55:29 Reverier-Arch kernel: NVRM: API mismatch: the client has the version 550.76, but\n"
           "                                       NVRM: this kernel module has the version 550.67.  Please\n")


def test_a_cjk_month_reads_the_stamp_and_the_host():
    head = read_head(CHINESE.splitlines()[0], CTX)
    assert head.stamp == datetime(2024, 4, 20, 19, 55, 29, tzinfo=timezone.utc)
    assert head.host == "Reverier-Arch" and head.message.startswith("NVRM: API mismatch")
    # ko_KR's word for month; a number no month has is no stamp
    assert read_head("12월 15 14:15:47 host kernel: x", CTX).stamp == datetime(2023, 12, 15, 14, 15, 47, tzinfo=timezone.utc)
    assert read_head("13月 15 14:15:47 host kernel: x", CTX).stamp is None
    # ja_JP pads the month to two characters (glibc's abmon " 4<U6708>")
    assert read_head(" 4月 20 19:55:29 host kernel: x", CTX).host == "host"


def test_the_cjk_journal_names_its_host_as_responsible():
    d = diag({"logs/app/journal.txt": CHINESE})
    assert d.sub_domain == "driver_library_mismatch"
    assert d.responsible_nodes == ["Reverier-Arch"]


def test_month_words_two_locales_disagree_on_are_not_read():
    # "lip" is July in pl_PL and June in hr_HR: no stamp rather than a wrong month
    head = read_head("lip 15 07:56:59 testowy kernel: NVRM: Xid (PCI:0000:07:00): 109", CTX)
    assert head.stamp is None


# Finished runs (the ho21 round): a framework's own end-of-training line, then teardown noise.
# TimoSaemann/ENet#8: Caffe's solver and tool both log the end, then a SIGSEGV in the destructors
CAFFE = """I0627 03:28:14.706820 10388 solver.cpp:317] Iteration 75000, loss = 0.411978
I0627 03:28:14.706852 10388 solver.cpp:322] Optimization Done.
I0627 03:28:14.706856 10388 caffe.cpp:254] Optimization Done.
*** Aborted at 1498501694 (unix time) try "date -d @1498501694" if you are using GNU date ***
PC: @     0x7fba3dfb813c (unknown)
*** SIGSEGV (@0x0) received by PID 10388 (TID 0x7fba406eda40) from PID 0; stack trace: ***
    @     0x7fba3fef8a87 caffe::Blob<>::~Blob()
    @           0x40ec10 caffe::Net<>::~Net()
"""


def test_caffe_s_optimization_done_before_a_teardown_crash_is_a_finished_run():
    d = diag({"logs/app/caffe_train.log": CAFFE}, state="UNKNOWN")
    assert d.status == "no_failure"


def test_the_crash_without_caffe_s_end_line_is_not_a_finished_run():
    lines = CAFFE.splitlines(keepends=True)
    d = diag({"logs/app/caffe_train.log": lines[0] + "".join(lines[3:])}, state="UNKNOWN")
    assert d.status != "no_failure"


# NVIDIA-NeMo/Megatron-Bridge#2955: the test-set evaluation runs after training and the final validation
MEGATRON_TEST = """Evaluating iter 32/32
----------------------------------------------------------------------------------------------------------
 validation loss at iteration 50 on test set | lm loss value: 1.585846E-01 | lm loss PPL: 1.171851E+00 | 
----------------------------------------------------------------------------------------------------------
as04r5b22:2573730:2573730 [3] NCCL INFO comm 0x449c87a0 rank 7 nranks 8 cudaDev 3 busId ad000 - Destroy COMPLETE
as04r5b21:3078643:3078643 [0] NCCL INFO comm 0x4592f620 rank 0 nranks 8 cudaDev 0 busId 1b000 - Destroy COMPLETE
"""


def test_megatron_s_test_set_evaluation_is_the_end_of_its_training():
    d = diag({"logs/app/train.log": MEGATRON_TEST}, state="UNKNOWN")
    assert d.status == "no_failure"


def test_an_evaluation_iteration_alone_is_not_the_end():
    d = diag({"logs/app/train.log": MEGATRON_TEST.splitlines(keepends=True)[0]}, state="UNKNOWN")
    assert d.status != "no_failure"


# The ho23 round: out-of-memory and driver reports in the words of libraries other than PyTorch's allocator.
# DeepMotionAIResearch/DenseMatchingBenchmark#20
CUBLAS_ALLOC = """RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`
Exception raised from createCublasHandle at /opt/conda/conda-bld/pytorch_1595629403081/work/aten/src/ATen/cuda/CublasHandlePool.cpp:8 (most recent call first):
"""


def test_a_math_library_that_cannot_allocate_is_a_cuda_oom():
    d = diag({"logs/app/train.log": CUBLAS_ALLOC})
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom")


def test_cudnn_not_initialized_is_an_echo_not_a_bug_in_the_user_s_python():
    # seanie12/Info-HCVAE#7: the handle could not be made; the line does not say why
    d = diag({"logs/app/train.log": "RuntimeError: cuDNN error: CUDNN_STATUS_NOT_INITIALIZED\n"})
    assert d.status == "unattributed"


# dBeker/Faster-RCNN-TensorFlow-Python3#110 and google-research/l2p#20
TF_OOM = ("ResourceExhaustedError: OOM when allocating tensor with shape[25088,4096] and type float on "
          "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc\n")
XLA_OOM = ("2022-08-05 10:00:26.835281: E external/org_tensorflow/tensorflow/compiler/xla/pjrt/pjrt_stream_executor_client.cc:2130] "
           "Execution of replica 0 failed: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 9437184 bytes.\n"
           "BufferAssignment OOM Debugging.\n")


def test_tensorflow_s_tensor_oom_on_a_gpu_is_a_cuda_oom():
    d = diag({"logs/app/train.log": TF_OOM})
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom")


def test_xla_s_resource_exhausted_is_a_cuda_oom():
    d = diag({"logs/app/train.log": XLA_OOM}, start_time="2022-08-05T09:50:00Z", end_time="2022-08-05T10:05:00Z")
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom")


def test_the_hint_alone_names_no_oom():
    d = diag({"logs/app/train.log": "Hint: If you want to see a list of allocated tensors when OOM happens, add "
                                    "report_tensor_allocations_upon_oom to RunOptions for current allocation info.\n"})
    assert d.sub_domain != "cuda_oom"


# hiyouga/LlamaFactory#620: torch.save's zip writer after a short write
SHORT_WRITE = "RuntimeError: [enforce fail at inline_container.cc:337] . unexpected pos 11347827264 vs 11347827160\n"


def test_the_zip_writer_s_unexpected_pos_is_a_failed_checkpoint_write():
    d = diag({"logs/app/train.log": SHORT_WRITE})
    assert (d.status, d.sub_domain) == ("attributed", "storage_io_error")


# ai4d-iasc/trixie#9: PyTorch raises AssertionError with a message that starts on the next line
DRIVER_OLD = """AssertionError: 
The NVIDIA driver on your system is too old (found version 10010).
Please update your GPU driver by downloading and installing a new
"""


def test_an_exception_whose_message_is_below_it_is_that_message_s_fault():
    d = diag({"logs/app/slurm.out": DRIVER_OLD})
    assert (d.status, d.sub_domain) == ("attributed", "driver_library_mismatch")
    assert any(s.rule_id == "final.same.exception_message_below" for s in d.evidence)


def test_a_driver_older_than_the_job_s_cuda_never_drains_its_node():
    d = diag({"logs/app/slurm.out": DRIVER_OLD}, nodes=["node-01"])
    assert d.sub_domain == "driver_library_mismatch"
    assert d.recovery.action != "drain_nodes"


def test_the_bare_assertion_without_the_text_below_stays_the_user_s():
    d = diag({"logs/app/slurm.out": "AssertionError: \n"})
    assert d.sub_domain == "user_code_exception"


# The ho25 and ho26 rounds: Intel GPUs' out-of-memory, PyTorch's re-raised OOM, CUDA failing to start.
# open-edge-platform/geti_v2#1075 and intel/torch-ccl#65
XPU_OOM = "RuntimeError: Native API failed. Native API returns: 39 (UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)\n"
ONECCL_OOM = ("2024:05:29-19:16:18:(202165) |CCL_ERROR| worker.cpp:338 ccl_worker_func: worker 0 caught internal exception: "
              "oneCCL: ze_call.cpp:28 do_call: EXCEPTION: ze error at zeCommandQueueExecuteCommandLists, code: "
              "ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY\n"
              "terminate called after throwing an instance of 'ccl::v1::exception'\n")


def test_an_intel_gpu_out_of_device_memory_is_the_device_oom():
    for text in (XPU_OOM, ONECCL_OOM):
        d = diag({"logs/app/train.log": text})
        assert (d.status, d.sub_domain) == ("attributed", "cuda_oom"), text


def test_pytorch_s_xpu_allocator_is_read_like_cuda_s():
    # intel/torch-xpu-ops#3011
    d = diag({"logs/app/train.log": "torch.OutOfMemoryError: XPU out of memory. Tried to allocate 4.66 GiB. GPU 0 has a "
                                    "total capacity of 5.65 GiB of which 5.65 GiB is free.\n"})
    assert d.sub_domain == "cuda_oom"


def test_a_sycl_exception_alone_is_no_oom():
    d = diag({"logs/app/train.log": "terminate called after throwing an instance of 'sycl::_V1::exception'\n"})
    assert d.sub_domain != "cuda_oom"


# huggingface/trl#1169: DataParallel re-raises the replica's OOM under its own type
REWRAPPED = """2024-01-12T19:26:34.787+08:00                raise exception
2024-01-12T19:26:34.787+08:00                torch.cuda.OutOfMemoryError: Caught OutOfMemoryError in replica 0 on device 0.
"""


def test_an_oom_re_raised_from_a_replica_is_a_cuda_oom():
    d = diag({"logs/app/cloudwatch.log": REWRAPPED}, start_time="2024-01-12T11:00:00Z", end_time="2024-01-12T11:30:00Z")
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom")


# NVIDIA/k8s-device-plugin#319: CUDA cannot start in the pod
CUDA_UNKNOWN = ("RuntimeError: CUDA unknown error - this may be due to an incorrectly set up environment, e.g. changing env "
                "variable CUDA_VISIBLE_DEVICES after program start. Setting the available devices to be zero.\n")


def test_cuda_failing_to_start_is_an_echo_not_a_bug_in_the_user_s_python():
    d = diag({"logs/app/pod-shell.txt": CUDA_UNKNOWN})
    assert d.status == "unattributed"


# The ho29 round: Ascend NPUs' collective library (HCCL) as torch_npu reports it.
# hiyouga/LlamaFactory#3839
HCCL_BUSY = """RuntimeError: [ERROR] HCCL error in: torch_npu/csrc/distributed/ProcessGroupHCCL.cpp:64
[ERROR] 2024-05-21-11:57:54 (PID:927000, Device:3, RankID:3) ERR02200 DIST call hccl api failed.
EJ0001: 2024-05-21-11:57:54.167.645 Failed to initialize the HCCP process. Reason: Maybe the last training process is running.
"""


def test_an_hccl_failure_is_an_echo_and_cann_s_code_is_no_host():
    d = diag({"logs/app/train.log": HCCL_BUSY}, start_time="2024-05-21T03:50:00Z", end_time="2024-05-21T04:00:00Z")
    assert d.status == "unattributed"
    assert "EJ0001" not in d.responsible_nodes + d.suspect_nodes


def test_cann_s_error_code_is_not_read_as_a_pdsh_host():
    head = read_head("EI0006: [PID: 1292363] 2025-04-08-18:07:20.444.436 Getting socket times out.", CTX)
    assert head.host is None
    assert read_head("c000001: FileNotFoundError: x", CTX).host == "c000001"
