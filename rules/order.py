"""What the lines say about time, and what it can decide.

Every event carries the basis of its time (``Ev.quality``, set when its line was read):

=============  ==============================================================  ========
quality        what the line says                                              a point?
=============  ==============================================================  ========
``exact``      a stamp of its own with its year (ISO, slurmstepd's ``AT``)     yes
``no_year``    a stamp of its own whose year was inferred (syslog, glog)       yes
``uptime``     a dmesg uptime placed by the host's boot time                   yes
``order_only`` a dmesg uptime without boot time: orders lines of its file      no
``inherited``  no stamp: a lower bound, the stamped line above it              no
``none``       no time at all                                                  no
=============  ==============================================================  ========

Two events are ordered by their times only where both bases can decide it: two points
(beyond the clock tolerance), or a lower bound that already lies after a point. Otherwise
the FINAL stage decides by what is known causally: line order within one run of a file, the
catalog's relations (explains, same fault, refines), and specificity. Pure functions.

A file is one writer's stream only as far as its stamps run forward: ``cat app.log syslog.log
> all.log`` puts a node's kernel lines below the job's output whatever their times. Where the
stamps of a file's events step back by more than ``SEGMENT_STEP`` the file holds another run
(``file_runs``), and line order says nothing across runs: their times decide.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, TypeVar

from .model import Ev

if TYPE_CHECKING:                       # the context is only read here
    from .final import FinalContext

T = TypeVar("T", str, datetime)            # an ISO-8601 UTC text (they sort as times) or a datetime

POINT = ("exact", "no_year", "uptime")     # stamp qualities that place a line in time
LOWER_BOUND = ("inherited",)               # the line was written at or after this time
# How a time is known, in the diagnosis (root_cause.time_basis, symptoms[].first_basis).
TIME_BASIS = {"exact": "stamped", "no_year": "stamped", "uptime": "uptime", "inherited": "inherited"}
AT_LEAST = "≥"                             # how every surface marks a lower bound
# One writer's stamps do not step back by more than this (a clock step or a slow flush stays within
# it); a larger step back inside one file is where another log was appended to it.
SEGMENT_STEP = timedelta(seconds=120)


def basis_of(quality: str) -> str:
    """A stamp quality as the diagnosis names it: stamped, uptime, inherited, else line_order."""
    return TIME_BASIS.get(quality, "line_order")


def shown_at(first: T | None, basis: str | None, explained: bool, cause_at: T | None) -> T | None:
    """Where a symptom group sits on a timeline of its diagnosis (the JSON's order, the summary, the page).

    A time of its own is a point and stays where it is. A lower bound (``inherited``: the stamped
    line above) says only "at or after"; the group's explains edge says it came after its cause,
    so an explained group whose bound lies before its cause (or that has no time) sits at the
    cause, after it: never before the root it echoes. Unexplained bounds stay at their bound."""
    if not explained or cause_at is None:
        return first
    if first is None or (basis == "inherited" and first < cause_at):
        return cause_at
    return first


def placed(ev: Ev) -> bool:
    """Is the event's time a point (its own stamp), not a bound inherited from the line above?"""
    return ev.corrected_onset is not None and ev.quality in POINT


def file_runs(events: Iterable[Ev]) -> dict[int, int]:
    """id(event) -> which run of its file it lies in, for the events past a file's first run (the
    rest are in run 0): a run ends where the stamps (its own or the inherited one of the line above)
    step back by more than SEGMENT_STEP. An untimed event lies in the run of the events above it."""
    by_path: dict[str, list[Ev]] = defaultdict(list)
    for ev in events:
        if ev.source not in ("scheduler", "metrics"):
            by_path[ev.path].append(ev)
    runs: dict[int, int] = {}
    for evs in by_path.values():
        run, top = 0, None
        evs.sort(key=lambda e: e.line)
        for ev in evs:
            t = ev.stamp if ev.quality in POINT or ev.quality in LOWER_BOUND else None
            if t is not None:
                if top is not None and t < top - SEGMENT_STEP:
                    run, top = run + 1, t
                elif top is None or t > top:
                    top = t
            if run:
                runs[id(ev)] = run
    return runs


def in_file_order(src: Ev, tgt: Ev, runs: dict[int, int]) -> bool | None:
    """Within one run of a file line order is causal order: does ``tgt`` come after ``src``? None
    across files, and across the runs ``runs`` (file_runs) tells apart."""
    if src.path != tgt.path or src.source == "scheduler" or tgt.source == "scheduler":
        return None
    if runs.get(id(src), 0) != runs.get(id(tgt), 0):
        return None
    return tgt.line > src.line


def uptime_gap(src: Ev, tgt: Ev) -> float | None:
    """Seconds from ``src`` to ``tgt`` on one host's dmesg uptime clock (same file), else None."""
    a, b = src.fields.get("uptime_s"), tgt.fields.get("uptime_s")
    if src.path != tgt.path or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return None
    if src.host != tgt.host:                 # two hosts' dmesg in one file: two uptime clocks
        return None
    return float(b) - float(a)


def root_order(ev: Ev) -> tuple:
    """A total order for display and ties: onset (untimed last), strong first, then place."""
    t = ev.corrected_onset
    return (t is None, t.replace(tzinfo=None) if t else datetime.max, ev.strength != "strong",
            ev.host or "", ev.path, ev.line)


def same_clock(a: Ev, b: Ev) -> bool:
    """One file, or one host, has one clock: its points need no tolerance against each other."""
    return (a.path == b.path or bool(a.host and a.host == b.host)) and placed(a) and placed(b)


def precedes(ctx: "FinalContext", a: Ev, b: Ev) -> bool | None:
    """Does ``a`` certainly come before ``b``? True, False (``b`` certainly first) or None (undecided).

    Line order within one run of a file and one dmesg clock decide first; elsewhere two points
    decide beyond the clock tolerance, and a lower bound decides only when it already lies after
    the other event's point. A guessed bound never orders anything."""
    if a.path == b.path and a.line != b.line and not {a.source, b.source} & {"scheduler", "metrics"}:
        gap = uptime_gap(a, b)
        if gap is not None and gap != 0:
            return gap > 0
        order = in_file_order(a, b, ctx.runs())
        if order is not None:
            return order
    ta, tb = ctx.when(a), ctx.when(b)
    if ta is None or tb is None:
        return None
    tol = timedelta(0) if same_clock(a, b) else ctx.tol()
    if placed(a) and placed(b):
        if ta + tol < tb:
            return True
        if tb + tol < ta:
            return False
        return None
    if placed(a) and b.quality in LOWER_BOUND and tb > ta + tol:
        return True                       # b was written after a bound that is already past a
    if placed(b) and a.quality in LOWER_BOUND and ta > tb + tol:
        return False
    return None


def within(ctx: "FinalContext", a: Ev, b: Ev, window_s: float | None) -> bool:
    """Could an occurrence of ``a`` and one of ``b`` be at most ``window_s`` apart, either way round,
    as far as their bases tell?

    A repeated report spans its first to its last occurrence (a hung task reported every two minutes
    for an hour meets the stack frames of its last report). Points are compared (with the clock
    tolerance across hosts); a lower bound contradicts the window only when it already lies past the
    other's point plus the window; no time, no contradiction."""
    if window_s is None:
        return True
    ta, tb = ctx.when(a), ctx.when(b)
    if ta is None or tb is None:
        return True
    span = timedelta(seconds=float(window_s)) + (timedelta(0) if same_clock(a, b) else ctx.tol())
    if placed(a) and placed(b):
        return max(ta, tb) - min(ta + _spread(a), tb + _spread(b)) <= span
    if placed(a) and b.quality in LOWER_BOUND:
        return tb <= ta + span
    if placed(b) and a.quality in LOWER_BOUND:
        return ta <= tb + span
    return True


def _spread(ev: Ev) -> timedelta:
    """From an event's first occurrence to its last (zero for a single line)."""
    if ev.stamp is None or ev.last_stamp is None or ev.last_stamp <= ev.stamp:
        return timedelta(0)
    return ev.last_stamp - ev.stamp


_STRENGTH = {"strong": 0, "weak": 1, "echo": 2}


def first_cause(ctx: "FinalContext", roots: list[Ev]) -> list[Ev]:
    """``roots`` with the one that initiated first: among those no other root certainly precedes,
    the firmest, then the one with a time of its own, then by onset. A guessed or inherited time
    never puts a root ahead of one it cannot be ordered against; the rest follow by onset."""
    ranked = sorted(roots, key=root_order)
    if len(ranked) < 2:
        return ranked
    open_ = [r for r in ranked if not any(o is not r and precedes(ctx, o, r) for o in ranked)] or ranked
    lead = min(open_, key=lambda r: (_STRENGTH.get(r.strength, 3), not placed(r), root_order(r)))
    return [lead] + [r for r in ranked if r is not lead]
