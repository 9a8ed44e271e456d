"""The fleet memory in a process: a ``FleetState`` kept current from the store, judged at the clock.

The service, ``firstfault nodes`` and the recovery sink each hold one. It reads the record once
(``NodeHealthStore.snapshot``), then only the writes since (``changes``, the store's
changelog), so a request costs the diagnoses that arrived since the last one and the nodes it
shows, not the fleet's history. A changed policy (FIRSTFAULT_AVOID_*), a cleared record or a
reader that fell behind the changelog reads the record afresh.

Judgement is at ``at`` or the clock's now (injectable), never at the newest episode: a node's
verdict does not move because an unrelated diagnosis arrived.
"""
from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta, timezone
from typing import Any

from firstfault.rules.fleet import FleetReport, NodeView, Policy, Topology, cycle_start, episodes_from
from firstfault.rules.fleet_index import episode_of, from_us
from firstfault.rules.fleet_state import FleetState
from firstfault.schemas import Diagnosis

from .node_health import LogGap, NodeHealthStore, Position


class FleetMemory:
    def __init__(self, store: NodeHealthStore, clock: Callable[[], float] = time.time,
                 keep_from: datetime | None = None) -> None:
        """``keep_from``: reports at or after it stay exact (``firstfault nodes --at`` in the past)."""
        self.store, self.clock, self.keep_from = store, clock, keep_from
        self._lock = threading.Lock()
        self._state: FleetState | None = None
        self._pos: Position | None = None
        self.reloads = 0

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), timezone.utc)

    def _sync(self, policy: Policy) -> FleetState:
        """The state, current with the store (call with the lock held)."""
        state, now = self._state, self.now()
        if state is None or state.policy != policy or self._pos is None:
            return self._load(policy, now)
        pos = self._pos
        while True:
            try:
                entries, pos = self.store.changes(pos)
            except LogGap:
                return self._load(policy, now)
            for e in entries:
                state.absorb(e.key, e.revision, e.episodes, now, force=True)   # the store applied the revision rule
            self._pos = pos
            if not entries or len(entries) < 5000:
                return state

    def _load(self, policy: Policy, now: datetime) -> FleetState:
        entries, pos = self.store.snapshot()
        state = FleetState(policy, keep_from=self.keep_from)
        for e in entries:                       # oldest first: as if every episode had come in order
            state.absorb(e.key, e.revision, e.episodes, now, force=True)
        self._state, self._pos = state, pos
        self.reloads += 1
        # The state is a heap of new long-lived objects: the collector's full pass over them would
        # come in some later request; let it come now, with the load, which is slow anyway.
        gc.collect()
        return state

    def report(self, policy: Policy, topology: Topology | None = None, at: datetime | None = None, *,
               after: str | None = None, limit: int | None = None,
               hosts: Iterable[str] | None = None) -> tuple[FleetReport, str | None]:
        """The fleet report at ``at`` (default: now); a page of nodes with ``after``/``limit``, or
        just ``hosts``. Returns it with the next page's cursor."""
        with self._lock:
            state = self._sync(policy)
            return state.report(at or self.now(), topology, after=after, limit=limit, hosts=hosts)

    def report_data(self, policy: Policy, topology: Topology | None = None, at: datetime | None = None, *,
                    after: str | None = None, limit: int | None = None) -> tuple[dict[str, Any], str | None]:
        """``report``, as JSON-ready data (what a page of the API and the pages show)."""
        with self._lock:
            state = self._sync(policy)
            return state.report_data(at or self.now(), topology, after=after, limit=limit)

    def node(self, policy: Policy, host: str, topology: Topology | None = None,
             at: datetime | None = None) -> tuple[FleetReport, NodeView]:
        """The report for one node, and its view (``ok`` when nothing is recorded for it)."""
        report, _ = self.report(policy, topology, at, hosts=[host])
        view = report.nodes[0] if report.nodes else NodeView(host=host, recommendation="ok",
                                                             why="no episode recorded for this node")
        return report, view

    def what_if(self, policy: Policy, d: Diagnosis) -> dict[str, NodeView]:
        """The views of the nodes ``d`` implicates, counting ``d`` whether or not it is recorded
        yet, judged when ``d`` failed (the end of its cycle; now if that is earlier; the horizon
        of the exact record if it is older)."""
        mine = episodes_from(d)
        if not mine:
            return {}
        key = f"{d.attempt}:{d.workload_id}"
        with self._lock:
            state = self._sync(policy)
            now = self.now()
            end = cycle_start(mine[0].when, policy.cycle_s) + timedelta(seconds=policy.cycle_s)
            at = min(now, end)
            if state.final is not None and at <= from_us(state.final):
                at = from_us(state.final + 1)
            had = state.index.attempts.get(key)
            had_eps = [episode_of(x) for x in state.index.attempt_eps(key)]
            state.absorb(key, d.revision, mine, now, force=True)
            try:
                report, _ = state.report(at, hosts=sorted({e.host for e in mine}))
            finally:                           # the record is the store's: put the attempt back as it was
                state.absorb(key, had[0] if had else None, had_eps, now, force=True)
                if had is None:
                    state.index.attempts.pop(key, None)
            return {v.host: v for v in report.nodes}
