"""Lines from the ho15 round's emitters, through the real engine: TensorRT-LLM's CUDA check out of
memory, the MPI operator failing a job for evicted workers, the Go NVML bindings' lost GPU, the
"Failed: Cuda error" check of NCCL's examples (vLLM's and SGLang's custom all-reduce) with peer access
unsupported, Open MPI's lost daemon as an echo, amdgpu's RAS handler, TorchX's log prefix before
torchrun's rank tag, and torchelastic's restart between a crash and the run's end. Patterns:
rules/catalog/extract/app.yaml (cuda.runtime_error_in_oom, cuda.check_macro_failed), scheduler.yaml
(k8s.mpijob_workers_evicted), nvml.yaml (nvml.go_binding_gpu_lost), linux.yaml
(linux.amdgpu.ras_uncorrectable); EARLY: early/app.yaml (early.cuda.peer_access_unsupported),
launchers.yaml (early.launch.mpi_daemon_lost_node), linux.yaml (early.linux.amdgpu_ras_uncorrectable);
prefixes: rules/prefixes.py (torchx); FINAL: final.completed_in_lines."""

from conftest import diag


# NVIDIA/TensorRT-LLM#498
TRTLLM = ("[TensorRT-LLM][ERROR] [TensorRT-LLM][ERROR] CUDA runtime error in ::cudaMallocAsync(ptr, n, mCudaStream->get()): "
          "out of memory (/data/TensorRT-LLM/cpp/tensorrt_llm/runtime/tllmBuffers.h:112)\n")


def test_tensorrt_llm_s_cuda_check_out_of_memory_is_a_cuda_oom():
    d = diag({"logs/app/run.log": TRTLLM})
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom")


# kubeflow/mpi-operator#647: the MPIJob's Failed condition
MPIJOB = """  - lastTransitionTime: "2024-08-15T04:01:42Z"
    lastUpdateTime: "2024-08-15T04:01:42Z"
    message: 1/8 workers are evicted
    reason: MPIJobEvicted
    status: "True"
    type: Failed
"""


def test_an_mpijob_failed_for_evicted_workers_is_an_eviction():
    d = diag({"logs/scheduler/mpijob-status.yaml": MPIJOB})
    assert (d.status, d.sub_domain) == ("attributed", "evicted")
    assert d.recovery.action == "retry"


# kubernetes/kubernetes#97131: the kubelet's admission error carries the device plugin's NVML error
ADMISSION = ("Message:        Pod Allocate failed due to device plugin GetPreferredAllocation rpc failed with err: rpc error: "
             "code = Unknown desc = Unable to retrieve list of available devices: error creating nvml.Device 5: nvml: GPU is lost, "
             "which is unexpected\n")


def test_the_device_plugin_s_lost_gpu_is_a_gpu_off_the_bus():
    d = diag({"logs/app/kubectl.txt": ADMISSION})
    assert (d.status, d.sub_domain) == ("attributed", "gpu_fell_off_bus")


def test_the_device_plugin_s_permission_error_is_not_a_lost_gpu():
    # a public troubleshooting note: the same wrapper with NVML's permission error
    d = diag({"logs/app/kubectl.txt": "  error creating nvml.Device 0: nvml: Insufficient Permissions, which is unexpected\n"})
    assert d.sub_domain != "gpu_fell_off_bus"


# sgl-project/sglang#1509: the custom all-reduce's CUDACHECK on both TP ranks
PEER = ("Failed: Cuda error /workspace/csrc/custom_all_reduce.cuh:307 'peer access is not supported between these two devices'\n"
        * 2)


def test_peer_access_unsupported_is_the_collective_s_configuration_and_never_drains():
    d = diag({"logs/app/bench_latency.log": PEER}, nodes=["node-01"])
    assert (d.status, d.sub_domain) == ("attributed", "nccl_config_error")
    assert d.recovery.action == "notify_owner"


# kubeflow/mpi-operator#152: Open MPI's own hedge on why it lost the daemon
ORTE = """ORTE has lost communication with a remote daemon.

  HNP daemon   : [[43015,0],0] on node tf-bert-libnlp-token-lr-5e-6-fp32-1572827779-launcher-gdqv7
  Remote daemon: [[43015,0],20] on node tf-bert-libnlp-token-lr-5e-6-fp32-1572827779-worker-19

This is usually due to either a failure of the TCP network
connection to the node, or possibly an internal failure of
the daemon itself. We cannot recover from this failure, and
therefore will terminate the job.
"""


def test_a_lost_mpi_daemon_alone_names_a_suspect_not_a_cause():
    d = diag({"logs/app/launcher.log": ORTE})
    assert d.status == "unattributed"
    assert d.suspect_nodes == ["tf-bert-libnlp-token-lr-5e-6-fp32-1572827779-worker-19"]
    assert d.recovery.action == "notify_owner"


# ROCm/legacy-rocm-build#4021 (MI300X): the RAS interrupt on one GPU, the ACA entries of another after it
AMD = """[13850.912648] amdgpu 0000:1c:00.0: {1}uncorrectable hardware error(ERREVENT_ATHUB_INTERRUPT) detected!
[13850.927924] amdgpu 0000:42:00.0: {1}[Hardware Error]: Accelerator Check Architecture events logged
[13850.927941] amdgpu 0000:42:00.0: {1}[Hardware Error]: aca entry[00].STATUS=0x98000800003e0000
"""


def test_amdgpu_s_uncorrectable_ras_error_is_the_gpu_s_hardware_fault_on_that_gpu():
    d = diag({"logs/syslog/node-01.log": AMD}, nodes=["node-01"])
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_hardware_fault", ["node-01"])
    assert d.root_cause.gpu == "0000:1c:00.0"


def test_the_aca_entries_alone_name_no_cause():
    d = diag({"logs/syslog/node-01.log": "".join(AMD.splitlines(keepends=True)[1:])}, nodes=["node-01"])
    assert d.status == "unattributed"


# NVIDIA-NeMo/Speech#14348: NeMo-Run (TorchX's "role/replica ") before torchrun's "[default2]:" tag
NAN = ("i.pretrain/0 [default2]:[rank2]: RuntimeError: Rank 2, node dcfai-xe9680-01, device 2, iteration -1: Unexpected "
       "result nan (message='found NaN in local grad norm for bucket #0 in backward pass before data-parallel communication "
       "collective')\n")


def test_torchx_s_prefix_before_torchrun_s_tag_is_peeled_and_the_exception_read():
    d = diag({"logs/app/pretrain.log": NAN})
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")


def test_a_message_that_starts_like_role_slash_replica_is_not_peeled():
    d = diag({"logs/scheduler/mpijob-status.yaml": "1/8 workers are evicted\n"})
    assert d.sub_domain == "evicted"


# NVIDIA/NeMo's resiliency demo (NeMo-Run, torchelastic; corpus case mix2-nofail-injected-crash-...): a crash,
# the agent's restart, the run's end, three of its lines in order
RESILIENCY = """ining-demo/0 [default2]:[rank2]: Exception: Simulating a crash at step 17!
ining-demo/0 [2025-03-07 22:39:36,177] [INFO] [ft_launcher@4809917ea058] [default] Worker group FAILED. 3/3 attempts left; will restart worker group
ining-demo/0 [default0]:`Trainer.fit` stopped: `max_steps=20` reached.
"""


def test_a_crash_the_agent_restarted_after_is_recovered_when_the_run_then_ends():
    d = diag({"logs/app/train.log": RESILIENCY}, state="UNKNOWN")
    assert d.status == "no_failure"


def test_a_crash_after_the_restart_is_still_a_failure():
    lines = RESILIENCY.splitlines(keepends=True)
    d = diag({"logs/app/train.log": lines[1] + lines[0] + lines[2]}, state="UNKNOWN")
    assert d.status != "no_failure"
