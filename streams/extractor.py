"""The extractor stream: raw lines -> aggregated structured events keyed by workload.

A confluent-kafka batch consumer (``consume(num_messages=...)``) reads the raw
topic; every batch is scanned once by the catalog's multi-pattern prefilter and
only candidate lines are read, with the same ``Extractor`` the offline path uses.
Node-scoped lines (kernel, driver, Fabric Manager, NIC) are fanned out to every
workload attempt that held the node at the line's time, from an allocation
timeline built from the whole scheduler topic (every extractor reads all of it).
Lines that arrive before their workload's start wait (bounded in time and count).
Events are merged per workload within the batch and produced as one ``EventBatch``
per workload; offsets are committed after the batch is delivered (at least once).

    python -m firstfault.streams.extractor        # configured by FIRSTFAULT_* variables

``FIRSTFAULT_METRICS_PORT`` (default 9464, 0: off) serves ``/metrics``, ``/healthz`` and
``/readyz`` (:mod:`.health`): records consumed and dead-lettered, consumer lag per
assigned partition, producer delivery errors; alive while the loop turns, ready once
the consumer group assigned this worker its partitions (none is fine: an idle spare).
"""
from __future__ import annotations

import gc
import json
import logging
import os
import signal
import socket
import sys
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from itertools import accumulate
from pathlib import PurePosixPath
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from prometheus_client import CollectorRegistry, Counter, Gauge

from firstfault.connectors import metrics_names as M
from firstfault.rules.catalog import Catalog, load_catalog
from firstfault.rules.diagnose import EVIDENCE_HORIZON_S
from firstfault.rules.errors import RecordError
from firstfault.rules.extract import ExtractStats, Extractor, LineMemory, source_of
from firstfault.rules.model import EventSet
from firstfault.rules.prefixes import StampContext, read_head
from firstfault.schemas import DeadLetter, EventBatch, RawLine
from firstfault.schemas.avro import encode

from . import kafka
from .codecs import decode_raw, decode_scheduler, raw_lines
from .config import StreamConfig
from .health import Health, LagSeries, RulesMetrics, port_from_env
from .metrics_reader import MetricsReader
from .progress import PROGRESS_EVERY_S, ProgressTracker, progress_key
from .rules_feed import RulesFollower
from .timeline import Allocation, AllocationTimeline

log = logging.getLogger("firstfault.extractor")
NODE_SCOPED = ("syslog", "fabricmanager")
CONTEXT_RECORDS = 4096        # records re-read before a taken-over partition's committed offset, for context
LAG_EVERY_S = 5.0             # consumer lag is recomputed at most this often
STALE_AFTER_S = 120.0         # /healthz: a loop turn may take a 30 s flush and a commit; this is stuck
HELD_NAMED = 1000             # progress reports name at most this many attempts and hosts with held lines


@dataclass(slots=True)
class Held:
    rec: RawLine
    ts_ms: int
    since: float
    above: list[str] | None = None      # the lines above it when it arrived, for stamp inheritance
    at: tuple[int, int] | None = None   # (raw partition, offset): the commit stays below it while it waits


@dataclass
class Counters:
    records: int = 0
    candidates: int = 0
    events: int = 0
    batches_out: int = 0
    deadletters: int = 0
    held: int = 0
    unrouted_lines: int = 0
    node_history: int = 0
    refused: int = 0             # raw records that did not decode (never reached the core)
    failed: int = 0              # records the core could not handle (dead-lettered by the worker)
    by_host: dict[str, int] = field(default_factory=dict)


@dataclass
class Failure:
    """One record (or event) the core gave up on: the worker turns it into a dead letter."""

    reason: str
    step: str                                  # extract | encode (metrics_names.POISON_STAGES)
    rec: RawLine | None = None                 # the line, when known
    ref: tuple[str, int] | None = None         # else the (path, line) of the event it made


class Unencodable(ValueError):
    """An event the events topic cannot carry (Avro longs are 64-bit): its line is dead-lettered."""


_LONG = 2 ** 63


def check_encodable(ev) -> None:
    """Refuse, at the line that made it, an event whose rank or line is past an Avro long. Checked per
    event (a few compares) rather than found at encode time, where events of many lines are merged."""
    for name, v in (("rank", ev.rank), ("line", ev.line), ("gpu_index", ev.gpu_index), ("count", ev.count)):
        if isinstance(v, int) and not -_LONG <= v < _LONG:
            raise Unencodable(f"{name} {v} does not fit an Avro long")
    # (A field value past a long travels in the union's double branch: lossy, not refused.)


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:500]}"


def line_bytes(rec: RawLine) -> bytes:
    """The bytes of a line (surrogate escapes back to the bytes they stand for)."""
    try:
        return rec.text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:                 # a RawLine made without validation
        return rec.text.encode("utf-8", "surrogatepass")


class ExtractorCore:
    """Everything but the Kafka I/O: routing, extraction, aggregation. Testable on its own."""

    def __init__(self, cfg: StreamConfig, catalog: Catalog | None = None) -> None:
        self.cfg = cfg
        self.catalog = catalog or load_catalog(cfg.rules)
        self.timeline = AllocationTimeline()
        self._extractors: dict[tuple[str, int], Extractor] = {}
        self.memory = LineMemory()
        self.held: deque[Held] = deque()
        self.counters = Counters()
        self._sent_paths: set[tuple[str, int, str]] = set()
        # What the batches made since the last confirmed delivery used up, restored if they are lost:
        # the files they credited, the held lines and unrouted files they routed, the starts they replayed.
        self._unconfirmed_paths: list[tuple[str, int, str]] = []
        self._unconfirmed_held: list[Held] = []
        self._unconfirmed_unrouted: dict[str, Held] = {}
        self._unconfirmed_starts: list[Allocation] = []
        self._starts_again: list[Allocation] = []       # starts whose replay was lost: replayed at the next retry
        self._unrouted_paths: dict[str, Held] = {}     # files seen before their workload was known
        # Node-scoped lines of the last hold_s seconds, per host, replayed for a workload whose
        # start event arrives after them (a scheduler connector polls; lines do not wait).
        self._recent: dict[str, deque[Held]] = {}
        self._recent_files: dict[str, dict[str, Held]] = {}
        probe = Extractor(self.catalog, _placeholder())
        self.prefilter = probe.prefilter
        self._generic = probe
        self.metrics_reader = MetricsReader()
        self.metric_pending: deque[Held] = deque()      # samples whose workload is not known yet
        self._metric_hosts: dict[tuple[str, int], list[str]] = {}   # for the batches being built
        # For the batches being built: workload -> signature -> the (file, line) its lines came from,
        # so the correlator counts a line once however often it is read (EventBatch.lines).
        self._lines: dict[tuple[str, int], dict[str, list[tuple[str, int]]]] = {}
        self.failures: list[Failure] = []               # taken by the worker after every call

    def take_failures(self) -> list[Failure]:
        out, self.failures = self.failures, []
        return out

    def unconfirmed(self) -> bool:
        """Batches were made whose delivery the worker has not confirmed (or reported lost) yet."""
        return bool(self._unconfirmed_paths or self._unconfirmed_held or self._unconfirmed_unrouted
                    or self._unconfirmed_starts)

    def outputs_delivered(self) -> None:
        """Every batch made so far reached the broker."""
        self._unconfirmed_paths.clear()
        self._unconfirmed_held.clear()
        self._unconfirmed_unrouted.clear()
        self._unconfirmed_starts.clear()

    def outputs_lost(self) -> None:
        """Batches made since the last confirmed delivery may not have reached the broker. The worker reads
        the raw lines of its batch again; what else those batches used up is put back, to be made again: the
        files they credited (credited again when their lines are read again, or a workload's evidence
        inventory would lack them for good), the held lines and unrouted files they routed (retried), the
        recent lines replayed to a new workload (replayed again). What did arrive merges once: the
        correlator counts a line once (EventBatch.lines) and a file's credit is a set."""
        self._sent_paths.difference_update(self._unconfirmed_paths)
        self.held = deque(self._unconfirmed_held + list(self.held))
        for key, h in self._unconfirmed_unrouted.items():
            self._unrouted_paths.setdefault(key, h)
        self._starts_again += [a for a in self._unconfirmed_starts if all(a is not b for b in self._starts_again)]
        self._unconfirmed_paths, self._unconfirmed_held, self._unconfirmed_unrouted = [], [], {}
        self._unconfirmed_starts = []

    def has_waiting(self) -> bool:
        """Lines, files, samples or replays wait for ``retry_held``."""
        return bool(self.held or self._unrouted_paths or self.metric_pending or self._starts_again)

    def use_catalog(self, catalog: Catalog) -> None:
        """From the next batch on, extract with ``catalog`` (a newly published one: rules_feed.py)."""
        probe = Extractor(catalog, _placeholder())
        self.catalog, self.prefilter, self._generic = catalog, probe.prefilter, probe
        self._extractors.clear()            # made again on demand, from the new catalog

    def _failed(self, exc: BaseException, step: str, rec: RawLine | None = None,
                ref: tuple[str, int] | None = None) -> None:
        """One record must never stop the stream: note it and go on with the others."""
        self.counters.failed += 1
        log.warning("%s failed on %s: %s", step, f"{rec.path}:{rec.line}" if rec else ref, _reason(exc))
        self.failures.append(Failure(_reason(exc), step, rec, ref))

    # ------------------------------------------------------------ routing
    def extractor_for(self, alloc: Allocation) -> Extractor:
        key = (alloc.workload.workload_id, alloc.workload.attempt)
        ex = self._extractors.get(key)
        if ex is None or ex.workload is not alloc.workload:
            new = self._extractors[key] = Extractor(self.catalog, alloc.workload)
            if ex is not None:
                # A newer record (the end event's) makes the extractor again, for its hosts; what a file's
                # lines so far said of the lines below them belongs to the file, not the record: kept, as
                # the offline reader, which reads each file with one extractor, keeps it.
                new.carry_file_state(ex)
            ex = new
        return ex

    def _when(self, rec: RawLine, ts_ms: int) -> datetime | None:
        # A shipper that read the line after the fact (``firstfault ship``, a backfill) says when
        # it belongs in ``ingest_ts``; a live shipper's record time is close enough.
        if rec.ingest_ts is not None:
            anchor = rec.ingest_ts if rec.ingest_ts.tzinfo else rec.ingest_ts.replace(tzinfo=timezone.utc)
        else:
            anchor = datetime.fromtimestamp(ts_ms / 1000, timezone.utc) if ts_ms > 0 else datetime.now(timezone.utc)
        head = read_head(rec.text, StampContext(zone=timezone.utc, anchor=anchor))
        return head.stamp or anchor

    def route(self, rec: RawLine, ts_ms: int) -> list[Allocation] | None:
        """Workload attempts this line belongs to; None = not known yet (hold it)."""
        if rec.workload_id:
            alloc = self.timeline.get(rec.workload_id)
            return [alloc] if alloc else None
        source = rec.source or source_of(rec.path) or "app"
        host = rec.host or (self._generic.hosts.file_host(rec.path, source) if source in NODE_SCOPED else None)
        if host is None:
            host = PurePosixPath(rec.path).stem
        found = self.timeline.at(host, self._when(rec, ts_ms))
        return found or None

    def _horizon(self, rec: RawLine, allocs) -> tuple[list[Allocation], list[Allocation]]:
        """(allocations whose evidence horizon holds this line, those it is already past).

        Routing is generous (a line's zone is unknown until its workload is); the evidence
        inventory must not be, or a host's syslog would count for every job near it. A file
        counts for a workload once one of its lines falls in the horizon (or has no stamp),
        as ``engine.inventory`` decides offline.
        """
        source = rec.source or source_of(rec.path) or "app"
        if source not in NODE_SCOPED:
            return list(allocs), []
        inside, past = [], []
        span = timedelta(seconds=EVIDENCE_HORIZON_S)
        for a in allocs:
            ex = self.extractor_for(a)
            stamp = read_head(rec.text, ex.context(ex.hosts.file_host(rec.path, source), rec.path)).stamp
            end = a.end or a.workload.end_time
            if stamp is None or (stamp >= a.workload.start_time - span and (end is None or stamp <= end + span)):
                inside.append(a)
            elif end is not None and stamp > end + span:
                past.append(a)
        return inside, past

    def _credit(self, rec: RawLine, ts_ms: int, now: float, paths: dict) -> bool:
        """Credit this line's file to the workloads it feeds; True when nothing is left to decide."""
        allocs = self.route(rec, ts_ms)
        if allocs is None:
            key = _mem_key(rec)
            if key not in self._unrouted_paths:
                self._unrouted_paths[key] = Held(rec, ts_ms, now)
            return True
        open_ = [a for a in allocs if (a.workload.workload_id, a.workload.attempt, rec.path) not in self._sent_paths
                 and rec.path not in paths.get((a.workload.workload_id, a.workload.attempt), ())]
        if not open_:
            return True
        inside, past = self._horizon(rec, open_)
        for a in inside:
            paths.setdefault((a.workload.workload_id, a.workload.attempt), set()).add(rec.path)
        return len(inside) + len(past) == len(open_)

    # ------------------------------------------------------------ a batch
    def handle(self, records: list[tuple[RawLine, int]], now: float | None = None,
               texts: list[bytes | None] | None = None) -> dict[tuple[str, int], EventBatch]:
        """Extract a batch; returns one EventBatch per workload attempt (events merged).

        ``texts``: each line's bytes when the caller has them already (the Avro decoder does);
        None entries are made from the record. A record that raises is left out and noted in
        ``failures``; the others go on.
        """
        now = time.monotonic() if now is None else now
        out: dict[tuple[str, int], EventSet] = {}
        paths: dict[tuple[str, int], set[str]] = {}
        stats = ExtractStats()
        if texts is None:
            line_hits = self._scan([line_bytes(r) for r, _ in records])
        else:
            line_hits = self._scan([t if t is not None else line_bytes(r) for (r, _), t in zip(records, texts)])
        last_line: dict[str, int] = {}       # per file in this batch: the last line number seen
        settled: dict[str, bool] = {}        # per file: every workload it may feed is decided
        fed: set[tuple[str, int]] = set()
        self.counters.records += len(records)
        for (rec, ts_ms), anchor_hits in zip(records, line_hits):
            if anchor_hits is False:
                continue                     # the prefilter failed on it: already noted
            try:
                self._one(rec, ts_ms, anchor_hits, now, out, paths, fed, stats, last_line, settled)
            except Exception as exc:  # a record must never stop the worker
                self._failed(exc, "encode" if isinstance(exc, Unencodable) else "extract", rec)
        self._drain_metrics(fed, out)
        return self._batches(out, paths)

    def remember_context(self, records: list[tuple[RawLine, int]], now: float | None = None) -> None:
        """Lines a previous owner of their partition extracted already, read again for what the lines
        after them see (stamps inherited from the lines above, a file's lines above a match, the
        node-scoped lines a workload that starts later is given): remembered as ``handle`` would, never
        extracted, routed or counted."""
        now = time.monotonic() if now is None else now
        for rec, ts_ms in records:
            if (rec.source or source_of(rec.path)) == "metrics":
                continue
            key = _mem_key(rec)
            try:
                hits = self.prefilter.scan(line_bytes(rec)).get(0)
                if not rec.workload_id:
                    self._remember(rec, ts_ms, now, candidate=bool(hits))
            except Exception:                    # context only: a line it cannot read is just not remembered
                continue
            if hits:
                try:
                    self._remember_scope(rec, ts_ms, hits)
                except Exception:                # its scope is lost, never the line above the next ones
                    log.debug("context line %s:%s not read for its scope", rec.path, rec.line, exc_info=True)
            self.memory.add(key, rec.line, rec.text)

    def _remember_scope(self, rec: RawLine, ts_ms: int, anchor_ids) -> None:
        """What a context line says of the lines below it in its file (srun's tear-down, kubectl
        describe's object, a stated time), kept in its workloads' extractors without an event."""
        allocs = self.route(rec, ts_ms)
        if not allocs:
            return
        raw = line_bytes(rec)
        source = rec.source or source_of(rec.path) or "app"
        for alloc in allocs:
            ex = self.extractor_for(alloc)
            file_host = ex.hosts.file_host(rec.path, source)
            ex.read_line(rec.path, source, file_host, ex.context(file_host, rec.path), rec.line, raw, anchor_ids,
                         lambda r=rec: self.memory.above(_mem_key(r), r.line), ExtractStats(), remember_only=True)

    def _scan(self, encoded: list[bytes]) -> list:
        """Prefilter hits per line (anchor ids or None); False for a line the prefilter raised on."""
        if not encoded:
            return []
        offsets = list(accumulate([len(raw) + 1 for raw in encoded[:-1]], initial=0))    # each line's start
        try:
            hits = self.prefilter.scan(b"\n".join(encoded))
            return [hits.get(o) for o in offsets]
        except Exception as exc:
            log.warning("prefilter failed on a batch (%s): scanning it line by line", _reason(exc))
        out: list = []
        for raw in encoded:
            try:
                out.append(self.prefilter.scan(raw).get(0))
            except Exception as exc:
                self._failed(exc, "extract", None)
                out.append(False)
        return out

    def _one(self, rec: RawLine, ts_ms: int, anchor_hits, now: float, out: dict, paths: dict, fed: set,
             stats: ExtractStats, last_line: dict, settled: dict) -> None:
        host_key = rec.host or "?"
        by_host = self.counters.by_host
        by_host[host_key] = by_host.get(host_key, 0) + 1
        if (rec.source or source_of(rec.path)) == "metrics":
            self._metric_line(Held(rec, ts_ms, now), paths, fed)
            return
        # Which workloads a file feeds (the evidence inventory): routed once per run of
        # consecutive lines, again where the numbering jumps (another file, a rotation).
        key = _mem_key(rec)
        line = rec.line
        if last_line.get(key) != line - 1 or not settled[key]:
            settled[key] = self._credit(rec, ts_ms, now, paths)
        last_line[key] = line
        if not rec.workload_id:
            if anchor_hits:
                self._remember(rec, ts_ms, now, candidate=True)
            else:                        # the common case, inlined: a file's latest line per host
                files = self._recent_files.get(host_key)
                if files is None:
                    files = self._recent_files[host_key] = {}
                files[key] = Held(rec, ts_ms, now)
        if anchor_hits:
            self.counters.candidates += 1
            allocs = self.route(rec, ts_ms)
            if allocs is None:
                self._hold(rec, ts_ms, now)
            else:
                self._extract(rec, anchor_hits, allocs, out, stats)
        self.memory.add(key, line, rec.text)

    def _metric_line(self, h: Held, paths: dict, fed: set) -> bool:
        """A metrics sample names its workload; one whose start event has not come yet waits
        (bounded like held lines: ``hold_s``, ``hold_max``). True when it was routed."""
        rec = h.rec
        alloc = self.timeline.get(rec.workload_id) if rec.workload_id else None
        if alloc is None:
            if rec.workload_id:
                self.metric_pending.append(h)
                while len(self.metric_pending) > self.cfg.hold_max:
                    self.metric_pending.popleft()
                    self.counters.unrouted_lines += 1
            else:
                self.counters.unrouted_lines += 1
            return False
        key = (alloc.workload.workload_id, alloc.workload.attempt)
        self.metrics_reader.add(key, alloc.workload, rec)
        paths.setdefault(key, set()).add(rec.path)
        fed.add(key)
        return True

    def _drain_metrics(self, fed: set, out: dict) -> None:
        if not fed:
            return
        workloads = {k: a.workload for k in fed if (a := self.timeline.get(*k)) is not None}
        for key, (events, hosts) in self.metrics_reader.drain(workloads).items():
            if events:
                out.setdefault(key, EventSet()).update(events)
                self.counters.events += len(events)
            if hosts:
                self._metric_hosts[key] = sorted(set(self._metric_hosts.get(key, [])) | set(hosts))

    def _extract(self, rec: RawLine, anchor_ids, allocs: list[Allocation], out, stats: ExtractStats,
                 above: list[str] | None = None) -> None:
        raw = line_bytes(rec)
        source = rec.source or source_of(rec.path) or "app"
        for alloc in allocs:
            ex = self.extractor_for(alloc)
            file_host = ex.hosts.file_host(rec.path, source)
            ctx = ex.context(file_host, rec.path)
            lines_above = (lambda a=above: a) if above is not None else \
                (lambda r=rec: self.memory.above(_mem_key(r), r.line))
            ev = ex.read_line(rec.path, source, file_host, ctx, rec.line, raw, anchor_ids, lines_above, stats)
            if ev is not None:
                check_encodable(ev)
                key = (alloc.workload.workload_id, alloc.workload.attempt)
                out.setdefault(key, EventSet()).add(ev)
                self._lines.setdefault(key, {}).setdefault(ev.signature, []).append((_line_file(rec), rec.line))
                self.counters.events += 1

    def _hold(self, rec: RawLine, ts_ms: int, now: float) -> None:
        # Keep its context now: by the time its workload is known the file has moved on.
        self.held.append(Held(rec, ts_ms, now, list(self.memory.above(_mem_key(rec), rec.line))))
        self.counters.held += 1
        while len(self.held) > self.cfg.hold_max:
            self._give_up(self.held.popleft())      # over the count bound: counted, oldest first

    def waiting_for(self) -> set[str]:
        """The workload ids and hosts whose lines were read but wait unrouted for a start event: held
        lines, metrics samples, files not credited to a workload yet."""
        out: set[str] = set()
        for h in (*self.held, *self.metric_pending, *self._unrouted_paths.values()):
            rec = h.rec
            out.add(rec.workload_id or rec.host or PurePosixPath(rec.path).stem)
        return out

    def orphan_event(self, rec: RawLine):
        """The event a line makes on its own (UTC, no workload), for node history."""
        raw = line_bytes(rec)
        hits = self.prefilter.scan(raw)
        if not hits:
            return None
        source = rec.source or source_of(rec.path) or "app"
        ex = self._generic
        host = ex.hosts.file_host(rec.path, source) or rec.host
        ev = ex.read_line(rec.path, source, host, ex.context(host), rec.line, raw, hits[0], None, ExtractStats())
        return ev.to_schema() if ev is not None else None

    def _give_up(self, h: Held) -> None:
        self.counters.unrouted_lines += 1
        self.counters.node_history += 1

    def _remember(self, rec: RawLine, ts_ms: int, now: float, candidate: bool) -> None:
        host = rec.host or "?"
        if candidate:
            buf = self._recent.setdefault(host, deque(maxlen=1000))
            buf.append(Held(rec, ts_ms, now, list(self.memory.above(_mem_key(rec), rec.line))))
        else:
            self._recent_files.setdefault(host, {})[_mem_key(rec)] = Held(rec, ts_ms, now)

    def started(self, alloc: Allocation, now: float | None = None) -> dict[tuple[str, int], EventBatch]:
        """A new workload attempt started: give it the recent node-scoped lines of its hosts."""
        now = time.monotonic() if now is None else now
        out: dict[tuple[str, int], EventSet] = {}
        paths: dict[tuple[str, int], set[str]] = {}
        stats = ExtractStats()
        key = (alloc.workload.workload_id, alloc.workload.attempt)
        self._unconfirmed_starts.append(alloc)
        waiting = {id(h.rec) for h in self.held}      # retry_held routes those; do not count them twice
        for host in alloc.workload.nodes:
            for h in [h for h in self._recent.get(host, ())
                      if now - h.since <= self.cfg.hold_s and id(h.rec) not in waiting]:
                try:
                    if any(a is alloc for a in self.route(h.rec, h.ts_ms) or ()):
                        hits = self.prefilter.scan(line_bytes(h.rec))
                        if hits:
                            self._extract(h.rec, hits[0], [alloc], out, stats, above=h.above)
                except Exception as exc:  # dropped, so it cannot fail again for the next workload
                    self._recent[host].remove(h)
                    self._failed(exc, "encode" if isinstance(exc, Unencodable) else "extract", h.rec)
            for h in list(self._recent_files.get(host, {}).values()) + [h for h in self._recent.get(host, ())]:
                try:
                    if now - h.since <= self.cfg.hold_s and any(a is alloc for a in self.route(h.rec, h.ts_ms) or ()):
                        if self._horizon(h.rec, [alloc])[0]:
                            paths.setdefault(key, set()).add(h.rec.path)
                except Exception as exc:
                    self._recent_files.get(host, {}).pop(_mem_key(h.rec), None)
                    self._failed(exc, "extract", h.rec)
        return self._batches(out, paths)

    def retry_held(self, now: float | None = None) -> tuple[dict[tuple[str, int], EventBatch], list[Held]]:
        """Route held lines again (after new scheduler events); expire old ones to node history."""
        now = time.monotonic() if now is None else now
        out: dict[tuple[str, int], EventSet] = {}
        paths: dict[tuple[str, int], set[str]] = {}
        expired: list[Held] = []
        keep: deque[Held] = deque()
        stats = ExtractStats()
        while self.held:
            h = self.held.popleft()
            try:
                allocs = self.route(h.rec, h.ts_ms)
                if allocs:
                    self._unconfirmed_held.append(h)
                    hits = self.prefilter.scan(line_bytes(h.rec))
                    if hits:
                        self._extract(h.rec, hits[0], allocs, out, stats, above=h.above)
                    for a in allocs:
                        paths.setdefault((a.workload.workload_id, a.workload.attempt), set()).add(h.rec.path)
                elif now - h.since > self.cfg.hold_s:
                    expired.append(h)
                    self._give_up(h)
                else:
                    keep.append(h)
            except Exception as exc:  # dropped: a held line is tried once per scheduler event
                self._failed(exc, "encode" if isinstance(exc, Unencodable) else "extract", h.rec)
        self.held = keep
        for key, h in list(self._unrouted_paths.items()):
            try:
                allocs = self.route(h.rec, h.ts_ms)
                if allocs:
                    for a in self._horizon(h.rec, allocs)[0]:
                        paths.setdefault((a.workload.workload_id, a.workload.attempt), set()).add(h.rec.path)
                    del self._unrouted_paths[key]
                    self._unconfirmed_unrouted[key] = h
                elif now - h.since > self.cfg.hold_s:
                    del self._unrouted_paths[key]
            except Exception as exc:
                self._unrouted_paths.pop(key, None)
                self._failed(exc, "extract", h.rec)
        fed: set[tuple[str, int]] = set()
        waiting, self.metric_pending = self.metric_pending, deque()
        for h in waiting:                       # in arrival order: a series stays in file order
            try:
                routed = self._metric_line(h, paths, fed)
            except Exception as exc:
                self._failed(exc, "extract", h.rec)
                continue
            if not routed and now - h.since > self.cfg.hold_s:
                self.metric_pending.pop()
                self.counters.unrouted_lines += 1
        self._drain_metrics(fed, out)
        batches = self._batches(out, paths)
        again, self._starts_again = self._starts_again, []
        for alloc in again:
            if self.timeline.get(alloc.workload.workload_id, alloc.workload.attempt) is alloc:
                for key, batch in self.started(alloc, now).items():
                    batches[key] = _merge(batches.get(key), batch)
        return batches, expired

    def _batches(self, out: dict, paths: dict) -> dict[tuple[str, int], EventBatch]:
        batches: dict[tuple[str, int], EventBatch] = {}
        lines_of, self._lines = self._lines, {}
        for key in sorted(set(out) | set(paths) | set(self._metric_hosts)):
            new_paths = sorted(p for p in paths.get(key, ()) if (key[0], key[1], p) not in self._sent_paths)
            events = []
            occurrences = lines_of.get(key, {})
            files: dict[str, int] = {}
            runs: list[list[int]] = []
            for e in (out[key].sorted() if key in out else ()):
                try:
                    events.append(e.to_schema())
                except Exception as exc:  # one event the contract refuses: that line's dead letter
                    self._failed(exc, "encode", ref=(e.path, e.line))
                    continue
                runs.append(line_runs(occurrences.get(e.signature, ()), files))
            if not events and not new_paths and key not in self._metric_hosts:
                continue
            sent = [(key[0], key[1], p) for p in new_paths]
            self._sent_paths.update(sent)
            self._unconfirmed_paths += sent
            batches[key] = EventBatch(workload_id=key[0], attempt=key[1], events=events, paths=new_paths,
                                      metric_hosts=self._metric_hosts.pop(key, []),
                                      line_files=list(files) if any(runs) else [],
                                      lines=runs if any(runs) else [])
        return batches


def encode_batch(batch: EventBatch, failures: list[Failure], limit: int | None = None) -> list[bytes]:
    """The records that carry ``batch``: one, or halves (recursively) of one over ``limit`` bytes; an
    event that does not encode is left out and noted in ``failures``."""
    limit = MAX_OUTPUT_BYTES if limit is None else limit
    try:
        value = encode(batch)
    except Exception as exc:
        return _encode_apart(batch, failures, _reason(exc), limit)
    if len(value) <= limit:
        return [value]
    if len(batch.events) <= 1:
        failures.append(Failure(f"EventBatch of {len(value)} bytes, over {limit}", "encode", ref=_first_ref(batch)))
        return []
    half = len(batch.events) // 2      # the correlator merges batches: any split is the same evidence
    first = _some_events(batch, range(half))
    second = _some_events(batch, range(half, len(batch.events))).model_copy(update={"paths": [], "metric_hosts": []})
    return encode_batch(first, failures, limit) + encode_batch(second, failures, limit)


def _encode_apart(batch: EventBatch, failures: list[Failure], reason: str, limit: int) -> list[bytes]:
    """The batch did not encode: find the events that do not, dead-letter their lines, send the rest."""
    good = []
    for i, ev in enumerate(batch.events):
        try:
            encode(EventBatch(workload_id="-", events=[ev]))
            good.append(i)
        except Exception as exc:
            failures.append(Failure(_reason(exc), "encode", ref=ev.ref.key()))
    if len(good) == len(batch.events):      # the batch itself (its id, its paths) is what fails
        failures.append(Failure(reason, "encode", ref=_first_ref(batch)))
        return []
    return encode_batch(_some_events(batch, good), failures, limit)


def _some_events(batch: EventBatch, keep) -> EventBatch:
    """``batch`` with only the events at the indices ``keep``, each with its own lines: ``lines`` is
    per event, in order, and the correlator's ledger counts an event's lines by that place."""
    keep = list(keep)
    lines = [batch.lines[i] for i in keep] if batch.lines else []
    return batch.model_copy(update={"events": [batch.events[i] for i in keep],
                                    "lines": lines if any(lines) else [],
                                    "line_files": batch.line_files if any(lines) else []})


def _line_file(rec: RawLine) -> str:
    """A file as the correlator tells lines apart: the host, the workload it ships for, the path."""
    return f"{rec.host or ''}\x1f{rec.workload_id or ''}\x1f{rec.path}"


def line_runs(occurrences, files: dict[str, int]) -> list[int]:
    """(file, line) pairs -> runs of consecutive lines, flat (file index, first, last); ``files``
    gives each file its index in the batch (new ones appended)."""
    out: list[int] = []
    for f, line in sorted(set(occurrences)):
        i = files.setdefault(f, len(files))
        if out and out[-3] == i and out[-1] == line - 1:
            out[-1] = line
        else:
            out += [i, line, line]
    return out


def _mem_key(rec: RawLine) -> str:
    """One file's lines: an application file is its workload's; a host's syslog is one file."""
    return f"{rec.workload_id or ''}\x1f{rec.path}"


def _placeholder():
    from firstfault.schemas import WorkloadRecord

    return WorkloadRecord.model_validate({"workload_id": "-", "state": "RUNNING", "start_time": "2000-01-01T00:00:00Z"})


class Metrics:
    """The extractor's Prometheus metrics (names from connectors/metrics_names.py), in its own registry.

    Nothing here is touched per line: the loop counts once per batch (``ExtractorWorker.after_step``).
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.consumed = Counter(M.base_name(M.RECORDS_CONSUMED), "input records", ["worker", "topic"], registry=r)
        self.deadletter = Counter(M.base_name(M.DEADLETTER), "records refused", ["stage"], registry=r)
        self.poison = Counter(M.base_name(M.POISON_RECORDS), "records a worker could not use, by where it failed",
                              ["worker", "stage"], registry=r)
        self.lag = Gauge(M.CONSUMER_LAG, "records between the consumer's position and the high watermark",
                         ["worker", "topic", "partition"], registry=r)
        self.publish_errors = Counter(M.base_name(M.PUBLISH_ERRORS), "records the broker did not take", ["sink"],
                                      registry=r)
        # The children the loop touches, made once (they also show 0 before anything happened).
        self.raw_consumed = self.consumed.labels("extractor", "raw")
        self.dead = self.deadletter.labels("extractor")
        self.kafka_errors = self.publish_errors.labels("kafka")
        self.poisoned = {stage: self.poison.labels("extractor", stage) for stage in M.POISON_STAGES}


# Output records are split below this (a default Kafka broker takes 1 MB), dead-lettered past it.
MAX_OUTPUT_BYTES = 1_000_000
# Delivery errors that a retry cannot cure: the record is dead-lettered, the batch is not read again.
PERMANENT = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_MSG, KafkaError.INVALID_MSG_SIZE,
                       KafkaError.INVALID_RECORD, KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_TIMESTAMP,
                       KafkaError._INVALID_ARG, KafkaError._INVALID_TYPE})
BUFFER_WAIT_S = 60.0          # how long produce() waits for room in the local queue


class ExtractorWorker:
    """The Kafka side: batch consume, extract, produce, commit. One process, one loop.

    One record never stops the loop: whatever fails on it (decoding, extraction, encoding
    its events, a broker refusing them) ends as a dead letter with the reason, counted on
    ``POISON_RECORDS``, and the batch commits. Only a failure a retry can cure (the broker
    unreachable) makes the batch be read again.

    ``metrics_port``: serve /metrics, /healthz and /readyz there (0: do not);
    ``metrics_required``: a port that cannot be bound is an error (else a warning).
    """

    def __init__(self, cfg: StreamConfig, catalog: Catalog | None = None, metrics_port: int = 0,
                 metrics_required: bool = True) -> None:
        self.cfg = cfg
        self.metrics = Metrics()
        self.health = Health(self.metrics.registry, "extractor", stale_after_s=STALE_AFTER_S)
        self.health.not_ready("connecting: waiting for the consumer group to assign partitions")
        self.health.serve(metrics_port, required=metrics_required)     # answers "starting" while we connect
        self.lag = LagSeries(self.metrics.lag, "extractor", {t: n for n, t in cfg.topics.items()})
        self._counted = 0                  # records + refused ones already added to RECORDS_CONSUMED
        self._lag_due = 0.0
        self._joined = False               # the group assigned this member its partitions (maybe none)
        self._fresh = True                 # the last consume drained what was fetched (progress.py)
        self._context_until: dict[int, int] = {}   # raw partition -> its committed offset: below, context only
        self._brokers_down = False
        self._delivery_log_due = 0.0
        self._failed_deliveries = 0        # producer records the broker refused for now (retriable), ever
        self._refused_outputs: list[tuple[Any, Any]] = []     # (message, error): refused for good
        self.core = ExtractorCore(cfg, catalog)
        self.rules = RulesFollower(cfg, "extractor", self.core.catalog, RulesMetrics(self.metrics.registry))
        self.worker_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.progress = ProgressTracker(cfg.topic("raw"), cfg.topic("events"), self.worker_id)
        self._progress_due = 0.0
        # Every delivery reports back: events offsets feed the progress watermark (a few per batch).
        self.producer = kafka.producer(cfg, on_delivery=self._delivered)
        self.consumer = kafka.consumer(cfg, group=cfg.extractor_group, error_cb=self._kafka_error)
        self.consumer.subscribe([cfg.topic("raw")], on_assign=self._assigned, on_revoke=self._revoked,
                                on_lost=self._revoked)
        # The whole scheduler topic, every partition, from the beginning: no group.
        self.sched = kafka.consumer(cfg, group=f"{cfg.extractor_group}-timeline-{uuid.uuid4().hex[:8]}")
        meta = self.sched.list_topics(cfg.topic("scheduler"), timeout=10).topics.get(cfg.topic("scheduler"))
        parts = sorted(meta.partitions) if meta and meta.partitions else list(range(cfg.partitions))
        self.sched.assign([TopicPartition(cfg.topic("scheduler"), p, 0) for p in parts])
        # Replay's time -> offset index, for brokers whose time index is wrong (Tansu).
        from firstfault.connectors.sinks.offset_index import OffsetIndex

        self.offsets = OffsetIndex.for_config(cfg)
        self._stop = False

    def stop(self, *_: object) -> None:
        self._stop = True

    # ------------------------------------------------------------ output that never fails

    def _produce(self, topic: str, key: bytes | None, value: bytes) -> str | None:
        """Queue one record; None when queued, else why not (it never raises)."""
        deadline = time.monotonic() + BUFFER_WAIT_S
        while True:
            try:
                self.producer.produce(topic, key=key, value=value)
                return None
            except BufferError:                  # the local queue is full: let deliveries drain it
                if time.monotonic() > deadline:
                    self._failed_deliveries += 1     # retriable: the batch is read again
                    return "the producer queue stayed full"
                self.producer.poll(0.1)
            except (KafkaException, TypeError, ValueError) as exc:   # refused at once: too large, bad topic
                self.metrics.kafka_errors.inc()
                return f"{type(exc).__name__}: {exc}"

    def dead_letter(self, msg, reason: str, stage: str = "extractor", step: str = "decode") -> None:
        """The refused record, its reason and origin on the dead-letter topic; never raises.

        A record over ``DEAD_LETTER_HEAD`` goes as its head, size and SHA-256."""
        ts = msg.timestamp()[1] if msg.timestamp() and msg.timestamp()[1] > 0 else None
        self._send_dead(DeadLetter.of(reason, stage, msg.topic(), msg.partition(), msg.offset(), msg.key(),
                                      msg.value(), ts, step), msg.key(), step)

    def _send_dead(self, dl: DeadLetter, key: bytes | None, step: str) -> None:
        self.core.counters.deadletters += 1
        self.metrics.dead.inc()
        self.metrics.poisoned.get(step, self.metrics.poisoned["process"]).inc()
        try:
            value = dl.model_dump_json().encode()
        except Exception as exc:                 # DeadLetter.of makes it serializable; belt and braces
            value = json.dumps({"reason": f"unserializable dead letter: {exc}", "stage": dl.stage}).encode()
        why = self._produce(self.cfg.topic("deadletter"), key if key and len(key) <= 1024 else None, value)
        if why is not None:
            log.error("dead letter for %s[%d]@%d not sent: %s", dl.topic, dl.partition, dl.offset, why)

    def _blame(self, failures: list[Failure], origin: dict) -> None:
        """Dead letters for what the core gave up on: the original message when it is in this batch."""
        for f in failures:
            msg = None
            if f.rec is not None:
                msg = origin.get(id(f.rec)) or origin.get((f.rec.path, f.rec.line))
            elif f.ref is not None:
                msg = origin.get(f.ref)
            if msg is not None:
                self.dead_letter(msg, f.reason, step=f.step)
                continue
            # A held line or an event from an earlier batch: its offset is not known here.
            value = f.rec.raw() if f.rec is not None else json.dumps({"path": f.ref[0] if f.ref else None,
                                                                      "line": f.ref[1] if f.ref else None}).encode()
            self._send_dead(DeadLetter.of(f.reason, "extractor", self.cfg.topic("raw"), -1, -1,
                                          (f.rec.host or "").encode() if f.rec is not None else None, value,
                                          step=f.step), None, f.step)

    # ------------------------------------------------------------ the scheduler topic

    def poll_timeline(self) -> int:
        n = 0
        while True:
            msgs = self.sched.consume(num_messages=1000, timeout=0.0)
            if not msgs:
                return n
            for m in msgs:
                if m.error():
                    continue
                self.offsets.note_message(m)
                try:
                    ev = decode_scheduler(m.value())
                except RecordError:
                    continue      # the correlator dead-letters scheduler records; one report is enough
                try:
                    known = self.core.timeline.get(ev.workload.workload_id, ev.workload.attempt) is not None
                    alloc = self.core.timeline.apply(ev)
                    if not known:
                        self.publish(self.core.started(alloc))
                    n += 1
                except Exception as exc:  # one scheduler record must not stop the worker either
                    log.exception("timeline failed on %s[%d]@%d", m.topic(), m.partition(), m.offset())
                    self.dead_letter(m, _reason(exc), step="timeline")
                self._blame(self.core.take_failures(), {})

    def keep_for_node_history(self, expired: list[Held]) -> None:
        """Lines that no workload claimed: extracted without a workload and kept per host."""
        for h in expired:
            try:
                ev = self.core.orphan_event(h.rec)
                if ev is None:
                    continue
                value = encode(ev)
            except Exception as exc:
                self._blame([Failure(_reason(exc), "extract", h.rec)], {})
                continue
            key = (ev.host or h.rec.host or "?").encode()
            why = self._produce(self.cfg.topic("node-history"), key, value)
            if why is not None:
                log.warning("node history for %s not sent: %s", key, why)

    # ------------------------------------------------------------ events out

    def publish(self, batches: dict[tuple[str, int], EventBatch], origin: dict | None = None) -> None:
        """Produce each workload's batch: split when large, a refused event dead-lettered, never raises."""
        origin = origin or {}
        for (wid, _), batch in batches.items():
            failures: list[Failure] = []
            for value in encode_batch(batch, failures):
                why = self._produce(self.cfg.topic("events"), wid.encode(), value)
                if why is not None:
                    failures.append(Failure(f"events record not produced: {why}", "publish",
                                            ref=_first_ref(batch)))
            self._blame(failures, origin)
            self.core.counters.batches_out += 1

    # ------------------------------------------------------------ the loop

    def step(self, timeout: float = 0.5) -> int:
        failed_before = self._failed_deliveries
        if (catalog := self.rules.poll()) is not None:       # a newly published catalog: between batches
            self.core.use_catalog(catalog)
        if self.poll_timeline():
            self._retry_held()
        msgs = self.consumer.consume(num_messages=self.cfg.batch, timeout=timeout)
        # Fewer than asked: what the consumer had fetched is drained, so its fetch high watermarks are
        # recent; a full batch means a backlog, whose highs can be many seconds old (progress.py).
        self._fresh = len(msgs) < self.cfg.batch
        if self._context_until:
            msgs = self._read_context(msgs)
        good = [m for m in msgs if m.error() is None]
        if len(good) != len(msgs):
            for m in msgs:
                if m.error() is not None:
                    log.warning("consumer error: %s", m.error())
        self._note_offsets(good)
        # Avro RawLines decoded in one pass; anything else (or refused there) by decode_raw, one by one.
        fast, fast_texts = raw_lines([m.value() for m in good])
        records: list[tuple[RawLine, int]] = []
        texts: list[bytes | None] = []
        kept = []
        for m, rec, text in zip(good, fast, fast_texts):
            if rec is None:
                try:
                    rec = decode_raw(m.value(), m.key(), m.headers(), m.offset())
                except RecordError as exc:
                    self.core.counters.refused += 1
                    self.dead_letter(m, str(exc))
                    continue
                except Exception as exc:  # a record must never stop the worker
                    self.core.counters.refused += 1
                    self.dead_letter(m, _reason(exc))
                    continue
            records.append((rec, m.timestamp()[1]))
            texts.append(text)
            kept.append(m)
        origin = Origin(records, kept)
        if records:
            self.publish(self._handle(records, origin, texts), origin)
            self._place_held(origin)
        if self.core.has_waiting():
            self._retry_held()
        if msgs or self.core.unconfirmed():
            # At least once: everything produced for this batch is delivered before its offsets commit;
            # what was lost is read (the batch) or made (held lines, replays, credits) again.
            left = self.producer.flush(30)
            self._refused_for_good()
            if left or self._failed_deliveries != failed_before:
                self.core.outputs_lost()
                if msgs:
                    self.rewind(msgs)
            else:
                if msgs:
                    self._commit(good)
                self.core.outputs_delivered()
        self.report_progress()
        self.after_step()
        return len(msgs)

    def _read_context(self, msgs: list) -> list:
        """The records before a taken-over partition's committed offset (``_prime``) go to the context
        only; the rest, returned, are this member's to extract and commit."""
        context, rest = [], []
        for m in msgs:
            until = self._context_until.get(m.partition()) if m.error() is None else None
            if until is None:
                rest.append(m)
                continue
            if m.offset() + 1 >= until:
                del self._context_until[m.partition()]
            if m.offset() >= until:
                rest.append(m)
                continue
            try:
                context.append((decode_raw(m.value(), m.key(), m.headers(), m.offset()), m.timestamp()[1]))
            except Exception:                    # refused when its owner read it: nothing to remember
                continue
        self.core.remember_context(context)
        return rest

    def _prime(self, consumer, partitions) -> None:
        """A partition taken over mid-stream starts CONTEXT_RECORDS before its committed offset, so the
        lines after that offset are read with what was above them, as by the member that had it (a
        line extracted without it can inherit another stamp and make another event)."""
        try:
            committed = consumer.committed(partitions, timeout=5.0)
        except KafkaException as exc:
            log.warning("committed offsets not known at assignment, reading without context: %s", exc)
            return
        moved = False
        for tp in committed:
            if tp.offset <= 0:
                continue
            try:
                low, _ = consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=2.0)
            except KafkaException:
                low = 0
            start = max(low if low is not None and low >= 0 else 0, tp.offset - CONTEXT_RECORDS)
            if start < tp.offset:
                self._context_until[tp.partition] = tp.offset
                tp.offset, moved = start, True
        if moved:
            consumer.assign(committed)

    def _note_offsets(self, msgs) -> None:
        """Replay's time index: the first message of each (partition, hour) in the batch is the one
        that can lower a noted offset (a partition's offsets ascend), so only those are noted."""
        if not self.offsets.enabled:
            return
        seen: set = set()
        bucket_ms = self.offsets.bucket_ms
        for m in msgs:
            ts_type, ts = m.timestamp()
            key = (m.topic(), m.partition(), ts // bucket_ms if ts_type and ts > 0 else None)
            if key not in seen:
                seen.add(key)
                self.offsets.note_message(m)

    def _handle(self, records: list[tuple[RawLine, int]], origin, texts: list[bytes | None] | None = None
                ) -> dict[tuple[str, int], EventBatch]:
        """``core.handle``, whose per-record failures become dead letters; if the batch as a whole
        raises (past the per-record guards), each record alone, so only the culprit is refused."""
        counted = self.core.counters.records
        try:
            out = self.core.handle(records, texts=texts)
        except Exception:
            log.exception("extraction of a batch of %d failed: handling its records one by one", len(records))
            self._blame(self.core.take_failures(), origin)
            out = {}
            for r in records:
                try:
                    for key, b in self.core.handle([r]).items():
                        out[key] = _merge(out.get(key), b)
                except Exception as exc:
                    self.core.failures.append(Failure(_reason(exc), "extract", r[0]))
            self.core.counters.records = counted + len(records)       # each counted once
        self._blame(self.core.take_failures(), origin)
        return out

    def _retry_held(self) -> None:
        try:
            batches, expired = self.core.retry_held()
        except Exception:                        # past the per-line guards: logged, the loop goes on
            log.exception("retrying held lines failed")
            self.metrics.poisoned["extract"].inc()
            batches, expired = {}, []
        self._blame(self.core.take_failures(), {})
        self.publish(batches)
        self.keep_for_node_history(expired)

    def _place_held(self, origin: Origin) -> None:
        """Note where this batch's newly held lines (and metrics samples) sit in the raw topic: they
        are appended last, so the walk stops at the first one placed already."""
        for queue in (self.core.held, self.core.metric_pending):
            for h in reversed(queue):
                if h.at is not None:
                    break
                m = origin.get(id(h.rec))
                if m is None:
                    break
                h.at = (m.partition(), m.offset())

    def held_floor(self) -> dict[int, int]:
        """Per raw partition, the offset of the oldest line still held in memory (waiting for its
        workload's start): the commit stays at it, so a member that leaves or dies loses nothing (its
        successor reads those lines again; the correlator counts each line once)."""
        floor: dict[int, int] = {}
        for queue in (self.core.held, self.core.metric_pending):
            for h in queue:
                if h.at is not None and h.at[1] < floor.get(h.at[0], h.at[1] + 1):
                    floor[h.at[0]] = h.at[1]
        return floor

    def _commit(self, good) -> None:
        """Commit what was consumed, but never past a line still held; ``good``: this batch's messages
        without an error, in order."""
        last = {}                        # one consume() call: each partition's offsets ascend
        for m in good:
            last[m.partition()] = m      # the worker reads only the raw topic
        nxt = {p: m.offset() + 1 for p, m in last.items()}
        stamps: dict[int, int] = {}
        for m in good:
            ts_type, ts = m.timestamp()
            if ts_type and ts > stamps.get(m.partition(), -1):
                stamps[m.partition()] = ts
        floor = self.held_floor()
        topic = self.cfg.topic("raw")
        self.consumer.commit(offsets=[TopicPartition(topic, p, min(o, floor.get(p, o))) for p, o in nxt.items()],
                             asynchronous=False)
        self.progress.committed(nxt, stamps)

    def _refused_for_good(self) -> None:
        """Output the broker refused for good (too large...): dead-lettered, the batch is not read again."""
        refused, self._refused_outputs = self._refused_outputs, []
        for msg, err in refused:
            topic = msg.topic() if msg is not None else "?"
            if topic in (self.cfg.topic("deadletter"), self.cfg.topic("progress")):
                continue                         # nothing to fall back on; logged in _delivered
            value = msg.value() if msg is not None else None
            self._send_dead(DeadLetter.of(f"the broker refused the {topic} record: {err}", "extractor", topic,
                                          msg.partition() if msg is not None else -1, -1,
                                          msg.key() if msg is not None else None, value, step="publish"),
                            msg.key() if msg is not None else None, "publish")
        if refused:
            self.producer.flush(10)

    # ------------------------------------------------------------ progress watermark

    def report_progress(self, force: bool = False) -> None:
        """Each owned raw partition's position and fetch high watermark, at most every PROGRESS_EVERY_S."""
        now = time.monotonic()
        if not force and now < self._progress_due:
            return
        self._progress_due = now + PROGRESS_EVERY_S
        topic = self.cfg.topic("raw")
        try:
            unknown = self.progress.unknown()
            if unknown:
                for tp in self.consumer.committed([TopicPartition(topic, p) for p in unknown], timeout=2.0):
                    start = tp.offset
                    if start < 0:                # never committed: the consumer starts at the low watermark
                        low, _ = self.consumer.get_watermark_offsets(TopicPartition(topic, tp.partition),
                                                                     cached=True)
                        start = low if low is not None and low >= 0 else 0
                    self.progress.start_at(tp.partition, start)
            highs = {}
            # Read that far means nothing of an attempt is left to route: the reports name the attempts
            # and hosts whose lines wait for a start event; past HELD_NAMED of them, the report counts
            # only once every start event is read (the scheduler topic read to its end).
            held = self.core.waiting_for()
            current = len(held) <= HELD_NAMED or self._timeline_current()
            for p in self.progress.positions:
                _, high = self.consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)
                highs[p] = high if current and high is not None and high >= 0 else -1
        except KafkaException as exc:
            log.debug("progress not reported: %s", exc)
            return
        named = sorted(held) if len(held) <= HELD_NAMED else []
        for rep in self.progress.reports(highs, int(time.time() * 1000), named, fresh=self._fresh):
            self._produce(self.cfg.topic("progress"), progress_key(topic, rep.partition),
                          rep.model_dump_json().encode())
        self.producer.poll(0)

    def _timeline_current(self) -> bool:
        """The scheduler topic read as far as its last fetch reported (a restarted worker catching up is not)."""
        for tp in self.sched.position(self.sched.assignment()):
            _, high = self.sched.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), cached=True)
            if high is None or high < 0 or (tp.offset if tp.offset >= 0 else 0) < high:
                return False
        return True

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        freeze_startup_heap()
        while not self._stop:
            try:
                self.step()
            except KafkaException as exc:        # the broker, not a record: wait and go on
                log.warning("step failed: %s", exc)
                time.sleep(1.0)
        self.close()

    def close(self) -> None:
        self.rules.close()
        self.offsets.close()
        self.producer.flush(10)
        self.consumer.close()
        self.sched.close()
        self.health.close()

    # ------------------------------------------------------------ metrics and probes

    def after_step(self) -> None:
        """Once per loop turn, O(1) unless the lag is due: heartbeat, records counted, lag."""
        self.health.beat()
        c = self.core.counters
        seen = c.records + c.refused             # every raw record is handled or refused at decoding
        if seen != self._counted:
            self.metrics.raw_consumed.inc(seen - self._counted)
            self._counted = seen
        now = time.monotonic()
        if now >= self._lag_due:
            self._lag_due = now + LAG_EVERY_S
            self.refresh_lag()

    def refresh_lag(self) -> None:
        """CONSUMER_LAG for the raw partitions this member owns and the scheduler partitions it reads."""
        if self._brokers_down:
            try:
                self.consumer.list_topics(self.cfg.topic("raw"), timeout=1.0)
                self._brokers_down = False
                self._readiness()
            except KafkaException:
                return
        try:
            lags = kafka.consumer_lag(self.consumer)
            lags.update(kafka.consumer_lag(self.sched, start=0))      # the timeline reads from offset 0
        except KafkaException as exc:
            log.debug("consumer lag not refreshed: %s", exc)
            return
        self.lag.show(lags)

    def _readiness(self) -> None:
        if self._brokers_down:
            self.health.not_ready("all brokers are down")
        elif not self._joined:
            self.health.not_ready("rebalancing: waiting for the consumer group to assign partitions")
        else:
            self.health.ready()

    def _assigned(self, _consumer, partitions) -> None:
        self._joined = True
        self._lag_due = 0.0                      # show the new partitions' lag at the next turn
        self._progress_due = 0.0
        self.progress.assigned(tp.partition for tp in partitions)
        self._prime(_consumer, partitions)
        self._readiness()
        log.info("assigned %d partition(s) of %s", len(partitions), self.cfg.topic("raw"))

    def _revoked(self, _consumer, partitions) -> None:
        self._joined = False
        self.progress.revoked(tp.partition for tp in partitions)
        for tp in partitions:
            self._context_until.pop(tp.partition, None)
        self._readiness()

    def _kafka_error(self, err: KafkaError) -> None:
        if err.code() == KafkaError._ALL_BROKERS_DOWN:
            self._brokers_down = True
            self._readiness()
            log.warning("consumer: %s", err.str())

    def rewind(self, msgs) -> None:
        """Some output of this batch did not reach the broker: read the batch again instead of
        committing past it (the correlator merges the events it then sees twice)."""
        first: dict[tuple[str, int], int] = {}
        for m in msgs:
            if m.error() is None:
                key = (m.topic(), m.partition())
                first[key] = min(first.get(key, m.offset()), m.offset())
        for (topic, part), off in first.items():
            try:
                self.consumer.seek(TopicPartition(topic, part, off))
            except KafkaException as exc:          # revoked meanwhile: its new owner reads from the commit
                log.warning("rewind of %s[%d] failed: %s", topic, part, exc)
        log.warning("not every record of the batch was delivered; reading %d record(s) again", len(msgs))

    def _delivered(self, err, msg) -> None:
        """The producer's delivery report: events offsets for the watermark; failures sorted."""
        if err is None:
            if msg is not None:
                self.progress.delivered(msg.topic(), msg.partition(), msg.offset())
            return
        self.metrics.kafka_errors.inc()
        if err.code() in PERMANENT:
            self._refused_outputs.append((msg, err))
        else:
            self._failed_deliveries += 1
        now = time.monotonic()
        if now >= self._delivery_log_due:        # at most one line per 10 s, however many fail
            self._delivery_log_due = now + 10.0
            log.warning("delivery to %s failed: %s", msg.topic() if msg is not None else "?", err)


def freeze_startup_heap() -> None:
    """Move what start-up made (the catalog, compiled patterns, clients) out of the garbage
    collector's sight: every batch allocates thousands of records, and each full collection
    walked all of it again (measured: about half of the loop's time in bench_stream.py)."""
    gc.collect()
    gc.freeze()


class Origin:
    """The message each record of a batch came from, by ``id(record)`` and by ``(path, line)``:
    built only when a failure asks (rarely), not for every record of every batch."""

    def __init__(self, records: list[tuple[RawLine, int]], msgs: list) -> None:
        self._records, self._msgs = records, msgs
        self._map: dict | None = None

    def get(self, key, default=None):
        if self._map is None:
            self._map = {}
            for (rec, _), m in zip(self._records, self._msgs):
                self._map[id(rec)] = m
                self._map[(rec.path, rec.line)] = m
        return self._map.get(key, default)

    def __bool__(self) -> bool:
        return True


def _first_ref(batch: EventBatch) -> tuple[str, int] | None:
    return batch.events[0].ref.key() if batch.events else None


def _merge(a: EventBatch | None, b: EventBatch) -> EventBatch:
    """Two batches of one workload (the correlator merges events by signature, so a list join is exact);
    ``b``'s line runs renumbered onto the joined ``line_files``."""
    if a is None:
        return b
    files = list(a.line_files)
    index = {f: i for i, f in enumerate(files)}

    def renumbered(runs: list[int]) -> list[int]:
        out = list(runs)
        for i in range(0, len(runs), 3):
            name = b.line_files[runs[i]]
            if name not in index:
                index[name] = len(files)
                files.append(name)
            out[i] = index[name]
        return out

    lines = (a.lines or [[] for _ in a.events]) + ([renumbered(r) for r in b.lines] if b.lines else
                                                   [[] for _ in b.events])
    known = any(lines)
    return a.model_copy(update={"events": a.events + b.events, "paths": sorted(set(a.paths) | set(b.paths)),
                                "metric_hosts": sorted(set(a.metric_hosts) | set(b.metric_hosts)),
                                "lines": lines if known else [], "line_files": files if known else []})


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s extractor %(levelname)s %(message)s")
    cfg = StreamConfig.from_env()
    if not cfg.bootstrap:
        print("extractor: FIRSTFAULT_KAFKA_BOOTSTRAP is not set", file=sys.stderr)
        return 2
    kafka.ensure_topics(cfg)
    port, explicit = port_from_env()
    ExtractorWorker(cfg, metrics_port=port, metrics_required=explicit).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
