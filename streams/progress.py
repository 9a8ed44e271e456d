"""Progress watermarks: has the extractor read the raw topic as far as a workload's end?

The correlator finalizes on a grace period; an extractor that is stalled or restarting
has not turned the last lines into events yet, and a final published then is wrong
(issue 10, finding 9). So every extractor publishes, per raw partition it owns, a
``Progress`` record on the compacted progress topic: the next offset it will read
(everything before it extracted and delivered), the high watermark its last fetch saw,
its wall clock, and where its EventBatches ended on each events partition.

A report with ``position >= high`` says "I had read everything the broker had". That
holds for an idle partition too (position = high = its committed offset, or 0 when it
never held a record), so an idle partition never blocks. The correlator finalizes an
ended attempt once, for every raw partition, such a caught-up report is stamped after
the end event (plus ``watermark_margin_s`` for clock skew and the fetch's age) and it
has merged the EventBatches that report counts on the attempt's events partition. A
restarted or rebalanced extractor simply reports again; until one does, the partition
is behind. The wait is bounded by ``watermark_wait_s``.

Both sides are here, without Kafka: :class:`ProgressTracker` (extractor) and
:class:`ProgressView` (correlator).
"""
from __future__ import annotations

import bisect
import logging
from collections.abc import Iterable

from pydantic import ValidationError

from firstfault.schemas.records import Progress

log = logging.getLogger("firstfault.progress")

PROGRESS_EVERY_S = 1.0        # an extractor reports each owned partition at least this often
KEEP_REPORTS = 4096           # caught-up reports kept per raw partition (about an hour at 1/s)


def progress_key(topic: str, partition: int) -> bytes:
    return f"{topic}/{partition}".encode()


class ProgressTracker:
    """The extractor's side: positions it committed, events it delivered, reports to send."""

    def __init__(self, raw_topic: str, events_topic: str, worker: str) -> None:
        self.raw_topic, self.events_topic, self.worker = raw_topic, events_topic, worker
        self.positions: dict[int, int | None] = {}      # owned raw partition -> next offset (None: not known yet)
        self.events_end: dict[int, int] = {}

    def assigned(self, partitions: Iterable[int]) -> None:
        for p in partitions:
            self.positions.setdefault(p, None)

    def revoked(self, partitions: Iterable[int]) -> None:
        for p in partitions:
            self.positions.pop(p, None)

    def unknown(self) -> list[int]:
        return sorted(p for p, pos in self.positions.items() if pos is None)

    def start_at(self, partition: int, offset: int) -> None:
        """Where an owned partition starts: its committed offset (or the low watermark)."""
        if partition in self.positions and self.positions[partition] is None:
            self.positions[partition] = max(0, offset)

    def committed(self, offsets: dict[int, int]) -> None:
        """A batch was delivered and committed: partition -> the offset after its last record."""
        for p, nxt in offsets.items():
            if p in self.positions:
                self.positions[p] = max(self.positions[p] or 0, nxt)

    def delivered(self, topic: str, partition: int, offset: int) -> None:
        if topic == self.events_topic and offset >= 0:
            if offset + 1 > self.events_end.get(partition, 0):
                self.events_end[partition] = offset + 1

    def reports(self, highs: dict[int, int], now_ms: int) -> list[Progress]:
        """One report per owned partition whose position is known; ``highs``: fetch high watermarks."""
        return [Progress(topic=self.raw_topic, partition=p, position=pos, high=highs.get(p, -1), ts_ms=now_ms,
                         worker=self.worker, events_end=dict(self.events_end))
                for p, pos in sorted(self.positions.items()) if pos is not None]


class ProgressView:
    """The correlator's side: the caught-up reports per raw partition, and who is behind."""

    def __init__(self, raw_topic: str, partitions: int) -> None:
        self.raw_topic = raw_topic
        self.partitions = partitions
        self.seen_any = False                 # an extractor ever reported: the gate applies
        self._ts: dict[int, list[int]] = {}   # partition -> ts_ms of caught-up reports, sorted
        self._ends: dict[int, list[dict[int, int]]] = {}
        self.latest: dict[int, Progress] = {}

    def add_json(self, value: bytes | None) -> bool:
        """A record of the progress topic; False (and nothing changed) when it is not a report."""
        if not value:
            return False
        try:
            rep = Progress.model_validate_json(value)
        except (ValidationError, ValueError):
            return False
        return self.add(rep)

    def add(self, rep: Progress) -> bool:
        if rep.topic != self.raw_topic:
            return False
        self.seen_any = True
        p = rep.partition
        if p not in self.latest or rep.ts_ms >= self.latest[p].ts_ms:
            self.latest[p] = rep
        if rep.caught_up:
            ts, ends = self._ts.setdefault(p, []), self._ends.setdefault(p, [])
            i = bisect.bisect_right(ts, rep.ts_ms)
            ts.insert(i, rep.ts_ms)
            ends.insert(i, rep.events_end)
            if len(ts) > KEEP_REPORTS:        # the oldest go: an attempt waits watermark_wait_s at most
                del ts[:len(ts) - KEEP_REPORTS]
                del ends[:len(ends) - KEEP_REPORTS]
        return True

    def behind(self, since_ms: int, events_partition: int | None, events_position: int | None) -> list[int]:
        """Raw partitions not yet read up to ``since_ms``: no caught-up report stamped at or after it,
        or the first such report counts on EventBatches the correlator has not merged yet."""
        out = []
        for p in range(self.partitions):
            ts = self._ts.get(p, [])
            i = bisect.bisect_left(ts, since_ms)
            if i == len(ts):
                out.append(p)
                continue
            need = self._ends[p][i].get(events_partition, 0) if events_partition is not None else 0
            if need > 0 and (events_position is None or events_position < need):
                out.append(p)
        return out
