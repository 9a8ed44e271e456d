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

import base64
import logging
import signal
import sys
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

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
from .codecs import decode_raw, decode_scheduler
from .config import StreamConfig
from .health import Health, LagSeries, port_from_env
from .metrics_reader import MetricsReader
from .timeline import Allocation, AllocationTimeline

log = logging.getLogger("firstfault.extractor")
NODE_SCOPED = ("syslog", "fabricmanager")
LAG_EVERY_S = 5.0             # consumer lag is recomputed at most this often
STALE_AFTER_S = 120.0         # /healthz: a loop turn may take a 30 s flush and a commit; this is stuck


@dataclass
class Held:
    rec: RawLine
    ts_ms: int
    since: float
    above: list[str] | None = None      # the lines above it when it arrived, for stamp inheritance


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
    by_host: dict[str, int] = field(default_factory=dict)


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

    # ------------------------------------------------------------ routing
    def extractor_for(self, alloc: Allocation) -> Extractor:
        key = (alloc.workload.workload_id, alloc.workload.attempt)
        ex = self._extractors.get(key)
        if ex is None or ex.workload is not alloc.workload:
            ex = self._extractors[key] = Extractor(self.catalog, alloc.workload)
        return ex

    def _when(self, rec: RawLine, ts_ms: int) -> datetime | None:
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
            from pathlib import PurePosixPath

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
            stamp = read_head(rec.text, ex.context(ex.hosts.file_host(rec.path, source))).stamp
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
    def handle(self, records: list[tuple[RawLine, int]], now: float | None = None) -> dict[tuple[str, int], EventBatch]:
        """Extract a batch; returns one EventBatch per workload attempt (events merged)."""
        now = time.monotonic() if now is None else now
        out: dict[tuple[str, int], EventSet] = {}
        paths: dict[tuple[str, int], set[str]] = {}
        stats = ExtractStats()
        encoded = [r.text.encode("utf-8", "surrogateescape") for r, _ in records]
        offsets, pos = [], 0
        for raw in encoded:
            offsets.append(pos)
            pos += len(raw) + 1
        hits = self.prefilter.scan(b"\n".join(encoded)) if records else {}
        last_line: dict[str, int] = {}       # per file in this batch: the last line number seen
        settled: dict[str, bool] = {}        # per file: every workload it may feed is decided
        fed: set[tuple[str, int]] = set()
        for i, (rec, ts_ms) in enumerate(records):
            self.counters.records += 1
            host_key = rec.host or "?"
            self.counters.by_host[host_key] = self.counters.by_host.get(host_key, 0) + 1
            if (rec.source or source_of(rec.path)) == "metrics":
                self._metric_line(Held(rec, ts_ms, now), paths, fed)
                continue
            # Which workloads a file feeds (the evidence inventory): routed once per run of
            # consecutive lines, again where the numbering jumps (another file, a rotation).
            key = _mem_key(rec)
            if last_line.get(key) != rec.line - 1:
                settled[key] = False
            if not settled[key]:
                settled[key] = self._credit(rec, ts_ms, now, paths)
            last_line[key] = rec.line
            anchor_hits = hits.get(offsets[i])
            if anchor_hits and not rec.workload_id:
                self._remember(rec, ts_ms, now, candidate=True)
            elif not rec.workload_id:
                self._remember(rec, ts_ms, now, candidate=False)
            if anchor_hits:
                self.counters.candidates += 1
                allocs = self.route(rec, ts_ms)
                if allocs is None:
                    self._hold(rec, ts_ms, now)
                else:
                    self._extract(rec, anchor_hits, allocs, out, stats)
            self.memory.add(_mem_key(rec), rec.line, rec.text)
        self._drain_metrics(fed, out)
        return self._batches(out, paths)

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
        raw = rec.text.encode("utf-8", "surrogateescape")
        source = rec.source or source_of(rec.path) or "app"
        for alloc in allocs:
            ex = self.extractor_for(alloc)
            file_host = ex.hosts.file_host(rec.path, source)
            ctx = ex.context(file_host)
            lines_above = (lambda a=above: a) if above is not None else \
                (lambda r=rec: self.memory.above(_mem_key(r), r.line))
            ev = ex.read_line(rec.path, source, file_host, ctx, rec.line, raw, anchor_ids, lines_above, stats)
            if ev is not None:
                key = (alloc.workload.workload_id, alloc.workload.attempt)
                out.setdefault(key, EventSet()).add(ev)
                self.counters.events += 1

    def _hold(self, rec: RawLine, ts_ms: int, now: float) -> None:
        # Keep its context now: by the time its workload is known the file has moved on.
        self.held.append(Held(rec, ts_ms, now, list(self.memory.above(_mem_key(rec), rec.line))))
        self.counters.held += 1
        while len(self.held) > self.cfg.hold_max:
            self._give_up(self.held.popleft())      # over the count bound: counted, oldest first

    def orphan_event(self, rec: RawLine):
        """The event a line makes on its own (UTC, no workload), for node history."""
        raw = rec.text.encode("utf-8", "surrogateescape")
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
        waiting = {id(h.rec) for h in self.held}      # retry_held routes those; do not count them twice
        for host in alloc.workload.nodes:
            for h in [h for h in self._recent.get(host, ())
                      if now - h.since <= self.cfg.hold_s and id(h.rec) not in waiting]:
                if any(a is alloc for a in self.route(h.rec, h.ts_ms) or ()):
                    hits = self.prefilter.scan(h.rec.text.encode("utf-8", "surrogateescape"))
                    if hits:
                        self._extract(h.rec, hits[0], [alloc], out, stats, above=h.above)
            for h in list(self._recent_files.get(host, {}).values()) + [h for h in self._recent.get(host, ())]:
                if now - h.since <= self.cfg.hold_s and any(a is alloc for a in self.route(h.rec, h.ts_ms) or ()):
                    if self._horizon(h.rec, [alloc])[0]:
                        paths.setdefault(key, set()).add(h.rec.path)
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
            allocs = self.route(h.rec, h.ts_ms)
            if allocs:
                hits = self.prefilter.scan(h.rec.text.encode("utf-8", "surrogateescape"))
                if hits:
                    self._extract(h.rec, hits[0], allocs, out, stats, above=h.above)
                for a in allocs:
                    paths.setdefault((a.workload.workload_id, a.workload.attempt), set()).add(h.rec.path)
            elif now - h.since > self.cfg.hold_s:
                expired.append(h)
                self._give_up(h)
            else:
                keep.append(h)
        self.held = keep
        for key, h in list(self._unrouted_paths.items()):
            allocs = self.route(h.rec, h.ts_ms)
            if allocs:
                for a in self._horizon(h.rec, allocs)[0]:
                    paths.setdefault((a.workload.workload_id, a.workload.attempt), set()).add(h.rec.path)
                del self._unrouted_paths[key]
            elif now - h.since > self.cfg.hold_s:
                del self._unrouted_paths[key]
        fed: set[tuple[str, int]] = set()
        waiting, self.metric_pending = self.metric_pending, deque()
        for h in waiting:                       # in arrival order: a series stays in file order
            if not self._metric_line(h, paths, fed) and now - h.since > self.cfg.hold_s:
                self.metric_pending.pop()
                self.counters.unrouted_lines += 1
        self._drain_metrics(fed, out)
        return self._batches(out, paths), expired

    def _batches(self, out: dict, paths: dict) -> dict[tuple[str, int], EventBatch]:
        batches: dict[tuple[str, int], EventBatch] = {}
        for key in sorted(set(out) | set(paths) | set(self._metric_hosts)):
            new_paths = sorted(p for p in paths.get(key, ()) if (key[0], key[1], p) not in self._sent_paths)
            events = [e.to_schema() for e in out[key].sorted()] if key in out else []
            if not events and not new_paths and key not in self._metric_hosts:
                continue
            self._sent_paths.update((key[0], key[1], p) for p in new_paths)
            batches[key] = EventBatch(workload_id=key[0], attempt=key[1], events=events, paths=new_paths,
                                      metric_hosts=self._metric_hosts.pop(key, []))
        return batches


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
        self.lag = Gauge(M.CONSUMER_LAG, "records between the consumer's position and the high watermark",
                         ["worker", "topic", "partition"], registry=r)
        self.publish_errors = Counter(M.base_name(M.PUBLISH_ERRORS), "records the broker did not take", ["sink"],
                                      registry=r)
        # The children the loop touches, made once (they also show 0 before anything happened).
        self.raw_consumed = self.consumed.labels("extractor", "raw")
        self.dead = self.deadletter.labels("extractor")
        self.kafka_errors = self.publish_errors.labels("kafka")


class ExtractorWorker:
    """The Kafka side: batch consume, extract, produce, commit. One process, one loop.

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
        self._counted = 0                  # records + dead letters already added to RECORDS_CONSUMED
        self._lag_due = 0.0
        self._joined = False               # the group assigned this member its partitions (maybe none)
        self._brokers_down = False
        self._delivery_log_due = 0.0
        self._failed_deliveries = 0        # producer records the broker refused, ever
        self.core = ExtractorCore(cfg, catalog)
        # Delivery reports only for failures: nothing per delivered record.
        self.producer = kafka.producer(cfg, on_delivery=self._delivered, **{"delivery.report.only.error": True})
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

        self.offsets = OffsetIndex(cfg.redis_url, prefix=cfg.prefix)
        self._stop = False

    def stop(self, *_: object) -> None:
        self._stop = True

    def dead_letter(self, msg, reason: str, stage: str = "extractor") -> None:
        dl = DeadLetter(reason=reason, stage=stage, topic=msg.topic(), partition=msg.partition(), offset=msg.offset(),
                        key_b64=base64.b64encode(msg.key()).decode() if msg.key() else None,
                        value_b64=base64.b64encode(msg.value()).decode() if msg.value() is not None else None,
                        timestamp_ms=msg.timestamp()[1] if msg.timestamp() else None)
        self.producer.produce(self.cfg.topic("deadletter"), key=msg.key(), value=dl.model_dump_json().encode())
        self.core.counters.deadletters += 1
        self.metrics.dead.inc()

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
                    known = self.core.timeline.get(ev.workload.workload_id, ev.workload.attempt) is not None
                    alloc = self.core.timeline.apply(ev)
                    if not known:
                        self.publish(self.core.started(alloc))
                    n += 1
                except RecordError:
                    pass      # the correlator dead-letters scheduler records; one report is enough

    def keep_for_node_history(self, expired: list[Held]) -> None:
        """Lines that no workload claimed: extracted without a workload and kept per host."""
        for h in expired:
            ev = self.core.orphan_event(h.rec)
            if ev is not None:
                key = (ev.host or h.rec.host or "?").encode()
                self.producer.produce(self.cfg.topic("node-history"), key=key, value=encode(ev))

    def publish(self, batches: dict[tuple[str, int], EventBatch]) -> None:
        for (wid, _), batch in batches.items():
            self.producer.produce(self.cfg.topic("events"), key=wid.encode(), value=encode(batch))
            self.core.counters.batches_out += 1

    def step(self, timeout: float = 0.5) -> int:
        failed_before = self._failed_deliveries
        if self.poll_timeline():
            batches, expired = self.core.retry_held()
            self.publish(batches)
            self.keep_for_node_history(expired)
        msgs = self.consumer.consume(num_messages=self.cfg.batch, timeout=timeout)
        records: list[tuple[RawLine, int]] = []
        for m in msgs:
            if m.error():
                log.warning("consumer error: %s", m.error())
                continue
            self.offsets.note_message(m)
            try:
                records.append((decode_raw(m.value(), m.key(), m.headers(), m.offset()), m.timestamp()[1]))
            except RecordError as exc:
                self.dead_letter(m, str(exc))
            except Exception as exc:  # a record must never stop the worker
                self.dead_letter(m, f"{type(exc).__name__}: {exc}")
        if records:
            self.publish(self.core.handle(records))
        if self.core.held or self.core._unrouted_paths or self.core.metric_pending:
            batches, expired = self.core.retry_held()
            self.publish(batches)
            self.keep_for_node_history(expired)
        if msgs:
            # At least once: everything produced for this batch is delivered before its offsets commit.
            left = self.producer.flush(30)
            if left or self._failed_deliveries != failed_before:
                self.rewind(msgs)
            else:
                self.consumer.commit(asynchronous=False)
        self.after_step()
        return len(msgs)

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        while not self._stop:
            self.step()
        self.close()

    def close(self) -> None:
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
        seen = c.records + c.deadletters         # every raw record is handled or dead-lettered
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
        self._readiness()
        log.info("assigned %d partition(s) of %s", len(partitions), self.cfg.topic("raw"))

    def _revoked(self, _consumer, _partitions) -> None:
        self._joined = False
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
        """The producer's delivery report; with delivery.report.only.error, only failures come here."""
        if err is None:
            return
        self._failed_deliveries += 1
        self.metrics.kafka_errors.inc()
        now = time.monotonic()
        if now >= self._delivery_log_due:        # at most one line per 10 s, however many fail
            self._delivery_log_due = now + 10.0
            log.warning("delivery to %s failed: %s", msg.topic() if msg is not None else "?", err)


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
