"""DeepSpeed runtime sites (ZeRO checkpoints, the op builder, NVMe offload) and the DeepSpeed strategy
wrappers' exceptions added from DeepSpeed's and Lightning's source. Real lines through the real engine.
Patterns: rules/catalog/extract/deepspeed_runtime.yaml; roles: rules/catalog/early/deepspeed_runtime.yaml
(and early/app.yaml's python_exception rules); the enumeration of sites: rules/emitters/deepspeed_runtime.yaml.

Each message is as posted in the public report named beside it; "N: " srun labels and "[rankN]: "
prefixes are the launcher's and PyTorch's own, added only where a test places a line on a rank."""

from datetime import datetime, timezone

from conftest import diag

from firstfault.rules.prefixes import StampContext, read_head

# deepspeedai/DeepSpeed#6441
WORLD_SIZE = ("deepspeed.runtime.zero.utils.ZeRORuntimeException: The checkpoint being loaded used a DP world size of 8 "
              "but the current world size is 16. Automatic adjustment of ZeRO's optimizer state partitioning with a new "
              "world size is not currently supported.")
# JIA-Lab-research/MGM#91
CUDA_MISMATCH = ("deepspeed.ops.op_builder.builder.CUDAMismatchException: >- DeepSpeed Op Builder: Installed CUDA version 12.2 "
                 "does not match the version torch was compiled with 11.7, unable to compile cuda/cpp extensions without a "
                 "matching cuda version.")
# thinhlpg/vixtts-demo#12
MISSING_CUDA = "deepspeed.ops.op_builder.builder.MissingCUDAException: CUDA_HOME does not exist, unable to compile CUDA op(s)"
# deepspeedai/DeepSpeed#7524
OFFLOAD_OPTIMIZER = ("deepspeed.runtime.zero.utils.ZeRORuntimeException: You are using ZeRO-Offload with a client provided "
                     "optimizer (<class 'deepspeed.ops.lion.cpu_lion.DeepSpeedCPULion'>) which in most cases will yield poor "
                     "performance. Please either use deepspeed.ops.adam.DeepSpeedCPUAdam or set an optimizer in your ds-config "
                     "(https://www.deepspeed.ai/docs/config-json/#optimizer-parameters). If you really want to use a custom "
                     "optimizer w. ZeRO-Offload and understand the performance impacts you can also set "
                     "<\"zero_force_ds_cpu_optimizer\": false> in your configuration file.")
# deepspeedai/DeepSpeed#3376 (four ranks' output interleaved, as posted)
AIO_3376 = (
    "python: /usr/local/lib/python3.8/dist-packages/deepspeed/ops/csrc/aio/py_lib/deepspeed_py_aio_handle.cpp:228: int "
    "deepspeed_aio_handle_t::pread(const at::Tensor&, const char*, bool, bool): Assertion `static_cast<long long int>"
    "(buffer.nbytes()) == num_file_bytes' failed.\n"
    "/nvme/zero_stage_3/optimizer/rank6/139649992513552.tensor.swp: buffer nbytes != file bytes 4001366016 != 3426746368\n"
    "python: /usr/local/lib/python3.8/dist-packages/deepspeed/ops/csrc/aio/py_lib/deepspeed_py_aio_handle.cpp:228: int "
    "deepspeed_aio_handle_t::pread(const at::Tensor&, const char*, bool, bool): Assertion `static_cast<long long int>"
    "(buffer.nbytes()) == num_file_bytes' failed.\n"
    "/nvme/zero_stage_3/optimizer/rank2/139929715382368.tensor.swp: buffer nbytes != file bytes 4001366016 != 3599761408\n"
    "/nvme/zero_stage_3/optimizer/rank1/140296723433568.tensor.swp: buffer nbytes != file bytes python: "
    "/usr/local/lib/python3.8/dist-packages/deepspeed/ops/csrc/aio/py_lib/deepspeed_py_aio_handle.cpp:228: int "
    "deepspeed_aio_handle_t::pread(const at::Tensor&, const char*, bool, bool): Assertion `static_cast<long long int>"
    "(buffer.nbytes()) == num_file_bytes' failed.\n"
    "4001366016 != 3539992576\n")
# deepspeedai/DeepSpeed#2006 (the python3 program name glibc's assert puts first)
AIO_PY3 = ("python3: /usr/local/lib/python3.6/dist-packages/deepspeed/ops/csrc/aio/py_lib/deepspeed_py_aio_handle.cpp:223: int "
           "deepspeed_aio_handle_t::pread(const at::Tensor&, const char*, bool, bool): Assertion `static_cast<long long int>"
           "(buffer.nbytes()) == num_file_bytes' failed.")
CTX = StampContext(zone=timezone.utc, anchor=datetime(2024, 1, 1, tzinfo=timezone.utc))


# ------------------------------------------------------------------ ZeRO checkpoints

def test_zero_checkpoint_resumed_on_another_world_size_is_the_owners_with_its_fix():
    d = diag({"logs/app/node-01.log": "5: [rank5]: " + WORLD_SIZE + "\n"})
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")
    assert d.recovery.action == "notify_owner" and d.recovery.nodes == []
    assert "8 ranks, not 16" in d.recovery.next_step and "ds_to_universal" in d.recovery.next_step


def test_world_size_traceback_as_posted():
    # THUDM/GLM#136: the checkpoint engine's INFO line, the raise line and the exception.
    log = ("[2023-03-21 20:28:05,674] [INFO] [torch_checkpoint_engine.py:21:load] [Torch] Loading checkpoint from "
           "/home/zhaojinming/data/pretrained_model/glm-10b-chinese-mp4/80000/mp_rank_00_model_states.pt...\n"
           "    raise ZeRORuntimeException(\"The checkpoint being loaded used a DP \" \\\n"
           "deepspeed.runtime.zero.utils.ZeRORuntimeException: The checkpoint being loaded used a DP world size of 256 but the "
           "current world size is 2. Automatic adjustment of ZeRO's optimizer state partitioning with a new world size is not "
           "currently supported.\n")
    d = diag({"logs/app/node-01.log": log}, start_time="2023-03-21T20:00:00Z", end_time="2023-03-21T21:00:00Z")
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")
    assert d.root_cause.kind == "python_exception"
    assert "256 ranks, not 2" in d.recovery.next_step


# ------------------------------------------------------------------ the op builder

def test_cuda_toolkit_mismatch_is_the_jobs_environment_never_the_node():
    d = diag({"logs/app/node-01.log": "0: [rank0]: " + CUDA_MISMATCH + "\n"})
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")
    assert d.recovery.action == "notify_owner" and d.recovery.nodes == []
    assert "CUDA toolkit" in d.recovery.next_step and "11.7" in d.recovery.next_step


def test_missing_cuda_home_in_every_wording():
    for line in (MISSING_CUDA,
                 # CCmahua/ChatTTS-Enhanced#3 (pip's indentation kept)
                 "      op_builder.builder.MissingCUDAException: CUDA_HOME does not exist, unable to compile CUDA op(s)",
                 # LlamaChinese/Llama-Chinese#168 (before 0.9: an AssertionError)
                 "      AssertionError: CUDA_HOME does not exist, unable to compile CUDA op(s)",
                 # databrickslabs/dolly#168 (before 0.9.3: a plain Exception)
                 "Exception: >- DeepSpeed Op Builder: Installed CUDA version 9.1 does not match the version torch was compiled "
                 "with 11.8, unable to compile cuda/cpp extensions without a matching cuda version."):
        d = diag({"logs/app/node-01.log": line + "\n"})
        assert (d.status, d.sub_domain) == ("attributed", "user_code_exception"), line
        assert "CUDA toolkit" in d.recovery.next_step, line


def test_a_compatible_minor_version_notice_is_no_failure():
    # Printed by assert_no_cuda_mismatch when it accepts the pair; the run goes on (a training log
    # quoted in a public repository, code index).
    d = diag({"logs/app/node-01.log": "Installed CUDA version 11.7 does not match the version torch was compiled with 11.8 "
                                      "but since the APIs are compatible, accepting this combination\n"})
    assert d.status != "attributed"


def test_the_jit_build_failure_stays_the_applications():
    # deepspeedai/DeepSpeed#6892 (already read by torch.cpp_extension_build_failed)
    d = diag({"logs/app/node-01.log": "[rank1]: subprocess.CalledProcessError: Command '['ninja', '-v']' returned non-zero "
                                      "exit status 1.\n"})
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")


# ------------------------------------------------------------------ DeepSpeed and Lightning exception classes

def test_offload_with_a_client_optimizer_is_an_application_fault():
    d = diag({"logs/app/node-01.log": "0: [rank0]: " + OFFLOAD_OPTIMIZER + "\n"})
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")
    assert "ds_to_universal" not in d.recovery.next_step


def test_offload_optimizer_traceback_as_posted():
    # OptimalScale/LMFlow#470: the end of the engine's traceback, then the program's own traceback starts.
    log = ("  File \"/home/mahongli/anaconda3/envs/lmflow/lib/python3.9/site-packages/deepspeed/runtime/engine.py\", line 1281, "
           "in _configure_optimizer\n"
           "    raise ZeRORuntimeException(msg)\n"
           "deepspeed.runtime.zero.utils.ZeRORuntimeException: You are using ZeRO-Offload with a client provided optimizer "
           "(<class 'transformers.optimization.AdamW'>) which in most cases will yield poor performance. Please either use "
           "deepspeed.ops.adam.DeepSpeedCPUAdam or set an optimizer in your ds-config "
           "(https://www.deepspeed.ai/docs/config-json/#optimizer-parameters). If you really want to use a custom optimizer w. "
           "ZeRO-Offload and understand the performance impacts you can also set <\"zero_force_ds_cpu_optimizer\": false> in "
           "your configuration file.\n"
           "Traceback (most recent call last):\n"
           "  File \"/home/mahongli/LMFlow/examples/finetune.py\", line 68, in <module>\n"
           "    main()\n")
    d = diag({"logs/app/node-01.log": log})
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")
    assert "ZeRO-Offload" in d.summary


def test_lightning_refusing_the_deepspeed_config_is_an_application_fault():
    # Lightning-AI/pytorch-lightning#19891, BlinkDL/RWKV-LM#251
    for line in ("lightning.fabric.utilities.exceptions.MisconfigurationException: Do not set `gradient_accumulation_steps` "
                 "in the DeepSpeed config as this will be set with the `accumulate_grad_batches` argument passed via the "
                 "Lightning Trainer.",
                 "[rank0]: lightning_fabric.utilities.exceptions.MisconfigurationException: Unknown configuration for model "
                 "optimizers."):
        d = diag({"logs/app/node-01.log": line + "\n"})
        assert (d.status, d.sub_domain) == ("attributed", "user_code_exception"), line


def test_lightning_seeing_fewer_gpus_is_not_read_as_a_user_bug():
    # The first physical line of device_parser.py's two-line message, as a public README quotes it.
    d = diag({"logs/app/node-01.log": "pytorch_lightning.utilities.exceptions.MisconfigurationException: You requested GPUs: "
                                      "[0]\n But your machine only has: []\n"})
    assert d.sub_domain != "user_code_exception"


def test_accelerate_launch_port_taken_is_a_rendezvous_error_not_an_echo():
    # bmaltais/kohya_ss#2498 (accelerate/utils/launch.py, raised before any rank starts)
    log = ("ConnectionError: Tried to launch distributed communication on port `29500`, but another process is utilizing it. "
           "Please specify a different port (such as using the `----main_process_port` flag or specifying a different "
           "`main_process_port` in your config file) and rerun your script. To automatically use the next open port (on a single "
           "node), you can set this to `0`.\n")
    d = diag({"logs/app/node-01.log": log})
    assert (d.status, d.sub_domain) == ("attributed", "rendezvous_error")
    assert d.recovery.nodes == []


# ------------------------------------------------------------------ NVMe offload

def test_short_swap_file_alone_names_the_suspect_and_never_drains():
    d = diag({"logs/app/node-01.log": AIO_3376})
    assert d.status == "unattributed"
    assert "node-01" in d.suspect_nodes
    assert d.recovery.action not in ("drain_nodes", "retry_excluding_nodes")
    assert d.responsible_nodes == []


def test_glibc_assert_program_name_is_not_a_host():
    assert read_head(AIO_PY3, CTX).host is None
    assert read_head("python3.10: ../x.cpp:1: void f(): Assertion `x' failed.", CTX).host is None
    assert read_head("c000001: FileNotFoundError: x", CTX).host == "c000001"
    d = diag({"logs/app/node-02.log": AIO_PY3 + "\n"})
    assert "python3" not in d.suspect_nodes + d.responsible_nodes


def test_short_swap_file_beside_a_firm_cause_on_the_host_is_that_cause():
    # An errno-28 line (python.storage_errno's example, NVIDIA/Megatron-LM#878) is firm storage evidence.
    d = diag({"logs/app/node-01.log": "/zero_stage_3/optimizer/rank1/140302004385408_gradient_988164096_75497472.tensor.swp: "
                                      "buffer nbytes != file bytes 301989888 != 0\n"
                                      "OSError: [Errno 28] No space left on device\n"})
    assert (d.status, d.sub_domain) == ("attributed", "storage_io_error")


# ------------------------------------------------------------------ lines that must not fire

NOISE = [
    # deepspeedai/DeepSpeed#3211 (op_builder/async_io.py is_compatible, printed at every import)
    " [WARNING]  async_io requires the dev libaio .so object and headers but these were not found.",
    " [WARNING]  If libaio is already installed (perhaps from source), try setting the CFLAGS and LDFLAGS environment "
    "variables to where it can be found.",
    # deepspeedai/DeepSpeed#4194 (op_builder/builder.py)
    " [WARNING]  cpu_adam cuda is missing or is incompatible with installed torch, only cpu ops can be compiled!",
    # the corpus' BigScience ZeRO-3 run (fp16 loss scaling)
    "[2021-05-25 06:38:10,754] [INFO] [stage3.py:2708:_overflow_clean_up] [deepscale] OVERFLOW! Rank 0 Skipping step. "
    "Attempted loss scale: 256, reducing to 256",
    # the corpus' Megatron-DeepSpeed run (runtime/utils.py see_memory_usage)
    "[2023-08-15 06:31:34,679] [INFO] [utils.py:786:see_memory_usage] MA 0.0 GB         Max_MA 0.73 GB         CA 0.0 GB"
    "         Max_CA 1 GB",
    "[2023-08-15 06:31:34,680] [INFO] [utils.py:793:see_memory_usage] CPU Virtual Memory:  used = 53.28 GB, percent = 5.3%",
    # an ms-swift GRPO log quoted in a public repository (stage3.py's memory-pressure warning)
    "[2025-10-09 12:01:31,035] [WARNING] [stage3.py:2160:step] 1 pytorch allocator cache flushes since last step. this "
    "happens when there is high memory pressure and is detrimental to performance. if this is happening frequently consider "
    "adjusting settings to reduce memory consumption. If you are unable to make the cache flushes go away consider adding "
    "get_accelerator().empty_cache() calls in your training loop to ensure that all ranks flush their caches at the same time",
    # lean-dojo/ReProver#71 (engine.py load_checkpoint finds no 'latest' and returns)
    "[2024-08-20 01:49:18,235] [WARNING] [engine.py:2796:load_checkpoint] Unable to find latest file at "
    "kaiyuy/leandojo-lean4-retriever-tacgen-byt5-small/latest, if trying to load latest checkpoint please ensure this file "
    "exists or pass an explicit checkpoint tag when loading a checkpoint.",
    # huggingface/transformers#27820 (the log_dist "[Rank N]" wrapper)
    "[2023-12-12 06:20:12,261] [INFO] [logging.py:96:log_dist] [Rank 0] [Torch] Checkpoint global_step10 is about to be saved!",
]


# The lines' own stamps span 2021-2025: a window that holds them all, so none is scoped out.
SPAN = {"start_time": "2021-01-01T00:00:00Z", "end_time": "2026-11-02T10:21:14Z"}


def test_deepspeeds_routine_warnings_name_no_cause():
    for line in NOISE:
        d = diag({"logs/app/node-01.log": line + "\n"}, **SPAN)
        assert d.status != "attributed", line
        assert d.root_cause is None, line


def test_routine_warnings_in_a_completed_run_stay_no_failure():
    d = diag({"logs/app/node-01.log": "\n".join(NOISE) + "\n"}, state="COMPLETED", exit_code="0:0", **SPAN)
    assert d.status == "no_failure"
