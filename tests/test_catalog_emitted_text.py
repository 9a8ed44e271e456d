"""Lines as their emitters print them, through the real engine: PyTorch's CUDA check with its help
run onto the same line, PyTorch's legacy serializer failing a read, TensorFlow's checkpoint ops,
Slurm's GPU accounting losing a GPU. Patterns: rules/catalog/extract/app.yaml (cuda.runtime_error,
cuda.watchdog_cuda_error, torch.checkpoint_write_failed), extract/runtime.yaml (tf.checkpoint_save_failed),
extract/nvml.yaml (nvml.slurm_gpu_lost)."""
from firstfault.rules.engine import analyze_files

from conftest import BASE_WORKLOAD

# c10/cuda/CUDAException.cpp: the error string, get_cuda_error_help's "Search for ..." and
# get_cuda_check_suffix's sentences, each on its own line as PyTorch prints them; a paste that lost
# the line breaks has them on one (ostris/ai-toolkit#470).
HELP = ("Search for `{code}' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information. "
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect. "
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1 Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")


def diag(files, **wl):
    return analyze_files({**BASE_WORKLOAD, **wl}, files).diagnosis


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
