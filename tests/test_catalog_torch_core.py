"""PyTorch core sites outside c10d added from PyTorch's source: the CUDA caching allocator and
c10/cuda's checks, the DataLoader and shared memory, torch.multiprocessing.spawn, torch.load, and
the torch.compile exceptions. Real-format lines through the real engine. Patterns:
rules/catalog/extract/torch_core.yaml; roles: rules/catalog/early/torch_core.yaml (and
early/app.yaml for the reused kinds); the enumeration of sites: rules/emitters/torch_core.yaml.

Each message is as posted in the public report named beside it; the "N: [rankN]: " and glog
prefixes are the launcher's and PyTorch's own, added to place the line on a rank."""

from conftest import diag

# pytorch/pytorch#112377 (PyTorch 2.1 conda build)
NVML_OOM = ('RuntimeError: NVML_SUCCESS == r INTERNAL ASSERT FAILED at "/opt/conda/conda-bld/pytorch_1695392020201/work/'
            'c10/cuda/CUDACachingAllocator.cpp":1154, please report a bug to PyTorch.')
WD = ("{rank}: [rank{rank}]:[E1102 10:13:12.044871 ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective operation "
      "timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for 600054 "
      "milliseconds before timing out.")
XID79 = "Nov  2 10:03:11 {host} kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"


def lines(template, ranks):
    return "\n".join(template.format(rank=r) for r in ranks) + "\n"


# ------------------------------------------------------------------ out of memory in other words

def test_nvml_assert_in_the_oom_report_is_a_cuda_oom():
    d = diag({"logs/app/node-01.log": "0: [rank0]: " + NVML_OOM + "\n"})
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom")
    assert d.recovery.action == "notify_owner"


def test_nvml_assert_on_one_rank_explains_the_others_timeouts():
    d = diag({"logs/app/node-01.log": "3: [rank3]: " + NVML_OOM + "\n",
              "logs/app/node-02.log": lines(WD, range(8, 16))})
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "cuda_oom", ["node-01"])


def test_another_allocator_assert_is_not_an_oom():
    # pytorch/pytorch#119452: an expandable-segments bug, not the OOM branch.
    d = diag({"logs/app/node-01.log": 'RuntimeError: !block->expandable_segment_ INTERNAL ASSERT FAILED at '
                                      '"../c10/cuda/CUDACachingAllocator.cpp":2814, please report a bug to PyTorch.\n'})
    assert d.sub_domain != "cuda_oom"


def test_cuda_malloc_async_backend_oom():
    # Comfy-Org/ComfyUI#2021
    d = diag({"logs/app/node-01.log": "torch.cuda.OutOfMemoryError: Allocation on device 0 would exceed allowed memory. "
                                      "(out of memory)\n"})
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom")


def test_thc_out_of_memory_is_an_oom_not_a_cuda_error_echo():
    # levyfan/reid-mgn#9: THC prints the check, then the RuntimeError names the same code 2.
    d = diag({"logs/app/node-01.log": "THCudaCheck FAIL file=/pytorch/aten/src/THC/THCTensorRandom.cu line=25 error=2 : out of memory\n"
                                      "RuntimeError: cuda runtime error (2) : out of memory at /pytorch/aten/src/THC/THCTensorRandom.cu:25\n"})
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom")


def test_oom_wrapped_in_an_inductor_error_is_still_the_oom():
    # The InductorError wrapper (torch/_inductor/compile_fx.py) prints the inner type and message
    # on one line; the OOM text is the allocator's (pytorch/pytorch#112377's era wording).
    d = diag({"logs/app/node-01.log": "torch._inductor.exc.InductorError: OutOfMemoryError: CUDA out of memory. Tried to allocate "
                                      "2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.73 GiB is free.\n"})
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom")


# ------------------------------------------------------------------ CUDA start-up and driver API

def test_no_cuda_gpu_is_a_configuration_error_never_drained():
    # Grace9994/CoMoSVC#6
    d = diag({"logs/app/node-01.log": "0: [rank0]: RuntimeError: No CUDA GPUs are available\n"})
    assert (d.status, d.sub_domain) == ("attributed", "nccl_config_error")
    assert d.recovery.action == "notify_owner" and d.recovery.nodes == []
    assert "CUDA_VISIBLE_DEVICES" in d.recovery.next_step


def test_no_cuda_gpu_beside_a_gpu_loss_on_that_host_is_the_gpu_loss():
    d = diag({"logs/syslog/node-02.log": XID79.format(host="node-02"),
              "logs/app/node-02.log": "8: [rank8]: RuntimeError: No CUDA GPUs are available\n"})
    assert not (d.status == "attributed" and d.sub_domain == "nccl_config_error")


def test_no_nvidia_driver_names_the_gpu_runtime():
    # runpod/containers#56
    d = diag({"logs/app/node-01.log": "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA "
                                      "GPU and installed a driver from http://www.nvidia.com/Download/index.aspx\n"})
    assert (d.status, d.sub_domain) == ("attributed", "nccl_config_error")
    assert "driver" in d.recovery.next_step and d.recovery.action == "notify_owner"


def test_cuda_initialization_warning_alone_is_no_failure_cause():
    # detectron2-era torch 1.x warning form (torch/cuda/__init__.py device_count); the format is
    # c10/cuda/CUDAFunctions.cpp's TORCH_WARN("CUDA initialization: ", msg).
    d = diag({"logs/app/node-01.log": "/usr/local/lib/python3.8/dist-packages/torch/cuda/__init__.py:52: UserWarning: CUDA "
                                      "initialization: Found no NVIDIA driver on your system. Please check that you have an NVIDIA "
                                      "GPU and installed a driver from http://www.nvidia.com/Download/index.aspx (Triggered internally "
                                      "at  /pytorch/c10/cuda/CUDAFunctions.cpp:100.)\n"})
    assert d.status != "attributed"


def test_device_count_errors_are_symptoms_unless_their_string_names_a_cause():
    # PKU-YuanGroup/Video-LLaVA#22 (804) is CUDA's forward compatibility on a GPU that has none: the driver older
    # than the job's CUDA, a weak driver/library mismatch never drained (early.cuda.forward_compat_unsupported);
    # shariqfarooq123/AdaBins#79 (101) is the program's launch configuration (early.cuda.invalid_device_ordinal).
    pre = ("RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling "
           "NumCudaDevices() that might have already set an error? ")
    d804 = diag({"logs/app/node-01.log": pre + "Error 804: forward compatibility was attempted on non supported HW\n"})
    assert (d804.status, d804.sub_domain) == ("attributed", "driver_library_mismatch")
    assert d804.recovery.action != "drain_nodes"
    d101 = diag({"logs/app/node-01.log": pre + "Error 101: invalid device ordinal\n"})
    assert (d101.status, d101.sub_domain) == ("attributed", "user_code_exception")
    unknown = diag({"logs/app/node-01.log": pre + "Error 999: unknown error\n"})
    assert unknown.status != "attributed"


def test_cuda_driver_initialization_failure_alone_never_drains():
    # ErlerPhilipp/points2surf#17
    d = diag({"logs/app/node-01.log": "RuntimeError: CUDA driver initialization failed, you might not have a CUDA gpu.\n"})
    assert d.status != "attributed"
    assert d.recovery.action not in ("drain_nodes", "retry_excluding_nodes")


def test_cuda_driver_api_error_is_an_echo_not_a_user_bug():
    # pytorch/pytorch#192330 (expandable segments under WSL2)
    d = diag({"logs/app/node-01.log": "RuntimeError: CUDA driver error: unknown error\n"})
    assert d.sub_domain != "user_code_exception"
    assert d.status != "attributed"


# ------------------------------------------------------------------ shared memory and the DataLoader

def test_shm_fallocate_failure_is_shm_exhausted_and_explains_the_loader_deaths():
    # The posix_fallocate message of aten/src/ATen/MapAllocator.cpp, as quoted in a Slurm DDP job's
    # notes (find_string id 65943390586); the worker and pin-memory lines are torch/csrc/DataLoader.cpp's
    # and dataloader.py's (dbolya/yolact#147, milesial/Pytorch-UNet#517).
    d = diag({"logs/app/node-01.log":
              "0: [rank0]: RuntimeError: unable to allocate shared memory(shm) for file </torch_4304_2962414746_0>: "
              "No space left on device (28)\n"
              "1: [rank1]: RuntimeError: DataLoader worker (pid 29332) exited unexpectedly with exit code 1. Details are lost "
              "due to multiprocessing. Rerunning with num_workers=0 may give better error trace.\n"
              "2: [rank2]: RuntimeError: Pin memory thread exited unexpectedly\n"})
    assert (d.status, d.sub_domain) == ("attributed", "shm_exhausted")
    assert d.recovery.action == "notify_owner"


def test_loader_deaths_alone_are_no_confident_answer():
    d = diag({"logs/app/node-01.log":
              "RuntimeError: DataLoader worker (pid 29332) exited unexpectedly with exit code 1. Details are lost due to "
              "multiprocessing. Rerunning with num_workers=0 may give better error trace.\n"
              "RuntimeError: Pin memory thread exited unexpectedly\n"})
    assert d.status != "attributed"


def test_worker_exit_beside_the_workers_own_exception_is_that_exception():
    # pytorch/pytorch#22136 (quoted there with '#' comment marks, removed here): the worker's own
    # AttributeError is printed before the main process's line.
    d = diag({"logs/app/node-01.log":
              "AttributeError: Can't get attribute 'Dataset' on <module '__mp_main__' from '/deepspeech.pytorch/convasr/bug_.py'>\n"
              "RuntimeError: DataLoader worker (pid 29332) exited unexpectedly with exit code 1. Details are lost due to "
              "multiprocessing. Rerunning with num_workers=0 may give better error trace.\n"})
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")


# ------------------------------------------------------------------ torch.multiprocessing.spawn

def test_spawn_child_killed_alone_is_no_user_bug():
    # jeffffffli/HybrIK#198 (1.x plain Exception) and pytorch/xla#2645
    for line in ("Exception: process 3 terminated with signal SIGKILL",
                 "Exception: process 5 terminated with exit code 17",
                 "torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with signal SIGKILL"):
        d = diag({"logs/app/node-01.log": line + "\n"})
        assert d.status != "attributed", line
        assert d.sub_domain != "user_code_exception", line


def test_spawn_child_killed_by_the_oom_killer_is_the_host_oom():
    # lyu-yx/ACUMEN#4's parent line; the kernel line is tests/test_catalog_linux.py's real dmesg form.
    d = diag({"logs/app/node-01.log": "torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with signal SIGKILL\n",
              "logs/syslog/node-01.log": "Nov  2 10:03:11 node-01 kernel: [14808.083306] Killed process 11344 (python) "
                                         "total-vm:390360kB, anon-rss:183712kB, file-rss:1016kB\n"})
    assert (d.status, d.sub_domain) == ("attributed", "host_oom")


# ------------------------------------------------------------------ torch.load, torch.compile

def test_weights_only_refusal_is_the_programs_with_its_fix():
    # modelscope/ms-swift#5808
    d = diag({"logs/app/node-01.log": "4: [rank4]: _pickle.UnpicklingError: Weights only load failed. This file can still be "
                                      "loaded, to do so you have two options, do those steps only if you trust the source of the "
                                      "checkpoint. \n"})
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")
    assert "weights_only=False" in d.recovery.next_step


def test_compile_crash_is_an_application_fault():
    # huggingface/lerobot#2852, unslothai/unsloth#2204
    for line in ("torch._inductor.exc.InductorError: AssertionError",
                 "torch._dynamo.exc.UserError: Dynamic control flow is not supported at the moment."):
        d = diag({"logs/app/node-01.log": line + "\n"})
        assert (d.status, d.sub_domain) == ("attributed", "user_code_exception"), line
        assert d.recovery.action == "notify_owner"


def test_graph_break_log_is_no_failure_cause():
    # pytorch/pytorch#94795: Dynamo logs Unsupported for a graph break and training goes on.
    d = diag({"logs/app/node-01.log": "torch._dynamo.exc.Unsupported: call_method UserDefinedObjectVariable(set) __contains__ "
                                      "[UserDefinedObjectVariable()] {}\n"})
    assert d.status != "attributed"


def test_compile_header_then_inner_exception_reads_the_inner_line():
    # pytorch/pytorch#99067: the header on its own line, the inner exception on the next.
    d = diag({"logs/app/node-01.log": "torch._dynamo.exc.BackendCompilerFailed: backend='compile_fn' raised:\n"
                                      "TypeError: _convert_frame_assert() missing 2 required positional arguments: 'hooks' and "
                                      "'frame_state'\n"})
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")


def test_no_hip_gpu_is_the_same_configuration_error_on_rocm():
    # pytorch/pytorch#70036: PyTorch's ROCm build hipifies the message
    d = diag({"logs/app/node-01.log": "RuntimeError: No HIP GPUs are available\n"})
    assert (d.status, d.sub_domain) == ("attributed", "nccl_config_error")
    assert d.recovery.nodes == []


# deepspeedai/DeepSpeed#6892: DeepSpeed JIT-builds fused_adam on rank 1 and ninja fails
NINJA = ("Building extension module fused_adam...\n"
         "Allowing ninja to set a default number of workers... (overridable by setting the environment variable MAX_JOBS=N)\n"
         "[rank1]: Traceback (most recent call last):\n"
         "[rank1]:   File \"[..]/svgen2/lib/python3.11/site-packages/torch/utils/cpp_extension.py\", line 2105, in _run_ninja_build\n"
         "[rank1]:     subprocess.run(\n"
         "[rank1]: subprocess.CalledProcessError: Command '['ninja', '-v']' returned non-zero exit status 1.\n")


def test_an_extension_that_fails_to_build_is_the_jobs_own_environment():
    d = diag({"logs/app/node-01.log": NINJA})
    assert (d.status, d.sub_domain) == ("attributed", "user_code_exception")
    assert d.recovery.nodes == []


def test_building_an_extension_is_no_failure_by_itself():
    d = diag({"logs/app/node-01.log": "\n".join(NINJA.splitlines()[:2]) + "\n"})
    assert d.status != "attributed"
