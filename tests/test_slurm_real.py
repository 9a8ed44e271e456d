"""The Slurm connector against a real cluster (tests/slurm_cluster.py): jobs submitted with ``sbatch``,
run by the real slurmd, ended the ways users see them end; the connector polls the real
``sacct`` (slurmdbd) and ``squeue`` (slurmctld) while they do.

All scenarios run at once on one session cluster (n1 for single-node jobs, n2+n3 for the
job whose node goes down) so the module takes about as long as the slowest of them: the
time limit, which slurmctld checks every 30 s.
"""
from __future__ import annotations

import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from firstfault.connectors import slurm
from firstfault.connectors.slurm import SlurmConnector
from firstfault.schemas import SchedulerEvent
from slurm_cluster import SlurmCluster, wait_for

pytest_plugins = ["conftest_slurm"]

PY = sys.executable
# A training loop that logs like one and keeps going until Slurm ends it; one process per rank (srun).
TRAIN_PY = """import os, time
rank, node = os.environ["SLURM_PROCID"], os.environ["SLURMD_NODENAME"]
print(f"rank {rank} on {node}: NCCL INFO comm initialized", flush=True)
for step in range(100000):
    if step % 20 == 0:
        print(f"rank {rank} step {step} loss {2.3 - step / 1e5:.4f}", flush=True)
    time.sleep(0.05)
"""
TRAIN = f"srun --kill-on-bad-exit=1 {PY} -u train.py\n"
SCRIPTS = {
    "traceback": f"""#!/bin/bash
echo "starting on $SLURMD_NODENAME"
exec {PY} -u -c '
print("epoch 0 step 10 loss 2.31", flush=True)
import torch_stub_that_is_missing_on_purpose
'
""",
    "completed": f"""#!/bin/bash
{PY} -u -c 'print("epoch 3/3 done, saving checkpoint")'
""",
    "timeout": "#!/bin/bash\n" + TRAIN,
    "cancelled": "#!/bin/bash\n" + TRAIN,
    "node_down": "#!/bin/bash\n" + TRAIN,
    # attempt 0 trains until requeued; attempt 1 (SLURM_RESTART_COUNT=1) finishes
    "requeued": f"""#!/bin/bash
echo "incarnation ${{SLURM_RESTART_COUNT:-0}}"
if [ "${{SLURM_RESTART_COUNT:-0}}" = 0 ]; then
{TRAIN}
else
  {PY} -u -c 'print("resumed from checkpoint, done")'
fi
""",
}
OPTS = {
    "traceback": ["-w", "n1"], "completed": ["-w", "n1"], "cancelled": ["-w", "n1"],
    "timeout": ["-w", "n1", "--time=1"],
    "requeued": ["-w", "n1", "--requeue"],
    "node_down": ["-N", "2", "-w", "n2,n3", "--exclusive"],
}


class Collect:
    """The connector's publisher: keeps each event with the time it was published."""

    def __init__(self) -> None:
        self.events: list[tuple[float, SchedulerEvent]] = []

    def publish(self, events: list[SchedulerEvent]) -> None:
        now = time.time()
        self.events += [(now, e) for e in events]


@dataclass
class Scenario:
    cluster: SlurmCluster
    jobs: dict[str, int]
    out: dict[str, Path]
    published: Collect
    polls: list[int] = field(default_factory=list)     # commands run per poll
    failures: list[str] = field(default_factory=list)

    def ends(self) -> dict[tuple[str, int], SchedulerEvent]:
        return {(e.workload.workload_id, e.workload.attempt): e for _, e in self.published.events if e.type == "end"}


def _poll_loop(conn: SlurmConnector, stop: threading.Event, polls: list[int], failures: list[str]) -> None:
    calls = 0
    text = conn._text

    def counted(argv, env=None):                        # count every Slurm command a poll runs
        nonlocal calls
        calls += 1
        return text(argv, env)
    conn._text = counted                                # type: ignore[method-assign]
    while not stop.is_set():
        calls = 0
        try:
            conn.poll()
            polls.append(calls)
        except slurm.SlurmError as exc:
            failures.append(str(exc))
        stop.wait(0.5)


@pytest.fixture(scope="module")
def scenario(slurm_cluster, tmp_path_factory):
    c = slurm_cluster
    work = tmp_path_factory.mktemp("slurm-jobs")
    (work / "train.py").write_text(TRAIN_PY)
    published = Collect()
    conn = SlurmConnector(work / "state.json", published, lookback_s=600, overlap_s=120)
    stop = threading.Event()
    polls: list[int] = []
    failures: list[str] = []
    poller = threading.Thread(target=_poll_loop, args=(conn, stop, polls, failures), daemon=True)
    poller.start()
    jobs, out = {}, {}
    for kind, script in SCRIPTS.items():
        out[kind] = work / f"{kind}.out"
        jobs[kind] = c.sbatch(script, f"--job-name={kind}", f"--output={out[kind]}", *OPTS[kind], cwd=work)
    try:
        for kind in ("timeout", "cancelled", "node_down", "requeued"):
            c.wait_job(jobs[kind], {"RUNNING"})
            # the training loop is up and logging on every node before Slurm ends it
            ranks = 2 if kind == "node_down" else 1
            wait_for(f"{kind} training", lambda k=kind: out[k].exists() and
                     out[k].read_text().count("step 0 loss") >= ranks, 60)
        # The limit is in minutes: cut it to 0 so slurmctld's next limit check (every 30 s) ends it.
        c.run("scontrol", "update", f"JobId={jobs['timeout']}", "TimeLimit=0")
        c.run("scancel", str(jobs["cancelled"]))
        c.run("scontrol", "update", "NodeName=n3", "State=DOWN", "Reason=ecc errors")
        c.run("scontrol", "requeue", str(jobs["requeued"]))
        # a requeued job waits 2 minutes before it may start again (BeginTime): not in a test
        c.wait_job(jobs["requeued"], {"PENDING"})
        c.start_now(jobs["requeued"])
        for kind, state in (("traceback", "FAILED"), ("completed", "COMPLETED"), ("cancelled", "CANCELLED"),
                            ("node_down", "NODE_FAIL"), ("requeued", "COMPLETED"), ("timeout", "TIMEOUT")):
            c.wait_job(jobs[kind], {state}, timeout_s=300)
        c.run("scontrol", "update", "NodeName=n3", "State=RESUME")
        # every attempt's end reaches the connector (accounting may lag the controller)
        want = {(f"slurm-{j}", 0) for j in jobs.values()} | {(f"slurm-{jobs['requeued']}", 1)}
        wait_for("the connector's end events", lambda: want <= {
            (e.workload.workload_id, e.workload.attempt) for _, e in published.events if e.type == "end"}, 90)
    finally:
        stop.set()
        poller.join(60)
    yield Scenario(c, jobs, out, published, polls, failures)


def test_a_real_cluster_with_several_nodes(slurm_cluster):
    assert set(slurm_cluster.node_states()) == {"n1", "n2", "n3"}
    assert "is UP" in slurm_cluster.run("scontrol", "ping").stdout


def test_output_files_are_what_slurm_writes(scenario):
    text = {k: p.read_text() for k, p in scenario.out.items()}
    j = scenario.jobs
    assert "ModuleNotFoundError: No module named 'torch_stub_that_is_missing_on_purpose'" in text["traceback"]
    assert "Traceback (most recent call last)" in text["traceback"]
    assert f"*** JOB {j['timeout']} ON n1 CANCELLED AT" in text["timeout"]
    assert "DUE TO TIME LIMIT ***" in text["timeout"]
    assert f"*** JOB {j['cancelled']} ON n1 CANCELLED AT" in text["cancelled"]
    assert "DUE TO" not in text["cancelled"]
    assert "srun: error: Node failure on n3" in text["node_down"]
    assert "DUE TO NODE FAILURE" in text["node_down"]
    assert "rank 0 on n2" in text["node_down"] and "rank 1 on n3" in text["node_down"]
    # the requeued job's file holds its second incarnation (Slurm truncates it on restart)
    assert "incarnation 1" in text["requeued"] and "resumed from checkpoint, done" in text["requeued"]


def test_accounting_records_each_ending(scenario):
    c, j = scenario.cluster, scenario.jobs
    states = {k: [r["state"]["current"] for r in c.sacct(v)] for k, v in j.items()}
    flat = {k: [s if isinstance(s, str) else s[0] for s in v] for k, v in states.items()}
    assert flat == {"traceback": ["FAILED"], "completed": ["COMPLETED"], "timeout": ["TIMEOUT"],
                    "cancelled": ["CANCELLED"], "node_down": ["NODE_FAIL"], "requeued": ["REQUEUED", "COMPLETED"]}


def test_connector_end_events(scenario):
    j, ends = scenario.jobs, scenario.ends()

    def end(kind: str, attempt: int = 0):
        return ends[(f"slurm-{j[kind]}", attempt)].workload

    got = {k: (end(k).state, end(k).exit_code, end(k).nodes, end(k).terminal_state) for k in j}
    got["requeued-1"] = (end("requeued", 1).state, end("requeued", 1).exit_code, end("requeued", 1).nodes,
                         end("requeued", 1).terminal_state)
    assert got == {
        "traceback": ("FAILED", "1:0", ["n1"], "failed"),               # no srun: the allocation is the attempt
        "completed": ("COMPLETED", "0:0", ["n1"], "completed"),
        "timeout": ("TIMEOUT", "0:15", ["n1"], "timeout"),              # the srun step got SIGTERM at the limit
        "cancelled": ("CANCELLED by root", "0:15", ["n1"], "cancelled"),
        "node_down": ("NODE_FAIL", "0:15", ["n2", "n3"], "node_fail"),
        "requeued": ("REQUEUED", "0:15", ["n1"], "unknown"),            # attempt 0, ended by the requeue
        "requeued-1": ("COMPLETED", "0:0", ["n1"], "completed"),
    }
    # slurmctld's reason, read from squeue in the poll that saw the end in accounting
    assert {k: end(k).model_extra.get("reason") for k in j} == {
        "traceback": "NonZeroExitCode", "completed": None, "timeout": "TimeLimit", "cancelled": None,
        "node_down": "NodeDown", "requeued": None}
    assert end("requeued", 1).model_extra["restart_cnt"] == 1 and end("requeued").model_extra["restart_cnt"] == 0
    assert end("timeout").model_extra["slurm_step"] == f"{j['timeout']}.0"
    assert end("traceback").model_extra["slurm_step"] is None
    for kind in j:                                    # each end after its start, in real time
        w = end(kind)
        assert w.end_time >= w.start_time and w.model_extra["user"] == "root"


def test_each_attempt_published_once_with_its_start(scenario):
    keys = [slurm.event_key(e) for _, e in scenario.published.events]
    assert len(keys) == len(set(keys)), "an event was published twice"
    starts = {k.rsplit("|", 1)[0] for k in keys if k.endswith("|start")}
    ends = {k.rsplit("|", 1)[0] for k in keys if k.endswith("|end")}
    assert ends <= starts
    # A fresh connector reading the same history from scratch sees exactly the same attempts.
    again = SlurmConnector(scenario.cluster.root / "again.json", Collect(), lookback_s=600).poll()
    assert {slurm.event_key(e) for e in again} == set(keys)


def test_end_events_arrive_within_seconds_at_bounded_cost(scenario):
    # Figures: end of the job in accounting -> the connector's end event, and commands per poll.
    c, j = scenario.cluster, scenario.jobs
    ends = {e.workload.workload_id: t for t, e in scenario.published.events if e.type == "end"}
    lags = []
    for kind, jid in j.items():
        rec = c.sacct(jid)[-1]
        lags.append(ends[f"slurm-{jid}"] - rec["time"]["end"])
    print(f"\nend->event lag s: max {max(lags):.1f}, all {sorted(round(x, 1) for x in lags)}; "
          f"polls {len(scenario.polls)}, commands per poll {sorted(set(scenario.polls))}")
    assert all(-1.5 < lag < 60 for lag in lags)        # second-resolution end times; poll every 0.5 s
    # squeue + sacct JSON and its text exit codes, for the window and (open or requeued jobs) by id
    assert max(scenario.polls) <= 5
    # polling a quiet cluster (before the first job) is not an error: 22.05 says "Nothing found"
    assert scenario.failures == []


# What a user should be told, from the connector's end record and the job's own output file.
DIAGNOSES = {
    "traceback": ("attributed", "user_code_exception"),
    "completed": ("no_failure", "none"),
    "timeout": ("attributed", "walltime_exceeded"),
    "cancelled": ("attributed", "user_cancelled"),
    "node_down": ("attributed", "node_failure"),
}


def test_diagnosis_of_each_job_from_its_record_and_output(scenario, tmp_path):
    from firstfault.rules.engine import analyze_path

    got, nodes = {}, {}
    for kind in DIAGNOSES:
        w = scenario.ends()[(f"slurm-{scenario.jobs[kind]}", 0)].workload
        bundle = tmp_path / kind
        (bundle / "logs" / "app").mkdir(parents=True)
        (bundle / "workload.json").write_text(w.model_dump_json())
        shutil.copy(scenario.out[kind], bundle / "logs" / "app" / f"{w.nodes[0]}.log")      # the batch host's
        d = analyze_path(bundle).diagnosis
        got[kind], nodes[kind] = (d.status, d.sub_domain), d.responsible_nodes
    assert got == DIAGNOSES, nodes
    # n3 went DOWN. The only line naming it is srun's "Node failure on n3"; slurmstepd on n2
    # reports the cancellation, so the rules may name n2 as well.
    assert "n3" in nodes["node_down"], nodes
