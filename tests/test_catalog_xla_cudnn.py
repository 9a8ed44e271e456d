"""Lines from emitters the catalog did not read before the ho13 round, through the real engine:
XLA's NCCL stub and coordination service (JAX, TensorFlow), PyTorch's "NCCL error in: ..., invalid
argument", cuDNN's execution failure as PyTorch and TransformerEngine raise it, conda's shell error
in a batch job's output, and mount.nfs failing to reach its server. Patterns:
rules/catalog/extract/runtime.yaml (xla.nccl_library_unloadable, xla.init_barrier_timeout,
storage.nfs_mount_unreachable), extract/app.yaml (nccl.error_invalid_argument,
cuda.cudnn_execution_failed); EARLY: early/app.yaml (early.python.conda_shell_not_initialized)."""
from pathlib import Path

from firstfault.rules.engine import analyze_path

from conftest import diag


# LargeWorldModel/LWM#44: openxla/xla's nccl_stub.cc answers ncclGetErrorString this way when libnccl
# cannot be loaded; JAX's backend probes for ROCm and TPU above it are start-up noise.
XLA_NO_NCCL = """I0223 22:58:05.579038 140312230876992 xla_bridge.py:660] Unable to initialize backend 'rocm': NOT_FOUND: Could not find registered platform with name: "rocm". Available platform names are: CUDA
I0223 22:58:05.579842 140312230876992 xla_bridge.py:660] Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so: libtpu.so: cannot open shared object file: No such file or directory
2024-02-23 23:00:08.992159: W external/xla/xla/service/gpu/runtime/support.cc:58] Intercepted XLA runtime error:
INTERNAL: external/xla/xla/service/gpu/nccl_utils.cc:134: NCCL operation ncclGetUniqueId(&id) failed: Unable to load NCCL library. Multi-GPU collectives will not work.. Last NCCL warning(error) log entry (may be unrelated) 'Unable to load NCCL library. Multi-GPU collectives will not work.'.
"""


def test_xla_unable_to_load_nccl_is_the_job_s_configuration():
    d = diag({"logs/app/train.log": XLA_NO_NCCL})
    assert (d.status, d.sub_domain) == ("attributed", "nccl_config_error")
    assert d.recovery.action == "notify_owner" and d.responsible_nodes == []


def test_jax_backend_probes_alone_name_no_cause():
    d = diag({"logs/app/train.log": "".join(XLA_NO_NCCL.splitlines(keepends=True)[:2])})
    assert d.status == "unattributed"


# ayaka14732/llama-2-jax#20 (the connect barrier, older wording) and AI-Hypercomputer/gpu-recipes#2
# (the registration barrier, xla/tsl coordination_service.cc's newer wording).
CONNECT_BARRIER = """jaxlib.xla_extension.XlaRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. Barrier_id: PjRT_Client_Connect. Timed out task names:
/job:jax_worker/replica:0/task:1
/job:jax_worker/replica:0/task:6
"""
REGISTER_BARRIER = """Stopping coordination service as cluster registration failed. This may be due to 1) some tasks crashed earlier before connecting, 2) some tasks were never scheduled, or 3) scheduling delays. Consider setting a longer initialization timeout if such delays are expected, the timeout is currently set to: 1h.

Original error: DEADLINE_EXCEEDED: Barrier timed out. Id: [Init]Wait_for_all_tasks_to_register::0. This usually happens because a task triggered the barrier too early or too slowly. Please look at the task logs (both timed out and first task) to debug further.
"""


def test_a_jax_start_up_barrier_timeout_is_a_rendezvous_failure():
    for text in (CONNECT_BARRIER, REGISTER_BARRIER):
        d = diag({"logs/app/train.log": text})
        assert (d.status, d.sub_domain) == ("attributed", "rendezvous_error"), text
        assert d.recovery.action == "retry"


def test_a_barrier_later_in_the_run_is_not_a_rendezvous_failure():
    # an orbax checkpoint's barrier (a public JAX report): a peer was slow or gone mid-run
    d = diag({"logs/app/train.log": "jaxlib.xla_extension.XlaRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. Id: "
                                    "0_async_write_complete.0.1. This usually happens because a task triggered the barrier "
                                    "too early or too slowly. Please look at the task logs (both timed out and first task) "
                                    "to debug further.\n"})
    assert d.sub_domain != "rendezvous_error"


# facebookresearch/ParlAI#3084: NCCL 2.4's ncclInvalidArgument through PyTorch, then srun's exits.
PARLAI = """RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/../c10d/NCCLUtils.hpp:82, invalid argument, NCCL version 2.4.8
srun: error: slurm-job-compute-0-0: tasks 2-7: Exited with exit code 1
srun: error: slurm-job-compute-0-1: tasks 8-13,15: Exited with exit code 1
"""


def test_nccl_invalid_argument_is_the_launch_s_configuration_not_a_user_bug():
    d = diag({"logs/app/stdout.log": PARLAI}, nodes=["slurm-job-compute-0-0", "slurm-job-compute-0-1"])
    assert (d.status, d.sub_domain) == ("attributed", "nccl_config_error")


def test_nccl_system_error_in_the_same_wrapper_stays_a_symptom():
    d = diag({"logs/app/stdout.log": "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:410, "
                                     "unhandled system error, NCCL version 2.4.8\n"})
    assert d.status == "unattributed"


# THUDM/slime#1783 (TransformerEngine's NVTE_CHECK_CUDNN_FE, the driver's 700 in its message) and
# jianweif/OptimalGradCheckpointing#5 (PyTorch's cuDNN check).
TE_CUDNN = """RuntimeError: /TransformerEngine/transformer_engine/common/fused_attn/fused_attn_f16_arbitrary_seqlen.cu:534 in function fused_attn_arbitrary_seqlen_fwd_impl: cuDNN Error: execute(handle, plan->get_raw_desc(), variant_pack_descriptor.get_ptr()) failed with message: err 700 != CUDA_SUCCESS :: shimCuLaunchKernelEx(&config, func, kernelParams, nullptr)
 at: err != CUDA_SUCCESS, and code: CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER. For more information, enable cuDNN error logging by setting CUDNN_LOGERR_DBG=1 and CUDNN_LOGDEST_DBG=stderr in the environment.
"""


def test_a_cudnn_execution_failure_is_no_user_bug_and_names_no_cause_alone():
    for text in (TE_CUDNN, "RuntimeError: cuDNN error: CUDNN_STATUS_EXECUTION_FAILED\n"):
        d = diag({"logs/app/train.log": text})
        assert d.status == "unattributed", text
        assert d.sub_domain != "user_code_exception"


def test_an_unsupported_cudnn_call_is_still_read_as_the_program_s():
    d = diag({"logs/app/train.log": "RuntimeError: cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if "
                                    "you passed in a non-contiguous input.\n"})
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")


# owencqueen/PolymerGNN (a job's committed .e file, corpus case ho13-sched-polymergnn-...): conda's error at
# the top, two hours of progress, then Slurm's time limit; read verbatim from the corpus.
CONDA = (Path(__file__).resolve().parents[1] / "corpus/real/ho13-sched-polymergnn-cv-job-time-limit-clr1247/input/SOAP_42.e")


def test_conda_s_shell_error_does_not_compete_with_the_time_limit_that_ended_the_job():
    d = analyze_path(CONDA).diagnosis            # as posted: its stamps are its own, no record around it
    assert (d.status, d.sub_domain) == ("attributed", "walltime_exceeded")


def test_a_missing_module_after_conda_s_error_is_still_the_program_s_failure():
    d = diag({"logs/app/job.err": "CommandNotFoundError: Your shell has not been properly configured to use 'conda activate'.\n"
                                  "ModuleNotFoundError: No module named 'torch'\n"})
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")


# kubeflow/testing#346: the kubelet's MountVolume.SetUp failure for an NFS volume (kubectl describe's
# events), then the FailedMount event; extract/runtime.yaml storage.nfs_mount_unreachable.
NFS = """Mount failed: mount failed: exit status 32
Mounting command: chroot
Mounting arguments: [/home/kubernetes/containerized_mounter/rootfs mount -t nfs 10.49.145.162:/kubeflow /var/lib/kubelet/pods/5264288b-5328-11e9-ad34-42010af001d5/volumes/kubernetes.io~nfs/gcfs]
Output: mount.nfs: Connection timed out
"""


def test_an_nfs_server_that_does_not_answer_a_mount_is_the_shared_storage():
    d = diag({"logs/app/describe_events.txt": NFS})
    assert (d.status, d.domain, d.sub_domain) == ("attributed", "storage", "storage_io_error")


def test_an_nfs_export_that_refuses_the_client_is_not_read_as_a_storage_fault():
    # a public NFS CSI report: the export's configuration, not the server failing
    d = diag({"logs/app/describe_events.txt": "Output: mount.nfs: access denied by server while mounting 192.168.56.11:/srv/nfs\n"})
    assert d.sub_domain != "storage_io_error"
