"""A fault that cleared and explains nothing is weak evidence: the catalog's ``clears`` relations.

A report can say that an earlier fault went away: NCCL's "port active" after "port error" on
the same HCA port. Where the clearing report comes after the fault's last report (``window_s``
at most), on the same place (``join``, ``equal``), and the fault explains nothing that failed
(no explains edge leaves it: the explains rules ran first), the fault recovered and nothing in
the lines shows it hurt the run (a finished run prints exactly this): it becomes weak evidence
(strength ``echo``), which alone names its host as a suspect and never drains or excludes a node.
A fault that explains failures (the completion errors and timeouts a flap leaves) stays a cause
however it ended, and one reported again after it cleared is not cleared.

Order decides here, as it does for a cause and its echoes, so both sides need a stated time of
their own on one clock (same host): a line with no stamp, or an inherited one, clears nothing.
"""
from __future__ import annotations

from datetime import timedelta

from .catalog import CLEARS
from .early import holds
from .final import FinalContext, same_place
from .model import Ev
from .order import placed, root_order


def apply_clears(ctx: FinalContext) -> int:
    """Apply the clears relations in priority order; a step per relation that cleared a fault. Returns
    how many faults cleared."""
    count = 0
    for rule in ctx.catalog.explains:
        if rule.relation != CLEARS:
            continue
        # the fault of each report an edge leaves, once a report (a cascade's report leaves thousands)
        explaining = {id(ctx.fault(src)) for src in {id(e.source): e.source for e in ctx.edges}.values()}
        targets = [r for r in sorted(ctx.independent_roots, key=root_order)
                   if r.strength != "echo" and id(ctx.fault(r)) not in explaining and holds(rule.target, r)]
        if not targets:
            continue
        sources = [e for e in ctx.events if holds(rule.source, e)]
        cleared: list[Ev] = []
        for tgt in targets:
            by = next((src for src in sources if src is not tgt and _clears(ctx, rule, src, tgt)), None)
            if by is not None:
                tgt.strength = "echo"
                cleared.append(tgt)
        if cleared:
            count += len(cleared)
            ctx.step(rule.id, "clears", cleared, reason="the fault cleared after its last report: weak evidence")
    return count


def _clears(ctx: FinalContext, rule, src: Ev, tgt: Ev) -> bool:
    """``src`` reports, on ``tgt``'s host, after ``tgt``'s last report and within the window, that it cleared."""
    if src.host is None or src.host != tgt.host or not same_place(ctx, rule, src, tgt):
        return False
    if not (placed(src) and placed(tgt)):
        return False
    last_fault = tgt.last_stamp or tgt.stamp
    last_clear = src.last_stamp or src.stamp
    if last_fault is None or last_clear is None or last_clear <= last_fault:
        return False
    return rule.window_s is None or last_clear - last_fault <= timedelta(seconds=float(rule.window_s))
