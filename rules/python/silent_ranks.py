"""FINAL rule: ranks whose logs are present but that printed nothing about the collective everyone
else timed out on are suspects (issue 20 item 6).

When a collective hangs, every rank that reached it waits and its watchdog reports the timeout.
A rank that never reached it (hung in a data loader, a dead GPU, a stuck kernel) often prints
nothing more at all: the other ranks' reports are the only trace, and it is the absent one that
the story is about. The rule needs the world size from the lines or the record (never a guess),
and it blames only ranks whose earlier lines are in the bundle: a rank that printed no line at
all may simply have had its log left out, which is missing evidence (``final.missing``), not a
sign of a fault.
"""
from __future__ import annotations

from collections import Counter, defaultdict

from ..final import FinalContext
from ..model import Ev
from . import final_rule

# Lines that report a failed collective and name its sequence number.
TIMEOUT_KINDS = ("watchdog_timeout", "watchdog_status", "watchdog_exception", "comm_aborted")
# Anything the ProcessGroupNCCL watchdog prints about a failed collective: a rank that printed one
# of these is not silent, whatever it said (a rank that is behind is final.straggler's).
WATCHDOG_KINDS = TIMEOUT_KINDS + ("dump_signal", "pg_teardown", "heartbeat_timeout")

_LAUNCHER = "elastic."           # torchrun's lines (its failure summary names ranks it did not print for)

_WL = {"workload_id": "ex", "state": "FAILED", "start_time": "2026-11-02T09:58:00Z",
       "end_time": "2026-11-02T10:21:14Z", "nodes": ["node-01", "node-02"], "gpus_per_node": 8}
# The formats of nccl.init_complete's and torch.watchdog_timeout's examples, with srun's --label prefix.
_INIT = ("{r}: {host}:47{r:02d}:48{r:02d} [{d}] NCCL INFO comm 0x9f2ef80 rank {r} nranks 16 cudaDev {d} "
         "nvmlDev {d} busId {d}b000 commId 0x5ae77eb5ea4ec1ee - Init COMPLETE")
_WD = ("{r}: [rank{r}]:[E1102 10:13:12.044871 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective "
       "operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) "
       "ran for 600054 milliseconds before timing out.")
# torch.store_socket_retry's format: a benign startup line (context) that shows rank 11 was logging.
_RETRY = ("11: [W1102 09:58:40.149509694 socket.cpp:752] [c10d] The client socket has failed to connect to "
          "[node-01]:29500 (errno: 111 - Connection refused).")
_XID79 = ("Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, "
          "GPU has fallen off the bus.")


def _host_log(host: str, ranks: range, silent: tuple[int, ...] = (), init: bool = True) -> str:
    lines = [_INIT.format(r=r, host=host, d=r % 8) for r in ranks] if init else []
    lines += [_WD.format(r=r) for r in ranks if r not in silent]
    return "\n".join(lines) + "\n"


def _ex(files: dict[str, str], **workload) -> dict:
    return {"workload": {**_WL, **workload}, "files": files}


_SILENT_11 = {"logs/app/node-01.log": _host_log("node-01", range(0, 8)),
              "logs/app/node-02.log": _host_log("node-02", range(8, 16), silent=(11,))}


@final_rule(
    id="final.silent_ranks", priority=395, title="Ranks that printed nothing about the hung collective",
    description="When the world size is known (NCCL's 'Init COMPLETE' lines say nranks; else the record's nodes x "
                "gpus_per_node) and most ranks report a watchdog timeout or failure on one collective (SeqNum), the "
                "minority of ranks that printed nothing at all about it, although other lines of theirs are in the "
                "bundle (an NCCL init line, any line with their rank), never reached it: their hosts are suspects. "
                "A rank with no line at all is not blamed (its log may not have been collected). Only when the "
                "diagnosis is unattributed. Source: pytorch/pytorch ProcessGroupNCCL.cpp (WorkNCCL::checkTimeout: every rank "
                "that enqueued the collective reports it); the line formats of torch.watchdog_timeout and "
                "nccl.init_complete.",
    examples={"fires": [_ex(_SILENT_11)],
              "quiet": [_ex({"logs/app/node-01.log": _host_log("node-01", range(0, 8)),
                             "logs/app/node-02.log": _host_log("node-02", range(8, 16))}),
                        # rank 11 was logging, but the world size is known from nowhere (no NCCL init
                        # line, no gpus_per_node)
                        _ex({"logs/app/node-01.log": _host_log("node-01", range(0, 8), init=False),
                             "logs/app/node-02.log": _RETRY + "\n" + _host_log("node-02", range(8, 16), silent=(11,),
                                                                                init=False)},
                            gpus_per_node=None),
                        # an attributed cause stands
                        _ex({**_SILENT_11, "logs/syslog/node-02.log": _XID79})]},
)
def silent_ranks(ctx: FinalContext) -> None:
    # Only when no cause is proven: an attributed cause stands, and an ambiguous diagnosis names its
    # candidates' nodes already (the silent ranks may favour one of them: not decided here).
    if ctx.status != "unattributed":
        return
    world, world_basis = world_size(ctx)
    if not world:
        return
    watchdog = [e for e in ctx.events if e.kind in WATCHDOG_KINDS and id(e) not in ctx.excluded]
    with_seq = [e for e in watchdog if e.kind in TIMEOUT_KINDS and isinstance(e.fields.get("seq"), int)]
    if not with_seq:
        return
    # The collective most ranks report (as final.straggler reads it).
    weight: Counter = Counter()
    for ev in with_seq:
        weight[ev.fields["seq"]] += max(len(ev.ranks), 1)
    seq = max(weight.items(), key=lambda kv: (kv[1], kv[0]))[0]
    on_seq = [e for e in with_seq if e.fields["seq"] == seq]
    timed_out = set().union(*(e.ranks for e in on_seq))
    reported = set().union(*(e.ranks for e in watchdog))
    if any(r >= world for r in reported):
        return                                  # a rank beyond the world: the world size is wrong
    unknown_hosts = _rankless_hosts(watchdog)
    if None in unknown_hosts:
        return
    quiet = sorted(set(range(world)) - reported)
    # A minority stays quiet while a majority timed out on this collective: otherwise the quiet
    # ranks are the logs that were not collected (or the job was torn down), not a straggler.
    if not quiet or len(quiet) * 2 >= world or len(timed_out) * 2 <= world:
        return
    own = _lines_of(ctx, world)
    hosts = _hosts_of(ctx, world)
    silent = [r for r in quiet if own.get(r) and hosts.get(r, (None,))[0] not in unknown_hosts]
    unseen = [r for r in quiet if not own.get(r)]
    uncertain = [r for r in quiet if own.get(r) and r not in silent]
    if not silent:
        return
    where = {r: hosts[r] for r in silent if r in hosts}
    suspects = sorted({h for h, _ in where.values()})
    ctx.suspects.update(suspects)
    op = next((e.fields.get("op") for e in on_seq if isinstance(e.fields.get("op"), str)), None)
    detail = {
        "silent_ranks": silent, "hosts": suspects,
        "rank_hosts": {str(r): h for r, (h, _) in sorted(where.items())},
        "host_basis": {str(r): how for r, (_, how) in sorted(where.items())},
        "collective": seq, "op": op, "timed_out": len(timed_out), "world_size": world, "world_basis": world_basis,
        "evidence": "log present, silent about the collective: other lines of these ranks are in the bundle "
                    "but none about the collective the others timed out on",
    }
    if unseen:
        detail["no_lines"] = unseen
        detail["no_lines_note"] = ("no line at all of these ranks is in the bundle: their logs may not have been "
                                   "collected, so their silence is not evidence (not suspects)")
    if uncertain:
        detail["uncertain"] = uncertain
        detail["uncertain_note"] = ("their host has more watchdog lines naming no rank than ranks that reported: "
                                    "one may be theirs (not suspects)")
    lines = list({id(e): e for r in silent for e in own[r]}.values())     # each line once
    ctx.step("final.silent_ranks", "suspect", lines, **detail)


def _rankless_hosts(watchdog: list[Ev]) -> set[str | None]:
    """Hosts where a watchdog line that names no rank may be a quiet rank's own report.

    A C++ ``what():`` line quotes the timeout without srun's or PyTorch's rank prefix. Each rank that
    reported prints about one such copy, so on a host the copies of one line are counted against the
    ranks there that reported with their rank named; a copy more than those may be a quiet rank's.
    Lines placed on no host are counted against every reporting rank (None: they may be anyone's).
    """
    known: dict[str | None, set[int]] = defaultdict(set)
    for ev in watchdog:
        known[ev.host] |= ev.ranks
        known[None] |= ev.ranks
    out: set[str | None] = set()
    for ev in watchdog:
        extra = ev.count - len(ev.ranks)      # the lines of this signature that named no rank (or repeats)
        if extra > 0 and extra > len(known[ev.host]):
            out.add(ev.host)
    return out


def world_size(ctx: FinalContext) -> tuple[int | None, str | None]:
    """The number of ranks, from what the lines say (NCCL's nranks), else the workload record.

    The largest communicator NCCL reports is the world's (tensor and pipeline groups are smaller),
    unless a line names a rank beyond it (only sub-communicators' init lines were logged): then the
    record's nodes x gpus_per_node, if it covers every rank the lines name. Never a guess.
    """
    highest = max((r for e in ctx.events if e.source != "scheduler" for r in e.ranks), default=-1)
    nranks = [e.fields["nranks"] for e in ctx.events
              if e.kind == "nccl_init" and isinstance(e.fields.get("nranks"), int) and e.fields["nranks"] > 0]
    if nranks and max(nranks) > highest:
        return max(nranks), "NCCL Init COMPLETE nranks"
    wl = ctx.workload
    if wl.gpus_per_node and wl.nodes and len(wl.nodes) * wl.gpus_per_node > highest:
        return len(wl.nodes) * wl.gpus_per_node, "workload record (nodes x gpus_per_node)"
    return None, None


def _world_rank(ev: Ev, world: int) -> int | None:
    """The global rank an NCCL init line states: its comm rank, when the comm is the world's."""
    rank = ev.fields.get("rank")
    if ev.kind == "nccl_init" and ev.fields.get("nranks") == world and isinstance(rank, int):
        return rank
    return None


def _lines_of(ctx: FinalContext, world: int) -> dict[int, list[Ev]]:
    """Each rank's own lines in the evidence (the ranks a line carries, an NCCL world-comm init line)."""
    out: dict[int, list[Ev]] = defaultdict(list)
    for ev in ctx.events:
        if ev.source == "scheduler" or ev.pattern.startswith(_LAUNCHER):
            continue                    # the launcher's report about a rank is not the rank's own line
        ranks = set(ev.ranks)
        r = _world_rank(ev, world)
        if r is not None:
            ranks.add(r)
        for rank in ranks:
            out[rank].append(ev)
    return out


def _hosts_of(ctx: FinalContext, world: int) -> dict[int, tuple[str, str]]:
    """Rank -> (host, how it is known): NCCL's init line, else the rank's own lines, else the record."""
    out: dict[int, tuple[str, str]] = {}
    for ev in ctx.events:
        r = _world_rank(ev, world)
        if r is not None and ev.host and ev.host.strip():
            out.setdefault(r, (ev.host, "NCCL Init COMPLETE line"))
    seen: dict[int, set[str]] = defaultdict(set)
    for ev in ctx.events:
        if ev.source != "scheduler" and ev.host and not ev.pattern.startswith(_LAUNCHER):
            for r in ev.ranks:
                seen[r].add(ev.host)
    for r, hs in seen.items():
        if r not in out and len(hs) == 1:
            out[r] = (next(iter(hs)), "the rank's own lines")
    wl = ctx.workload
    for r in range(world):
        if r not in out:
            h = wl.host_of_rank(r)
            if h:
                how = "workload rank map" if r in wl.ranks else "workload block placement (nodes x gpus_per_node)"
                out[r] = (h, how)
    return out
