"""Progress watermarks: has the extractor read the raw topic as far as a workload's end?

The correlator finalizes on a grace period; an extractor that is stalled or restarting
has not turned the last lines into events yet, and a final published then is wrong
(issue 10, finding 9). So every extractor publishes, per raw partition it owns, a
``Progress`` record on the compacted progress topic: the next offset it will read
(everything before it extracted and delivered), the high watermark its last fetch saw,
its wall clock, and where its EventBatches ended on each events partition.

A report with ``position >= high`` says "I had read everything the broker had" when the
high is recent: the consumer had drained what it fetched (``fresh``). That holds for an idle
partition too (position = high = its committed offset, or 0), so an idle partition never
blocks. Working through a backlog the consumer stops fetching and its cached high can be
seconds old; then the report's ``done_ts_ms`` (the latest record time read) decides: a
record stamped after an attempt's end record was appended after every line shipped before
that end. The correlator finalizes an ended attempt once every raw partition passed either
way (:class:`ProgressView`), the report counts on no EventBatch it has not merged, and no line
of the attempt is held unrouted (reports name the attempts and hosts whose lines wait for a
start event). So a workload waits for the lines shipped before its end, not for the whole
backlog. A restarted or rebalanced extractor simply reports again; until one does, the
partition is behind. Past ``watermark_wait_s`` the correlator says so in a provisional
diagnosis.

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
        self.done_ts: dict[int, int] = {}               # owned raw partition -> latest record time before it
        self.events_end: dict[int, int] = {}

    def assigned(self, partitions: Iterable[int]) -> None:
        for p in partitions:
            self.positions.setdefault(p, None)

    def revoked(self, partitions: Iterable[int]) -> None:
        for p in partitions:
            self.positions.pop(p, None)
            self.done_ts.pop(p, None)

    def unknown(self) -> list[int]:
        return sorted(p for p, pos in self.positions.items() if pos is None)

    def start_at(self, partition: int, offset: int) -> None:
        """Where an owned partition starts: its committed offset (or the low watermark)."""
        if partition in self.positions and self.positions[partition] is None:
            self.positions[partition] = max(0, offset)

    def committed(self, offsets: dict[int, int], stamps: dict[int, int] | None = None) -> None:
        """A batch was delivered and committed: partition -> the offset after its last record; ``stamps``:
        partition -> the latest record time in the batch (ms)."""
        for p, nxt in offsets.items():
            if p in self.positions:
                self.positions[p] = max(self.positions[p] or 0, nxt)
        for p, ts in (stamps or {}).items():
            if p in self.positions and ts > self.done_ts.get(p, -1):
                self.done_ts[p] = ts

    def delivered(self, topic: str, partition: int, offset: int) -> None:
        if topic == self.events_topic and offset >= 0:
            if offset + 1 > self.events_end.get(partition, 0):
                self.events_end[partition] = offset + 1

    def reports(self, highs: dict[int, int], now_ms: int, held: list[str] | None = None,
                fresh: bool = True) -> list[Progress]:
        """One report per owned partition whose position is known; ``highs``: fetch high watermarks;
        ``held``: the workloads and hosts whose lines wait unrouted; ``fresh``: the consumer had drained
        what it fetched (its highs are recent)."""
        return [Progress(topic=self.raw_topic, partition=p, position=pos, high=highs.get(p, -1), ts_ms=now_ms,
                         worker=self.worker, events_end=dict(self.events_end), held=list(held or ()),
                         done_ts_ms=self.done_ts.get(p, -1), fresh=fresh)
                for p, pos in sorted(self.positions.items()) if pos is not None]


class ProgressView:
    """The correlator's side: the extractors' reports per raw partition, and who is behind.

    A partition has passed an attempt's end once a report shows either

    * a record read there whose time is past the end record's time (+ the margin for the
      shippers' clocks): the lines shipped before the end were appended before it, so they are
      read too; that holds however far behind the extractor's fetches are, or
    * the partition read to the high watermark of a *fresh* report stamped after the end was
      seen (+ the margin): the extractor had drained what it fetched, so that high is recent;
      this is how a partition that got nothing since the end passes.

    and that report counts on no EventBatch the correlator has not merged and holds none of the
    attempt's lines unrouted.
    """

    def __init__(self, raw_topic: str, partitions: int) -> None:
        self.raw_topic = raw_topic
        self.partitions = partitions
        self.seen_any = False                 # an extractor ever reported: the gate applies
        self._ts: dict[int, list[int]] = {}   # partition -> ts_ms of usable reports (high known), sorted
        self._rows: dict[int, list[Progress]] = {}    # ... the reports, in that order
        self._done: dict[int, list[int]] = {}         # running max of done_ts_ms (bisect), rebuilt when stale
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
        ts, rows = self._ts.setdefault(p, []), self._rows.setdefault(p, [])
        i = bisect.bisect_right(ts, rep.ts_ms)
        ts.insert(i, rep.ts_ms)
        rows.insert(i, rep)
        done = self._done.get(p)
        if done is not None and i == len(done):
            done.append(max(done[-1], rep.done_ts_ms) if done else rep.done_ts_ms)
        else:
            self._done.pop(p, None)           # inserted before the end: rebuilt at the next look
        if len(ts) > KEEP_REPORTS:            # the oldest go: an attempt waits watermark_wait_s at most
            del ts[:len(ts) - KEEP_REPORTS]
            del rows[:len(rows) - KEEP_REPORTS]
            self._done.pop(p, None)
        return True

    def _running_done(self, p: int) -> list[int]:
        done = self._done.get(p)
        if done is None:
            done, top = [], -1
            for rep in self._rows.get(p, []):
                top = max(top, rep.done_ts_ms)
                done.append(top)
            self._done[p] = done
        return done

    def _passed(self, p: int, since_ms: int, end_ms: int | None, keys: frozenset[str]) -> Progress | None:
        """The first report that shows partition ``p`` read past the attempt's end, with none of ``keys``
        (its workload id and hosts) held unrouted."""
        ts, rows = self._ts.get(p, []), self._rows.get(p, [])
        found: list[int] = []
        if end_ms is not None:                # a record past the end's time was read
            j = bisect.bisect_left(self._running_done(p), end_ms)
            while j < len(rows) and not rows[j].held_disjoint(keys):
                j += 1
            if j < len(rows):
                found.append(j)
        j = bisect.bisect_left(ts, since_ms)  # read to a recent high watermark after the end was seen
        while j < len(rows) and not (rows[j].fresh and rows[j].caught_up and rows[j].held_disjoint(keys)):
            j += 1
        if j < len(rows):
            found.append(j)
        return rows[min(found)] if found else None

    def describe(self, p: int, now_ms: int) -> str:
        """Partition ``p``'s latest report in a few words, for a log line on an attempt still waiting."""
        rep = self.latest.get(p)
        if rep is None:
            return f"raw[{p}]: no report"
        return (f"raw[{p}]: {rep.worker} at {rep.position} of {rep.high}, {'fresh' if rep.fresh else 'not fresh'}, "
                f"{(now_ms - rep.ts_ms) / 1000:.1f} s ago, {len(rep.held)} held, events_end {rep.events_end}")

    def behind(self, since_ms: int, events_partition: int | None, events_position: int | None,
               keys: frozenset[str] = frozenset(), end_ms: int | None = None) -> list[int]:
        """Raw partitions not yet shown read past the attempt's end (``end_ms``: its end record's time
        + the margin; ``since_ms``: when the end was seen + the margin), or shown so by a report that
        counts on EventBatches not merged yet."""
        out = []
        for p in range(self.partitions):
            rep = self._passed(p, since_ms, end_ms, keys)
            if rep is None:
                out.append(p)
                continue
            need = rep.events_end.get(events_partition, 0) if events_partition is not None else 0
            if need > 0 and (events_position is None or events_position < need):
                out.append(p)
        return out
