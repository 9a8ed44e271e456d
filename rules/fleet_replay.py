"""Fleet memory, the replay: evaluate's cycle-by-cycle avoid decisions, one step at a time, undoable.

Pure. ``evaluate`` decides at each cycle end that holds episodes (and at the evaluation
instant): avoids lapse for nodes that no longer qualify, then of the nodes that qualify, the
``max_new_per_cycle`` with most episodes (then newest, then by name) are avoided; the others
wait. It looks at every node at every step, and every node's every episode: quadratic. The
same decisions need only the nodes whose counted episodes moved since the last step
(``EpisodeIndex.hosts_moved``): any other node qualifies, or not, with the same episodes as
before. The waiting nodes sit in a heap, so a step costs its moved nodes and its avoids.

Each step keeps an undo log (the journal): an episode that arrives late for a cycle already
stepped over rewinds the steps from its cycle and replays them, and an evaluation instant
that is not a cycle end is a step taken and undone.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

class _Missing:
    """No value: the key was absent (one object, copies included)."""

    def __deepcopy__(self, memo: dict) -> "_Missing":
        return self

    def __copy__(self) -> "_Missing":
        return self

    def __repr__(self) -> str:
        return "MISSING"


_MISSING: Any = _Missing()
Key = tuple[int, int, str]                  # (-episodes, -newest, host): the avoid order, smallest first


@dataclass
class Step:
    """One step's undo log."""

    at: int
    prev_nonbroad: int | None
    prev_frontier: int | None
    undo: list[tuple[dict, str, Any]] = field(default_factory=list)
    forced: set[str] | None = None


class Replay:
    def __init__(self, max_new_per_cycle: int) -> None:
        self.k = max_new_per_cycle
        self.avoided: dict[str, int] = {}           # host -> since (the step that avoided it)
        self.waiting: dict[str, Key] = {}           # qualifying, not yet avoided (evaluate's `pending`)
        self._heap: list[tuple[Key, str]] = []      # lazily deleted: an entry counts while waiting holds it
        self.last_nonbroad: int | None = None       # the last step that was not a broad event
        self.frontier: int | None = None            # the last step taken
        self.force: set[str] = set()                # nodes to judge at the next step whatever moved
        self.journal: list[Step] = []               # the steps that may still be undone, oldest first

    def step(self, at: int, broad: bool, hosts: set[str], judge: Callable[[str, int], tuple[bool, int, int]]) -> Step:
        """Decide at ``at``, judging ``hosts`` (the nodes whose episodes moved since the last
        non-broad step: the others stand as they stood); returns the step's undo log (the
        caller keeps it in the journal or undoes it)."""
        log = Step(at, self.last_nonbroad, self.frontier)
        self.frontier = at
        if broad:                    # a broad event avoids no node and lets none lapse
            return log
        if self.force:
            log.forced, self.force = self.force, set()
            hosts |= log.forced
        self.last_nonbroad = at
        for h in hosts:
            ok, best, newest = judge(h, at)
            if h in self.avoided:
                if not ok:
                    self._set(log, self.avoided, h, _MISSING)
            elif ok:
                key = (-best, -newest, h)
                if self.waiting.get(h) != key:
                    self._set(log, self.waiting, h, key)
                    heapq.heappush(self._heap, (key, h))
            elif h in self.waiting:
                self._set(log, self.waiting, h, _MISSING)
        for _ in range(self.k):
            h = self._pop()
            if h is None:
                break
            self._set(log, self.waiting, h, _MISSING)
            self._set(log, self.avoided, h, at)
        return log

    def _pop(self) -> str | None:
        while self._heap:
            key, h = heapq.heappop(self._heap)
            if self.waiting.get(h) == key:
                return h
        return None

    @staticmethod
    def _set(log: Step, d: dict, k: str, v: Any) -> None:
        log.undo.append((d, k, d.get(k, _MISSING)))
        if v is _MISSING:
            del d[k]
        else:
            d[k] = v

    def undo(self, log: Step) -> None:
        for d, k, old in reversed(log.undo):
            if old is _MISSING:
                d.pop(k, None)
            else:
                d[k] = old
                if d is self.waiting:
                    heapq.heappush(self._heap, (old, k))
        if log.forced:
            self.force |= log.forced
        self.last_nonbroad, self.frontier = log.prev_nonbroad, log.prev_frontier

    def changes(self, log: Step) -> tuple[dict[str, Any], dict[str, Any]]:
        """What a step changed, as (avoided, waiting) overlays: host -> its value after the step
        (``MISSING``: gone). Read before undoing it."""
        av: dict[str, Any] = {}
        wt: dict[str, Any] = {}
        for d, k, _ in log.undo:
            (av if d is self.avoided else wt)[k] = d.get(k, _MISSING)
        return av, wt

    def rewind(self, to: int) -> int:
        """Undo the journal's steps at or after ``to``; returns how many."""
        n = 0
        while self.journal and self.journal[-1].at >= to:
            self.undo(self.journal.pop())
            n += 1
        return n

    def settle(self, through: int) -> None:
        """Steps at or before ``through`` are final: drop their undo logs."""
        i = 0
        while i < len(self.journal) and self.journal[i].at <= through:
            i += 1
        del self.journal[:i]

    @property
    def settled_nonbroad(self) -> int | None:
        """The last non-broad step among the final ones: what the next step looks back from."""
        return self.journal[0].prev_nonbroad if self.journal else self.last_nonbroad

    def compact(self) -> None:
        if len(self._heap) > 4 * len(self.waiting) + 64:
            self._heap = [(key, h) for h, key in self.waiting.items()]
            heapq.heapify(self._heap)


MISSING = _MISSING
