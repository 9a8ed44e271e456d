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
ended attempt once, for every raw partition, a report stamped after the end event (plus
``watermark_margin_s`` for clock skew and the fetch's age) named a high watermark that a
report at or after it has read up to, and it has merged the EventBatches that report
counts on the attempt's events partition, and holds no line of the attempt unrouted (a
report names the attempts and hosts whose lines wait for a start event). So under a backlog,
or steady scheduler traffic, a workload waits for the lines shipped before its end, not for
the whole backlog. A restarted or rebalanced
extractor simply reports again; until one does, the partition is behind. Past
``watermark_wait_s`` the correlator says so in a provisional diagnosis.

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
KEEP_REPORTS = 4096           # reports kept per raw partition (about an hour at 1/s per owner)


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

    def reports(self, highs: dict[int, int], now_ms: int, held: list[str] | None = None) -> list[Progress]:
        """One report per owned partition whose position is known; ``highs``: fetch high watermarks;
        ``held``: the workloads and hosts whose lines wait unrouted."""
        return [Progress(topic=self.raw_topic, partition=p, position=pos, high=highs.get(p, -1), ts_ms=now_ms,
                         worker=self.worker, events_end=dict(self.events_end), held=list(held or ()))
                for p, pos in sorted(self.positions.items()) if pos is not None]


class ProgressView:
    """The correlator's side: the extractors' reports per raw partition, and who is behind.

    A partition has passed an attempt's end once a report stamped at or after the end (+ the
    margin) gave its high watermark ``h`` (everything shipped before the end is below it) and a
    report at or after that one has ``position >= h``: read that far. Under a backlog that is
    long before the partition is drained (a caught-up report is the case where both are one).
    """

    def __init__(self, raw_topic: str, partitions: int) -> None:
        self.raw_topic = raw_topic
        self.partitions = partitions
        self.seen_any = False                 # an extractor ever reported: the gate applies
        self._ts: dict[int, list[int]] = {}   # partition -> ts_ms of usable reports (high known), sorted
        self._pos: dict[int, list[int]] = {}  # ... their positions, highs and events_end, in that order
        self._high: dict[int, list[int]] = {}
        self._ends: dict[int, list[dict[int, int]]] = {}
        self._held: dict[int, list[frozenset[str]]] = {}
        self._most: dict[int, list[int]] = {}  # running max of positions (bisect), rebuilt when stale
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
        if rep.high < 0:                      # the extractor's timeline was not current: says nothing
            return True
        ts = self._ts.setdefault(p, [])
        cols = (self._pos.setdefault(p, []), self._high.setdefault(p, []), self._ends.setdefault(p, []),
                self._held.setdefault(p, []))
        i = bisect.bisect_right(ts, rep.ts_ms)
        ts.insert(i, rep.ts_ms)
        for col, v in zip(cols, (rep.position, rep.high, rep.events_end, frozenset(rep.held))):
            col.insert(i, v)
        most = self._most.get(p)
        if most is not None and i == len(most):
            most.append(max(most[-1], rep.position) if most else rep.position)
        else:
            self._most.pop(p, None)           # inserted before the end: rebuilt at the next look
        if len(ts) > KEEP_REPORTS:            # the oldest go: an attempt waits watermark_wait_s at most
            cut = len(ts) - KEEP_REPORTS
            for col in (ts, *cols):
                del col[:cut]
            self._most.pop(p, None)
        return True

    def _running_max(self, p: int) -> list[int]:
        most = self._most.get(p)
        if most is None:
            most, top = [], -1
            for v in self._pos.get(p, []):
                top = max(top, v)
                most.append(top)
            self._most[p] = most
        return most

    def _passed(self, p: int, since_ms: int, keys: frozenset[str] = frozenset()) -> int | None:
        """The index of the first report that read partition ``p`` past what it held at ``since_ms``
        while holding no line of ``keys`` (the attempt's workload id and hosts)."""
        ts = self._ts.get(p, [])
        i = bisect.bisect_left(ts, since_ms)
        if i == len(ts):
            return None
        pos, need, held = self._pos[p], self._high[p][i], self._held[p]
        j = max(i, bisect.bisect_left(self._running_max(p), need))
        while j < len(ts) and (pos[j] < need or not held[j].isdisjoint(keys)):   # rare, short
            j += 1
        return j if j < len(ts) else None

    def behind(self, since_ms: int, events_partition: int | None, events_position: int | None,
               keys: frozenset[str] = frozenset()) -> list[int]:
        """Raw partitions not yet read past what they held at ``since_ms`` (with no line of ``keys`` held
        unrouted), or read that far by a report that counts on EventBatches not merged yet."""
        out = []
        for p in range(self.partitions):
            j = self._passed(p, since_ms, keys)
            if j is None:
                out.append(p)
                continue
            need = self._ends[p][j].get(events_partition, 0) if events_partition is not None else 0
            if need > 0 and (events_position is None or events_position < need):
                out.append(p)
        return out
