"""A fault that cleared is weak evidence (rules/clears.py, rules/catalog/final/clears.yaml), and a
step's SIGKILL banner below a task's non-zero exit is srun's tear-down (extract/scheduler.yaml
slurm.srun_task_exit_code, early/scheduler.yaml early.slurm.srun_abort_kill). Real lines:
mghpcc/aicr-benchmarks@9fd27bd2 (a finished ResNet-152 run on a0007; an HPCG run on b0015) and
llm-d/llm-d#191 (a port that kept flapping)."""
from __future__ import annotations

from conftest import diag

A0007 = {"nodes": ["a0007"], "start_time": "2026-05-11T18:18:00Z", "end_time": "2026-05-11T18:40:00Z"}
ERR = ("[2026-05-11 18:22:08] a0007:{pid}:68340 [0] transport/net_ib.cc:253 NCCL WARN NET/IB : "
       "mlx5_3:1 Got non-fatal async event: port error(10)")
REREG = ("[2026-05-11 18:28:14] a0007:68265:68340 [0] transport/net_ib.cc:253 NCCL WARN NET/IB : "
         "mlx5_3:1 Got non-fatal async event: client reregistration(17)")
UP = ("[2026-05-11 18:28:14] a0007:{pid}:68328 [0] transport/net_ib.cc:253 NCCL WARN NET/IB : "
      "mlx5_3:1 Got non-fatal async event: port active(9)")
PIDS = range(68264, 68272)

LLMD = {"nodes": ["ms-pd-llm-d-modelservice-prefill-2"], "start_time": "2025-09-17T15:00:00Z",
        "end_time": "2025-09-17T15:40:00Z"}
FLAP = """[2025-09-17 15:16:23] ms-pd-llm-d-modelservice-prefill-2:311:405 [0] transport/net_ib.cc:199 NCCL WARN NET/IB : mlx5_32:1 Got async error event: port error
[2025-09-17 15:16:31] ms-pd-llm-d-modelservice-prefill-2:311:405 [0] transport/net_ib.cc:199 NCCL WARN NET/IB : mlx5_32:1 Got async error event: port active
[2025-09-17 15:23:34] ms-pd-llm-d-modelservice-prefill-2:311:405 [0] transport/net_ib.cc:199 NCCL WARN NET/IB : mlx5_32:1 Got async error event: port error
"""


def _steps(d):
    return {s.rule_id for s in d.evidence}


def test_a_port_error_alone_is_the_cause_and_excludes_its_node():
    d = diag({"logs/app/a0007.log": "\n".join(ERR.format(pid=p) for p in PIDS) + "\n"}, **A0007)
    assert (d.status, d.sub_domain) == ("attributed", "ib_link_error")
    assert d.recovery.action == "retry_excluding_nodes" and d.recovery.nodes == ["a0007"]


def test_a_port_back_to_active_after_its_last_error_excludes_nothing():
    text = "\n".join([*(ERR.format(pid=p) for p in PIDS), REREG, *(UP.format(pid=p) for p in PIDS)]) + "\n"
    d = diag({"logs/app/a0007.log": text}, **A0007)
    assert d.status == "unattributed"
    assert d.suspect_nodes == ["a0007"] and d.responsible_nodes == []
    assert d.recovery.action == "notify_owner" and d.recovery.nodes == []
    assert "final.clears.ib_port_back_to_active" in _steps(d)


def test_a_port_that_errs_again_after_coming_back_stays_the_cause():
    d = diag({"logs/app/prefill-2.log": FLAP}, **LLMD)
    assert (d.status, d.sub_domain) == ("attributed", "ib_link_error")
    assert d.recovery.nodes == ["ms-pd-llm-d-modelservice-prefill-2"]
    assert "final.clears.ib_port_back_to_active" not in _steps(d)


def test_another_port_coming_back_clears_nothing():
    other = UP.format(pid=68264).replace("mlx5_3:1", "mlx5_4:1")
    d = diag({"logs/app/a0007.log": ERR.format(pid=68264) + "\n" + other + "\n"}, **A0007)
    assert (d.status, d.sub_domain) == ("attributed", "ib_link_error")


def test_a_port_active_before_the_error_clears_nothing():
    # the order of the stamps decides, not the order of the lines
    up_first = UP.format(pid=68264).replace("18:28:14", "18:20:00")
    d = diag({"logs/app/a0007.log": up_first + "\n" + ERR.format(pid=68264) + "\n"}, **A0007)
    assert (d.status, d.sub_domain) == ("attributed", "ib_link_error")


def test_an_unstamped_port_active_clears_nothing():
    bare = UP.format(pid=68264).split("] ", 1)[1]       # the same line without its collector stamp
    d = diag({"logs/app/a0007.log": ERR.format(pid=68264) + "\n" + bare + "\n"}, **A0007)
    assert (d.status, d.sub_domain) == ("attributed", "ib_link_error")


B0015 = {"nodes": ["b0015"], "start_time": "2026-05-22T11:50:00Z", "end_time": "2026-05-22T12:03:00Z"}
KILLED = "[2026-05-22T12:02:49.520] error: *** STEP 27009.0 ON b0015 CANCELLED AT 2026-05-22T12:02:49 DUE to SIGNAL Killed ***"
HPCG_TAIL = f"""srun: error: b0015: tasks 4-5: Exited with exit code 134
srun: error: b0015: tasks 0,6: Exited with exit code 134
[2026-05-22T12:02:49.516] error:  mpi/pmix_v3: _errhandler: b0015 [0]: pmixp_client_v2.c:225: Error handler invoked: status = -25, source = [slurm.pmix.27009.0:5]
srun: Job step aborted: Waiting up to 62 seconds for job step to finish.
{KILLED}
srun: error: b0015: tasks 1-3,7: Killed
"""


def test_a_sigkill_banner_below_a_task_exit_is_sruns_teardown_not_a_cancel():
    d = diag({"logs/app/hpcg_27009.err": HPCG_TAIL}, **B0015)
    assert d.status == "unattributed" and d.sub_domain != "user_cancelled"
    assert "early.slurm.srun_abort_kill" in _steps(d)


def test_a_sigkill_banner_alone_is_still_a_weak_cancel():
    d = diag({"logs/app/hpcg_27009.err": KILLED + "\n"}, **B0015)
    assert (d.status, d.sub_domain) == ("attributed", "user_cancelled")
    assert d.recovery.action == "none"


def test_a_banner_above_the_task_exit_is_not_torn_down_by_it():
    # scancel first: the tasks' exits come after slurmstepd's banner
    d = diag({"logs/app/hpcg_27009.err": KILLED + "\nsrun: error: b0015: tasks 4-5: Exited with exit code 134\n"}, **B0015)
    assert (d.status, d.sub_domain) == ("attributed", "user_cancelled")


def test_killed_tasks_do_not_tear_the_step_down():
    # "Killed" is what the SIGKILL did to the tasks, not a task that failed first
    d = diag({"logs/app/hpcg_27009.err": "srun: error: b0015: tasks 1-3,7: Killed\n" + KILLED + "\n"}, **B0015)
    assert (d.status, d.sub_domain) == ("attributed", "user_cancelled")


# PyTorch's watchdog line (ProcessGroupNCCL.cpp, as tests/test_catalog_torch_c10d.py writes it), on a0007's ranks
WD = ("[rank{rank}]:[E0511 18:32:10.044871 ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective operation "
      "timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for "
      "600054 milliseconds before timing out.")


def test_a_port_that_came_back_but_explains_the_hang_stays_the_cause():
    # The flap hung the collective that was in flight: the watchdog timeouts began when the port erred.
    text = "\n".join([*(ERR.format(pid=p) for p in PIDS), REREG, *(UP.format(pid=p) for p in PIDS),
                      *(WD.format(rank=r) for r in range(8))]) + "\n"
    d = diag({"logs/app/a0007.log": text}, **A0007)
    assert (d.status, d.sub_domain) == ("attributed", "ib_link_error")
    assert d.recovery.nodes == ["a0007"]
    assert "final.clears.ib_port_back_to_active" not in _steps(d)
