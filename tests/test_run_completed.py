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
