"""`firstfault up --slurm` on a real Slurm (tests/slurm_cluster.py): one command, and a job that dies gets its
final diagnosis from the connector's end event and the job's own output file, tailed while it ran.

Everything is real: `up` starts the embedded broker, the Slurm connector and the output tailer on the
session cluster's `sacct` and `squeue` (SLURM_CONF); the job goes through `sbatch` and `slurmd`; the
diagnosis is read with `firstfault diagnoses` as a user reads it."""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from firstfault.connectors.slurm_tail import Job, output_path
from firstfault.rules.engine import analyze_path
from firstfault.schemas.records import SchedulerEvent
from firstfault.streams.codecs import decode_scheduler
from firstfault.streams.runfile import RunInfo
from slurm_cluster import wait_for
from stream_pipeline import start_up
from test_up_ready import base_env, cli

pytest_plugins = ["conftest_slurm"]

ROOT = Path(__file__).resolve().parents[1]
TRACEBACK = f"""#!/bin/bash
echo "starting on $SLURMD_NODENAME"
exec {sys.executable} -u -c '
print("epoch 0 step 10 loss 2.31", flush=True)
import torch_stub_that_is_missing_on_purpose
'
"""


def published_end(env: dict[str, str], wid: str) -> SchedulerEvent:
    """The end event of ``wid`` on the scheduler topic of the `up` whose run file ``env`` names."""
    run = RunInfo.model_validate_json(Path(env["FIRSTFAULT_RUN_FILE"]).read_text())
    topic = f"{run.prefix}scheduler"
    c = Consumer({"bootstrap.servers": run.bootstrap, "group.id": f"{run.prefix}check", "enable.auto.commit": False})
    try:
        meta = c.list_topics(topic, timeout=10).topics[topic]
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for m in c.consume(num_messages=100, timeout=0.5) or []:
                if m.error() is None:
                    ev = decode_scheduler(m.value())
                    if ev.type == "end" and ev.workload.workload_id == wid:
                        return ev
    finally:
        c.close()
    raise AssertionError(f"no end event of {wid} on {topic}")


def test_up_slurm_diagnoses_a_job_that_dies_from_its_output(slurm_cluster, tmp_path):
    c = slurm_cluster
    tag = f"s{uuid.uuid4().hex[:8]}"
    env = base_env(tmp_path)
    # Polls every second (the defaults, 30 s and 5 s, are for a real controller); a short grace.
    up_env = {**env, "FIRSTFAULT_TOPIC_PREFIX": f"{tag}.", "FIRSTFAULT_APP_ID": f"{tag}-correlator",
              "FIRSTFAULT_EXTRACTOR_GROUP": f"{tag}-extractor", "FIRSTFAULT_GRACE_S": "1",
              "FIRSTFAULT_GRACE_CAP_S": "1", "FIRSTFAULT_SLURM_INTERVAL_S": "1",
              "FIRSTFAULT_SLURM_TAIL_INTERVAL_S": "1"}
    jobs = tmp_path / "jobs"
    # The tailer finds the file from the job's StdOut, which Slurm 22.05 gives unexpanded.
    pattern = str(jobs / "train-%x-%j.out")
    proc, text, err_lines = start_up(up_env, ROOT, "--slurm", timeout=90)
    try:
        assert text.splitlines()[-1:] and text.splitlines()[-1].startswith("ready"), text + "".join(err_lines)
        assert "worker    slurm " in text and "worker    slurm-tail " in text, text
        assert "try:      sbatch JOB.sh    firstfault diagnoses --follow" in text, text
        job = c.sbatch(TRACEBACK, "--job-name=tb", f"--output={pattern}", "-w", "n1", cwd=jobs)
        ended = c.wait_job(job, {"FAILED"}, timeout_s=60)
        wid = f"slurm-{job}"

        def final() -> dict | None:
            listed = cli(["diagnoses", "--all", "--json"], env, tmp_path)
            assert listed.returncode == 0, listed.stderr
            got = [json.loads(x) for x in listed.stdout.splitlines() if x.strip()]
            return next((d for d in got if d["workload_id"] == wid and not d["provisional"]), None)
        d = wait_for(f"the final diagnosis of {wid}", final, 60, every_s=0.5)
        lag = time.time() - time.mktime(time.strptime(ended["EndTime"], "%Y-%m-%dT%H:%M:%S"))
        print(f"\njob end -> final diagnosis seen: {lag:.1f} s")
        assert (d["status"], d["sub_domain"]) == ("attributed", "user_code_exception"), d
        # The stream read the job's own file: the diagnosis is `analyze`'s of that file beside the
        # connector's end record, as a bundle (the batch host's output as its application log).
        out = jobs / f"train-tb-{job}.out"
        assert d["root_cause"]["ref"] == {"path": "logs/app/n1.log", "line": 5}, d["root_cause"]
        # The end record the connector published, as the stream read it: a later poll may know more
        # (squeue's reason appears once slurmctld answers, under load it may not have), so it is read
        # back from the topic, not polled again.
        end = published_end(env, wid)
        bundle = tmp_path / "bundle"
        (bundle / "logs" / "app").mkdir(parents=True)
        (bundle / "workload.json").write_text(end.workload.model_dump_json())
        shutil.copy(out, bundle / "logs" / "app" / "n1.log")
        offline = analyze_path(bundle).diagnosis
        assert d["diagnosis_id"] == offline.diagnosis_id, (d, offline)

        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_output_file_patterns_are_expanded_as_slurm_does(tmp_path):
    job = Job(job_id=42, start=1, ended=False, name="train", user="ada", host="n7", workdir=str(tmp_path))
    assert output_path(job) == tmp_path / "slurm-42.out"                  # Slurm's default, in the job's directory
    assert output_path(job, "/scratch/%u/%x-%j.%N.out") == Path("/scratch/ada/train-42.n7.out")
    assert output_path(job, "logs/%5j-%%.out") == tmp_path / "logs" / "00042-%.out"
    task = Job(job_id=43, start=1, ended=False, host="n7", workdir=str(tmp_path), array_job=40, array_task=3)
    assert output_path(task) == tmp_path / "slurm-40_3.out"
    # slurmstepd writes its host name for %N, which need not be the node name: the one file that fits
    (tmp_path / "o-42-login1.out").write_text("x\n")
    assert output_path(job, "o-%j-%N.out") == tmp_path / "o-42-login1.out"
