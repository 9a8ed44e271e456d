"""Which workloads held which node when: built from scheduler start/end events.

Every extractor keeps the whole scheduler topic in one of these (the global-table
pattern), so a node-scoped line from any host can be routed to every workload
attempt that held the node at that line's time.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from firstfault.schemas import SchedulerEvent, WorkloadRecord


@dataclass
class Allocation:
    workload: WorkloadRecord
    start: datetime
    end: datetime | None = None


class AllocationTimeline:
    def __init__(self, slack_s: float = 3600.0 + 86400.0) -> None:
        # Generous: a line's zone is not known before routing; diagnose() applies the
        # exact evidence horizon once the line is read in its workload's zone.
        self.slack = timedelta(seconds=slack_s)
        self._by_key: dict[tuple[str, int], Allocation] = {}
        self._by_host: dict[str, set[tuple[str, int]]] = {}

    def apply(self, ev: SchedulerEvent) -> Allocation:
        wl = ev.workload
        key = (wl.workload_id, wl.attempt)
        alloc = self._by_key.get(key)
        if alloc is None:
            alloc = Allocation(workload=wl, start=wl.start_time)
            self._by_key[key] = alloc
        if ev.type == "end":
            alloc.workload = wl
            alloc.end = wl.end_time or ev.ts
        elif alloc.end is None:
            alloc.workload = wl
        for host in wl.nodes:
            self._by_host.setdefault(host, set()).add(key)
        return alloc

    def get(self, workload_id: str, attempt: int | None = None) -> Allocation | None:
        if attempt is not None:
            return self._by_key.get((workload_id, attempt))
        found = [a for (w, _), a in self._by_key.items() if w == workload_id]
        return max(found, key=lambda a: a.workload.attempt) if found else None

    def at(self, host: str, when: datetime | None) -> list[Allocation]:
        """Allocations of ``host`` covering ``when`` (with slack); with no time, the running ones."""
        out = []
        for key in self._by_host.get(host, ()):
            a = self._by_key[key]
            if when is None:
                if a.end is None:
                    out.append(a)
                continue
            if a.start - self.slack <= when and (a.end is None or when <= a.end + self.slack):
                out.append(a)
        return sorted(out, key=lambda a: (a.workload.workload_id, a.workload.attempt))

    def __len__(self) -> int:
        return len(self._by_key)
