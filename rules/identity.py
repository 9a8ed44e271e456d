"""One fault, one cause: reports of one physical fault become one candidate.

The catalog's identity relations (``same_fault`` and ``refines`` in ``catalog/final/*.yaml``)
say which reports are one fault: the driver's Xid and CUDA's error string for it on the same
host (``same_fault``), or a finer decode of the same family (``refines``: an NVLink5 link-down
decoded as signal integrity refines a plain NVLink error). Where they hold, the target report
is folded into the source's candidate: it stays evidence, it still explains what it caused
(for its fault), and it never competes as a second cause. Order decides nothing here: two
reports of one fault are one fault whichever clock put one before the other, so the join is
on place (and the declared window either side, as far as the times' bases can tell).
"""
from __future__ import annotations

from .catalog import IDENTITY
from .final import Edge, FinalContext, TargetPool, reporter_only, same_place
from .model import Ev
from .order import root_order, within


def fold_identities(ctx: FinalContext) -> None:
    """Apply the identity relations in priority order; record a step per relation that folded."""
    roots = sorted(ctx.roots, key=root_order)
    for rule in ctx.catalog.explains:
        if rule.relation not in IDENTITY:
            continue
        # The roots each side's condition holds for, in order: a pool a relation, as folding changes hosts.
        pool = TargetPool(roots)
        sources = pool.matching(rule.source)
        if not sources:
            continue
        targets = pool.matching(rule.target)
        # A report that names no host (a pasted dmesg, an unlabelled console line) is the other side's
        # only when every report on that side names one and the same host: nowhere else it could be.
        # The fault then has that host (the driver's line names the GPU, the app's line the host).
        # A host that is only the rank's block-placement guess counts as unknown here.
        src_host, tgt_host = _lone_host(sources), _lone_host(targets)
        folded: list[Ev] = []
        placed_by: dict[str, str] = {}
        for tgt in targets:
            if id(tgt) in ctx.explained_by:
                continue
            for src in sources:
                if src is tgt or ctx.fault(src) is tgt or ctx.fault(src) is ctx.fault(tgt):
                    continue
                unplaced = (_known_host(tgt) is None and src_host is not None) or \
                           (_known_host(src) is None and tgt_host is not None)
                below = LINES_BELOW.get(rule.join)
                if below is not None:
                    if not _below(tgt, src, below):
                        continue
                elif not same_place(ctx, rule, src, tgt, unplaced=unplaced):
                    continue
                if not within(ctx, src, tgt, rule.window_s):
                    continue
                for side, other in ((src, tgt), (tgt, src)):
                    if _known_host(side) is None and _known_host(other) is not None:
                        if side.host != other.host:     # the fault's host, from the report that names it
                            side.host = other.host
                            placed_by[f"{side.path}:{side.line}"] = f"{other.path}:{other.line}"
                        side.fields.pop("host_basis", None)     # no longer a guess
                ctx.fault_of[id(tgt)] = src
                ctx.explained_by[id(tgt)] = src
                ctx.edges.append(Edge(rule.id, rule.relation, src, tgt))
                folded.append(tgt)
                break
        if folded:
            extra = {"host_from_same_fault": placed_by} if placed_by else {}
            ctx.step(rule.id, rule.relation, folded, into=sorted({f"{ctx.fault(t).kind}:{ctx.fault(t).sub_domain}"
                                                                  for t in folded}), **extra)


# The joins on a file's lines, and how far below the exception its report may start. message_below: Python
# prints "<Type>: <message>", and a message that starts with a newline leaves the type alone on its line with
# the text below it (a blank line between is the message's own). content_below: a wrapper's exception says
# another error follows ("Operator conv2d raises an ... exception. The exception content is ...") and prints
# that error's words a few lines down: PaddlePaddle puts two lines of its own and a blank one between, and a
# progress bar redrawn between every two of them (a tqdm loop's output) doubles that.
LINES_BELOW = {"message_below": 2, "content_below": 12}


def _below(exc: Ev, report: Ev, lines: int) -> bool:
    """``report`` is ``exc``'s own message or wrapped error: on one of the ``lines`` lines below it in its file."""
    return report.path == exc.path and 1 <= report.line - exc.line <= lines


def _known_host(ev: Ev) -> str | None:
    """The host a line names (or its file or the job's one node), not the rank-placement guess nor the
    node that only reported it (host_basis "reporter": a cancellation banner's printing node)."""
    return None if ev.fields.get("host_basis") == "rank_placement" or reporter_only(ev) else ev.host


def _lone_host(reports: list[Ev]) -> str | None:
    """The one host every report that names a host names, when there is exactly one."""
    hosts = {h for r in reports if (h := _known_host(r))}
    return next(iter(hosts)) if len(hosts) == 1 else None
