"""Input partitions a worker owns but does not read, and when to resume them. Pure: no Faust.

Faust pauses a worker's input partitions while it recovers its tables and resumes them when
recovery completes, unless a newer rebalance began meanwhile: then its recovery returns early
and the partitions can stay paused. And after a restart, partitions that had no committed
offset yet were seen never fetched at all. Nothing reads them, no fetch reports their high
watermark (so the lag metric is silent), and the workloads there never get a final. The correlator's
health timer asks :func:`unfetched` which assigned partitions are not fetched and resumes the
ones :class:`StuckPartitions` says have waited long enough; readiness names them meanwhile.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def unfetched(assigned: Iterable[Any], paused: Iterable[Any], active: Iterable[Any] | None,
              buffered: Iterable[Any], never_fetched: Iterable[Any] = ()) -> set[Any]:
    """Assigned partitions the consumer does not fetch: paused, out of the active set with no full
    buffer to explain it (``active`` None: the consumer has not built that set yet), or never fetched
    at all (no fetch ever reported their high watermark: seen after a restart for partitions that had
    no committed offset yet)."""
    paused, buffered, never = set(paused), set(buffered), set(never_fetched)
    active = None if active is None else set(active)
    return {tp for tp in assigned if tp in paused or tp in never
            or (active is not None and tp not in active and tp not in buffered)}


class StuckPartitions:
    """Since when each partition has been unfetched; which are due for a resume."""

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s
        self._since: dict[Any, float] = {}

    def update(self, stuck: set[Any], now: float) -> list[Any]:
        """Record this look; the partitions unfetched for ``after_s`` (their clock restarts)."""
        for tp in list(self._since):
            if tp not in stuck:
                del self._since[tp]
        for tp in stuck:
            self._since.setdefault(tp, now)
        due = sorted(tp for tp, since in self._since.items() if now - since >= self.after_s)
        for tp in due:
            self._since[tp] = now
        return due
