"""XLA on GPU and JAX's multi-process runtime, read from their source (openxla/xla with TSL's
coordination service, jax-ml/jax), through the real engine: XLA's NCCL wrapper, the coordination
service's heartbeats, barriers and key waits, the JAX client's deliberate "Terminating process",
the GPU allocators' out-of-memory wordings and "No visible GPU devices". Patterns:
rules/catalog/extract/xla_jax.yaml; roles: rules/catalog/early/xla_jax.yaml (and early/app.yaml,
early/torch_core.yaml for the reused kinds); the enumeration of sites: rules/emitters/xla_jax.yaml.

Each message is as posted in the public report named beside it. Where a test places lines on ranks
and hosts, the "N: " srun label is added in front; where a posted stamp falls outside the test
workload's window, it is dropped or moved into it (said where done)."""
from conftest import diag, pattern_of


# ------------------------------------------------------------------ XLA's NCCL wrapper

# jax-ml/jax#17399
NCCL_CUDA = ("INTERNAL: external/xla/xla/service/gpu/nccl_utils.cc:275: NCCL operation ncclCommInitRank(&comm, nranks, id, "
             "rank) failed: unhandled cuda error")
# tensorflow/tensorflow#62757 (TensorFlow's XLA, two GPUs)
NCCL_USAGE = ("  (0) INTERNAL:  Failed to execute XLA Runtime executable: run time error: custom call 'xla.gpu.all_reduce' "
              "failed: external/local_xla/xla/service/gpu/nccl_utils.cc:297: NCCL operation ncclCommInitRank(&comm, nranks, "
              "id, rank) failed: invalid usage; current tracing scope: all-reduce-start.4; current profiling annotation: "
              "XlaModule:#hlo_module=a_inference_run_step_7562__.4006,program_id=447#.")
# google/flax#4942 (the call's arguments hold parentheses of their own)
NCCL_ARG = ("E0912 23:44:51.552719 2536982 pjrt_stream_executor_client.cc:3008] Execution of replica 0 failed: INTERNAL: NCCL "
            "operation ncclAllReduce( send_buffer.opaque(), recv_buffer.opaque(), ToNcclCount(dtype, count), nccl_dtype, "
            "ToNcclReduction(reduction_kind), comm_, se::gpu::AsGpuStreamValue(stream)) failed: invalid argument (run with "
            "NCCL_DEBUG=WARN for details). Last NCCL warning(error) log entry (may be unrelated) ''.")
# LargeWorldModel/LWM#42: NCCL's topology probe, quoted as XLA's "last NCCL warning"
NCCL_TOPO = ("jaxlib.xla_extension.XlaRuntimeError: INTERNAL: Failed to execute XLA Runtime executable: run time error: "
             "custom call 'xla.gpu.reduce_scatter' failed: external/xla/xla/service/gpu/nccl_utils.cc:305: NCCL operation "
             "ncclCommInitRank(&comm, nranks, id, rank) failed: internal error - please report this issue to the NCCL "
             "developers. Last NCCL warning(error) log entry (may be unrelated) 'Attribute busid of node nic not found'.; current")
# LargeWorldModel/LWM#44
NCCL_LIB = ("INTERNAL: external/xla/xla/service/gpu/nccl_utils.cc:134: NCCL operation ncclGetUniqueId(&id) failed: Unable to "
            "load NCCL library. Multi-GPU collectives will not work.. Last NCCL warning(error) log entry (may be unrelated) "
            "'Unable to load NCCL library. Multi-GPU collectives will not work.'.")


def test_xla_nccl_failures_are_read_and_the_quoted_cause_wins():
    assert pattern_of(NCCL_CUDA) == "xla.nccl_operation_failed"
    assert pattern_of(NCCL_ARG) == "xla.nccl_operation_failed"
    assert pattern_of(NCCL_TOPO) == "nccl.config_topology"
    assert pattern_of(NCCL_LIB) == "xla.nccl_library_unloadable"


def test_an_unhandled_cuda_error_in_xla_s_nccl_call_is_a_symptom():
    d = diag({"logs/app/train.log": NCCL_CUDA + "\n"})
    assert d.status == "unattributed"
    assert [s.kind for s in d.symptoms] == ["nccl_error"]


def test_invalid_usage_of_nccl_through_xla_is_the_job_s_configuration():
    for line in (NCCL_USAGE, NCCL_ARG):
        d = diag({"logs/app/train.log": line + "\n"})
        assert (d.status, d.sub_domain) == ("attributed", "nccl_config_error"), line
        assert d.recovery.action == "notify_owner" and d.recovery.nodes == []


def test_nccl_s_topology_error_quoted_by_xla_stays_a_configuration_error():
    d = diag({"logs/app/train.log": NCCL_TOPO + "\n"})
    assert (d.status, d.sub_domain) == ("attributed", "nccl_config_error")


# ------------------------------------------------------------------ coordination service

# jax-ml/jax docs/fault_tolerance.rst: what the surviving tasks print after one is killed
DOC_ECHO = """E0926 17:26:32.075402  157988 coordination_service_agent.cc:332] Polled an error from coordination service (this can be an error from this or another task).
F0926 17:26:32.075587  157988 client.h:77] Terminating process because the JAX distributed service detected fatal errors. This most likely indicates that another task died; see the other task logs for more details. Disable Python buffering, i.e. `python -u`, to be sure to see all the previous output. absl::Status: UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):
/job:jax_worker/replica:0/task:3
The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. preemption, eviction) to debug further.
"""
# EleutherAI/architecture-objective#26 (TensorFlow-era coordination service)
TASK37 = ("2022-11-15 16:03:15.140058: E external/org_tensorflow/tensorflow/core/distributed_runtime/coordination/"
          "coordination_service.cc:954] /job:jax_worker/replica:0/task:37 has been set to ERROR in coordination service: "
          "UNAVAILABLE: Task /job:jax_worker/replica:0/task:37 heartbeat timeout. This indicates that the remote task has "
          "failed, got preempted, or crashed unexpectedly. [type.googleapis.com/tensorflow.CoordinationServiceError='']")


def test_a_lost_task_alone_names_no_cause():
    for text in (DOC_ECHO, TASK37 + "\n"):
        d = diag({"logs/app/train.log": text})
        assert d.status == "unattributed", text
        assert {s.kind for s in d.symptoms} == {"coordination_peer_failed"}
        assert d.recovery.action == "notify_owner" and d.recovery.nodes == []


def _on(label: int, text: str) -> str:
    return "".join(f"{label}: {ln}\n" for ln in text.splitlines())


# ecmwf-lab/ai-models-graphcast#18
ALLOC_REQUEST = ("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Failed to allocate request for 2.99GiB "
                 "(3206250496B) on device ordinal 0")


def test_the_dead_task_s_own_oom_explains_the_others_terminating():
    d = diag({"logs/app/node-02.log": _on(8, ALLOC_REQUEST),
              "logs/app/node-01.log": _on(0, DOC_ECHO)})
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "cuda_oom", ["node-02"])
    assert d.symptom_coverage == 1.0


def test_a_gpu_lost_on_another_host_explains_the_coordination_echoes():
    # the doc's lines, their glog stamps moved into the workload's window (after the Xid)
    echo = DOC_ECHO.replace("E0926 17:26:32", "E1102 10:03:40").replace("F0926 17:26:32", "F1102 10:03:40")
    d = diag({"logs/syslog/node-02.log": "Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', "
                                         "name=<unknown>, GPU has fallen off the bus.\n",
              "logs/app/node-01.log": _on(0, echo)})
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_fell_off_bus", ["node-02"])
    assert "node-01" not in d.recovery.nodes


# marin-community/marin#1933 (levanter's broadcast barrier), EnzymeAD/Enzyme-JAX#623 (the NCCL clique id's key)
LATE_BARRIER = ("jaxlib.xla_extension.XlaRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. Barrier_id: "
                "multihost_broadcast_sync0. Timed out task names:")
KV = ("E0000 00:00:1743713172.513857  698835 pjrt_stream_executor_client.cc:3072] Execution of replica 0 failed: "
      "DEADLINE_EXCEEDED: GetKeyValue() timed out with key: devices=[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,"
      "22,23,24,25,26,27,28,29]; stream=0; groups=[[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,"
      "28,29]]; root_device=0; num_local_participants=2 and duration: 10m [type.googleapis.com/tensorflow.CoordinationServiceError='']")
# ayaka14732/llama-2-jax#20
CONNECT_BARRIER = ("jaxlib.xla_extension.XlaRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. Barrier_id: PjRT_Client_Connect. "
                   "Timed out task names:")


def test_waits_after_start_up_are_echoes_not_a_rendezvous_failure():
    for line in (LATE_BARRIER, KV):
        assert pattern_of(line) == "xla.coordination_wait_timeout", line
        d = diag({"logs/app/train.log": line + "\n"})
        assert d.status == "unattributed" and d.sub_domain != "rendezvous_error", line


def test_the_start_up_barrier_is_still_a_rendezvous_failure():
    assert pattern_of(CONNECT_BARRIER) == "xla.init_barrier_timeout"
    d = diag({"logs/app/train.log": CONNECT_BARRIER + "\n"})
    assert (d.status, d.sub_domain) == ("attributed", "rendezvous_error")


# ------------------------------------------------------------------ GPU memory

# kingoflolz/mesh-transformer-jax#66 (old JAX raises a plain RuntimeError)
OLD_RUNTIME = "RuntimeError: Resource exhausted: Failed to allocate request for 32.00MiB (33554432B) on device ordinal 0"
# onpix/LLNeRF#9, octo-models/octo#22 (the inline-code backtick kept)
ALLOCATING = "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory allocating 20029400304 bytes."
CONSTANT = "`jaxlib.xla_extension.XlaRuntimeError: INTERNAL: Failed to allocate 98697216 bytes for new constant"
# jax-ml/jax#27354 (XLA's BFC allocator, the final failure) and flatironinstitute/nemos#345 (the retry warnings)
BFC_FAIL = ("2025-03-23 20:28:59.832181: W external/xla/xla/tsl/framework/bfc_allocator.cc:501] Allocator (GPU_0_bfc) ran out "
            "of memory trying to allocate 1.25TiB (rounded to 1374521760000)requested by op ")
BFC_RETRY = ("2025-05-18 21:59:55.086788: W external/xla/xla/tsl/framework/bfc_allocator.cc:310] Allocator (GPU_0_bfc) ran out "
             "of memory trying to allocate 3.37GiB with freed_by_count=0. The caller indicates that this is not a failure, but "
             "this may mean that there could be performance gains if more memory were available.")


def test_xla_s_other_allocator_wordings_are_a_gpu_out_of_memory():
    # the BFC line without its 2025 stamp, which falls outside the test workload's window
    for line in (ALLOC_REQUEST, OLD_RUNTIME, ALLOCATING, CONSTANT, BFC_FAIL.split(": W ", 1)[1]):
        d = diag({"logs/app/train.log": line + "\n"})
        assert (d.status, d.sub_domain) == ("attributed", "cuda_oom"), line
        assert d.recovery.action == "notify_owner"


def test_old_jax_s_runtime_error_is_not_read_as_the_program_s_exception():
    assert pattern_of(OLD_RUNTIME) == "xla.device_alloc_failed"


def test_the_bfc_retry_warning_is_not_an_out_of_memory():
    assert pattern_of(BFC_RETRY) is None
    d = diag({"logs/app/train.log": BFC_RETRY.split(": W ", 1)[1] + "\n"})
    assert d.sub_domain != "cuda_oom"


def test_pinned_host_memory_is_not_a_gpu_out_of_memory():
    # format-built from tf_allocator_adapter.cc's MemoryAllocationError (host memory space): no public log found
    line = ("RESOURCE_EXHAUSTED: Out of host memory while trying to allocate 2.00GiB. Please set the environment variable "
            "XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB to allocate larger host memory than the default 64 GB.")
    assert pattern_of(line) is None


# ------------------------------------------------------------------ no visible GPU

NO_GPU = "jaxlib.xla_extension.XlaRuntimeError: FAILED_PRECONDITION: No visible GPU devices."
# jax-ml/jax#24866: the cuInit failure XLA logs before it
CUINIT_802 = ("2024-11-12 15:36:48.401160: E external/xla/xla/stream_executor/cuda/cuda_driver.cc:152] failed call to cuInit: "
              "INTERNAL: CUDA error: Failed call to cuInit: CUDA_ERROR_SYSTEM_NOT_READY: system not yet initialized")
# KosinskiLab/AlphaPulldown#571
CUINIT_UNKNOWN = ("2026-01-22 22:32:40.809897: E external/xla/xla/stream_executor/cuda/cuda_platform.cc:51] failed call to "
                  "cuInit: INTERNAL: CUDA error: Failed call to cuInit: CUDA_ERROR_UNKNOWN: unknown error")


def test_no_visible_gpu_alone_proves_no_configuration():
    # a raised RuntimeError around it was read as the program's own exception before
    for text in (NO_GPU, "RuntimeError: Unable to initialize backend 'cuda': FAILED_PRECONDITION: No visible GPU devices. "
                         "(you may need to uninstall the failing plugin package, or set JAX_PLATFORMS=cpu to skip this backend.)"):
        d = diag({"logs/app/train.log": text + "\n"})
        assert d.status == "unattributed", text
        assert d.sub_domain != "user_code_exception"


def test_the_cuinit_error_above_no_visible_gpu_decides():
    # the cuInit lines without their glog stamps, which fall outside the test workload's window
    d = diag({"logs/app/train.log": CUINIT_802.split("] ", 1)[1] + "\n" + NO_GPU + "\n"})
    assert (d.status, d.sub_domain) == ("attributed", "nvswitch_fatal")
    d = diag({"logs/app/train.log": CUINIT_UNKNOWN.split("] ", 1)[1] + "\n" + NO_GPU + "\n"})
    assert d.status == "unattributed" and d.sub_domain != "nccl_config_error"


def test_jax_s_quiet_backend_probe_is_not_read():
    # LargeWorldModel/LWM#44
    assert pattern_of("I0223 22:58:05.579842 140312230876992 xla_bridge.py:660] Unable to initialize backend 'tpu': "
                      "INTERNAL: Failed to open libtpu.so: libtpu.so: cannot open shared object file: No such file or directory") is None
