"""Lines as their emitters print them, through the real engine: PyTorch's CUDA check with its help
run onto the same line, PyTorch's legacy serializer failing a read, TensorFlow's checkpoint ops,
Slurm's GPU accounting losing a GPU. Patterns: rules/catalog/extract/app.yaml (cuda.runtime_error,
cuda.watchdog_cuda_error, torch.checkpoint_write_failed), extract/runtime.yaml (tf.checkpoint_save_failed),
extract/nvml.yaml (nvml.slurm_gpu_lost)."""

from conftest import diag

# c10/cuda/CUDAException.cpp: the error string, get_cuda_error_help's "Search for ..." and
# get_cuda_check_suffix's sentences, each on its own line as PyTorch prints them; a paste that lost
# the line breaks has them on one (ostris/ai-toolkit#470).
HELP = ("Search for `{code}' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information. "
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect. "
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1 Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")


def test_a_run_together_ecc_error_is_the_gpu_s_memory_not_a_device_side_assert():
    d = diag({"logs/app/train.log": "CUDA error: uncorrectable ECC error encountered " + HELP.format(code="cudaErrorECCUncorrectable") + "\n"},
             nodes=["node-01"])
    assert (d.status, d.sub_domain) == ("attributed", "gpu_memory_ecc")


def test_a_run_together_illegal_address_stays_weak_evidence():
    d = diag({"logs/app/train.log": "torch.AcceleratorError: CUDA error: an illegal memory access was encountered "
                                    + HELP.format(code="cudaErrorIllegalAddress") + "\n"})
    assert d.status == "unattributed"
    assert d.recovery.action == "notify_owner"


def test_the_error_on_its_own_line_reads_the_same_with_the_help_below_it():
    lines = "\n".join(["RuntimeError: CUDA error: uncorrectable ECC error encountered",
                       *HELP.format(code="cudaErrorECCUncorrectable").replace(". ", ".\n").split("\n")]) + "\n"
    d = diag({"logs/app/train.log": lines}, nodes=["node-01"])
    assert (d.status, d.sub_domain) == ("attributed", "gpu_memory_ecc")


# pytorch/pytorch#45826: torch.load on a shared file system under Slurm; the c10::Error abort comes later.
STALE = """  File "/apps/pytorch/1.4.0-py37-cuda90/lib/python3.7/site-packages/torch/serialization.py", line 709, in _legacy_load
    deserialized_objects[key]._set_from_file(f, offset, f_should_read_directly)
RuntimeError: read(): fd 33 failed with Stale file handle
terminate called after throwing an instance of 'c10::Error'
"""


def test_a_failed_read_of_a_checkpoint_is_the_file_system():
    d = diag({"logs/app/train.log": STALE})
    assert (d.status, d.sub_domain) == ("attributed", "storage_io_error")


def test_a_read_that_refuses_to_spin_is_not_a_file_system_fault():
    d = diag({"logs/app/train.log": "RuntimeError: read(): non-blocking fd 12 read EAGAIN; cowardly refusing to spin-wait\n"})
    assert d.sub_domain != "storage_io_error"


# aws/sagemaker-python-sdk#454: the checkpoint save to S3 cannot reach the endpoint.
S3_SAVE = """tensorflow - Saving checkpoints for 7200 into s3://....../checkpoints/model.ckpt.
tensorflow/core/platform/s3/aws_logging.cc:60] Curl returned error code 55
tensorflow/core/framework/op_kernel.cc:1273] OP_REQUIRES failed at save_restore_v2_ops.cc:137 : Unknown: : Unable to connect to endpoint
ERROR - container_support.training - uncaught exception during training: : Unable to connect to endpoint
"""


def test_tensorflow_s_checkpoint_op_failing_on_its_store_is_a_storage_error():
    d = diag({"logs/app/train.log": S3_SAVE})
    assert (d.status, d.sub_domain) == ("attributed", "storage_io_error")


def test_a_checkpoint_that_does_not_fit_the_graph_is_not_a_storage_error():
    d = diag({"logs/app/train.log": "2020-05-18 10:16:20.560931: W tensorflow/core/framework/op_kernel.cc:1651] "
                                    "OP_REQUIRES failed at save_restore_v2_ops.cc:184 : Not found: Key Variable not found in checkpoint\n"})
    assert d.sub_domain != "storage_io_error"


def test_slurm_s_gpu_accounting_losing_a_gpu_is_a_gpu_off_the_bus_that_never_drains():
    # LSSI-ETH/plmfit#40; SchedMD/slurm src/plugins/gpu/nvml/gpu_nvml.c ("NVML: Failed to get usage(%d): %s")
    d = diag({"logs/app/slurm.err": "slurmstepd: error: NVML: Failed to get usage(15): GPU is lost\n"}, nodes=["node-01"])
    assert (d.status, d.sub_domain) == ("attributed", "gpu_fell_off_bus")
    assert d.recovery.action != "drain_nodes"          # user space's word only: weak


def test_slurm_s_other_nvml_failures_name_no_fault():
    d = diag({"logs/app/slurm.err": "slurmstepd: error: NVML: Failed to get usage(3): Not Supported\n"}, nodes=["node-01"])
    assert d.status == "unattributed"


# A CUDA error string or CUresult name in a wrapper no pattern names (extract/app.yaml cuda.error_text,
# cuda.error_name, nccltests.cuda_failure; early/app.yaml and early/nvidia.yaml read the names too).
# MFlowCode/MFC#1748: NVHPC's OpenACC runtime wraps its message over two lines.
NVHPC = """Accelerator Fatal Error: call to cuCtxCreate returned error 214
  (CUDA_ERROR_ECC_UNCORRECTABLE): uncorrectable ECC error encountered
mfc: ERROR > syscheck failed with exit code 1.
"""


def test_nvhpc_s_uncorrectable_ecc_at_context_creation_is_the_gpu_s_memory():
    d = diag({"logs/app/job.log": NVHPC}, nodes=["node-01"])
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_memory_ecc", ["node-01"])


def test_only_the_call_line_without_its_error_names_no_cause():
    d = diag({"logs/app/job.log": NVHPC.splitlines()[0] + "\n"})
    assert d.status == "unattributed"


def test_tensorflow_s_driver_error_name_with_its_string():
    # nagadit/DeepFaceLab_Linux#89
    line = ("F tensorflow/stream_executor/lib/statusor.cc:34] Attempting to fetch value instead of handling error Internal: "
            "failed initializing StreamExecutor for CUDA device ordinal 0: Internal: failed call to cuDevicePrimaryCtxRetain: "
            "CUDA_ERROR_ECC_UNCORRECTABLE: uncorrectable ECC error encountered\n")
    d = diag({"logs/app/train.log": line}, nodes=["node-01"])
    assert (d.status, d.sub_domain) == ("attributed", "gpu_memory_ecc")


def test_a_driver_error_name_alone_reads_as_its_string_and_stays_weak():
    # numba/numba#3788: a launch failure is the program's (or an echo of a GPU fault), never a drain
    d = diag({"logs/app/train.log": "2019-02-21 10:15:18,210 - ERROR - Call to cuMemcpyDtoH results in CUDA_ERROR_LAUNCH_FAILED\n"})
    assert d.status == "unattributed" and d.recovery.action == "notify_owner"
    assert "early.cuda.illegal_access" in {e.rule_id for e in d.evidence}


def test_no_device_is_not_a_gpu_fault():
    d = diag({"logs/app/train.log": "failed call to cuInit: CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected\n"})
    assert d.sub_domain not in ("gpu_memory_ecc", "gpu_fell_off_bus", "gpu_hardware_fault", "illegal_memory_access")


def test_nccl_tests_cuda_check_names_its_host_and_802_is_the_fabric():
    # NVIDIA/nccl-tests#264: CUDACHECK prints "<hostname>: Test CUDA failure <file>:<line> '<string>'"
    log = """# Using devices
test: Test CUDA failure common.cu:941 'system not yet initialized'
 .. test pid 54340: Test failure common.cu:891
"""
    d = diag({"logs/app/nccl-tests.log": log}, nodes=["test"])
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "nvswitch_fatal", ["test"])


def test_tensorflow_s_io_error_status_is_the_file_system():
    # tensorflow/tensorflow#20090: TSL's IOError is "<context>; <strerror>"
    log = ("2018-06-12 15:00:27,564 INFO (MainThread-2183) global step 83: loss = 1.2674 (7.400 sec/step)\n"
           "2018-06-12 15:00:32,553 INFO (Thread-4-2183) Error reported to Coordinator: "
           "/dbfs/FileStore/tables/TFOS/trainData/checkpoint.tmpb97208e81436466b80430829067e21d8; Input/output error\n")
    d = diag({"logs/app/executor.log": log}, start_time="2018-06-12T14:00:00Z", end_time="2018-06-12T15:01:00Z")
    assert (d.status, d.sub_domain) == ("attributed", "storage_io_error")


def test_a_semicolon_before_an_errno_word_in_prose_is_not_read():
    d = diag({"logs/app/train.log": "INFO retrying the upload; Input/output error is retried three times\n"})
    assert d.sub_domain != "storage_io_error"


# NVIDIA/nccl-tests#263: every process of a two-host run asks for a GPU index its host does not have.
ORDINAL = """# Using devices
g0010: Test CUDA failure common.cu:941 'invalid device ordinal'
 .. g0010 pid 888386: Test failure common.cu:891
g0016: Test CUDA failure common.cu:941 'invalid device ordinal'
"""


def test_an_invalid_device_ordinal_is_the_launch_s_configuration():
    d = diag({"logs/app/all_reduce_perf.log": ORDINAL}, nodes=["g0010", "g0016"])
    assert (d.status, d.sub_domain) == ("attributed", "nccl_config_error")
    assert d.recovery.action == "notify_owner"


def test_a_gpu_that_fell_off_the_bus_explains_the_missing_ordinal_on_its_host():
    xid = ("Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, "
           "GPU has fallen off the bus.\n")
    app = "node-02: Test CUDA failure common.cu:941 'invalid device ordinal'\n"
    d = diag({"logs/syslog/node-02.log": xid, "logs/app/nccl-tests.log": app})
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_fell_off_bus", ["node-02"])


def test_gpu_burn_s_error_802_is_the_fabric_not_being_up():
    # wilicc/gpu-burn#92: gpu-burn's checkError prints the CUDA string; the other workers' 304s follow
    log = """Burning for 60 seconds.
terminate called after throwing an instance of 'std::runtime_error'
  what():  Error (gpu_burn-drv.cpp:298): system not yet initialized
terminate called after throwing an instance of 'std::runtime_error'
  what():  Error (gpu_burn-drv.cpp:298): OS call failed or operation not supported on this OS
"""
    d = diag({"logs/app/gpu_burn.log": log}, nodes=["node-01"])
    assert (d.status, d.sub_domain) == ("attributed", "nvswitch_fatal")


def test_a_subsystem_not_yet_initialized_is_not_cuda_s():
    d = diag({"logs/app/train.log": "WARNING Logging system not yet initialized, buffering\n"})
    assert d.sub_domain != "nvswitch_fatal"


def test_a_stale_handle_in_any_wrapper_is_the_shared_file_system():
    # pytorch/pytorch#173679: ranks load a compiled kernel from a cache on a shared file system
    line = ("[rank9]: torch._inductor.exc.InductorError: ImportError: /root/.triton/cache/XU5DT2AO5BD5AEHEYGLPP5LRDFHHCUEJT4LGDVLB4STXUGVGHFPA/"
            "cuda_utils.cpython-310-x86_64-linux-gnu.so: cannot read file data: Stale file handle\n")
    d = diag({"logs/app/train.log": line})
    assert (d.status, d.sub_domain) == ("attributed", "storage_io_error")
