"""End-of-run lines read from the frameworks' source (rules/emitters/run_end.yaml): a bare log whose
program said it finished is no_failure even with alarming teardown lines after the end; the same log
without the end line is not; a cause before the end, or a firm fault after it, is still the answer.

Patterns: rules/catalog/extract/run_end.yaml (run.completed.ignite, run.completed.keras_early_stopping,
run.completed.verl, run.completed.horovod_benchmark, run.completed.axolotl, run.completed.paddlenlp);
EARLY: early/runtime.yaml (early.run.completed); FINAL: final.completed_in_lines. Every line below is
copied from the public log named beside it; a test's log joins lines of one framework's run with
another report's teardown lines.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import diag

ROOT = Path(__file__).resolve().parents[1]

# huggingface/trl#3436 (corpus/real/ho-oom-fsdp-sft-8x3080-rank0-trl-3436): a CUDA OOM, a firm cause
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 388.00 MiB. GPU 0 has a total capacity of 9.68 GiB "
       "of which 95.75 MiB is free. Including non-PyTorch memory, this process has 9.54 GiB memory in use. Of the allocated "
       "memory 6.61 GiB is allocated by PyTorch, and 2.57 GiB is reserved by PyTorch but unallocated. If reserved but "
       "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
       "See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n")

# Teardown alarms after a finished run (each from a run its reporter says had finished):
# modelscope/ms-swift#5109: PyTorch's exit-time warning and an allocator abort while freeing memory at exit
ABORT_AT_EXIT = (
    "[rank4]:[W724 21:48:59.726502657 ProcessGroupNCCL.cpp:1496] Warning: WARNING: destroy_process_group() was not called "
    "before program exit, which can leak resources. For more info, please see "
    "https://pytorch.org/docs/stable/distributed.html#shutdown (function operator())\n"
    "terminate called after throwing an instance of 'c10::Error'\n"
    "  what():  Trying to free a pointer not allocated here\n"
    "Exception raised from raw_delete at /pytorch/torch/csrc/cuda/CUDAPluggableAllocator.cpp:151 (most recent call first):\n")
# hpcaitech/ColossalAI#1427: a CUDA event queried while the driver unloads at exit
DRIVER_SHUTTING_DOWN = ("terminate called after throwing an instance of 'c10::CUDAError'\n"
                        "  what():  CUDA error: driver shutting down\n")
# kubeflow/trainer#1168: TensorFlow cancelling the input pipeline after the last epoch
TF_GENERATOR_CANCELLED = ("2020-06-08 05:30:15.889706: W tensorflow/core/kernels/data/generator_dataset_op.cc:103] Error "
                          "occurred when finalizing GeneratorDataset iterator: Cancelled: Operation was cancelled\n")
# johnson7788/RLDecisionAgent@d0dd792:docs/Error.md item 15: Ray's shutdown after verl's last step
RAY_WORKER_DIED = (
    "(raylet) A worker died or was killed while executing a task by an unexpected system error. To troubleshoot the "
    "problem, check the logs for the dead worker. RayTask ID: ffffffffffffffffc90bbe1574830f10a33b147c01000000 Worker ID: "
    "f7ea96b1e8e804f578390a97c97d6bf28b5bc9fed13f0ef433e444c7 Node ID: "
    "cc69c4cc97291a2847bc91bcfbd1f19c419b6e6fbe86aad345f2f665 Worker IP address: 192.168.100.8 Worker port: 41497 Worker "
    "PID: 269812 Worker exit type: SYSTEM_ERROR Worker exit detail: Worker exits unexpectedly by a signal. SystemExit is "
    "raised (sys.exit is called). Exit code: 1. The process receives a SIGTERM.\n")
# mozilla/DeepSpeech#528: a segfault at process exit after the model export
SEGFAULT_AT_EXIT = "Segmentation fault (core dumped)\n"

# Each framework: (lines before the end, the end-of-run line(s), teardown alarms after the end).
FRAMEWORKS = {
    # Brummi/BehindTheScenes#34 (corpus/real/ho21-app-nofail-ignite-engine-run-complete-at-epoch1)
    "ignite": (
        "[2025-01-06 20:58:03,513][ignite.engine.engine.Engine][INFO] - Epoch[1] Complete. Time taken: 00:00:01.491\n"
        "[2025-01-06 20:58:03,513][ignite.engine.engine.Engine][INFO] - Engine run complete. Time taken: 00:00:01.789\n"
        "2025-01-06 20:58:03,608 kitti_360 INFO: Engine run complete. Time taken: 00:01:45.348\n",
        "2025-01-06 20:58:03,681 ignite.distributed.launcher.Parallel INFO: End of run\n",
        ABORT_AT_EXIT),
    # keras-team/keras-io@3a16b044:examples/timeseries/md/timeseries_classification_from_scratch.md and
    # keras-team/keras#20323 (the restore line)
    "keras": (
        "Epoch 287/500\n"
        "90/90 [==============================] - 1s 7ms/step - loss: 0.0499 - sparse_categorical_accuracy: 0.9854 - "
        "val_loss: 0.0735 - val_sparse_categorical_accuracy: 0.9778 - lr: 1.0000e-04\n",
        "Epoch 287: early stopping\n"
        "Restoring model weights from the end of the best epoch: 6.\n",
        TF_GENERATOR_CANCELLED),
    # johnson7788/RLDecisionAgent@d0dd792:docs/Error.md item 15 (verl PPO under Ray)
    "verl": (
        "me_per_step:30.030646292492747 - perf/throughput:619.4671875793262\n",
        "(TaskRunner pid=267532) (\"Final validation metrics: {'val-aux/char_count/reward/mean@1': \"\n"
        "(TaskRunner pid=267532)  \"0.2008238928939238, 'val-aux/char_count/reward/mean@2': 0.0, \"\n"
        "(TaskRunner pid=267532)  \"'val-aux/char_count/reward/worst@3/std': 0.0}\")\n",
        RAY_WORKER_DIED),
    # horovod/horovod#712 (pytorch_synthetic_benchmark.py on 4 GPUs)
    "horovod": (
        "Iter #8: 107.5 img/sec per GPU\nIter #9: 108.3 img/sec per GPU\n",
        "Img/sec per GPU: 108.2 +-1.2\nTotal img/sec on 4 GPU(s): 432.8 +-4.9 \n",
        DRIVER_SHUTTING_DOWN),
    # an axolotl walkthrough's run (the index's stored copy; see extract/run_end.yaml references)
    "axolotl": (
        "100%|#############################################################| 260/260 [02:38<00:00,  1.64it/s]\n"
        "[2026-06-20 15:38:29,823] [INFO] [axolotl.train] Training completed! Saving trained model to ./outputs/lora-out.\n",
        "[2026-06-20 15:38:30,136] [INFO] [axolotl.train] Model successfully saved to ./outputs/lora-out\n",
        ABORT_AT_EXIT),
    # a PaddleNLP prompt-tuning run log (the index's stored copy; see extract/run_end.yaml references)
    "paddlenlp": (
        "[2022-08-31 17:25:53,102] [    INFO] - \n"
        "Training completed. \n"
        "\n"
        "[2022-08-31 17:25:53,102] [    INFO] - Loading best model from ./checkpoints/checkpoint-800 (score: "
        "0.5651857246904588).\n",
        "[2022-08-31 17:25:53,901] [    INFO] - train_runtime: 1081.2467, train_samples_per_second: 55.935, "
        "train_steps_per_second: 6.992, train_loss: 1.9880492639541627, epoch: 3.1746\n",
        SEGFAULT_AT_EXIT),
}


def _diag(text: str):
    return diag({"logs/app/train.log": text}, state="UNKNOWN")


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_a_finished_run_with_teardown_alarms_after_its_end_line_has_no_failure(framework):
    before, end, after = FRAMEWORKS[framework]
    d = _diag(before + end + after)
    assert (d.status, d.sub_domain) == ("no_failure", "none"), framework


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_without_the_end_line_the_same_alarms_are_not_no_failure(framework):
    before, _end, after = FRAMEWORKS[framework]
    d = _diag(before + after)
    assert d.status != "no_failure", framework


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_a_failure_before_the_end_line_is_still_the_answer(framework):
    before, end, after = FRAMEWORKS[framework]
    d = _diag(before + OOM + end + after)
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom"), framework


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_a_firm_fault_after_the_end_line_is_a_failure(framework):
    """A CUDA OOM after the end line is no exit-time exception: the end line does not hide it."""
    before, end, _after = FRAMEWORKS[framework]
    d = _diag(before + end + OOM)
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom"), framework


@pytest.mark.parametrize("line", [
    # Ignite's Engine prints this after every Engine.run (the evaluator's each epoch, a terminate() too)
    "2025-01-06 20:58:03,608 kitti_360 INFO: Engine run complete. Time taken: 00:01:45.348",
    "[2025-01-06 20:58:03,513][ignite.engine.engine.Engine][INFO] - Epoch[1] Complete. Time taken: 00:00:01.491",
    # Keras' per-epoch header (keras-io timeseries example)
    "Epoch 287/500",
    # axolotl's line before the save, the save that fails in axolotl-ai-cloud/axolotl#1304
    "[2024-02-20 15:28:34,251] [INFO] [axolotl.train.log:61] [PID:648453] [RANK:0] Training Completed!!! Saving "
    "pre-trained model to ./lora-out",
    "[2026-06-20 15:38:29,823] [INFO] [axolotl.train] Training completed! Saving trained model to ./outputs/lora-out.",
    # PaddleNLP's per-step log line (the same run log)
    "[2022-08-31 17:08:15,648] [    INFO] - loss: 4.43004913, learning_rate: 2.96031746031746e-05, global_step: 100, "
    "interval_runtime: 2.274, interval_samples_per_second: 3.518, interval_steps_per_second: 4.398, epoch: 0.2646",
    # Horovod's per-iteration and per-GPU lines come before the total (horovod/horovod#712)
    "Img/sec per GPU: 108.2 +-1.2",
    # a wrapped continuation of verl's pprint, not its first line
    "(TaskRunner pid=267532)  \"'val-aux/char_count/reward/std@2': 0.0, \"",
])
def test_lines_that_do_not_say_the_run_finished(line):
    d = _diag(line + "\n" + ABORT_AT_EXIT)
    assert d.status != "no_failure", line


def test_the_ignite_report_in_the_corpus_has_no_failure():
    """Brummi/BehindTheScenes#34 as the corpus holds it: Ignite's evaluator lines, then the launcher's End of run."""
    src = ROOT / "corpus/real/ho21-app-nofail-ignite-engine-run-complete-at-epoch1/input/train.log"
    d = _diag(src.read_text())
    assert (d.status, d.sub_domain) == ("no_failure", "none")
