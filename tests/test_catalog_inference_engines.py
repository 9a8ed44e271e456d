"""vLLM and SGLang, read from their source (vllm-project/vllm, sgl-project/sglang), through the real
engine: the engines' memory budget checks (the KV cache of the configured context does not fit) as the
application's CUDA out-of-memory, their reports that an engine core, a worker or a scheduler died or
stalled as echoes that never attribute, vLLM 0.4's missing NCCL library, and both engines' log
prefixes. Patterns: rules/catalog/extract/inference_engines.yaml; roles:
rules/catalog/early/inference_engines.yaml (and early/app.yaml for the reused kinds); prefixes:
rules/prefixes.py; the enumeration of sites: rules/emitters/inference_engines.yaml.

Each message is as posted in the public report named beside it. The test workload's window is moved
to the posted stamps (their year-less month and day) where a test diagnoses stamped lines."""
from firstfault.rules.ruletest import extract_one, seen_as

from conftest import catalog as _catalog, diag, pattern_of


def window(day: str, hhmm: str = "00:00", until: str = "23:59") -> dict:
    """A workload record whose window holds a posted day ("2024-11-18")."""
    return {"start_time": f"{day}T{hhmm}:00Z", "end_time": f"{day}T{until}:00Z"}


# ------------------------------------------------------------------ the memory budget: cuda_oom

# vllm-project/vllm#10439 (v0 in docker compose: the compose prefix, then vLLM's pre-bracket logger)
KV_V0 = (
    'vllm-1  | ERROR 11-18 18:07:28 engine.py:366]   File "/usr/local/lib/python3.12/dist-packages/vllm/worker/worker.py", line 493, in raise_if_cache_size_invalid\n'
    'vllm-1  | ERROR 11-18 18:07:28 engine.py:366]     raise ValueError("No available memory for the cache blocks. "\n'
    "vllm-1  | ERROR 11-18 18:07:28 engine.py:366] ValueError: No available memory for the cache blocks. Try increasing "
    "`gpu_memory_utilization` when initializing the engine.\n")
# vllm-project/vllm#2418
MAX_SEQ_V0 = ("ValueError: The model's max seq len (4096) is larger than the maximum number of tokens that can be stored in KV "
              "cache (3664). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.")
# vllm-project/tpu-inference#223 (v1's wording, "models's" as vLLM wrote it)
MAX_SEQ_V1 = ("ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is needed, "
              "which is larger than the available KV cache memory (0.71 GiB). Based on the available memory, the estimated maximum "
              "model length is 5632. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.")
# vllm-project/vllm#25837 (another process held part of a 4 GiB GPU)
FREE_MEM = (
    "(EngineCore_DP0 pid=17374) ERROR 09-28 15:47:24 [core.py:718]     raise ValueError(\n"
    "(EngineCore_DP0 pid=17374) ERROR 09-28 15:47:24 [core.py:718] ValueError: Free memory on device (3.22/4.0 GiB) on startup "
    "is less than desired GPU memory utilization (0.9, 3.6 GiB). Decrease GPU memory utilization or reduce GPU memory used by "
    "other processes.\n"
    "(EngineCore_DP0 pid=17374) Process EngineCore_DP0:\n"
    "(EngineCore_DP0 pid=17374) Traceback (most recent call last):\n")
# vllm-project/vllm#17939
SAMPLER = ("(VllmWorker rank=1 pid=2445156) ERROR 05-10 16:00:15 [multiproc_executor.py:470] RuntimeError: CUDA out of memory "
           "occurred when warming up sampler with 256 dummy requests. Please try lowering `max_num_seqs` or "
           "`gpu_memory_utilization` when initializing the engine.")
# sgl-project/sglang#4330
SGL_MEM = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."


def test_the_memory_budget_checks_are_read_by_the_engine_patterns():
    assert pattern_of(KV_V0.splitlines()[-1]) == "vllm.kv_cache_memory"
    for line in (MAX_SEQ_V0, MAX_SEQ_V1, FREE_MEM.splitlines()[1], SAMPLER):
        assert pattern_of(line) == "vllm.kv_cache_memory", line
    assert pattern_of(SGL_MEM) == "sglang.kv_cache_memory"


def test_a_kv_cache_that_cannot_hold_the_context_is_the_job_s_cuda_oom():
    for line in (MAX_SEQ_V0, MAX_SEQ_V1, SAMPLER, SGL_MEM):
        d = diag({"logs/app/serve.log": line + "\n"}, **window("2025-05-10"))
        assert (d.status, d.sub_domain) == ("attributed", "cuda_oom"), line
        assert d.recovery.action == "notify_owner" and d.recovery.nodes == []


def test_the_engine_s_own_remedy_is_the_next_step():
    d = diag({"logs/app/serve.log": MAX_SEQ_V0 + "\n"})
    assert "gpu_memory_utilization" in d.recovery.next_step and "max_model_len" in d.recovery.next_step


def test_a_v0_log_in_docker_compose_is_read_through_both_prefixes():
    # before: neither the compose prefix's vLLM logger header nor the ValueError after it was read
    assert "ValueError: No available memory" in seen_as(KV_V0.splitlines()[-1]).split("'")[1]
    d = diag({"logs/app/vllm.log": KV_V0}, **window("2026-11-18"))
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom")
    assert d.root_cause.timestamp is not None and d.root_cause.timestamp.startswith("2026-11-18T18:07:28")


def test_free_memory_below_the_utilisation_is_an_out_of_memory_never_a_drain():
    d = diag({"logs/app/vllm.log": FREE_MEM}, **window("2026-09-28"))
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom")
    assert d.recovery.action != "drain_nodes" and d.recovery.nodes == []


def test_other_memory_lines_are_not_the_budget():
    assert pattern_of("INFO 04-27 10:13:05 llm_engine.py:275] # GPU blocks: 0, # CPU blocks: 256") is None
    # sgl-project/sglang#7691: a warning, the engine goes on with the profiled size
    assert pattern_of("[2025-07-02 07:41:59 DP0 TP0] max_total_tokens=131072 is larger than the profiled value -561981. "
                      "Use the profiled value instead.") is None
    # PyTorch's own allocator message stays torch.cuda_oom's (vllm-project/vllm#15105)
    assert pattern_of("(VllmWorker rank=1 pid=2978) ERROR 03-19 07:27:53 [multiproc_executor.py:375] torch.OutOfMemoryError: "
                      "CUDA out of memory. Tried to allocate 1.74 GiB. GPU 1 has a total capacity of 23.57 GiB of which "
                      "605.88 MiB is free.") == "torch.cuda_oom"


# ------------------------------------------------------------------ dead engines and workers: echoes

# vllm-project/vllm#23176
INIT_FAILED = ("(APIServer pid=1179246) RuntimeError: Engine core initialization failed. See root cause above. "
               "Failed core proc(s): {}")
# vllm-project/vllm#42362
ENGINE_DEAD = ("(APIServer pid=1) ERROR 05-12 01:48:42 [api_router.py:72] vllm.v1.engine.exceptions.EngineDeadError: EngineCore "
               "encountered an issue. See stack trace (above) for the root cause.")
# vllm-project/vllm#32468 (printed at the end of a script that never shut the engine down)
CORE_DIED = "ERROR 01-16 17:16:49 [core_client.py:605] Engine core proc EngineCore_DP0 died unexpectedly, shutting down client."
# vllm-project/vllm#9175 (v0's multiprocessing client: the engine's heartbeat stopped)
LOOP_DIED = "ERROR 10-09 02:13:55 client.py:250] RuntimeError: Engine loop has died"
# vllm-project/vllm#2067
ASYNC_DEAD = ("vllm.engine.async_llm_engine.AsyncEngineDeadError: Task finished unexpectedly. This should never happen! "
              "Please open an issue on Github. See stack trace above for the actual cause.")
# LMCache/LMCache#411
MQ_DEAD = ("ERROR 03-17 08:02:04 serving_chat.py:596] vllm.engine.multiprocessing.MQEngineDeadError: Engine loop is not running. "
           "Inspect the stacktrace to find the original error: AssertionError('Error in model execution (input dumped to "
           "/tmp/err_execute_model_input_20250317-080027.pkl): ').")
# vllm-project/vllm#14452 (vLLM's typo)
FATAL_SIGNAL = ("CRITICAL 03-15 17:24:18 [multiproc_executor.py:48] MulitprocExecutor got fatal signal from worker processes, "
                "shutting down. See stack trace above for root cause issue.")
# vllm-project/vllm#20226 (its title: RuntimeError: NCCL error: unhandled cuda error; the excerpt posted)
WORKER_INIT = (
    'ERROR 06-29 19:20:00 [core.py:515]   File "/environments/venv/lib64/python3.11/site-packages/vllm/v1/executor/multiproc_executor.py", line 427, in wait_for_ready\n'
    "ERROR 06-29 19:20:00 [core.py:515]     raise e from None\n"
    "ERROR 06-29 19:20:00 [core.py:515] Exception: WorkerProc initialization failed due to an exception in a background process. "
    "See stack trace for root cause.\n"
    "Process EngineCore_0:\n"
    "Traceback (most recent call last):\n")


def test_the_engines_death_reports_are_read_as_such():
    for line in (INIT_FAILED, ENGINE_DEAD, CORE_DIED, LOOP_DIED, ASYNC_DEAD, MQ_DEAD, FATAL_SIGNAL,
                 WORKER_INIT.splitlines()[2]):
        assert pattern_of(line) == "vllm.engine_dead", line


def test_an_engine_death_report_alone_attributes_nothing():
    # before: the undotted RuntimeError / Exception forms were python.exception_final's, a confident user_code_exception
    for line in (INIT_FAILED, ENGINE_DEAD, CORE_DIED, LOOP_DIED, ASYNC_DEAD, MQ_DEAD):
        d = diag({"logs/app/serve.log": line + "\n"})
        assert d.status == "unattributed", line
        assert [s.kind for s in d.symptoms] == ["inference_engine_dead"], line
        assert d.recovery.action == "notify_owner" and d.recovery.nodes == [], line


def test_a_worker_that_failed_to_start_is_an_echo_of_its_own_error():
    d = diag({"logs/app/vllm.log": WORKER_INIT}, **window("2026-06-29"))
    assert d.status == "unattributed" and d.sub_domain != "user_code_exception"
    assert {s.kind for s in d.symptoms} == {"inference_engine_dead"}


def test_an_nccl_error_under_the_engine_s_echo_stays_weak():
    # composed of two reports' lines: huggingface/trl#3408 (the corpus case: pynccl's unhandled cuda error under a
    # weight-sync RPC), then vllm-project/vllm#23176's start-up echo as the API server prints it. The echo must not turn
    # the weak NCCL error into a user exception (before, python.exception_final made it one)
    log = ("INFO 05-16 09:57:41 [pynccl.py:69] vLLM is using nccl==2.21.5\n"
           "ERROR 05-16 09:57:41 [core.py:459] Invocation of collective_rpc method failed\n"
           "ERROR 05-16 09:57:41 [core.py:459] RuntimeError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)\n"
           + INIT_FAILED + "\n")
    d = diag({"logs/app/vllm.log": log}, **window("2026-05-16"))
    assert (d.status, d.sub_domain) == ("unattributed", "unattributed")
    assert {s.kind for s in d.symptoms} == {"nccl_error", "inference_engine_dead"}


def test_the_worker_s_own_exception_explains_the_worker_s_death():
    # vllm-project/vllm#6145 (the corpus case): tensor parallelism 3 does not divide the model, the worker monitor follows
    log = ("[rank0]: AssertionError: 32768 is not divisible by 3\n\n"
           "ERROR 07-13 02:56:30 multiproc_worker_utils.py:120] Worker VllmWorkerProcess pid 382811 died, exit code: -15\n"
           "INFO 07-13 02:56:30 multiproc_worker_utils.py:123] Killing local vLLM worker processes\n")
    d = diag({"logs/app/vllm.log": log}, **window("2026-07-13"))
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")
    assert [s.kind for s in d.symptoms] == ["inference_engine_dead"]
    assert d.symptom_coverage == 1.0


def test_a_kv_cache_failure_explains_the_api_server_s_echo():
    # composed: vllm-project/vllm#2418's ValueError, then the start-up echo vllm-project/vllm#23176 shows under it
    d = diag({"logs/app/serve.log": MAX_SEQ_V0 + "\n" + INIT_FAILED + "\n"})
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom")
    assert d.symptom_coverage == 1.0


def test_lines_near_the_echoes_are_not_read_as_them():
    # the header of the core's traceback: its last line carries the cause (ovg-project/kvcached#191's log)
    assert pattern_of("(EngineCore_DP0 pid=10311) ERROR 10-25 11:17:27 [core.py:720] EngineCore encountered a fatal error.") is None
    # the worker's error as a string keeps the reading of what it quotes (or the program's exception)
    assert pattern_of("RuntimeError: Worker failed with error 'expected scalar type Long but found Int', please check the "
                      "stack trace above for the root cause") == "python.exception_final"
    # Ray's own actor death stays launch.ray_actor_died's (the corpus case of verl#2987)
    assert pattern_of("(TaskRunner pid=892962) ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing "
                      "this task.") == "launch.ray_actor_died"


# ------------------------------------------------------------------ stalls

# vllm-project/vllm#6208
ITERATION = "ERROR 07-07 15:20:11 async_llm_engine.py:535] Engine iteration timed out. This should never happen!"
# sgl-project/sglang#3752 (the corpus case): every TP rank's watchdog, then the launcher's SIGQUIT handler
SGL_WATCHDOG = (
    "[2025-03-09 00:57:15 TP4] Watchdog timeout (self.watchdog_timeout=300)\n"
    "[2025-03-09 00:57:15 TP6] Watchdog timeout (self.watchdog_timeout=300)\n"
    "[2025-03-09 00:57:15 TP1] Watchdog timeout (self.watchdog_timeout=300)\n"
    "[2025-03-09 00:57:15 TP2] Watchdog timeout (self.watchdog_timeout=300)\n"
    "[2025-03-09 00:57:15 TP5] Watchdog timeout (self.watchdog_timeout=300)\n"
    "[2025-03-09 00:57:15 TP7] Watchdog timeout (self.watchdog_timeout=300)\n"
    "[2025-03-09 00:57:16 TP3] Watchdog timeout (self.watchdog_timeout=300)\n"
    "[2025-03-09 00:57:16 TP0] Watchdog timeout (self.watchdog_timeout=300)\n"
    "[2025-03-09 00:57:20] Received sigquit from a child proces. It usually means the child failed.\n"
    "Killed\n")


def test_stalls_are_read_and_attribute_nothing():
    assert pattern_of(ITERATION) == "vllm.engine_stalled"
    assert pattern_of("TimeoutError: RPC call to execute_model timed out.") == "vllm.engine_stalled"
    d = diag({"logs/app/serve.log": ITERATION + "\n"}, **window("2026-07-07"))
    assert d.status == "unattributed" and [s.kind for s in d.symptoms] == ["inference_engine_stalled"]


def test_sglang_s_watchdog_on_every_rank_is_a_stall_with_stamps_and_no_drain():
    d = diag({"logs/app/server.log": SGL_WATCHDOG}, **window("2025-03-09"))
    assert d.status == "unattributed"
    kinds = {s.kind: s.count for s in d.symptoms}
    assert kinds == {"inference_engine_stalled": 8, "inference_engine_dead": 1}
    assert d.recovery.action == "notify_owner" and d.recovery.nodes == [] and d.suspect_nodes == []
    first = next(s for s in d.symptoms if s.kind == "inference_engine_stalled")
    assert first.first.startswith("2025-03-09T00:57:15")          # SGLang's "[date time TP4] " is read as a stamp


def test_the_ranks_in_sglang_s_prefix_are_not_read_as_the_job_s_ranks():
    ev = extract_one(_catalog(), "[2025-06-26 07:25:31 DP4 TP4] Watchdog timeout (self.watchdog_timeout=300)", "app")
    assert ev.pattern == "sglang.watchdog_timeout" and ev.rank is None


def test_pytorch_s_collective_watchdog_is_not_sglang_s():
    # the corpus case of sgl-project/sglang#10216
    line = ("[rank1]:[E909 08:45:30.126335825 ProcessGroupNCCL.cpp:2252] [PG ID 2 PG GUID 3 Rank 1]  failure detected by "
            "watchdog at work sequence id: 40231 PG status: last enqueued work: 40267, last completed work: 40230")
    assert pattern_of(line) != "sglang.watchdog_timeout"


def test_sglang_s_start_up_failures_are_echoes():
    for line in ("RuntimeError: Initialization failed. Please see the error messages above.",
                 "RuntimeError: Rank 0 scheduler died during initialization (exit code: -9). If exit code is -9 (SIGKILL), a "
                 "common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check."):
        assert pattern_of(line) == "sglang.child_failed", line
        d = diag({"logs/app/server.log": line + "\n"})
        assert d.status == "unattributed" and d.sub_domain != "user_code_exception", line


# ------------------------------------------------------------------ vLLM 0.4's NCCL library

def test_vllm_0_4_without_libnccl_is_the_job_s_nccl_setup():
    # vllm-project/vllm#4294 (the exception line as its title gives it)
    d = diag({"logs/app/serve.log": "NameError: name 'ncclGetVersion' is not defined\n"})
    assert (d.status, d.sub_domain) == ("attributed", "nccl_config_error")
    assert d.recovery.nodes == []


def test_the_load_failure_a_single_gpu_engine_survives_attributes_nothing():
    # OpenBMB/MiniCPM#189: tensor_parallel_size=1, the engine went on after these lines
    log = ("ERROR 08-19 09:33:57 pynccl.py:53] Failed to load NCCL library from libnccl.so.2 .It is expected if you are not "
           "running on NVIDIA/AMD GPUs.Otherwise please set the environment variable VLLM_NCCL_SO_PATH to point to the "
           "correct nccl library path.\n"
           "INFO 08-19 09:33:57 pynccl_utils.py:17] Failed to import NCCL library: libnccl.so.2: cannot open shared object "
           "file: No such file or directory\n"
           "INFO 08-19 09:33:57 pynccl_utils.py:18] It is expected if you are not running on NVIDIA GPUs.\n")
    d = diag({"logs/app/serve.log": log}, **window("2026-08-19"))
    assert d.status != "attributed"


# ------------------------------------------------------------------ prefixes

def test_vllm_s_logger_before_the_brackets_is_a_prefix():
    assert seen_as(LOOP_DIED) == ("the pattern sees 'RuntimeError: Engine loop has died' "
                                  "(prefixes removed: 'ERROR 10-09 02:13:55 client.py:250] ')")
    # rh-aiservices-bu/llm-on-openshift#57: after Ray's worker tag
    assert "(prefixes removed: '(RayWorkerVllm pid=1209) ERROR 04-23 19:30:04 pynccl.py:53] ')" in seen_as(
        "(RayWorkerVllm pid=1209) ERROR 04-23 19:30:04 pynccl.py:53] Failed to load NCCL library from libnccl.so.2 .")


def test_a_glog_line_is_not_read_as_vllm_s_logger():
    # torchrun's agent through absl (glog_bare), unchanged
    line = "W0726 10:59:50.786825 140538811684672 torch/distributed/elastic/multiprocessing/api.py:858] Sending process 1 closing signal SIGTERM"
    assert "W0726 10:59:50.786825 140538811684672" in seen_as(line)
