"""Silent ranks are suspects (issue 20 item 6): 15 of 16 ranks time out on one collective and
rank 11, whose earlier lines are in the logs, prints nothing about it. Real line formats (the
catalog's nccl.init_complete and torch.watchdog_timeout examples, srun --label prefixes), the
real engine."""
from __future__ import annotations

from firstfault.rules.engine import analyze_files, analyze_path

WL = {"workload_id": "slurm-200", "attempt": 0, "scheduler": "slurm", "state": "FAILED", "exit_code": "1:0",
      "start_time": "2026-11-02T09:58:00Z", "end_time": "2026-11-02T10:21:14Z",
      "nodes": ["node-01", "node-02"], "gpus_per_node": 8}
INIT = ("{r}: {host}:47{r:02d}:48{r:02d} [{d}] NCCL INFO comm 0x9f2ef80 rank {c} nranks {n} cudaDev {d} nvmlDev {d} "
        "busId {d}b000 commId 0x5ae77eb5ea4ec1ee - Init COMPLETE")
WD = ("{r}: [rank{r}]:[E1102 10:13:12.044871 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective "
      "operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) "
      "ran for 600054 milliseconds before timing out.")
# A benign startup line (kept as context): rank 11 was alive and logging before the hang.
RETRY = ("11: [W1102 09:58:40.149509694 socket.cpp:752] [c10d] The client socket has failed to connect to "
         "[node-01]:29500 (errno: 111 - Connection refused).")
XID79 = ("Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, "
         "GPU has fallen off the bus.")


def host_log(host: str, ranks, silent=(), init=True, nranks=16) -> str:
    # A communicator smaller than the world (a tensor-parallel group per node) numbers its ranks from 0.
    lines = [INIT.format(r=r, c=r if nranks == 16 else r % nranks, host=host, d=r % 8, n=nranks)
             for r in ranks] if init else []
    lines += [WD.format(r=r) for r in ranks if r not in silent]
    return "\n".join(lines) + "\n"


def bundle(silent=(11,), init=True, init_skip=()) -> dict[str, str]:
    def one(host, ranks):
        text = host_log(host, ranks, silent=silent, init=init)
        return "\n".join(ln for ln in text.splitlines() if not any(ln.startswith(f"{r}: {host}:") for r in init_skip)) + "\n"
    return {"logs/app/node-01.log": one("node-01", range(0, 8)), "logs/app/node-02.log": one("node-02", range(8, 16))}


def diag(files, **wl):
    return analyze_files({**WL, **wl}, files).diagnosis


def silent_step(d):
    return next((s for s in d.evidence if s.rule_id == "final.silent_ranks"), None)


def test_a_present_but_silent_rank_is_the_suspect_and_the_summary_names_it():
    d = diag(bundle())
    assert d.status == "unattributed" and d.responsible_nodes == []
    assert d.suspect_nodes == ["node-02"]
    step = silent_step(d)
    assert step is not None and step.action == "suspect"
    assert step.detail["silent_ranks"] == [11] and step.detail["hosts"] == ["node-02"]
    assert (step.detail["collective"], step.detail["timed_out"], step.detail["world_size"]) == (812, 15, 16)
    assert step.detail["world_basis"] == "NCCL Init COMPLETE nranks"
    assert step.detail["rank_hosts"] == {"11": "node-02"}
    assert step.detail["evidence"].startswith("log present, silent about the collective")
    assert [(r.path, r.line) for r in step.events] == [("logs/app/node-02.log", 4)]     # rank 11's init line
    assert "rank 11 (node-02) printed nothing about collective 812" in d.summary
    assert "15 of 16 ranks timed out" in d.summary


def test_every_rank_timed_out_names_no_silent_suspect():
    d = diag(bundle(silent=()))
    assert silent_step(d) is None
    assert d.suspect_nodes == [] and "printed nothing" not in d.summary


def test_world_size_unknown_says_nothing():
    # No NCCL init line and no gpus_per_node: nothing says how many ranks there are, although rank
    # 11's startup line shows its log is present.
    files = bundle(init=False)
    files["logs/app/node-02.log"] = RETRY + "\n" + files["logs/app/node-02.log"]
    d = diag(files, gpus_per_node=None)
    assert silent_step(d) is None
    assert d.suspect_nodes == [] and "printed nothing" not in d.summary
    # The same lines with the record's 2 x 8: the world is known, rank 11 is the suspect.
    d = diag(files)
    step = silent_step(d)
    assert step is not None and step.detail["world_basis"] == "workload record (nodes x gpus_per_node)"
    assert step.detail["silent_ranks"] == [11] and d.suspect_nodes == ["node-02"]


def test_world_size_from_the_record_when_only_smaller_communicators_are_logged():
    # Each node's init lines are of an 8-rank communicator (comm ranks 0-7): the lines name global
    # ranks up to 15 (srun's labels), so the world is the record's 2 x 8, and rank 11's own init line
    # (label 11) shows its log is present.
    files = {"logs/app/node-01.log": host_log("node-01", range(0, 8), nranks=8),
             "logs/app/node-02.log": host_log("node-02", range(8, 16), silent=(11,), nranks=8)}
    d = diag(files)
    step = silent_step(d)
    assert step is not None and step.detail["silent_ranks"] == [11]
    assert (step.detail["world_size"], step.detail["world_basis"]) == (16, "workload record (nodes x gpus_per_node)")
    assert step.detail["host_basis"] == {"11": "the rank's own lines"}
    assert d.suspect_nodes == ["node-02"]
    # Without the record's gpus_per_node nothing says how many ranks there are.
    d = diag(files, gpus_per_node=None)
    assert silent_step(d) is None and d.suspect_nodes == []


def test_a_rank_with_no_line_at_all_is_not_blamed():
    # Rank 11's init line is absent too: its log may simply not have been collected.
    d = diag(bundle(init_skip=(11,)))
    assert silent_step(d) is None
    assert "node-02" not in d.suspect_nodes


def test_a_silent_majority_is_not_a_straggler():
    # Only node-01's ranks timed out; node-02's eight ranks were silent: not a minority.
    files = {"logs/app/node-01.log": host_log("node-01", range(0, 8)),
             "logs/app/node-02.log": host_log("node-02", range(8, 16), silent=tuple(range(8, 16)))}
    d = diag(files)
    assert silent_step(d) is None and d.suspect_nodes == []


def test_an_attributed_diagnosis_is_unchanged():
    files = bundle()
    files["logs/syslog/node-02.log"] = XID79 + "\n"
    d = diag(files)
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_fell_off_bus", ["node-02"])
    assert silent_step(d) is None and d.suspect_nodes == []
    assert "printed nothing" not in d.summary


WHAT = ("  what():  [PG ID 0 PG GUID 0(default_pg) Rank {r}] Process group watchdog thread terminated with exception: "
        "[Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1024, "
        "NumelOut=1024, Timeout(ms)=600000) ran for 600054 milliseconds before timing out.")


def test_rankless_what_lines_of_the_reporting_ranks_do_not_hide_the_silent_one():
    # The C++ what() line has no rank prefix: one from each of node-02's seven reporting ranks.
    files = bundle()
    files["logs/app/node-02.log"] += "\n".join(WHAT.format(r=r) for r in (8, 9, 10, 12, 13, 14, 15)) + "\n"
    d = diag(files)
    step = silent_step(d)
    assert step is not None and step.detail["silent_ranks"] == [11] and d.suspect_nodes == ["node-02"]


def test_a_rankless_watchdog_line_more_than_the_reporters_may_be_the_silent_ranks():
    # Eight what() lines on node-02 and seven ranks that reported there: one may be rank 11's.
    files = bundle()
    files["logs/app/node-02.log"] += "\n".join(WHAT.format(r=r) for r in range(8, 16)) + "\n"
    d = diag(files)
    assert silent_step(d) is None and d.suspect_nodes == []


def test_bare_file_the_same_answer(tmp_path):
    # One console log, no workload.json: hosts from the NCCL prefixes, the world from nranks.
    files = bundle()
    log = tmp_path / "train.log"
    log.write_text(files["logs/app/node-01.log"] + files["logs/app/node-02.log"])
    d = analyze_path(log).diagnosis
    assert d.status == "unattributed"
    assert d.suspect_nodes == ["node-02"]
    step = silent_step(d)
    assert step is not None and step.detail["silent_ranks"] == [11]
    assert step.detail["host_basis"] == {"11": "NCCL Init COMPLETE line"}
    assert "rank 11 (node-02) printed nothing about collective 812" in d.summary


def test_bare_file_without_nranks_says_nothing(tmp_path):
    files = bundle(init=False)
    log = tmp_path / "train.log"
    log.write_text(RETRY + "\n" + files["logs/app/node-01.log"] + files["logs/app/node-02.log"])
    d = analyze_path(log).diagnosis
    assert silent_step(d) is None and d.suspect_nodes == []
    assert "printed nothing" not in d.summary
