"""FINAL rule: ranks that time out on different collectives of one hang are a desync (issue 21 item 4).

Every rank of a process group calls its collectives in the same order; NCCL matches the n-th call
of each rank with the n-th call of the others. A collective completes on all ranks or on none, so
when the ranks that time out in one hang report different collectives (another SeqNum, OpType or
element count), their calls no longer line up: that is a collective mismatch in the program (a
rank took another branch, called one collective more, or reduced a tensor of another size), not a
slow network or a dead rank. ProcessGroupNCCL prints the work in its timeout line
(``WorkNCCL(SeqNum=1516, OpType=ALLREDUCE, NumelIn=25427968, ...)``); the rule compares those.

Conservative: one process group (the lines' PG, when they name one, else the default), one hang
(the collectives began within the hang slack of each other; lines without a time count as one
hang only when they name the same SeqNum, the same call on every rank), exactly two versions of
the work and sequence numbers at most one apart. More versions, or numbers far apart, are more
likely several process groups (tensor, pipeline, data parallel each count their own) than one
desync.
"""
from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

from ..final import FinalContext
from ..model import Ev
from . import final_rule

_WL = {"workload_id": "ex", "state": "FAILED", "start_time": "2026-11-02T09:58:00Z",
       "end_time": "2026-11-02T10:21:14Z", "nodes": ["node-01"], "gpus_per_node": 8}
# The two lines of hiyouga/LlamaFactory#2902, as posted.
_R0 = ("[rank0]:[E1102 10:12:57.664949121 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout: "
       "WorkNCCL(SeqNum=1516, OpType=ALLREDUCE, NumelIn=25427968, NumelOut=25427968, Timeout(ms)=600000) ran for 600017 "
       "milliseconds before timing out.")
_R1 = ("[rank1]:[E1102 10:12:57.704703955 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught collective operation timeout: "
       "WorkNCCL(SeqNum=1517, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600026 "
       "milliseconds before timing out.")

# Two unstamped lines of axolotl-ai-cloud/axolotl#1495, as posted: one SeqNum, two element counts.
_U6 = ("[E ProcessGroupNCCL.cpp:475] [Rank 6] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=13807, "
       "OpType=ALLREDUCE, NumelIn=11274112, NumelOut=11274112, Timeout(ms)=1800000) ran for 1800233 milliseconds before "
       "timing out.")
_U7 = ("[E ProcessGroupNCCL.cpp:475] [Rank 7] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=13807, "
       "OpType=ALLREDUCE, NumelIn=10942336, NumelOut=10942336, Timeout(ms)=1800000) ran for 1800289 milliseconds before "
       "timing out.")

# Two ranks of modelscope/DiffSynth-Studio#458 (Lightning's ModelParallelStrategy), as posted: one coalesced
# batch, each rank's own element count.
_C4 = ("[rank4]:[E318 07:39:53.792630246 ProcessGroupNCCL.cpp:616] [Rank 4] Watchdog caught collective operation timeout: "
       "WorkNCCL(SeqNum=610, OpType=COALESCED, NumelIn=56320, NumelOut=450560, Timeout(ms)=600000) ran for 600086 "
       "milliseconds before timing out.")
_C6 = ("[rank6]:[E318 07:39:53.793305338 ProcessGroupNCCL.cpp:616] [Rank 6] Watchdog caught collective operation timeout: "
       "WorkNCCL(SeqNum=610, OpType=COALESCED, NumelIn=76800, NumelOut=614400, Timeout(ms)=600000) ran for 600087 "
       "milliseconds before timing out.")

_MAX_SEQ_GAP = 1
# c10d's OpType names (torch/csrc/distributed/c10d/Types.hpp). Point-to-point work pairs a SEND on one
# rank with a RECV on its peer, each with its own size: a pipeline's hang shows both, in step.
_P2P = frozenset({"SEND", "RECV", "RECVANYSOURCE"})
# Collectives whose element count is each rank's own: a coalesced batch (batch_isend_irecv's sends and
# receives, a coalescing manager's list), all-to-all with uneven splits, gather and scatter (the root's
# side differs). Their NumelIn differing says nothing of step; their SeqNum and OpType still do.
_OWN_COUNT = frozenset({"COALESCED", "ALLTOALL", "ALLTOALL_BASE", "GATHER", "SCATTER"})


def _work(ev: Ev) -> tuple:
    f = ev.fields
    op = f.get("op")
    return (f.get("seq"), op, None if op in _OWN_COUNT else f.get("numel_in"))


def _describe(work: tuple) -> str:
    seq, op, numel = work
    return f"{op} SeqNum={seq}" + (f" ({numel} element{'s' if numel != 1 else ''})" if isinstance(numel, int) else "")


def _members(ev: Ev) -> set[int]:
    """Who timed out: the global ranks, else the line's rank in its group ("[Rank N]", the group's own
    numbering; the rule compares one group's lines only)."""
    if ev.ranks:
        return ev.ranks
    pg_rank = ev.fields.get("pg_rank")
    return {pg_rank} if isinstance(pg_rank, int) else set()


def _ranks(evs: list[Ev]) -> list[int]:
    return sorted(set().union(*(_members(e) for e in evs)))


def _size(evs: list[Ev]) -> int:
    """How many report this version: its global ranks, and a line each where none is printed (the lines
    of ranks without one fold into one event, which keeps only the first line's group rank)."""
    return len(set().union(*(e.ranks for e in evs))) + sum(e.count for e in evs if not e.ranks)


@final_rule(
    id="final.desync", priority=640, title="Ranks that timed out on different collectives are out of step",
    description="In one hang of one process group, the ranks' watchdog timeouts name exactly two versions of the "
                "work (another SeqNum at most one apart, OpType or NumelIn): the ranks' collective calls no longer "
                "line up, a collective_mismatch in the program, with the ranks on the odd version named. Source: "
                "pytorch/pytorch torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (WorkNCCL's SeqNum/OpType/Numel in "
                "the timeout line); NCCL matches each rank's n-th collective with the others' n-th; "
                "hiyouga/LlamaFactory#2902 (the example's lines); axolotl-ai-cloud/axolotl#1495 (unstamped lines, one "
                "SeqNum, two NumelIn). Point-to-point work (SEND, RECV) is left out and the element count is not compared "
                "where it is each rank's own (COALESCED, ALLTOALL, ALLTOALL_BASE, GATHER, SCATTER: "
                "torch/csrc/distributed/c10d/Types.hpp's OpType; modelscope/DiffSynth-Studio#458, one coalesced batch).",
    examples={"fires": [{"workload": _WL, "files": {"logs/app/node-01.log": _R0 + "\n" + _R1}},
                        {"workload": _WL, "files": {"logs/app/node-01.log": _U6 + "\n" + _U7}}],
              "quiet": [{"workload": _WL, "files": {"logs/app/node-01.log": _R0 + "\n" + _R0.replace("rank0", "rank1")
                                                    .replace("Rank 0", "Rank 1")}},
                        {"workload": _WL, "files": {"logs/app/node-01.log": _R0 + "\n" + _R1.replace("1517", "1530")}},
                        # unplaced and one SeqNum apart: nothing ties them to one hang
                        {"workload": _WL, "files": {"logs/app/node-01.log": _U6 + "\n" + _U7.replace("13807", "13808")}},
                        # a coalesced batch: each rank's element count is its own
                        {"workload": _WL, "files": {"logs/app/node-01.log": _C4 + "\n" + _C6}}]},
)
def desync(ctx: FinalContext) -> None:
    timeouts = [e for e in ctx.events if e.kind == "watchdog_timeout" and isinstance(e.fields.get("seq"), int)
                and isinstance(e.fields.get("op"), str) and e.fields["op"] not in _P2P and _members(e)
                and id(e) not in ctx.excluded]
    groups: dict[object, list[Ev]] = defaultdict(list)
    for ev in timeouts:
        groups[ev.fields.get("pg")].append(ev)
    slack = timedelta(seconds=float(ctx.settings["hang_slack_s"])) + ctx.tol()
    for _pg, evs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        versions: dict[tuple, list[Ev]] = defaultdict(list)
        for ev in evs:
            versions[_work(ev)].append(ev)
        if len(versions) != 2:
            continue
        (a, a_evs), (b, b_evs) = sorted(versions.items(), key=lambda kv: (-_size(kv[1]), str(kv[0])))
        if abs(a[0] - b[0]) > _MAX_SEQ_GAP:
            continue
        if set(_ranks(a_evs)) & set(_ranks(b_evs)):
            continue                    # one rank in both versions: several hangs or restarts, not one desync
        onsets = [ctx.when(e) for e in a_evs + b_evs]
        known = [t for t in onsets if t is not None]
        if known and max(known) - min(known) > slack:
            continue                    # not one hang
        if len(known) < len(onsets) and a[0] != b[0]:
            # Unplaced lines: only the same SeqNum ties them to one collective call (the n-th of the
            # group on every rank); numbers one apart may come from two hangs the lines cannot order.
            continue
        # The version fewer ranks report is the odd one; a tie names both sides.
        odd = b_evs if _size(b_evs) < _size(a_evs) else a_evs + b_evs
        other = a if odd is b_evs else None
        for ev in odd:
            mine, theirs = (a_evs, b) if _work(ev) == a else (b_evs, a)
            ranks = _ranks([e for e in mine if _work(e) == _work(ev)])
            ev.role, ev.domain, ev.sub_domain, ev.strength = "root", "application", "collective_mismatch", "weak"
            ev.fields["desync_with"] = _describe(other or theirs)
            ev.output = (f"collective mismatch: rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks))} "
                         f"timed out on {_describe(_work(ev))} while the other ranks timed out on {_describe(other or theirs)}")
        ctx.step("final.desync", "promote", odd, odd_ranks=_ranks(odd), versions=[_describe(a), _describe(b)],
                 ranks={_describe(a): _ranks(a_evs), _describe(b): _ranks(b_evs)})
