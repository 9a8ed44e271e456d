"""FINAL stage: the workload's events together -> one decision.

``FinalContext`` is the working state the FINAL rules read and write; the rules
themselves are registered Python functions (``rules/python``) and declarative
explains rules (``rules/catalog/final``). Pure apart from the context object.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import compress
from datetime import datetime, timedelta
from typing import Any

from firstfault.schemas import WorkloadRecord

from .catalog import Catalog, Condition, ExplainsRule, Matcher
from .early import holds, reader, value_of
from .model import Ev
from .order import file_runs, in_file_order, placed, precedes, root_order, same_clock, uptime_gap

__all__ = ["Edge", "FinalContext", "TargetPool", "coverage", "joins", "placed", "reachable", "root_order", "run_explains"]

DEFAULT_SETTINGS: dict[str, Any] = {
    "clock_tolerance_s": 10.0,        # host clocks may disagree this much when nothing measures it
    "hang_slack_s": 60.0,             # a hang may begin this long before the fault that explains it
    "default_timeout_ms": 600000,     # PyTorch's NCCL process-group default, when no line states one
    "min_coverage": 0.5,              # a root must explain at least this share of symptom lines
    "ambiguity_margin": 0.1,          # roots within this coverage of the best one also fit
    "window_slack_s": 300.0,          # a root may precede the workload's start by this much
    "end_slack_s": 10.0,              # ... and follow its end only by this much (host clocks disagree)
    "inherited_slack_s": 60.0,        # a line with an inherited stamp may have been written this much later
    "max_refs": 10,
}


@dataclass
class Edge:
    """A FINAL rule's edge: its source event explains its target."""

    rule_id: str
    join: str
    source: Ev
    target: Ev


@dataclass
class Step:
    """One step of the evidence chain: a rule, what it did and the events it touched."""

    rule_id: str
    action: str
    events: list[Ev] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class FinalContext:
    """What the FINAL rules read and write: the workload, the catalog and the events."""

    workload: WorkloadRecord
    catalog: Catalog
    events: list[Ev]
    settings: dict[str, Any]
    offsets: dict[str, float] = field(default_factory=dict)     # host -> seconds its clock runs ahead
    clock_bound_s: float | None = None
    edges: list[Edge] = field(default_factory=list)
    explained_by: dict[int, Ev] = field(default_factory=dict)  # id(root) -> the root that explains it
    excluded: set[int] = field(default_factory=set)
    steps: list[Step] = field(default_factory=list)
    # the decision
    status: str | None = None
    chosen: list[Ev] = field(default_factory=list)
    candidates: list[dict[str, Any]] = field(default_factory=list)
    coverage: float = 0.0
    suspects: set[str] = field(default_factory=set)
    missing: list[dict[str, Any]] = field(default_factory=list)
    recovery: dict[str, Any] | None = None
    coverage_of: dict[int, float] = field(default_factory=dict)
    fault_of: dict[int, Ev] = field(default_factory=dict)      # id(report) -> the report it was folded into
    _workload_timeout: float | None = None
    _children: tuple[int, dict[int, list[Ev]]] | None = None    # (edges seen, id(source) -> targets)
    _tol: tuple[tuple, timedelta] | None = None                 # (what it was worked out from, the tolerance)
    _shift: dict[tuple[str, float], timedelta] = field(default_factory=dict)    # (host, offset) -> timedelta
    _runs: tuple[int, dict[int, int]] | None = None              # (events seen, order.file_runs of them)
    _reached: tuple[int, dict[int, tuple[Ev, list[Ev]]]] | None = None     # (edges seen, id(root) -> reachable)

    def runs(self) -> dict[int, int]:
        """id(event) -> the run of its file it lies in (order.file_runs), worked out again only
        when the events changed in number."""
        if self._runs is None or self._runs[0] != len(self.events):
            self._runs = (len(self.events), file_runs(self.events))
        return self._runs[1]

    def children(self) -> dict[int, list[Ev]]:
        """id(source) -> the events it explains. Edges are only ever appended: the map is extended
        with the new ones, not rebuilt for every root a FINAL rule asks about."""
        seen, by_source = self._children or (0, defaultdict(list))
        for e in self.edges[seen:]:
            by_source[id(e.source)].append(e.target)
        self._children = (len(self.edges), by_source)
        return by_source

    # ------------------------------------------------------------ views
    def by_role(self, role: str) -> list[Ev]:
        excluded = self.excluded
        return [e for e in self.events if e.role == role and id(e) not in excluded]

    @property
    def roots(self) -> list[Ev]:
        return self.by_role("root")

    @property
    def independent_roots(self) -> list[Ev]:
        return [e for e in self.roots if id(e) not in self.explained_by]

    @property
    def symptoms(self) -> list[Ev]:
        return self.by_role("symptom")

    def fault(self, ev: Ev) -> Ev:
        """The report that stands for ``ev``'s fault: itself unless folded into another (same fault, refines)."""
        seen = 0
        while id(ev) in self.fault_of and seen < len(self.fault_of):
            ev = self.fault_of[id(ev)]
            seen += 1
        return ev

    def step(self, rule_id: str, action: str, events: list[Ev] | None = None, **detail: Any) -> None:
        self.steps.append(Step(rule_id, action, list(events or []), detail))

    def tol(self) -> timedelta:
        # Asked for every pair the explains rules try: worked out again only when what it reads changed.
        key = (self.clock_bound_s, self.settings["clock_tolerance_s"])
        if self._tol is None or self._tol[0] != key:
            bound = self.clock_bound_s if self.clock_bound_s is not None else 0.0
            self._tol = (key, timedelta(seconds=max(float(self.settings["clock_tolerance_s"]), bound)))
        return self._tol[1]

    def when(self, ev: Ev) -> datetime | None:
        """Corrected onset (what the line reports began), else corrected stamp."""
        return ev.corrected_onset

    def seen(self, ev: Ev) -> datetime | None:
        """Corrected time the line was written."""
        if ev.stamp is None:
            return None
        host = ev.host or ""
        offset = self.offsets.get(host, 0.0)
        shift = self._shift.get((host, offset))
        if shift is None:
            if len(self._shift) >= 4096:
                self._shift.clear()
            shift = self._shift[(host, offset)] = timedelta(seconds=offset)
        return ev.stamp - shift

    def timeout_ms(self, ev: Ev) -> float:
        """The event's stated timeout, else the longest one the workload's lines state, else the default.

        A stated timeout past a year places no hang in time (PyTorch users set 10^14 ms to mean
        'never'): it is not used, so the arithmetic stays within datetime's range."""
        value = ev.fields.get("timeout_ms")
        if _usable_timeout(value):
            return float(value)
        if self._workload_timeout is None:
            stated = [v for v in (e.fields.get("timeout_ms") for e in self.events) if v is not None]
            seen = [v for v in stated if _usable_timeout(v)]
            self._workload_timeout = float(max(seen)) if seen else float(self.settings["default_timeout_ms"])
        return self._workload_timeout


MAX_TIMEOUT_MS = 366 * 86400 * 1000


def _usable_timeout(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= MAX_TIMEOUT_MS


def reporter_only(ev: Ev) -> bool:
    """The report's host is the node that printed it about another (slurmstepd's cancellation banner
    on a surviving node), not the node it is about: it names nothing to blame, drain or exclude."""
    return ev.fields.get("host_basis") == "reporter"


# ---------------------------------------------------------------- explains engine

def _same_place(ctx: FinalContext, src: Ev, tgt: Ev) -> bool:
    # Lines that name no host are on the one node of a one-node job (or the one unnamed node).
    return src.host == tgt.host and (bool(src.host) or len(ctx.workload.nodes) <= 1)


def same_place(ctx: FinalContext, rule: ExplainsRule, src: Ev, tgt: Ev, unplaced: bool = False) -> bool:
    """The rule's ``equal`` keys and, for same_host / same_gpu, the place. ``unplaced``: one side's host
    is unknown (or only a guess) and the caller has made sure the other side's is the only one it could
    be: the hosts are not compared."""
    for key in rule.equal:
        have = value_of(src, key)
        if have is None or have != value_of(tgt, key):
            return False
    if rule.join not in ("same_host", "same_gpu"):
        return True
    if not _same_place(ctx, src, tgt) and not unplaced:
        return False
    if rule.join == "same_gpu" and src.pci and tgt.pci and src.pci != tgt.pci:
        return False
    # Metrics name a GPU by its NVML index; other events' index is the CUDA device (from
    # NCCL's init line), which CUDA_VISIBLE_DEVICES may renumber: compare within metrics only.
    if rule.join == "same_gpu" and src.source == tgt.source == "metrics" and src.gpu_index is not None \
            and tgt.gpu_index is not None and src.gpu_index != tgt.gpu_index:
        return False
    return True


_NO_TOLERANCE = timedelta(0)
_UNKNOWN = object()


def joins(ctx: FinalContext, rule: ExplainsRule, src: Ev, tgt: Ev) -> bool:
    """Does ``src`` explain ``tgt`` under the rule's join and window?"""
    return _Join(ctx, rule, src)(tgt)


class _Join:
    """``joins`` from one source under one rule, for the many targets ``run_explains`` tries: what the
    rule and the source alone decide (the source's onset, whether it is placed, the rule's window) is
    read once, not once a target. ``hangs`` (id(target) -> hang_onset) is shared by the sources of a
    run, as a watchdog line's hang began where it began whichever fault is tried against it."""

    def __init__(self, ctx: FinalContext, rule: ExplainsRule, src: Ev, hangs: dict[int, datetime | None] | None = None):
        self.ctx, self.rule, self.src = ctx, rule, src
        self.s_on = ctx.when(src)
        self.placed = placed(src)
        # same_place has nothing to check for a rule without equal keys that does not join on place
        self.place = bool(rule.equal) or rule.join in ("same_host", "same_gpu")
        self.before = _seconds(rule.before_s)
        self.tol = ctx.tol()                  # across clocks; nothing a join reads moves it
        self.hangs = {} if hangs is None else hangs

    def __call__(self, tgt: Ev) -> bool:
        ctx, rule, src, s_on, join = self.ctx, self.rule, self.src, self.s_on, self.rule.join
        if self.place and not same_place(ctx, rule, src, tgt):
            return False
        if join == "after_onset" and _distinct_cause(src, tgt):
            # A distinct firm cause is demoted when the times (or line order) say it came later, or,
            # where they cannot tell, when the rule knows the direction (a GPU loss takes its peers'
            # links down, never the reverse). A rule that would read the pair either way round knows
            # no direction: then a guessed order is no order, and both stay candidates.
            first = precedes(ctx, src, tgt)
            if first is False or (first is None and holds(rule.source, tgt) and holds(rule.target, src)):
                return False
        if join in ("after_onset", "within_timeout_window") and not (self.placed and tgt.stamp is not None):
            return _unclocked_follows(ctx, rule, src, tgt)
        if join == "within_timeout_window":
            # The hang began when the collective was enqueued: the line's stamp minus how long it
            # ran (or minus the timeout when the line does not say). A fault causes the hang if it
            # happened within about one training step of that moment, either side: the waiting
            # ranks got there first, or the failing rank died before they arrived.
            began = self._hang_onset(tgt)
            if s_on is None or began is None:
                return False
            slack = _seconds(float(ctx.settings["hang_slack_s"])) + self._tolerance(tgt)
            return abs(s_on - began) <= slack
        t_on = ctx.when(tgt)
        if t_on is None:
            t_on = ctx.seen(tgt)
        if s_on is None or t_on is None:
            # Untimed events join on place; a window is checked on the file's own clock (dmesg uptime)
            # or, lacking one, on line order (within one file, line order is causal order).
            if join not in ("same_host", "same_gpu", "same_workload"):
                return False
            if rule.window_s is None:
                return True
            gap = uptime_gap(src, tgt)
            if gap is not None:
                return -float(rule.before_s) <= gap <= float(rule.window_s)
            order = _line_order(ctx, src, tgt)
            return bool(order) if rule.before_s == 0 else order is not None
        if join == "after_onset" and s_on == t_on:
            order = _line_order(ctx, src, tgt)
            if order is not None:
                return order                  # the same second in one run of a file: line order decides
        tol = self._tolerance(tgt)
        before = self.before
        if tgt.quality == "inherited":
            # An inherited stamp is only a lower bound (the last stamped line above it).
            before += _seconds(float(ctx.settings["inherited_slack_s"]))
        if t_on < s_on - tol - before:
            return False
        if rule.window_s is not None and t_on - s_on > _seconds(float(rule.window_s)) + tol:
            return False
        return True

    def _tolerance(self, tgt: Ev) -> timedelta:
        """How far the two lines' clocks may disagree: one host (one file) has one clock, its lines
        need no tolerance against each other."""
        return _NO_TOLERANCE if same_clock(self.src, tgt) else self.tol

    def _hang_onset(self, tgt: Ev) -> datetime | None:
        began = self.hangs.get(id(tgt), _UNKNOWN)
        if began is _UNKNOWN:
            began = self.hangs[id(tgt)] = hang_onset(self.ctx, tgt)
        return began


def hang_onset(ctx: FinalContext, report: Ev) -> datetime | None:
    """When the hang a watchdog line reports began: the collective's start the line states (its
    corrected onset), else the line's time minus the stated (or longest known) timeout."""
    seen = ctx.seen(report)
    if seen is None:
        return None
    if report.onset is not None and report.onset != report.stamp and report.corrected_onset is not None:
        return report.corrected_onset
    try:
        return seen - timedelta(milliseconds=ctx.timeout_ms(report))
    except OverflowError:                   # a stamp near year 1: no hang before it to place
        return None


def _line_order(ctx: FinalContext, src: Ev, tgt: Ev) -> bool | None:
    """``in_file_order`` of the two lines, the file runs (``ctx.runs``: every file's lines sorted)
    worked out only when two lines of one file are compared."""
    return in_file_order(src, tgt, ctx.runs()) if src.path == tgt.path else None


@lru_cache(maxsize=256)
def _seconds(value: float) -> timedelta:
    """timedelta(seconds=value) for the few settings and rule windows a join reads, made once each."""
    return timedelta(seconds=value)


def _distinct_cause(src: Ev, tgt: Ev) -> bool:
    """Is ``tgt`` a firm root of another sub_domain than ``src``: a cause of its own, not an echo?"""
    return tgt.role == "root" and tgt.strength == "strong" and tgt.sub_domain != src.sub_domain


def _unclocked_follows(ctx: FinalContext, rule: ExplainsRule, src: Ev, tgt: Ev) -> bool:
    """Order joins when a clock cannot decide: the source or the target has no time of its own.

    Within one file, line order decides. Across files an unstamped line lies somewhere after
    the stamped line above it (its inherited stamp is a lower bound): the join holds unless
    the stamps that exist contradict it (the source's lower bound is after the target).
    """
    gap = uptime_gap(src, tgt)
    if gap is not None:
        return gap >= 0 and (rule.window_s is None or rule.join != "after_onset" or gap <= float(rule.window_s))
    order = _line_order(ctx, src, tgt)
    if order is not None:
        return order
    s_low = ctx.when(src)
    t_time = ctx.seen(tgt) if placed(tgt) else None
    if s_low is not None and t_time is not None and s_low > t_time + ctx.tol():
        return False
    if rule.join == "within_timeout_window" and s_low is not None and placed(tgt):
        # Its lower bound after the hang began (past the slack): it came during the hang, not before it.
        began = hang_onset(ctx, tgt)
        if began is not None and s_low - began > _seconds(float(ctx.settings["hang_slack_s"])) + ctx.tol():
            return False
    return True


def run_explains(ctx: FinalContext) -> None:
    """Apply the declarative explains rules in priority order; record edges, demote explained roots.

    A report folded into another as the same fault (``ctx.fault_of``) still explains what it
    caused, for its fault: its edges are reached from the fault's representative."""
    order = sorted(ctx.roots, key=root_order)
    pool = TargetPool([t for t in ctx.events if id(t) not in ctx.excluded and t.role in ("root", "symptom", "marker")])
    explained_by, fault_of = ctx.explained_by, ctx.fault_of
    hangs: dict[int, datetime | None] = {}        # nothing here moves a clock or a timeout: one hang onset a target
    for rule in ctx.catalog.explains:
        if rule.relation != "explains":
            continue
        fired: list[Ev] = []
        demoted: list[Ev] = []
        targets = pool.matching(rule.target)
        if not targets:
            continue
        for src in order:
            if (id(src) in explained_by and id(src) not in fault_of) or not holds(rule.source, src):
                continue
            fault = ctx.fault(src)
            join = _Join(ctx, rule, src, hangs)
            for tgt in targets:
                if tgt is src or id(tgt) in explained_by:
                    continue
                if (ctx.fault(tgt) if id(tgt) in fault_of else tgt) is fault:   # only a folded report is another's
                    continue
                if not join(tgt):
                    continue
                ctx.edges.append(Edge(rule.id, rule.join, src, tgt))
                fired.append(tgt)
                if tgt.role == "root":
                    ctx.explained_by[id(tgt)] = src
                    demoted.append(tgt)
        if fired:
            ctx.step(rule.id, "explain", fired, demoted=len(demoted))


class TargetPool:
    """Events and the condition terms' verdicts on them: ``matching(cond)`` is the events ``holds`` for,
    in order, for as long as nothing changes what the terms read (the pool of ``run_explains``: nothing
    there changes an event's role or exclusion).

    Conditions share their first terms (``role: root``, ``kind: xid``), so a first term's verdict is
    worked out once a pool, its matcher tested once per distinct value of its key (an event kind, a
    role), not once per event and rule. The terms after it are read only on the events the terms
    before them kept: a first term leaves a few events of thousands, and grouping the whole pool by
    every key a rule names cost more than the rules' joins.
    """

    def __init__(self, events: list[Ev]) -> None:
        self.events = events
        self._typed: dict[str, list[tuple[type, Any]]] = {}
        self._verdicts: dict[Any, set[int]] = {}
        self._tests: dict[Matcher, dict[tuple[type, Any], bool]] = {}

    def _values(self, key: str) -> list[tuple[type, Any]]:
        """Each event's value of ``key`` with its type (1, 1.0 and True are equal keys, not equal strings)."""
        found = self._typed.get(key)
        if found is None:
            values = list(map(reader(key), self.events))
            found = self._typed[key] = list(zip(map(type, values), values))
        return found

    def _verdict(self, key: str, matcher: Matcher) -> set[int]:
        """The positions of the events whose ``key`` the matcher accepts: one test per distinct value,
        the events sorted into those values at C speed."""
        try:
            have = self._verdicts.get((key, matcher))
        except TypeError:                   # a matcher whose argument cannot be hashed
            have = None
        if have is not None:
            return have
        typed = self._values(key)
        try:
            accepted = {value for value in dict.fromkeys(typed) if matcher.test(value[1])}
            have = set(compress(range(len(typed)), map(accepted.__contains__, typed)))
        except TypeError:                   # a list in fields: each event tested
            have = {i for i, (_, value) in enumerate(typed) if matcher.test(value)}
        try:
            self._verdicts[(key, matcher)] = have
        except TypeError:
            pass
        return have

    def _narrow(self, keep: set[int], key: str, matcher: Matcher) -> set[int]:
        """The positions in ``keep`` whose ``key`` the matcher accepts, each distinct value tested once."""
        try:
            known = self._tests.setdefault(matcher, {})
        except TypeError:                   # a matcher whose argument cannot be hashed
            known = {}
        get, events, out = reader(key), self.events, set()
        for i in keep:
            value = get(events[i])
            try:
                ok = known.get((type(value), value))
                if ok is None:
                    ok = known[(type(value), value)] = matcher.test(value)
            except TypeError:               # a list in fields
                ok = matcher.test(value)
            if ok:
                out.add(i)
        return out

    def matching(self, cond: Condition) -> list[Ev]:
        if not cond.terms:
            return list(self.events)
        keep = self._verdict(*cond.terms[0])
        for key, matcher in cond.terms[1:]:
            if not keep:
                break
            keep = self._narrow(keep, key, matcher)
        return [self.events[i] for i in sorted(keep)]


def reachable(ctx: FinalContext, root: Ev) -> list[Ev]:
    """Every event explained by ``root``, directly or through roots it explains.

    The choice, the symptoms and the explains list ask it for the same roots once the edges are drawn:
    it is worked out again only when edges were added (the FINAL rules settle roles before the
    explains rules draw edges)."""
    edges, memo = ctx._reached or (-1, {})
    if edges != len(ctx.edges):
        memo = {}
        ctx._reached = (len(ctx.edges), memo)
    known = memo.get(id(root))
    if known is None or known[0] is not root:
        known = memo[id(root)] = (root, _reach(ctx, root))
    return list(known[1])


def _reach(ctx: FinalContext, root: Ev) -> list[Ev]:
    children = ctx.children()
    out: list[Ev] = []
    seen = {id(root)}
    stack = [root]
    while stack:
        cur = stack.pop()
        for t in children.get(id(cur), []):
            if id(t) in seen:
                continue
            seen.add(id(t))
            out.append(t)
            if t.role == "root":
                stack.append(t)
    return out


SCHEDULER_RECORD = "scheduler_end"      # the workload record's end: an event, but no symptom line


def coverage(ctx: FinalContext, roots: list[Ev]) -> float:
    """The share of symptom lines the roots explain (the scheduler's own record is not a line)."""
    total = sum(s.count for s in ctx.symptoms if s.kind != SCHEDULER_RECORD)
    if total == 0:
        return 1.0
    covered: dict[int, Ev] = {}
    for r in roots:
        for t in reachable(ctx, r):
            if t.role == "symptom" and t.kind != SCHEDULER_RECORD:
                covered[id(t)] = t
    return round(sum(t.count for t in covered.values()) / total, 4)
