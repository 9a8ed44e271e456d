"""Ranks timing out on different collectives of one hang are a desync (final.desync, issue 21 item 4)."""
from __future__ import annotations

from datetime import datetime, timezone

from firstfault.rules.engine import analyze_files
from firstfault.rules.prefixes import StampContext, read_head

from conftest import BASE_WORKLOAD, ROOT

WD = ("{rank}: [rank{rank}]:[E1102 10:13:12.{us:06d} ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective "
      "operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={n}, NumelOut={n}, Timeout(ms)=600000) "
      "ran for 600054 milliseconds before timing out.")
XID79 = "Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def _timeouts(odd: dict[int, dict]) -> str:
    lines = []
    for r in range(8):
        work = {"seq": 812, "op": "ALLREDUCE", "n": 1024, **odd.get(r, {})}
        lines.append(WD.format(rank=r, us=r, **work))
    return "\n".join(lines) + "\n"


def _diag(files):
    return analyze_files({**BASE_WORKLOAD, "nodes": ["node-01", "node-02"]}, files).diagnosis


def test_one_rank_on_another_operation_is_a_collective_mismatch_naming_it():
    d = _diag({"logs/app/node-01.log": _timeouts({5: {"op": "BROADCAST"}})})
    assert (d.status, d.sub_domain, d.recovery.nodes) == ("attributed", "collective_mismatch", [])
    assert "rank 5 timed out on BROADCAST SeqNum=812" in d.root_cause.message
    step = next(s for s in d.evidence if s.rule_id == "final.desync")
    assert step.detail["odd_ranks"] == [5]
    assert d.recovery.action == "notify_owner"


def test_one_rank_a_collective_ahead_with_another_size_is_a_mismatch():
    d = _diag({"logs/app/node-01.log": _timeouts({2: {"seq": 813, "n": 1}})})
    assert (d.status, d.sub_domain) == ("attributed", "collective_mismatch")
    assert next(s for s in d.evidence if s.rule_id == "final.desync").detail["odd_ranks"] == [2]


def test_every_rank_on_the_same_work_is_no_desync():
    d = _diag({"logs/app/node-01.log": _timeouts({})})
    assert d.status == "unattributed"
    assert not any(s.rule_id == "final.desync" for s in d.evidence)


def test_numbers_far_apart_are_other_process_groups_not_a_desync():
    d = _diag({"logs/app/node-01.log": _timeouts({5: {"seq": 64088}})})
    assert not any(s.rule_id == "final.desync" for s in d.evidence)


def test_three_versions_are_left_alone():
    d = _diag({"logs/app/node-01.log": _timeouts({5: {"op": "BROADCAST"}, 6: {"op": "ALLGATHER"}})})
    assert not any(s.rule_id == "final.desync" for s in d.evidence)


def test_a_hardware_fault_before_the_hang_stays_the_cause():
    d = _diag({"logs/app/node-01.log": _timeouts({5: {"op": "BROADCAST"}}), "logs/syslog/node-02.log": XID79 + "\n"})
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_fell_off_bus", ["node-02"])


def test_the_posted_llamafactory_desync_behind_a_progress_bar():
    # hiyouga/LlamaFactory#2902: rank 0's line follows a tqdm bar on the same line.
    path = ROOT / "corpus/real/ho-unattr-watchdog-seq-mismatch-1516-1517-llamafactory-2902/input/train.log"
    d = analyze_files({**BASE_WORKLOAD, "nodes": ["node-01"], "start_time": "2025-11-23T00:00:00Z",
                       "end_time": "2025-11-23T01:00:00Z"}, {"logs/app/train.log": path.read_text()}).diagnosis
    assert (d.status, d.sub_domain) == ("attributed", "collective_mismatch")
    assert sorted(next(s for s in d.evidence if s.rule_id == "final.desync").detail["odd_ranks"]) == [0, 1]


def test_a_progress_bar_before_a_log_line_is_decoration():
    ctx = StampContext(zone=timezone.utc, anchor=datetime(2026, 1, 1, tzinfo=timezone.utc))
    head = read_head("epoch 001:  37%|█  | 521/1426 [02:47<04:46,  3.16it/s, loss=0.138][rank3]:"
                     "[E1102 10:13:12.044871 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught", ctx)
    assert (head.rank, head.message) == (3, "[Rank 3] Watchdog caught")
    assert head.stamp is not None
    plain = read_head("loss went from 50%|to 20%", ctx)
    assert plain.message == "loss went from 50%|to 20%"
