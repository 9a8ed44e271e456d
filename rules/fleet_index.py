"""Fleet memory, the index: the kept episodes by node, by cycle and by attempt.

Pure (no I/O, no clock); times are integer microseconds since the epoch, so every comparison
is the one ``fleet.evaluate`` makes on datetimes. What the incremental state asks of it, each
answer touching only the nodes and cycles concerned:

* a node's counted episodes in a window (``counted``) and its verdict inputs (``judge``);
* which nodes had an episode enter or leave the window between two instants (``hosts_moved``):
  only those can change their standing between two evaluations;
* a cycle's nodes (more than ``broad_threshold``: a broad event);
* replacing an attempt's episodes (a later revision), and dropping whole cycles behind a cut.
"""
from __future__ import annotations

import sys
from bisect import bisect_left, bisect_right, insort
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from datetime import datetime, timedelta, timezone

from .fleet import WORKLOAD_CAUSED, Episode, Policy, cycle_start

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_US = timedelta(microseconds=1)
# Below 2**32 s (the year 2106) a float epoch resolves microseconds, so cycle_start's float
# arithmetic floors like integers do for whole-second cycles.
_EXACT_US = 2**32 * 1_000_000


def to_us(t: datetime) -> int:
    return (t - EPOCH) // _US


def from_us(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=us)


# A kept episode is a plain tuple of plain values, which the garbage collector stops tracking:
# a fleet's worth of them is never walked by a full collection (a third of a second a pass at
# 100,000 episodes as objects). Its fields are at these places; the Episode model is built
# again (``episode_of``) when a report shows it, for less than half the memory.
(WHEN, CYCLE, HOST, FAMILY, COUNTABLE, ORDER, ATTEMPT,        # what the policy asks of it
 SUB_DOMAIN, ROLE, WORKLOAD_ID, ATTEMPT_NO, AT, DIAGNOSIS_ID, REVISION, SUMMARY) = range(15)
Ep = tuple
_order = itemgetter(ORDER)


def ep_of(e: Episode, when: int, cycle: int, countable: bool, attempt: str) -> Ep:
    """``when`` and ``cycle`` (its start) in microseconds; ``countable``: not the workload's doing,
    and a role the policy counts; ``attempt``: the key it is put under. ORDER is evaluate's order
    of a node's episodes: at, key, family."""
    family = sys.intern(e.family)
    return (when, cycle, sys.intern(e.host), family, countable, (when, attempt if attempt == e.key else e.key, family),
            attempt, sys.intern(e.sub_domain), sys.intern(e.role), e.workload_id, e.attempt, e.at, e.diagnosis_id,
            e.revision, e.summary)


def episode_data(x: Ep) -> dict:
    """The episode as ``Episode.model_dump(mode="json")`` gives it (plain values only)."""
    return {"host": x[HOST], "family": x[FAMILY], "sub_domain": x[SUB_DOMAIN], "role": x[ROLE],
            "workload_id": x[WORKLOAD_ID], "attempt": x[ATTEMPT_NO], "at": x[AT], "diagnosis_id": x[DIAGNOSIS_ID],
            "revision": x[REVISION], "summary": x[SUMMARY]}


def episode_of(x: Ep) -> Episode:
    return Episode.model_validate(episode_data(x))    # pydantic-core: faster than model_construct


@dataclass
class Cycle:
    """The episodes of one cycle; more nodes than the threshold make it a broad event."""

    eps: tuple[Ep, ...] = ()                               # a tuple: the collector skips it, as the nodes'
    hosts: Counter[str] = field(default_factory=Counter)
    net: Counter[str] = field(default_factory=Counter)     # network episodes per node
    wide: bool = False                                     # more nodes than the threshold: a broad event
    version: int = 0                                       # a new number on every change (caches key on it)

    def ordered(self) -> list[Ep]:
        """evaluate's order of a cycle's episodes: time, node, attempt, family."""
        return sorted(self.eps, key=lambda x: (x[WHEN], x[HOST], x[ORDER][1], x[FAMILY]))


@dataclass
class Change:
    """What one attempt's replacement touched."""

    cycles: set[int] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    flipped: set[int] = field(default_factory=set)         # cycles that became, or stopped being, broad
    newest: int | None = None                              # the newest new episode's time


# The cycle so far at an evaluation instant that is not a cycle end, and whether it is broad
# yet: (cycle start, broad). None at a cycle end: every cycle before it is whole.
Partial = tuple[int, bool] | None


class EpisodeIndex:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.cycle_us = timedelta(seconds=policy.cycle_s) // _US
        self.window_us = timedelta(days=policy.window_days) // _US
        self.hosts: dict[str, tuple[Ep, ...]] = {}         # host -> its episodes in ORDER (tuples, never walked)
        self.names: list[str] = []                         # the hosts, sorted (pages)
        self.cycles: dict[int, Cycle] = {}
        self.starts: list[int] = []                        # cycle starts, sorted
        self.broad_starts: list[int] = []                  # ... of cycles with too many nodes
        self.net_starts: list[int] = []                    # ... of cycles with network episodes on several nodes
        # key -> (revision, its episodes as (host, order)): plain values, which the collector skips
        self.attempts: dict[str, tuple[int | None, tuple[tuple[str, tuple[int, str, str]], ...]]] = {}
        self.cut: int | None = None                        # cycles ending at or before it are dropped
        self._cycle_of: dict[int, int] = {}                # when -> cycle start (one datetime call per instant)
        self._changes = 0                                  # numbers the cycles' versions, never reused
        self._whole_s = float(policy.cycle_s).is_integer()

    # ------------------------------------------------------------ writing

    def cycle_key(self, t: int) -> int:
        """The start of the cycle holding ``t``, as ``fleet.cycle_start`` computes it."""
        if self._whole_s and 0 <= t < _EXACT_US:      # here cycle_start's float arithmetic is exact
            return t - t % self.cycle_us
        c = self._cycle_of.get(t)
        if c is None:
            c = to_us(cycle_start(from_us(t), self.policy.cycle_s))
            if len(self._cycle_of) > 100_000:
                self._cycle_of.clear()
            self._cycle_of[t] = c
        return c

    def broad(self, c: int) -> bool:
        cyc = self.cycles.get(c)
        return cyc is not None and cyc.wide

    def put(self, key: str, revision: int | None, episodes: Sequence[Episode], force: bool = False) -> Change | None:
        """Replace attempt ``key``'s episodes; None for a late, lower revision (ignored, as the
        store ignores it) unless ``force``. Episodes of dropped cycles are not kept."""
        rev = -1 if revision is None else revision
        cur = self.attempts.get(key)
        if not force and cur is not None and rev >= 0 and cur[0] is not None and cur[0] >= 0 and rev < cur[0]:
            return None
        ch = Change()
        before: dict[int, bool] = {}
        for x in self.attempt_eps(key):
            before.setdefault(x[CYCLE], self.broad(x[CYCLE]))
            self._remove(x)
            ch.cycles.add(x[CYCLE])
            ch.hosts.add(x[HOST])
        kept = []
        for e in episodes:
            when = to_us(e.when)
            c = self.cycle_key(when)
            if self.cut is not None and c + self.cycle_us <= self.cut:
                continue
            before.setdefault(c, self.broad(c))
            x = ep_of(e, when, c, e.sub_domain not in WORKLOAD_CAUSED
                      and (e.role == "attributed" or self.policy.count_suspects), key)
            self._add(x)
            kept.append(x)
            ch.cycles.add(c)
            ch.hosts.add(x[HOST])
            ch.newest = when if ch.newest is None else max(ch.newest, when)
        if kept or cur is not None:
            self.attempts[key] = (revision, tuple((x[HOST], x[ORDER]) for x in kept))
        ch.flipped = {c for c, was in before.items() if was != self.broad(c)}
        return ch

    def _add(self, x: Ep) -> None:
        eps = self.hosts.get(x[HOST])
        if eps is None:
            eps = ()
            insort(self.names, x[HOST])
        i = bisect_right(eps, x[ORDER], key=_order)
        self.hosts[x[HOST]] = eps[:i] + (x,) + eps[i:]       # a node has tens of episodes: copying is cheap
        cyc = self.cycles.get(x[CYCLE])
        if cyc is None:
            cyc = self.cycles[x[CYCLE]] = Cycle()
            insort(self.starts, x[CYCLE])
        wide, net = cyc.wide, len(cyc.net) >= self.policy.shared_min_nodes
        cyc.eps += (x,)
        cyc.hosts[x[HOST]] += 1
        cyc.wide = len(cyc.hosts) > self.policy.broad_threshold
        if x[FAMILY] == "network":
            cyc.net[x[HOST]] += 1
        self._changes += 1
        cyc.version = self._changes
        self._track(x[CYCLE], wide, net)

    def _remove(self, x: Ep) -> None:
        eps = self.hosts[x[HOST]]
        i = bisect_left(eps, x[ORDER], key=_order)
        while eps[i] is not x:
            i += 1
        eps = eps[:i] + eps[i + 1:]
        if eps:
            self.hosts[x[HOST]] = eps
        else:
            del self.hosts[x[HOST]]
            del self.names[bisect_left(self.names, x[HOST])]
        cyc = self.cycles[x[CYCLE]]
        wide, net = cyc.wide, len(cyc.net) >= self.policy.shared_min_nodes
        cyc.eps = tuple(y for y in cyc.eps if y is not x)
        for counter in (cyc.hosts, cyc.net) if x[FAMILY] == "network" else (cyc.hosts,):
            counter[x[HOST]] -= 1
            if counter[x[HOST]] <= 0:
                del counter[x[HOST]]
        cyc.wide = len(cyc.hosts) > self.policy.broad_threshold
        self._changes += 1
        cyc.version = self._changes
        if not cyc.eps:
            del self.cycles[x[CYCLE]]
            del self.starts[bisect_left(self.starts, x[CYCLE])]
        self._track(x[CYCLE], wide, net)

    def _track(self, c: int, was_broad: bool, was_net: bool) -> None:
        """Keep the sorted lists of broad and network cycles in step with cycle ``c``."""
        cyc = self.cycles.get(c)
        for was, now, starts in ((was_broad, self.broad(c), self.broad_starts),
                                 (was_net, cyc is not None and len(cyc.net) >= self.policy.shared_min_nodes,
                                  self.net_starts)):
            if now and not was:
                insort(starts, c)
            elif was and not now:
                del starts[bisect_left(starts, c)]

    def drop_through(self, cut: int) -> int:
        """Forget every cycle ending at or before ``cut``; returns the episodes dropped."""
        self.cut = cut if self.cut is None else max(self.cut, cut)
        n = 0
        while self.starts and self.starts[0] + self.cycle_us <= self.cut:
            cyc = self.cycles[self.starts[0]]
            for x in list(cyc.eps):
                self._remove(x)
                key = x[ATTEMPT]
                kept = self.attempts.get(key)
                if kept is not None:
                    rest = tuple(y for y in kept[1] if y != (x[HOST], x[ORDER]))
                    if rest:
                        self.attempts[key] = (kept[0], rest)
                    else:
                        del self.attempts[key]
                n += 1
        return n

    # ------------------------------------------------------------ reading

    def episodes(self, host: str) -> tuple[Ep, ...]:
        return self.hosts.get(host, ())

    def attempt_eps(self, key: str) -> list[Ep]:
        """The kept episodes attempt ``key`` put."""
        out = []
        for host, order in self.attempts.get(key, (None, ()))[1]:
            eps = self.hosts[host]
            out.append(eps[bisect_left(eps, order, key=_order)])     # (when, key, family) is one per node
        return out

    def window(self, host: str, lo: int, hi: int) -> tuple[Ep, ...]:
        """The node's episodes with ``lo <= when < hi``, in order."""
        eps = self.hosts.get(host, ())
        return eps[bisect_left(eps, (lo,), key=_order):bisect_left(eps, (hi,), key=_order)]

    def counted(self, host: str, until: int, part: Partial = None) -> dict[str, list[Ep]]:
        """evaluate's ``counted``: per family, the episodes in the window before ``until`` that count."""
        fams: dict[str, list[Ep]] = {}
        for x in self.window(host, until - self.window_us, until):
            if x[COUNTABLE] and not self.wide(x, part):
                fams.setdefault(x[FAMILY], []).append(x)
        return fams

    def judge(self, host: str, until: int, part: Partial = None) -> tuple[bool, int, int]:
        """(qualifies for avoid, most episodes of one family, newest counted episode) at ``until``;
        (False, 0, 0) when it does not qualify (the other two only order the qualifying)."""
        eps = self.hosts.get(host)
        if eps is None:
            return False, 0, 0
        i, j = bisect_left(eps, (until - self.window_us,), key=_order), bisect_left(eps, (until,), key=_order)
        need = self.policy.min_episodes
        if j - i < need:
            return False, 0, 0
        cycles = self.cycles
        pc, pw = part if part is not None else (None, False)
        cyc = cycles.get(pc) if pc is not None else None
        if cyc is not None and cyc.wide != pw:           # the cycle so far is not yet what it will be
            kept = [x for x in eps[i:j] if x[COUNTABLE] and not (pw if x[CYCLE] == pc else cycles[x[CYCLE]].wide)]
        else:
            kept = [x for x in eps[i:j] if x[COUNTABLE] and not cycles[x[CYCLE]].wide]
        if len(kept) < need:
            return False, 0, 0
        fams = [x[FAMILY] for x in kept]
        best = max(map(fams.count, set(fams)))
        return (True, best, kept[-1][WHEN]) if best >= need else (False, 0, 0)   # in time order: the last is newest

    def wide(self, x: Ep, part: Partial = None) -> bool:
        """Whether ``x``'s cycle is a broad event (the cycle so far, for ``part``'s)."""
        return part[1] if part is not None and x[CYCLE] == part[0] else self.cycles[x[CYCLE]].wide

    def between(self, lo: int | None, hi: int) -> Iterator[Ep]:
        """The episodes with ``lo <= when < hi`` (every one before ``hi`` when ``lo`` is None)."""
        first = 0 if lo is None else bisect_right(self.starts, lo - self.cycle_us)
        for c in self.starts[first:bisect_left(self.starts, hi)]:
            for x in self.cycles[c].eps:
                if (lo is None or x[WHEN] >= lo) and x[WHEN] < hi:
                    yield x

    def hosts_moved(self, lo: int | None, hi: int) -> set[str]:
        """The nodes with an episode entering (``lo <= when < hi``) or leaving (``lo <= when + window
        < hi``) the window between evaluations at ``lo`` and ``hi``: no other node's standing moved."""
        moved = {x[HOST] for x in self.between(lo, hi)}
        if lo is not None:
            moved.update(x[HOST] for x in self.between(lo - self.window_us, hi - self.window_us))
        return moved

    def next_end(self, after: int | None) -> int | None:
        """The first cycle end after ``after`` among the cycles holding episodes."""
        i = 0 if after is None else bisect_right(self.starts, after - self.cycle_us)
        return self.starts[i] + self.cycle_us if i < len(self.starts) else None

    def page(self, after: str | None, limit: int | None) -> list[str]:
        i = 0 if after is None else bisect_right(self.names, after)
        return self.names[i:] if limit is None else self.names[i:i + limit]

    def attempts_in_order(self) -> Iterable[tuple[str, int | None, list[Episode]]]:
        """Every kept attempt, oldest first: what a fresh state replays."""
        rows = sorted(self.attempts.items(), key=lambda kv: min((order[0] for _, order in kv[1][1]), default=0))
        return [(k, rev, [episode_of(x) for x in self.attempt_eps(k)]) for k, (rev, _) in rows]

    def __len__(self) -> int:
        return sum(len(c.eps) for c in self.cycles.values())
