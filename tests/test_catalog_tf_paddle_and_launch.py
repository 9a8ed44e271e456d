"""TensorFlow's collective group checks, PaddlePaddle's GPU allocator and NCCL wrapper, CUDA's forward-compatibility
error, c10d store addresses no host name can be, and lines pasted with an indent (held-out rounds ho41-ho44). Real
lines from the cited reports, through the real engine."""
from conftest import diag

from firstfault.rules.prefixes import StampContext, read_head

# tensorflow/tensorflow#59888 and #33979 (collective_param_resolver_local.cc CompleteGroupLocal)
TF_DEVICE_TYPE = ("tensorflow.python.framework.errors_impl.InternalError: Collective ops is aborted by: Device "
                  "/job:worker/replica:0/task:0/device:GPU:0 is joining a group with incompatible device typeCPU (group_key=3)\n")
TF_GROUP_SIZE = ("2019-11-04 16:59:38.489335: W tensorflow/core/common_runtime/base_collective_executor.cc:216] "
                 "BaseCollectiveExecutor::StartAbort Internal: Collective Op  has group_size 8 and group_key2 but that group "
                 "has size 4\n")

# PaddlePaddle/Paddle#44566 (tracer.cc's wrapper over cuda_allocator.cc's error), with Python's exception type as
# PaddlePaddle/PaddleSeg#1734 printed it
PADDLE_OOM = ("SystemError: (Fatal) Operator conv2d raises an paddle::memory::allocation::BadAlloc exception.\n"
              "The exception content is\n"
              ":ResourceExhaustedError: \n"
              "\n"
              "Out of memory error on GPU 0. Cannot allocate 69.629150MB memory on GPU 0, 39.525391GB memory has been "
              "allocated and available memory is only 62.187500MB.\n"
              "\n"
              "Please check whether there is any other process using GPU 0.\n"
              "1. If yes, please stop them, or start PaddlePaddle on another GPU.\n"
              "2. If no, please decrease the batch size of your model. \n")
# PaddlePaddle/PaddleDetection#7380 (enforce.h build_nvidia_error_msg)
PADDLE_NCCL = ("    task = group.process_group.barrier()\n"
               "OSError: (External) NCCL error(2), unhandled system error.\n")

# HorizonRobotics/GUMP#1 (CUDA 804 from torch.cuda.is_available() in a CUDA 12 image on a GeForce host)
COMPAT_804 = ("/usr/local/lib/python3.9/dist-packages/torch/cuda/__init__.py:118: UserWarning: CUDA initialization: "
              "Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling NumCudaDevices() "
              "that might have already set an error? Error 804: forward compatibility was attempted on non supported HW "
              "(Triggered internally at ../c10/cuda/CUDAFunctions.cpp:108.)\n")

# huggingface/accelerate#2245 (MASTER_ADDR from the wrong variable: a file path)
ADDR_PATH = ("9.91.4.251: [W socket.cpp:601] [c10d] The IPv6 network addresses of (/root/cuda11.8.bashrc, 45458) cannot be "
             "retrieved (gai error: -3 - Temporary failure in name resolution).\n")
# antgroup/animate-x#15: a real host name without IPv6, harmless
ADDR_LOCALHOST = ("[W socket.cpp:601] [c10d] The IPv6 network addresses of (localhost, 51595) cannot be retrieved "
                  "(gai error: -2 - Name or service not known).\n")

# triton-inference-server/tensorrtllm_backend#170, pasted with an indent before NCCL's prefix
INDENTED_NCCL = ("          xllm3-milu2-neil-3-trt-llm-f7457bcc-xsv4v:5011:5092 [1] init.cc:824 NCCL WARN Duplicate GPU "
                 "detected : rank 0 and rank 1 both on CUDA device e3000\n")


def test_tensorflow_workers_that_disagree_on_the_collective_group_are_a_collective_mismatch():
    for text in (TF_DEVICE_TYPE, TF_GROUP_SIZE):
        d = diag({"logs/app/worker-0.log": text}, start_time="2019-11-04T16:00:00Z", end_time="2019-11-04T17:30:00Z")
        assert (d.status, d.sub_domain) == ("attributed", "collective_mismatch"), text
        assert d.recovery.action == "notify_owner"


def test_a_tensorflow_shape_mismatch_is_still_its_own_pattern_and_a_retry_message_is_nothing():
    d = diag({"logs/app/worker-0.log": "The error could be from a previous operation. Restart your program to reset.\n"})
    assert d.sub_domain != "collective_mismatch"


def test_paddles_operator_wrapper_is_the_out_of_memory_it_wraps_one_cause():
    d = diag({"logs/app/workerlog.0": PADDLE_OOM})
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom"), d.summary
    assert d.recovery.action == "notify_owner"


def test_paddles_wrapper_alone_stays_a_python_exception():
    d = diag({"logs/app/workerlog.0": PADDLE_OOM.splitlines(keepends=True)[0]})
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")


def test_paddles_nccl_error_is_an_nccl_symptom_not_a_bug_in_the_users_python():
    d = diag({"logs/app/workerlog.0": PADDLE_NCCL})
    assert d.status == "unattributed", d.summary


def test_cuda_forward_compatibility_on_unsupported_hardware_is_a_weak_driver_mismatch():
    d = diag({"logs/app/python.log": COMPAT_804})
    assert (d.status, d.sub_domain) == ("attributed", "driver_library_mismatch")
    assert d.recovery.action != "drain_nodes"
    d = diag({"logs/app/node-01.log": COMPAT_804}, nodes=["node-01"])
    assert d.recovery.action != "drain_nodes"                 # the image's compat libraries may be the ones to change


def test_a_store_address_no_host_name_can_be_is_a_firm_rendezvous_error_and_a_plain_host_stays_weak():
    d = diag({"logs/app/train.log": ADDR_PATH})
    assert (d.status, d.sub_domain) == ("attributed", "rendezvous_error")
    assert d.root_cause.fields["problem"] == "master_addr_not_a_host_name"
    # a host name without IPv6 stays the weak reading of the same warning (early.c10d.src.store_addr_unresolved)
    d = diag({"logs/app/train.log": ADDR_LOCALHOST})
    assert d.root_cause.kind == "store_addr_unresolved" and "problem" not in d.root_cause.fields


def test_an_indent_before_a_prefix_is_taken_off_and_the_prefix_read():
    d = diag({"logs/app/server.log": INDENTED_NCCL})
    assert (d.status, d.sub_domain) == ("attributed", "nccl_config_error")
    assert d.responsible_nodes == ["xllm3-milu2-neil-3-trt-llm-f7457bcc-xsv4v"]


def test_an_indent_stays_where_no_prefix_follows():
    ctx = StampContext(zone=None, anchor=None, boot=None)
    frame = '  File "train.py", line 168, in main'
    assert read_head(frame, ctx).message == frame                   # a traceback's frame keeps its indent
    head = read_head("    2024-05-01 12:00:01,123 ERROR boom", ctx)  # a stamp after the indent is read
    assert head.stamp is not None and head.message == "ERROR boom"
    head = read_head("  0: host-7:11:12 [0] NCCL WARN x", ctx)       # srun's rank label still comes first
    assert (head.rank, head.host) == (0, "host-7")


# tensorflow/tensorflow#4768 (the stream executor's diagnostics after cuInit failed)
DSO_MISMATCH = ("E tensorflow/stream_executor/cuda/cuda_driver.cc:491] failed call to cuInit: CUDA_ERROR_INVALID_VALUE\n"
                "I tensorflow/stream_executor/cuda/cuda_diagnostics.cc:185] libcuda reported version is: 361.93.2\n"
                "I tensorflow/stream_executor/cuda/cuda_diagnostics.cc:189] kernel reported version is: 352.63.0\n"
                "E tensorflow/stream_executor/cuda/cuda_diagnostics.cc:296] kernel version 352.63.0 does not match DSO "
                "version 361.93.2 -- cannot find working devices in this configuration\n")
# jax-ml/jax#23452 (XLA's stream executor asked for a device the task does not have)
XLA_ORDINAL = ("2024-09-05 07:57:34.555804: W external/xla/xla/service/platform_util.cc:199] unable to create StreamExecutor "
               "for CUDA:1: failed initializing StreamExecutor for CUDA device ordinal 1: INTERNAL: Failed call to cuDeviceGet: "
               "CUDA_ERROR_INVALID_DEVICE: invalid device ordinal\n")


def test_the_stream_executors_kernel_and_dso_versions_disagreeing_is_a_driver_library_mismatch():
    d = diag({"logs/app/node-01.log": DSO_MISMATCH}, nodes=["node-01"])
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "driver_library_mismatch", ["node-01"])
    quiet = diag({"logs/app/node-01.log": "".join(DSO_MISMATCH.splitlines(keepends=True)[:3])}, nodes=["node-01"])
    assert quiet.sub_domain != "driver_library_mismatch"


def test_an_invalid_device_ordinal_in_xlas_words_is_the_programs_launch_configuration():
    d = diag({"logs/app/train.log": XLA_ORDINAL}, start_time="2024-09-05T07:00:00Z", end_time="2024-09-05T08:30:00Z")
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")
    assert d.recovery.action == "notify_owner"


# jax-ml/jax#3158: old jaxlib's runtime status in a RuntimeError, XLA's CHECK aborting the process, then Slurm's
# plain banner one second later
JAX_ABORT = ("RuntimeError: Internal: Unable to launch cuBLAS gemm on stream 0x562d67df53e0\n"
             "2020-05-18 19:33:00.557560: F external/org_tensorflow/tensorflow/compiler/xla/service/gpu/gpu_executable.cc:88] "
             "Check failed: pair.first->SynchronizeAllActivity() \n"
             "slurmstepd: error: *** JOB 505887 ON gpu117 CANCELLED AT 2020-05-18T19:33:01 ***\n")


def test_a_runtime_status_in_a_python_exception_is_no_bug_in_the_users_program():
    d = diag({"logs/app/slurm-505887.out": JAX_ABORT.splitlines(keepends=True)[0]})
    assert d.status != "attributed" or d.sub_domain != "user_code_exception"


def test_a_plain_cancellation_after_the_process_aborted_is_its_tear_down_not_a_persons_cancel():
    window = {"start_time": "2020-05-18T18:00:00Z", "end_time": "2020-05-18T19:40:00Z"}
    d = diag({"logs/app/slurm-505887.out": JAX_ABORT}, nodes=["gpu117"], **window)
    assert d.sub_domain != "user_cancelled" and d.recovery.action != "none", d.summary
    # the banner alone is still a cancellation
    d = diag({"logs/app/slurm-505887.out": JAX_ABORT.splitlines(keepends=True)[2]}, nodes=["gpu117"], **window)
    assert d.sub_domain == "user_cancelled"


# ray-project/ray_lightning#24: NCCL's P2P transport on a GPU pair without peer access
IPC_PEER = ("(pid=909608) z-pc:909608:910337 [0] transport/p2p.cc:238 NCCL WARN failed to open CUDA IPC handle : 217 "
            "peer access is not supported between these two devices\n")
# horovod/horovod#785: the other rank's open of the same handle fails with a string that names nothing
IPC_INVALID = "HOSTNAME:4974:4981 [0] transport/p2p.cu:548 NCCL WARN failed to open CUDA IPC handle : 11 invalid argument\n"
# NVIDIA/nccl#342: NCCL's SYSCHECK without the space before the colon, then the segment it could not create
SHM_FALLOCATE = ("include/shm.h:28 NCCL WARN Call to posix_fallocate failed: No space left on device\n"
                 "include/shm.h:48 NCCL WARN Error while creating shared memory segment "
                 "nccl-shm-recv-250a7cc850ba9298-0-1-3 (size 9637888)\n")
# huggingface/optimum-habana#289
HPU_OOM = ("return super().__torch_function__(func, types, new_args, kwargs) RuntimeError: [Rank:0] FATAL ERROR :: "
           "MODULE:PT_DEVMEM Allocation failed for size::3288334336 (3136)MB\n")
# HabanaAI/Setup_and_Install#1
HL_INIT = ("[   72.993087] habanalabs hl2: Failed to communicate with Device CPU (CPU-CP timeout)\n"
           "[   72.993269] habanalabs 0000:1a:00.0: Failed to initialize hl2. Device is NOT usable !\n")


def test_nccl_opening_a_peers_memory_without_peer_access_is_the_collectives_configuration():
    d = diag({"logs/app/worker.log": IPC_PEER}, nodes=["z-pc"])
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "nccl_config_error", ["z-pc"])
    assert d.recovery.action == "notify_owner"
    assert diag({"logs/app/worker.log": IPC_INVALID}).status != "attributed"


def test_nccls_fallocate_failing_for_space_is_one_shared_memory_cause_not_two():
    d = diag({"logs/app/train.log": SHM_FALLOCATE})
    assert (d.status, d.sub_domain) == ("attributed", "shm_exhausted"), d.summary


def test_a_gaudi_device_out_of_memory_is_the_jobs_sizing():
    d = diag({"logs/app/run.log": HPU_OOM})
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom")
    assert d.recovery.action == "notify_owner"


def test_a_gaudi_card_that_fails_at_probe_keeps_its_node_out_but_never_drains_it():
    d = diag({"logs/syslog/h001.log": HL_INIT}, nodes=["h001", "h002"])
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_hardware_fault", ["h001"])
    assert d.recovery.action == "retry_excluding_nodes"
    d = diag({"logs/syslog/h001.log": HL_INIT.splitlines(keepends=True)[0]}, nodes=["h001", "h002"])
    assert d.sub_domain != "gpu_hardware_fault"
