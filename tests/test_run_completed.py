"""No failure is an answer (issue 20 item 5): a bare log whose program finished says so.

Each framework's end-of-run line (rules/catalog/extract/runtime.yaml, run.completed*) makes a bare
file of that framework `no_failure` when nothing fails before it; a real failure before the line
is still the answer. The lines are copied from the public sources named beside them, or are the
framework's format string with realistic values (named so in the catalog's `references`).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from firstfault.rules.engine import analyze_path

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"

# NVIDIA/NeMo examples/llm/resiliency/resiliency-in-pretraining-demo.ipynb (a NeMo 2 run under torchrun)
_NEMO_STEPS = (
    "ining-demo/0 [default0]:Training epoch 1, iteration 0/19 | lr: 2.999e-06 | global_batch_size: 512 | "
    "global_step: 19 | reduced_train_loss: 11.03 | train_step_timing in s: 7.592 | consumed_samples: 10240\n"
    "ining-demo/0 [default0]:[NeMo I 2025-03-07 22:36:39 model_checkpoint:522] Async checkpoint save for step 19 "
    "(/tmp/nemo_run/checkpoints/resiliency-in-pretraining-demo/checkpoints/model_name=0--val_loss=0.00-step=18-"
    "consumed_samples=9728.0-last.ckpt) finalized successfully.\n")
_TORCHRUN_DONE = (
    "ining-demo/0 I0307 22:36:44.958000 170829 torch/distributed/elastic/agent/server/api.py:864] [default] worker "
    "group successfully finished. Waiting 300 seconds for other agents to finish.\n"
    "ining-demo/0 I0307 22:36:44.958000 170829 torch/distributed/elastic/agent/server/api.py:917] Local worker group "
    "finished (WorkerState.SUCCEEDED). Waiting 300 seconds for other agents to finish\n"
    "ining-demo/0 I0307 22:36:44.959000 170829 torch/distributed/elastic/agent/server/api.py:931] Done waiting for "
    "other agents. Elapsed: 0.0002548694610595703 seconds\n")

# Megatron-LM's iteration line (megatron/training/training.py training_log) and its exit-interval end
_MEGATRON_STEPS = (
    " iteration     6000/   10000 | consumed samples:       384000 | elapsed time per iteration (ms): 1658.8 | "
    "learning rate: 1.250000E-07 | global batch size:    64 | lm loss: 4.110266E-01 | loss scale: 1.0 | "
    "grad norm: 0.486 | number of skipped iterations:   0 | number of nan iterations:   0 |\n"
    "saving checkpoint at iteration    6000 to /checkpoints/gpt in torch_dist format\n"
    "  successfully saved checkpoint from iteration    6000 to /checkpoints/gpt\n")

# Each framework: (lines before the end, the end-of-run line(s)).
FRAMEWORKS = {
    "lightning_max_epochs": (
        "Epoch 49: 100%|##########| 391/391 [00:21<00:00, 18.31it/s, v_num=0, train_loss=0.212]\n",
        "`Trainer.fit` stopped: `max_epochs=50` reached.\n"),
    "lightning_time_limit": (
        "Epoch 13:  20%|##        | 367/1871 [21:22<1:27:35,  3.49s/it, loss=0.16, v_num=0]\n",
        "Time limit reached. Elapsed time is 1 day, 0:00:03. Signaling Trainer to stop.\n"),
    "lightning_early_stopping": (
        "Epoch 47 | train_loss=0.7834 | val_loss=0.7887 | val_acc=0.6420\n",
        "Monitored metric val/loss did not improve in the last 10 records. Best score: 0.786. "
        "Signaling Trainer to stop.\n"),
    "hf_trainer_metrics": (
        "***** Running training *****\n  Num examples = 3860\n  Num Epochs = 3\n"
        "  Total optimization steps = 1449\n"
        "{'loss': 0.2089, 'grad_norm': 3.1415, 'learning_rate': 1.7e-07, 'epoch': 2.99}\n",
        "{'train_runtime': 1187.4412, 'train_samples_per_second': 9.752, 'train_steps_per_second': 1.22, "
        "'train_loss': 0.3812, 'epoch': 3.0}\n"),
    "hf_trainer_completed": (
        "{'loss': 0.2089, 'grad_norm': 3.1415, 'learning_rate': 1.7e-07, 'epoch': 2.99}\n",
        "\n\nTraining completed. Do not forget to share your model on huggingface.co/models =)\n\n\n"),
    "torchrun": (_NEMO_STEPS, _TORCHRUN_DONE),
    "nemo_run": (
        "Experiment executed successfully.\n"
        "Waiting for job resiliency-in-pretraining-demo-xb3fnk3npq9wn to finish [log=True]...\n" + _NEMO_STEPS,
        "Job resiliency-in-pretraining-demo-xb3fnk3npq9wn finished: SUCCEEDED\n"),
    "megatron_exit_interval": (
        _MEGATRON_STEPS,
        "[exiting program at iteration 6000] datetime: 2025-08-25 19:54:10 \n"),
    "ray_train": (
        "(RayTrainWorker pid=1193, ip=10.244.4.193) Train Epoch 9: 100%|##########| 938/938 [00:09<00:00, 96.1it/s]\n"
        "Training saved a checkpoint for iteration 10 at: (local)/mnt/cluster_storage/finetune-resnet/"
        "TorchTrainer_96923_00000_0_2024-04-29_17-21-29/checkpoint_000009\n",
        "Training completed after 10 iterations at 2024-04-29 17:27:45. Total running time: 1min 9s\n"),
    "prime_rl": (
        "06-16 21:29:30 [TRAIN] [Rank 0] [INFO] [train.py:501] step: 20, loss: 0.0012\n",
        "06-16 21:29:32 [TRAIN] [Rank 0] [INFO] [train.py:535] Training finished, exiting ...\n"),
    # facebookresearch/fairseq examples/fully_sharded_data_parallel/README.md (the maintainers' example output)
    "fairseq": (
        '2021-03-08 18:12:19 | INFO | train_inner | {"epoch": 1, "update": 0.013, "loss": "16.548", "ppl": "95796.2", '
        '"wps": "3274.4", "ups": "0.02", "wpb": "131072", "bsz": "64", "num_updates": "10", "lr": "0", "gnorm": "5.22", '
        '"loss_scale": "1", "train_wall": "40", "gb_free": "9.3", "wall": "490"}\n'
        "2021-03-08 18:12:19 | INFO | fairseq_cli.train | Stopping training due to num_updates: 10 >= max_update: 10\n"
        "2021-03-08 18:12:45 | INFO | fairseq_cli.train | end of epoch 1 (average epoch stats below)\n",
        "2021-03-08 18:12:45 | INFO | fairseq_cli.train | done training in 509.9 seconds\n"),
    # ultralytics/yolov5#8401 (YOLOv5 train.py; the ultralytics package prints the same line)
    "ultralytics": (
        "     Epoch   gpu_mem       box       obj       cls    labels  img_size\n"
        "   299/299        0G  0.008668  0.002224         0        10       640: 100%|##########| 49/49 "
        "[01:21<00:00,  1.66s/it]\n"
        "                 all        245        258      0.987      0.961      0.988      0.794\n\n",
        "300 epochs completed in 8.675 hours.\n"
        "Optimizer stripped from runs/train/xfl-yolov5/weights/last.pt, 6.7MB\n"),
    # NVIDIA/nccl-tests#119 (all_reduce_perf's last row and its footer)
    "nccl_tests": (
        "   133169160      33292290     float     sum      -1   2666.0   49.95   95.74      0   2660.4   50.06   "
        "95.94      0\n",
        "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 84.8558\n"),
    # pytorch/torchtitan#3393 (a 100-step run's end under torchrun)
    "torchtitan": (
        "[rank0]:[titan] 2026-05-18 16:06:49,154 - root - INFO - Saving a full checkpoint at last step, step 100.\n"
        "[rank0]:[titan] 2026-05-18 16:06:49,630 - root - INFO - Last step checkpoint completed in 0.48s\n"
        "[rank0]:[titan] 2026-05-18 16:06:49,630 - root - INFO - Sleeping 2 seconds for other ranks to complete\n",
        "[rank0]:[titan] 2026-05-18 16:06:51,630 - root - INFO - Training completed\n"
        "[rank0]:[titan] 2026-05-18 16:06:51,631 - root - INFO - Destroying the purge thread.\n"
        "[rank0]:[titan] 2026-05-18 16:06:52,119 - root - INFO - Process group destroyed\n"),
    # modelscope/ms-swift#5772 (swift/llm/base.py SwiftPipeline.main)
    "ms_swift": (
        "Train: 100%|##########| 74/74 [32:09<00:00, 26.08s/it]\n"
        "[INFO:swift] last_model_checkpoint: /mnt/checkpoint/179466898/1/v0-20250911-154634/checkpoint-74\n"
        "[INFO:swift] best_model_checkpoint: /mnt/checkpoint/179466898/1/v0-20250911-154634/checkpoint-74\n",
        "[INFO:swift] End time of running main: 2025-09-11 16:19:22.473503\n"),
}


def _analyze(tmp_path: Path, text: str, name: str = "train.log"):
    p = tmp_path / name
    p.write_text(text)
    return analyze_path(p).diagnosis


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_a_bare_log_that_ends_with_the_end_of_run_line_is_no_failure(tmp_path, framework):
    before, end = FRAMEWORKS[framework]
    d = _analyze(tmp_path, before + end)
    assert d.status == "no_failure", (framework, d.status, d.sub_domain)
    assert d.sub_domain in (None, "none")


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_a_failure_before_the_end_of_run_line_is_still_the_answer(tmp_path, framework):
    before, end = FRAMEWORKS[framework]
    d = _analyze(tmp_path, before + OOM + end)
    assert d.status != "no_failure", framework
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom"), framework


def test_without_its_end_of_run_line_the_same_log_is_not_no_failure(tmp_path):
    """The end-of-run line is what decides: the lines before it alone say nothing finished."""
    for framework, (before, _end) in FRAMEWORKS.items():
        d = _analyze(tmp_path, before, name=f"{framework}.log")
        assert d.status != "no_failure", framework


@pytest.mark.parametrize("line", [
    # Ray's per-iteration report and Tune's per-trial end (ray python/ray/tune/experimental/output.py)
    "Training finished iteration 10 at 2024-06-19 08:29:36. Total running time: 9min 18s",
    "Trial train_model_f96d1_00000 completed after 27 iterations at 2024-08-19 16:19:06. Total running time: 8s",
    # torchrun's exit barrier after a failure (open-mmlab/mmagic#531)
    "INFO:torch.distributed.elastic.agent.server.api:Local worker group finished (FAILED). Waiting 300 seconds for "
    "other agents to finish",
    # Megatron-LM's signal stop, and Lightning's non-finite stop
    "[exiting program after receiving SIGTERM.] datetime: 2025-08-25 19:54:10 ",
    "Monitored metric val_loss = nan is not finite. Previous best value was 0.754. Signaling Trainer to stop.",
    # NeMo-Run's job state when the job failed (NVIDIA/NeMo resiliency demo)
    "Job resiliency-in-pretraining-demo-nr166h9790700 finished: FAILED",
    # Lightning with nothing to train
    "`Trainer.fit` stopped: No training batches.",
    # fairseq's stop decision comes before its end-of-epoch validation and its end line (fairseq FSDP README)
    "2021-03-08 18:12:19 | INFO | fairseq_cli.train | Stopping training due to num_updates: 10 >= max_update: 10",
    # nccl-tests' footer when the data check found wrong values (NVIDIA/nccl-tests#131)
    "# Out of bounds values : 50 FAILED",
    # torchtitan's line before the end, and another script's "Training completed!" that goes on to evaluate
    "[rank0]:[titan] 2026-05-18 16:06:49,630 - root - INFO - Sleeping 2 seconds for other ranks to complete",
    "2026-02-07 11:20:49,830 - root - INFO - Training completed!",
])
def test_lines_that_do_not_say_the_run_finished(tmp_path, line):
    d = _analyze(tmp_path, "Epoch 3: 100%|##########| 10/10 [00:01<00:00,  9.1it/s]\n" + line + "\n")
    assert d.status != "no_failure", line


def test_a_preempted_nemo_run_that_exits_zero_is_a_preemption(tmp_path):
    """NeMo's PreemptionCallback saves and exits 0, so torchrun and NeMo-Run report success after it
    (NVIDIA/NeMo resiliency demo, section 4): the job was taken back, it did not finish."""
    text = (_NEMO_STEPS
            + "ining-demo/0 [default0]:Simulating preemption by raising a SIGTERM at step 4!\n"
            + "ining-demo/0 [default0]:[NeMo I 2025-03-07 22:48:03 preemption:87] Received signal 15, initiating "
              "graceful stop\n"
            + "ining-demo/0 [default0]:[NeMo I 2025-03-07 22:48:03 preemption:67] Preemption detected, saving "
              "checkpoint and exiting\n"
            + _TORCHRUN_DONE
            + "Job resiliency-in-pretraining-demo-bngwzzcstc0p3 finished: SUCCEEDED\n")
    d = _analyze(tmp_path, text)
    assert (d.status, d.sub_domain) == ("attributed", "preempted")


def test_megatron_after_training_is_done_is_not_the_end_of_the_job(tmp_path):
    """NVIDIA-NeMo/Megatron-Bridge#1656, as a bare file: '[after training is done]' and then the job hangs
    in shutdown until Slurm's time limit. The line is an end-of-run line, but the scheduler's kill after it
    is a failure, not teardown: the time limit stays the answer."""
    root = Path(__file__).resolve().parents[1]
    src = root / "corpus/real/mix2-walltime-after-training-done-nsys-hang-megatronbridge-1656/input/logs/app/slurm-4226796.log"
    d = _analyze(tmp_path, src.read_text(), name="slurm-4226796.log")
    assert (d.status, d.sub_domain) == ("attributed", "walltime_exceeded")


def test_a_ray_train_run_that_fails_after_an_iteration_report_is_not_no_failure(tmp_path):
    """'Training finished iteration N ...' is Ray's per-iteration report (on_trial_result): the run goes on
    and can still fail. Read as an end-of-run line it turned the failure after it into teardown."""
    text = ("Training finished iteration 3 at 2024-04-29 17:25:01. Total running time: 45s\n"
            "Training errored after 3 iterations at 2024-04-29 17:25:20. Total running time: 1min 4s\n"
            + OOM)
    d = _analyze(tmp_path, text)
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom")
