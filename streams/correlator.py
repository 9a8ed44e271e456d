"""The windowed correlator: EventBatches + scheduler events -> diagnoses (Faust worker).

Run it::

    FIRSTFAULT_KAFKA_BOOTSTRAP=127.0.0.1:9092 python -m firstfault.streams.correlator worker --without-web

(no arguments means ``worker --without-web -l info``). Configuration is
``StreamConfig.from_env()``, plus three worker knobs: ``FIRSTFAULT_METRICS_PORT``
serves /metrics, /healthz and /readyz (:mod:`.health`; default 9464, best effort when
unset, 0: off); ``FIRSTFAULT_CHANGELOG_ONE_PER_BATCH=1``
sends one record per producer batch, the workaround for Tansu's off-by-a-few
recovery high-water (stack.md §3); ``FIRSTFAULT_COMMIT_INTERVAL_S`` sets Faust's
offset commit interval (default 2.8 s; redelivered input is deduplicated).

Per workload attempt the state lives in a plain changelog-backed Table (JSON string
values; windowed tables expire on wall-clock time, which would drop late evidence),
keyed ``"<workload_id>:<attempt>"``. The decisions are :mod:`.workload_state`'s; this
module only feeds it records and the two clocks, and publishes what it decides.

Publishing is an outbox: the state that records a diagnosis as published (and holds
it in ``pending``) is written to the changelog and flushed *before* the diagnosis is
sent, and written again *after* every sink confirmed. A crash in between re-sends
exactly that diagnosis (same diagnosis_id and revision) and nothing else.

Table writes go straight to the store plus ``send_changelog`` with the partition kept
in the state: Faust refuses ``table[key] = ...`` outside an agent, and the timer is
not one. The partition is the input partition, so the table stays co-partitioned.
"""
from __future__ import annotations

import asyncio
import atexit
import gc
import logging
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import faust
from confluent_kafka import KafkaError
from prometheus_client import CollectorRegistry, Counter as PCounter, Gauge, Histogram

from firstfault.connectors import metrics_names as M
from firstfault.rules.attempts import escalate
from firstfault.rules.catalog import Catalog, load_catalog
from firstfault.rules.errors import RecordError
from firstfault.schemas import DeadLetter
from firstfault.schemas.avro import EncodeError, encode

from . import state_codec
from .changelog_tail import read_tail
from .codecs import decode_batch, decode_scheduler
from .config import StreamConfig
from .health import Health, LagSeries, RulesMetrics, port_from_env
from .partition_watch import StuckPartitions, unfetched
from .unread import UnreadWatch
from .progress import ProgressView
from .rules_feed import RulesFollower
from .workload_state import (
    Now, Wake, WorkloadState, apply_scheduler, decide, expired, merge_batch, new_state, next_wake, settle,
    state_json,
    state_key,
)

log = logging.getLogger("firstfault.correlator")

TABLE = "workloads"
STATS_EVERY_S = 60.0
# How often due states are looked for: the finalization latency beyond the grace is about
# half of it. A look is a dict walk with a cached wake per state, cheap at thousands of states.
TICK_S = 0.1
TICK_BUDGET_S = 0.25          # a tick's work at most: the states past it are looked at by the next tick
FETCH_MAX_WAIT_MS = 100       # the longest a fetch waits on the broker for new input (Faust: 1500)
TAKE_MAX = 200                # EventBatch records per window of the events agent
TAKE_WITHIN_S = 0.05          # how long a window waits to fill when input is sparse
HEALTH_EVERY_S = 2.0          # the health timer: heartbeat, readiness; lag every LAG_EVERY_S
LAG_EVERY_S = 5.0
STALE_AFTER_S = 60.0          # /healthz: the event loop did not run the health timer for this long
STARTUP_S = 900.0             # Faust starts timers only once the table is recovered: allow for that
UNREAD_S = 30.0              # a partition of the inputs unread this long makes the worker not ready
UNFETCHED_S = 10.0            # an assigned input partition left paused this long past a rebalance is resumed


def _raw_topic(app: faust.App, name: str, partitions: int) -> Any:
    return app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw",
                     partitions=partitions)


def _utc(ts_s: float | None) -> datetime | None:
    return datetime.fromtimestamp(ts_s, timezone.utc) if ts_s and ts_s > 0 else None


class Metrics:
    """The correlator's Prometheus metrics (names from connectors/metrics_names.py), in its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.consumed = PCounter(M.base_name(M.RECORDS_CONSUMED), "input records", ["worker", "topic"], registry=r)
        self.deadletter = PCounter(M.base_name(M.DEADLETTER), "records refused", ["stage"], registry=r)
        self.diagnoses = PCounter(M.base_name(M.STREAM_DIAGNOSES), "diagnoses published", ["status", "kind"],
                                  registry=r)
        self.latency = Histogram(M.FINALIZATION_LATENCY, "scheduler end event seen -> final diagnosis sent",
                                 buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600), registry=r)
        self.open = Gauge(M.WORKLOADS_OPEN, "workload attempts held in correlator state", registry=r)
        self.publish_errors = PCounter(M.base_name(M.PUBLISH_ERRORS), "failed publications (retried)", ["sink"],
                                       registry=r)
        self.lag = Gauge(M.CONSUMER_LAG, "records between the last one processed and the high watermark",
                         ["worker", "topic", "partition"], registry=r)
        self.poison = PCounter(M.base_name(M.POISON_RECORDS), "records a worker could not use, by where it failed",
                               ["worker", "stage"], registry=r)
        self.unread = Gauge(M.PARTITION_UNREAD, "seconds records have waited on a partition its readers did "
                            "not advance on (0: read)", ["topic", "partition"], registry=r)
        self.awaiting = Gauge(M.WORKLOADS_AWAITING_EXTRACTORS,
                              "ended attempts past their grace waiting for the extractors' progress", registry=r)
        # Series with fixed labels exist from the start (0), so a query or an alert ratio has them.
        for topic in ("events", "scheduler"):
            self.consumed.labels("correlator", topic)
        self.deadletter.labels("correlator")
        for stage in M.POISON_STAGES:
            self.poison.labels("correlator", stage)
        for sink in ("kafka", "redis"):
            self.publish_errors.labels(sink)


class Correlator:
    """What the agents and the timer do; one asyncio lock serializes every state update."""

    def __init__(self, app: faust.App, cfg: StreamConfig, catalog: Catalog, store: Any | None) -> None:
        self.app, self.cfg, self.catalog, self.store = app, cfg, catalog, store
        self.metrics = Metrics()
        # str keys and values: JSON-serialized on the changelog, str again after recovery.
        # bytes values: each state's JSON compressed (state_codec), in the store and the changelog.
        self.table = app.Table(TABLE, key_type=str, value_type=bytes, partitions=cfg.partitions,
                               help="correlator state per workload attempt (compressed JSON)")
        self.table.on_recover(self.verify_recovery)
        self.events_topic = _raw_topic(app, cfg.topic("events"), cfg.partitions)
        self.scheduler_topic = _raw_topic(app, cfg.topic("scheduler"), cfg.partitions)
        self.out = _raw_topic(app, cfg.topic("diagnoses"), cfg.partitions)
        self.deadletter = _raw_topic(app, cfg.topic("deadletter"), cfg.partitions)
        self.lock = asyncio.Lock()
        self.stream_ms = 0                       # stream time: max Kafka timestamp seen by this worker
        self.counts: Counter[str] = Counter()
        # key -> (the raw value it was computed from, wake, partition): the timer re-parses a
        # state only when its value changed or it is due.
        self._wakes: dict[str, tuple[str, Wake | None, int | None]] = {}
        self._parsed: dict[str, tuple[str, WorkloadState]] = {}    # key -> (raw, that state parsed): _load
        self._last_stats = 0.0
        self.health = Health(self.metrics.registry, "correlator", stale_after_s=STALE_AFTER_S, startup_s=STARTUP_S)
        self.health.not_ready("starting: joining the group and recovering the table")
        self.lag = LagSeries(self.metrics.lag, "correlator", {cfg.topic(n): n for n in ("events", "scheduler")})
        self._positions: dict[tuple[str, int], int] = {}     # (topic, partition) -> next offset to process
        self._lag_due = 0.0
        # The extractors' progress (every partition of the progress topic, no group): read in the timer.
        self.progress = ProgressView(cfg.topic("raw"), cfg.partitions)
        self._progress_reader: Any = None
        self._progress_parts: set[int] = set()
        self._progress_at_end: set[int] = set()  # progress partitions read to their end once
        self._progress_read = False              # every one of them: the extractors' reports are known
        self._awaiting: set[str] = set()         # keys whose final waits for the extractors
        self._failing: dict[str, Any] = {}       # key -> the raw state decide raised on (not retried as is)
        self._tick_cursor = 0                     # where the next tick starts among the states
        self._stuck = StuckPartitions(UNFETCHED_S)   # assigned input partitions not fetched, and since when
        self._unread = UnreadWatch()              # any partition of the inputs or raw its readers left
        self._unread_names: dict[tuple[str, int], str] = {}   # (topic, partition) -> "events[1]"
        self._watch: Any = None                   # the consumer that looks (never joins the group)
        self.rules = RulesFollower(cfg, "correlator", catalog, RulesMetrics(self.metrics.registry))

    # ------------------------------------------------------------ clocks and table

    def now(self) -> Now:
        stream = datetime.fromtimestamp(self.stream_ms / 1000, timezone.utc) if self.stream_ms else None
        if self.cfg.watermark_wait_s <= 0:
            behind = None
        elif not self._progress_read:
            behind = self._unknown_progress     # a new member: the extractors' reports not read yet
        else:
            behind = self.behind if self.progress.seen_any else None
        return Now(wall=datetime.now(timezone.utc), stream=stream, behind=behind)

    def _unknown_progress(self, st: WorkloadState) -> list[int]:
        """Until the progress topic is read to its end, every raw partition counts as behind: a worker
        that just joined must not finalize on the grace alone."""
        return list(range(self.progress.partitions)) if st.end_seen is not None else []

    # ------------------------------------------------------------ the extractors' progress

    def behind(self, st: WorkloadState) -> list[int]:
        """Raw partitions not read up to this ended attempt's end event (+ the margin); [] when all are."""
        if st.end_seen is None:
            return []
        since_ms = int((st.end_seen.timestamp() + self.cfg.watermark_margin_s) * 1000)
        keys = frozenset([st.workload_id, *(st.workload.nodes if st.workload is not None else ())])
        end_ms = (int((st.end_record_ts.timestamp() + self.cfg.watermark_margin_s) * 1000)
                  if st.end_record_ts is not None else None)
        out = self.progress.behind(since_ms, st.partition, self._events_position(st.partition), keys, end_ms)
        if out:
            self._awaiting.add(st.key)
        else:
            self._awaiting.discard(st.key)
        return out

    def _events_position(self, partition: int | None) -> int | None:
        """The next events offset this worker will process on ``partition``: what it merged is below it."""
        if partition is None:
            return None
        name = self.events_topic.get_topic_name()
        pos = self._positions.get((name, partition))
        if pos is not None:
            return pos
        try:                                     # nothing processed since the assignment: its commit
            from faust.types import TP

            committed = self.app.consumer._committed_offset.get(TP(name, partition))
        except Exception:
            committed = None
        return committed if isinstance(committed, int) and committed >= 0 else None

    def poll_progress(self, max_records: int = 5000) -> int:
        """Read what the extractors reported since the last call (non-blocking)."""
        if self._progress_reader is None:
            self._progress_reader = self._open_progress()
            if self._progress_reader is None:
                return 0
        n = 0
        try:
            while n < max_records:
                msgs = self._progress_reader.consume(num_messages=1000, timeout=0.0)
                if not msgs:
                    break
                for m in msgs:
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            self._progress_at_end.add(m.partition())
                            self._progress_read = self._progress_read or self._progress_at_end >= self._progress_parts
                        continue
                    if self.progress.add_json(m.value()):
                        n += 1
                    else:
                        self.metrics.poison.labels("correlator", "decode").inc()   # not a report: skipped
        except Exception as exc:                 # the broker, not a record: the next tick tries again
            log.debug("progress not read: %s", exc)
        return n

    def _open_progress(self) -> Any:
        """Every partition of the progress topic from the beginning (compacted: one report per raw partition)."""
        from confluent_kafka import TopicPartition

        from . import kafka

        topic = self.cfg.topic("progress")
        try:
            reader = kafka.consumer(self.cfg, group=f"{self.cfg.app_id}-progress-{uuid.uuid4().hex[:8]}",
                                    **{"enable.partition.eof": True})
            meta = reader.list_topics(timeout=5)
            raw = meta.topics.get(self.cfg.topic("raw"))
            if raw is not None and raw.partitions:
                self.progress.partitions = len(raw.partitions)
            found = meta.topics.get(topic)
            parts = sorted(found.partitions) if found is not None and found.partitions else []
            if not parts:
                reader.close()
                self._progress_read = True       # no extractor made it yet: nothing to wait for
                return None                      # look again next tick
            self._progress_parts = set(parts)
            reader.assign([TopicPartition(topic, p, 0) for p in parts])
            return reader
        except Exception as exc:
            log.debug("progress topic not open yet: %s", exc)
            return None

    def _saw(self, message: Any, topic: str) -> None:
        self.metrics.consumed.labels("correlator", topic).inc()
        # Past the highest offset handled, not the last: a window's batches are merged workload by
        # workload, so they are handled out of offset order (the extractors' progress counts on this).
        key = (message.topic, message.partition)
        if message.offset + 1 > self._positions.get(key, 0):
            self._positions[key] = message.offset + 1
        if message.timestamp and message.timestamp > 0:
            self.stream_ms = max(self.stream_ms, int(message.timestamp * 1000))

    def _load(self, key: str) -> tuple[WorkloadState | None, bytes | None]:
        raw = self.table.data.get(key)
        if raw is None:
            return None, None
        # The state saved last is kept parsed (parsing a state with hundreds of events cost more than
        # merging a batch into it). Taken out of the cache: a handler that fails half-way leaves no
        # half-mutated object behind, the next load parses the stored value again.
        cached = self._parsed.pop(key, None)
        if cached is not None and cached[0] is raw:
            return cached[1], raw
        return WorkloadState.model_validate_json(state_codec.decode(raw)), raw

    def _keep_parsed(self, st: WorkloadState, raw: bytes) -> None:
        """Keep the parsed state only while it is busy (no final yet, or an outbox to send): a finalized
        one waits out the lateness horizon as its stored value alone, parsed again if late lines come."""
        if st.published is None or st.pending:
            self._parsed[st.key] = (raw, st)
        else:
            self._parsed.pop(st.key, None)

    def _save(self, st: WorkloadState, before: bytes | None = None) -> None:
        raw = state_codec.encode(state_json(st))
        if raw == before:                        # e.g. a redelivered record: nothing to log
            if before is not None and self.table.data.get(st.key) is before:
                self._keep_parsed(st, before)
            return
        self.table.data[st.key] = raw
        self._owned_by(st.key, st.partition)
        self.table.send_changelog(st.partition, st.key, raw)
        self._wakes[st.key] = (raw, next_wake(st, self.cfg), st.partition)
        self._keep_parsed(st, raw)

    def _owned_by(self, key: str, partition: int | None) -> None:
        """Tell the memory store which partition a key we wrote lives on (it learns that only from
        recovery): when the partition goes to another worker, the store drops the key."""
        known = getattr(self.table.data, "_key_partition", None)
        if isinstance(known, dict) and partition is not None:
            known[key] = partition

    async def verify_recovery(self) -> None:
        """After Faust recovered the table, before input resumes: the states the changelog holds past
        the end Faust was told about (:mod:`.changelog_tail`) replace what recovery left."""
        active = sorted(self._active_partitions())
        if not active or not self.cfg.bootstrap:
            return
        topic = self.table.changelog_topic.get_topic_name()
        try:
            tails = await asyncio.to_thread(read_tail, self.cfg, topic, active)
        except Exception as exc:                 # the broker, not the data: recovery stands as it was
            log.warning("the end of %s was not verified after recovery: %s", topic, exc)
            return
        fixed = 0
        for partition, values in tails.items():
            for key, value in values.items():
                have = self.table.data.get(key)
                if value is None:
                    if have is not None:
                        self.table.data.pop(key, None)
                        fixed += 1
                elif have != value:
                    self.table.data[key] = value
                    self._owned_by(key, partition)
                    fixed += 1
        self.counts["recovery_fixed"] += fixed
        if fixed:
            log.warning("recovery stopped short of %s's end: %d state(s) restored from the records past it",
                        topic, fixed)

    def _delete(self, st: WorkloadState) -> None:
        self.table.data.pop(st.key, None)
        self._wakes.pop(st.key, None)
        self._parsed.pop(st.key, None)
        self.table.send_changelog(st.partition, st.key, None, value_serializer="raw")
        self.counts["expired"] += 1

    # ------------------------------------------------------------ inputs

    async def on_batch(self, message: Any) -> None:
        self._saw(message, "events")
        batch = decode_batch(message.value)
        async with self.lock:
            st = await self._merge_group(state_key(batch.workload_id, batch.attempt), [(message, batch)])
            await self._publish_all([st] if st is not None else [])

    async def on_batches(self, messages: Sequence[Any]) -> None:
        """Many EventBatch records at once (``take_events``): per workload attempt one load, its
        batches merged in offset order, one decision and one save; then the window's diagnoses are
        published together (their deliveries overlap). A debounce: the merge is order-free, so the
        evidence and the final diagnosis are the same; fewer provisional looks in between.
        A record that does not decode is dead-lettered alone; a group that fails is done again
        record by record, so only the culprit is refused."""
        groups: dict[str, list[tuple[Any, Any]]] = {}
        for m in messages:
            try:
                batch = decode_batch(m.value)
            except Exception:
                await self.guarded(self.on_batch, m)     # dead-lettered with the reason, as alone
                continue
            groups.setdefault(state_key(batch.workload_id, batch.attempt), []).append((m, batch))
        async with self.lock:
            due: dict[str, WorkloadState] = {}           # states with an outbox to publish
            for key, items in groups.items():
                for m, _ in items:
                    self._saw(m, "events")
                try:
                    st = await self._merge_group(key, items)
                except Exception as exc:
                    if len(items) == 1:
                        await self._refuse(items[0][0], exc)
                        continue
                    log.warning("merging %d batches of %s at once failed: one by one", len(items), key)
                    for item in items:
                        try:
                            st = await self._merge_group(key, [item])
                        except Exception as one_exc:
                            await self._refuse(item[0], one_exc)
                            continue
                        if st is not None:
                            due[key] = st
                    continue
                if st is not None:
                    due[key] = st
            await self._publish_all(list(due.values()))

    async def _merge_group(self, key: str, items: list[tuple[Any, Any]]) -> WorkloadState | None:
        """Merge one attempt's batches (same key, so one partition, offsets ascending) and decide.
        Caller holds the lock; returns the state when it has diagnoses to publish."""
        st, before = self._load(key)
        st = st or new_state(items[0][1].workload_id, items[0][1].attempt, self.now().wall)
        st.partition = items[-1][0].partition
        wall = self.now().wall
        # EARLY rules and diagnose are CPU work: off the loop, so heartbeats keep flowing.
        applied = await asyncio.to_thread(lambda: [merge_batch(st, b, self.catalog, m.offset, wall) for m, b in items])
        self.counts["batches"] += sum(applied)
        self.counts["batches_skipped"] += len(applied) - sum(applied)
        await self._step(st, before, publish=False)
        return st if st.pending else None

    async def _publish_all(self, states: list[WorkloadState]) -> None:
        """Each state's outbox; several at once, so their flushes and deliveries overlap. Caller holds the lock."""
        if len(states) == 1:
            await self._publish(states[0])
        elif states:
            await asyncio.gather(*(self._publish(st) for st in states))

    async def on_scheduler(self, message: Any) -> None:
        self._saw(message, "scheduler")
        ev = decode_scheduler(message.value)
        async with self.lock:
            wl = ev.workload
            now = self.now()
            st, before = self._load(state_key(wl.workload_id, wl.attempt))
            st = st or new_state(wl.workload_id, wl.attempt, now.wall)
            st.partition = message.partition
            applied = apply_scheduler(st, ev, now.wall, record_ts=_utc(message.timestamp), seq=message.offset)
            self.counts[f"scheduler_{ev.type}" if applied else "scheduler_unchanged"] += 1
            await self._step(st, before)

    async def guarded(self, handler, message: Any) -> None:
        """Run a handler; a record it cannot use goes to the dead-letter topic. Never raises."""
        try:
            await handler(message)
        except Exception as exc:  # a bug must cost one record, not the agent
            await self._refuse(message, exc)

    async def _refuse(self, message: Any, exc: Exception) -> None:
        if isinstance(exc, RecordError):
            await self.dead_letter(message, str(exc), step="decode")
            return
        log.error("correlator failed on %s[%s]@%s", message.topic, message.partition, message.offset,
                  exc_info=exc)
        await self.dead_letter(message, f"correlator error: {type(exc).__name__}: {str(exc)[:500]}",
                               step="process")

    async def dead_letter(self, message: Any, reason: str, step: str = "decode") -> None:
        """The record, or its head, size and SHA-256 when large, on the dead-letter topic; never raises."""
        self.counts["deadletter"] += 1
        self.metrics.deadletter.labels("correlator").inc()
        self.metrics.poison.labels("correlator", step if step in M.POISON_STAGES else "process").inc()
        log.warning("dead letter #%d from %s[%s]@%s: %s", self.counts["deadletter"], message.topic,
                    message.partition, message.offset, reason[:300])
        try:
            ts = int(message.timestamp * 1000) if message.timestamp and message.timestamp > 0 else None
            key = message.key if isinstance(message.key, bytes) else None
            value = message.value if isinstance(message.value, bytes) else None
            dl = DeadLetter.of(reason, "correlator", message.topic, message.partition, message.offset, key, value,
                               ts, step)
            await self.deadletter.send(key=key if key and len(key) <= 1024 else None,
                                       value=dl.model_dump_json().encode())
        except Exception:
            log.exception("could not write the dead letter")

    # ------------------------------------------------------------ decisions and publishing

    async def _step(self, st: WorkloadState, before: bytes | None, publish: bool = True,
                    input_changed: bool = True) -> None:
        """Decide, then publish through the outbox (``publish=False``: the caller will). Caller holds the lock.
        ``input_changed=False`` (the timer): a decision that changed nothing is not saved again."""
        mark = _decision_mark(st)
        published = await asyncio.to_thread(decide, st, self.catalog, self.now(), self.cfg)
        if not input_changed and not published and before is not None and _decision_mark(st) == mark:
            self._keep_parsed(st, before)        # e.g. still waiting for the extractors: nothing to write
            return
        if st.published is not None:
            self._awaiting.discard(st.key)
        self._save(st, before)
        if st.pending and publish:
            await self._publish(st)
        for d in published:
            kind = "provisional" if d.provisional else ("final" if d.revision == 0 else "revision")
            self.counts[kind] += 1
            self.metrics.diagnoses.labels(d.status, kind).inc()

    async def _publish(self, st: WorkloadState) -> None:
        sink = "kafka"
        try:
            await self.app.producer.flush()      # BEFORE: the outbox is in the changelog first
            for p in st.pending:
                sink = "kafka"
                if not p.sent:
                    if self.store is not None and not p.diagnosis.provisional and p.diagnosis.attempt > 0:
                        # Attempt N failing like N-1 escalates recovery (rules/attempts.py); idempotent, so a
                        # retry after a crash gives the same diagnosis.
                        sink = "redis"
                        prev = await asyncio.to_thread(self.store.latest, st.workload_id, p.diagnosis.attempt - 1)
                        p.diagnosis = escalate(p.diagnosis, prev)
                        sink = "kafka"
                    try:
                        value = encode(p.diagnosis)
                    except EncodeError as exc:   # retrying cannot help: logged, counted, given up
                        log.error("diagnosis of %s cannot be encoded, not published: %s", st.key, exc)
                        self.metrics.poison.labels("correlator", "encode").inc()
                        p.sent = p.stored = True
                        continue
                    fut = await self.out.send(key=st.workload_id.encode(), value=value)
                    await fut                    # delivered, or it raises
                    p.sent = True
                    self._published(st, p.diagnosis)
                sink = "redis"
                if self.store is not None and not p.stored:
                    await asyncio.to_thread(self.store.save, p.diagnosis, ended_at=st.end_time)
                    p.stored = True
        except Exception as exc:                 # Kafka or the store is down: the timer retries
            self.counts["publish_errors"] += 1
            self.metrics.publish_errors.labels(sink).inc()
            log.warning("publishing %s to %s failed, will retry: %s", st.key, sink, exc)
        settle(st, has_store=self.store is not None)
        self._save(st)                           # AFTER: what was confirmed leaves the outbox

    def _published(self, st: WorkloadState, d: Any) -> None:
        log.info("published %s rev %s%s: %s %s/%s (%s)", st.key, d.revision, " provisional" if d.provisional else "",
                 d.status, d.domain, d.sub_domain, d.diagnosis_id)
        if not d.provisional and d.revision == 0 and st.end_seen is not None:
            self.metrics.latency.observe((datetime.now(timezone.utc) - st.end_seen).total_seconds())

    # ------------------------------------------------------------ the timer

    def _ready(self) -> bool:
        return not getattr(self.app, "rebalancing", False) and not getattr(self.app, "in_recovery", False)

    def _active_partitions(self) -> set[int]:
        name = self.events_topic.get_topic_name()
        return {tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == name}

    def _wake(self, key: str, raw: Any) -> tuple[Wake | None, int | None]:
        cached = self._wakes.get(key)
        if cached is not None and cached[0] is raw:
            return cached[1], cached[2]
        st = WorkloadState.model_validate_json(state_codec.decode(raw))
        wake = next_wake(st, self.cfg)
        self._wakes[key] = (raw, wake, st.partition)
        return wake, st.partition

    async def tick(self) -> None:
        """Finalize, revise-close, re-send pending and expire the states that are due."""
        if not self._ready():
            return
        if (catalog := self.rules.poll()) is not None:     # a newly published catalog: between batches
            async with self.lock:
                self.catalog = catalog
        self.poll_progress()
        active = self._active_partitions()
        now = self.now()
        # Bounded work per tick: past TICK_BUDGET_S the rest waits for the next tick, which starts
        # where this one stopped (a burst of finals no longer stalls input for seconds).
        keys = list(self.table.data.keys())
        start = self._tick_cursor % len(keys) if keys else 0
        began = asyncio.get_running_loop().time()
        for n, key in enumerate(keys[start:] + keys[:start]):
            if n and asyncio.get_running_loop().time() - began >= TICK_BUDGET_S:
                self._tick_cursor = start + n
                self.counts["ticks_cut"] += 1
                break
            # Read now, not from a snapshot: the awaits below let batches save newer states, and a
            # stale value would be parsed again to learn what the cached wake already says.
            raw = self.table.data.get(key)
            if raw is None or self._failing.get(key) is raw:
                continue                         # decide raised on exactly this state: wait for new input
            try:
                wake, partition = self._wake(key, raw)
                if wake is None or partition not in active or not wake.due(now):
                    continue
                async with self.lock:
                    st, before = self._load(key)
                    if st is None:
                        continue
                    now = self.now()
                    if expired(st, now.wall, self.cfg):
                        self._delete(st)
                    else:
                        await self._step(st, before, input_changed=False)
            except Exception:                    # one state must not stop the others' finalization
                log.exception("correlator timer failed on %s", key)
                self.metrics.poison.labels("correlator", "decide").inc()
                self._failing[key] = self.table.data.get(key)
        live = set(self.table.data.keys())
        for key in set(self._wakes) - live:
            del self._wakes[key]
        for key in set(self._parsed) - live:
            del self._parsed[key]
        for key in set(self._failing) - live:
            del self._failing[key]
        self._awaiting &= live
        self.metrics.open.set(len(self.table.data))
        self.metrics.awaiting.set(len(self._awaiting))
        self._log_stats()

    # ------------------------------------------------------------ health

    async def _resume_stuck(self, loop_now: float) -> list[str]:
        """Resume assigned input partitions left unfetched for UNFETCHED_S (:mod:`.partition_watch`),
        seeking each to its committed offset (or the start) so its fetching begins again; the ones not
        fetched now, named."""
        consumer = self.app.consumer
        inputs = {self.events_topic.get_topic_name(), self.scheduler_topic.get_topic_name()}
        try:
            assigned = {tp for tp in consumer.assignment() if tp.topic in inputs}
        except Exception:                        # consumer not started, or stopping
            return []
        never = set()
        for tp in assigned:
            try:
                if consumer.highwater(tp) is None:
                    never.add(tp)
            except Exception:
                continue
        stuck = unfetched(assigned, getattr(consumer, "_paused_partitions", None) or (),
                          getattr(consumer, "_active_partitions", None),
                          getattr(consumer, "_buffered_partitions", None) or (), never)
        due = self._stuck.update(stuck, loop_now)
        if due:
            log.warning("input partition(s) %s assigned but not fetched for %g s: resuming them",
                        ", ".join(f"{tp.topic}[{tp.partition}]" for tp in due), UNFETCHED_S)
            consumer.resume_partitions(due)
            committed = getattr(consumer, "_committed_offset", {}) or {}
            for tp in due:
                pos = self._positions.get((tp.topic, tp.partition), committed.get(tp))
                try:
                    await consumer.seek(tp, pos if isinstance(pos, int) and pos >= 0 else 0)
                except Exception as exc:         # revoked meanwhile: its new owner reads it
                    log.warning("seeking %s[%d] failed: %s", tp.topic, tp.partition, exc)
            self.counts["partitions_resumed"] += len(due)
        return [f"{tp.topic}[{tp.partition}]" for tp in sorted(stuck)]

    async def health_tick(self) -> None:
        """The health timer: the event loop is alive; ready unless rebalancing, recovering or an
        assigned input partition is not read; lag."""
        self.health.beat()
        loop_now = asyncio.get_running_loop().time()
        if getattr(self.app, "rebalancing", False):
            self.health.not_ready("rebalancing")
        elif getattr(self.app, "in_recovery", False):
            self.health.not_ready("recovering the table from its changelog")
        elif unread := await self._resume_stuck(loop_now):
            self.health.not_ready(f"assigned input partition(s) not read: {', '.join(unread)}")
        elif unowned := self._unread.unread(loop_now, UNREAD_S):
            self.health.not_ready("input partition(s) nobody reads: records wait and the group committed nothing "
                                  f"for {UNREAD_S:g} s: {', '.join(self._unread_names.get(k, str(k)) for k in unowned)}")
        else:
            self.health.ready()                  # timers run only once the app has started
        if loop_now >= self._lag_due and not getattr(self.app, "rebalancing", False):
            self._lag_due = loop_now + LAG_EVERY_S
            if self.health.is_ready:
                await self.refresh_lag()
            await self.refresh_unread(loop_now)

    async def refresh_unread(self, loop_now: float) -> None:
        """PARTITION_UNREAD for every partition of the inputs (against the group's committed offsets) and
        of the raw topic (against the extractors' reported positions), whoever owns it (:mod:`.unread`)."""
        try:
            looks = await asyncio.to_thread(self._look_unread)
        except Exception as exc:                 # the broker, not the data: the next look tries again
            log.debug("unread partitions not looked at: %s", exc)
            return
        own = (self.events_topic.get_topic_name(), self.scheduler_topic.get_topic_name())
        for (topic, partition), (done, high) in looks.items():
            self._unread.look((topic, partition), done, high, loop_now)
        self._unread.forget(set(looks))
        names = {self.cfg.topic(n): n for n in ("events", "scheduler", "raw")}
        self._unread_names = {key: f"{names.get(key[0], key[0])}[{key[1]}]" for key in looks}
        for (topic, partition), seconds in self._unread.seconds(loop_now).items():
            self.metrics.unread.labels(names.get(topic, topic), str(partition)).set(round(seconds, 1))
        for key in self._unread.unread(loop_now, UNREAD_S):
            if key[0] not in own:                # the raw topic: the extractors' group, said in the log
                log.warning("%s: records wait and no extractor's reported position moved for %g s or more",
                            self._unread_names[key], UNREAD_S)

    def _look_unread(self) -> dict[tuple[str, int], tuple[int | None, int | None]]:
        """Blocking (a thread): (topic, partition) -> (what its readers did, its high watermark)."""
        from confluent_kafka import TopicPartition

        from . import kafka

        if self._watch is None:                  # group id = ours, to read its commits; it never subscribes
            self._watch = kafka.consumer(self.cfg, group=self.cfg.app_id, **{"enable.auto.commit": False})
        meta = self._watch.list_topics(timeout=2.0).topics
        own = [self.events_topic.get_topic_name(), self.scheduler_topic.get_topic_name()]
        parts = [TopicPartition(t, p) for t in own if t in meta for p in sorted(meta[t].partitions)]
        out: dict[tuple[str, int], tuple[int | None, int | None]] = {}
        for tp in self._watch.committed(parts, timeout=2.0) if parts else []:
            out[(tp.topic, tp.partition)] = (tp.offset if tp.offset >= 0 else None, None)
        raw = self.cfg.topic("raw")
        for p in sorted(meta[raw].partitions) if raw in meta else []:
            rep = self.progress.latest.get(p)
            out[(raw, p)] = (rep.position if rep is not None else None, None)
        for (topic, partition), (done, _) in list(out.items()):
            _, high = self._watch.get_watermark_offsets(TopicPartition(topic, partition), timeout=2.0, cached=False)
            out[(topic, partition)] = (done, high)
        return out

    async def refresh_lag(self) -> None:
        """CONSUMER_LAG per assigned input partition: high watermark minus the next offset to process.

        The high watermark is the one aiokafka's last fetch reported (``consumer.highwater``,
        right on Tansu too, stack.md §1); the position is the offset after the last record
        an agent handled, so records Faust fetched but the agents have not reached yet
        count as lag. A partition no record was handled from since it was assigned
        counts from the consumer's fetch position.
        """
        consumer = self.app.consumer
        inputs = {self.events_topic.get_topic_name(), self.scheduler_topic.get_topic_name()}
        try:
            assigned = {(tp.topic, tp.partition): tp for tp in consumer.assignment() if tp.topic in inputs}
        except Exception as exc:                 # consumer not started, or stopping
            log.debug("consumer lag not refreshed: %s", exc)
            return
        for key in set(self._positions) - set(assigned):
            del self._positions[key]
        lags: dict[tuple[str, int], int] = {}
        for key, tp in assigned.items():
            try:
                high = consumer.highwater(tp)
            except Exception:
                continue
            if high is None or high < 0:
                continue
            pos = self._positions.get(key)
            if pos is None:
                try:
                    pos = await asyncio.wait_for(consumer.position(tp), timeout=1.0)
                except Exception:
                    pos = None
            if pos is not None and pos >= 0:
                lags[key] = max(0, high - pos)
        self.lag.show(lags)

    def _log_stats(self) -> None:
        loop_now = asyncio.get_running_loop().time()
        if loop_now - self._last_stats >= STATS_EVERY_S:
            self._last_stats = loop_now
            log.info("correlator: %d attempts in state, stream time %s, %s", len(self.table.data),
                     self.now().stream, dict(sorted(self.counts.items())))
            if self._awaiting:                   # why the oldest wait goes on: what the extractors said last
                key = min(self._awaiting)
                cached, raw = self._parsed.get(key), self.table.data.get(key)
                st = (cached[1] if cached is not None and cached[0] is raw else
                      None if raw is None else WorkloadState.model_validate_json(state_codec.decode(raw)))
                if st is not None:
                    now_ms = int(time.time() * 1000)
                    log.info("correlator: %d attempts await the extractors, e.g. %s (events[%s] read to %s): %s",
                             len(self._awaiting), key, st.partition, self._events_position(st.partition),
                             "; ".join(self.progress.describe(p, now_ms) for p in self.behind(st)))


def _decision_mark(st: WorkloadState) -> tuple:
    """What ``decide`` may change in a state, cheaply: equal before and after, it changed nothing."""
    return (len(st.pending), len(st.provisional), st.published, st.dirty, st.root_arrived, st.closed_at)


def _faust_settings(cfg: StreamConfig) -> dict[str, Any]:
    datadir = tempfile.mkdtemp(prefix=f"{cfg.app_id}-")
    atexit.register(shutil.rmtree, datadir, ignore_errors=True)
    settings: dict[str, Any] = dict(
        broker=[f"kafka://{h.strip()}" for h in (cfg.bootstrap or "").split(",") if h.strip()],
        store="memory://",
        processing_guarantee="at_least_once",        # Tansu cannot do exactly_once (stack.md §1)
        broker_session_timeout=2.0, broker_heartbeat_interval=0.5,
        topic_replication_factor=1, topic_partitions=cfg.partitions,
        consumer_auto_offset_reset="earliest",
        table_standby_replicas=cfg.standby_replicas,   # Faust's default 1 doubled a second worker's memory
        datadir=datadir, web_enabled=False, autodiscover=False,
    )
    if os.environ.get("FIRSTFAULT_COMMIT_INTERVAL_S"):
        # How much input a crash may redeliver (Faust's default: 2.8 s); redelivery is deduplicated.
        settings["broker_commit_interval"] = float(os.environ["FIRSTFAULT_COMMIT_INTERVAL_S"])
    if os.environ.get("FIRSTFAULT_CHANGELOG_ONE_PER_BATCH", "").strip().lower() in ("1", "true", "yes"):
        # aiokafka's max_batch_size is in bytes: 1 means one record per batch, so Tansu's
        # ListOffsets error cannot hide the last changelog records from recovery.
        settings["producer_max_batch_size"] = 1
    return settings


def _short_fetch_wait() -> None:
    """Faust builds its aiokafka consumer with ``fetch_max_wait_ms=1500`` and no setting to change it.
    A fetch that finds nothing waits that long on the broker; on Tansu a record produced meanwhile is
    seen only in steps of about 250 ms (measured by bench_stream.py's latency), which is most of the
    end -> final latency past the grace. Shorter fetches see it sooner, for a few more idle requests."""
    from faust.transport.drivers import aiokafka as driver

    make = driver.AIOKafkaConsumerThread._create_worker_consumer
    if getattr(make, "_firstfault", False):
        return

    def create(self, transport):
        consumer = make(self, transport)
        consumer._fetch_max_wait_ms = min(consumer._fetch_max_wait_ms, FETCH_MAX_WAIT_MS)   # read at start()
        return consumer

    create._firstfault = True
    driver.AIOKafkaConsumerThread._create_worker_consumer = create


def make_app(cfg: StreamConfig, store: Any | None = None, tick_s: float = TICK_S) -> faust.App:
    """The correlator app. ``store``: a DiagnosisStore; by default one on ``cfg.redis_url`` if set.

    Creates no topics: run :func:`firstfault.streams.kafka.ensure_topics` first (``main`` does).
    """
    _short_fetch_wait()
    if not cfg.bootstrap:
        raise ValueError("the correlator needs a broker: set FIRSTFAULT_KAFKA_BOOTSTRAP")
    if store is None and cfg.redis_url:
        from firstfault.connectors.sinks.redis_store import DiagnosisStore

        store = DiagnosisStore(cfg.redis_url, prefix=cfg.redis_prefix)
    app = faust.App(cfg.app_id, **_faust_settings(cfg))
    core = Correlator(app, cfg, load_catalog(cfg.rules), store)
    app.correlator = core                                     # for tests and operators

    @app.agent(core.events_topic, name="correlate-events")
    async def correlate_events(stream) -> None:
        # A few at a time: each attempt's batches in the window share one load, decision and save.
        # Acked after the body ran (at least once); ``within`` bounds the wait when input is sparse.
        async for events in stream.take_events(TAKE_MAX, within=TAKE_WITHIN_S):
            try:
                await core.on_batches([e.message for e in events])
            except Exception:                                 # on_batches guards its records
                log.exception("correlator failed on a window of %d batches", len(events))

    @app.agent(core.scheduler_topic, name="correlate-scheduler")
    async def correlate_scheduler(stream) -> None:
        async for event in stream.events():
            await core.guarded(core.on_scheduler, event.message)

    @app.timer(interval=tick_s, name="correlate-timer")
    async def correlate_timer() -> None:
        try:
            await core.tick()
        except Exception:                                     # the timer must keep ticking
            log.exception("correlator timer failed")

    # Its own timer: a long tick (many states due at once) must not look like a stuck loop.
    @app.timer(interval=HEALTH_EVERY_S, name="correlate-health")
    async def correlate_health() -> None:
        try:
            await core.health_tick()
        except Exception:
            log.exception("correlator health timer failed")

    return app


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m firstfault.streams.correlator [worker --without-web ...]`` with FIRSTFAULT_* config."""
    from .kafka import ensure_topics

    args = list(sys.argv[1:] if argv is None else argv) or ["worker"]
    if args[0] == "worker":
        if "--without-web" not in args:
            args.append("--without-web")             # else it binds :6066 and a second worker dies
        if not any(a in ("-l", "--loglevel") or a.startswith("--loglevel=") for a in args):
            args += ["-l", "info"]
    cfg = StreamConfig.from_env()
    if not cfg.bootstrap:
        print("firstfault correlator: set FIRSTFAULT_KAFKA_BOOTSTRAP (host:port[,host:port])", file=sys.stderr)
        return 2
    ensure_topics(cfg, [cfg.topic(n) for n in ("events", "scheduler", "diagnoses", "deadletter", "progress", "rules")])
    app = make_app(cfg)
    # Start-up's objects (Faust, the catalog) out of the collector's sight: full collections, which
    # the states' many small objects trigger, no longer walk them again and again.
    gc.collect()
    gc.freeze()
    # /metrics, /healthz, /readyz. Unset, the default port is best effort: tests and `firstfault up`
    # run several workers on one host (up gives each its own port or 0).
    port, explicit = port_from_env()
    app.correlator.health.serve(port, required=explicit)
    sys.argv = ["firstfault-correlator", *args]
    app.main()                                        # Faust's CLI; exits the process
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
