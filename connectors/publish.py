"""What the scheduler connectors share: publishing SchedulerEvents, and their metrics.

Events go to the scheduler topic as Avro ``SchedulerEvent`` keyed by ``workload_id``
(the correlator and every extractor read them there). ``publish`` returns only once
the broker confirmed every record, so a connector may advance its position after it.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from firstfault.schemas import SchedulerEvent
from firstfault.schemas.avro import encode
from firstfault.streams import kafka
from firstfault.streams.config import StreamConfig
from firstfault.streams.health import Health

from . import metrics_names as M

log = logging.getLogger("firstfault.connectors")


class PublishError(RuntimeError):
    """The broker did not confirm every record; the caller must not advance."""


class ConnectorMetrics:
    """The scheduler connectors' own metrics, in a registry of their own (tests make many), and their probes.

    ``health`` answers /healthz (alive while polls or watches keep coming back, failed or
    not, within ``stale_after_s``) and /readyz (ready after a successful poll or watch,
    not ready while the last one failed).
    """

    def __init__(self, connector: str, registry: CollectorRegistry | None = None,
                 stale_after_s: float = 600.0) -> None:
        self.connector = connector
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.health = Health(self.registry, connector, stale_after_s=stale_after_s)
        self.health.not_ready("no poll or watch has completed yet")
        self.events = Counter(M.base_name(M.SCHEDULER_EVENTS), "scheduler start/end events published",
                              ["scheduler", "type"], registry=self.registry)
        self.errors = Counter(M.base_name(M.CONNECTOR_ERRORS), "failed polls or watches",
                              ["connector"], registry=self.registry)
        self.last_success = Gauge(M.CONNECTOR_LAST_SUCCESS, "unix time of the last successful poll",
                                  ["connector"], registry=self.registry)

    def ok(self) -> None:
        self.last_success.labels(self.connector).set(time.time())
        self.health.beat()
        self.health.ready()

    def failed(self, reason: str = "") -> None:
        self.errors.labels(self.connector).inc()
        self.health.beat()                       # the loop is alive; what it talks to is not
        self.health.not_ready(f"the last poll or watch failed: {reason}"[:300] if reason else
                              "the last poll or watch failed")

    def serve(self, port: int) -> None:
        """Expose /metrics, /healthz and /readyz on ``port`` (0: do not)."""
        self.health.serve(port)


class SchedulerPublisher:
    def __init__(self, cfg: StreamConfig, metrics: ConnectorMetrics | None = None, producer: Any | None = None,
                 timeout_s: float = 30.0) -> None:
        if producer is None and not cfg.bootstrap:
            raise ValueError("no broker: set FIRSTFAULT_KAFKA_BOOTSTRAP")
        self.cfg, self.metrics, self.timeout_s = cfg, metrics, timeout_s
        self.producer = producer or kafka.producer(cfg)
        self.topic = cfg.topic("scheduler")

    def publish(self, events: Sequence[SchedulerEvent]) -> int:
        """Send in order and wait for every acknowledgement; raises PublishError otherwise."""
        failures: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                failures.append(str(err))

        for ev in events:
            key = ev.workload.workload_id.encode()
            while True:
                try:
                    self.producer.produce(self.topic, key=key, value=encode(ev), on_delivery=delivered)
                    break
                except BufferError:
                    self.producer.poll(0.1)
        left = self.producer.flush(self.timeout_s)
        if left or failures:
            raise PublishError(f"{left} unconfirmed, {len(failures)} failed: {failures[:3]}")
        if self.metrics is not None:
            for ev in events:
                self.metrics.events.labels(ev.workload.scheduler, ev.type).inc()
        return len(events)


class PrintPublisher:
    """``--dry-run``: the events as JSON lines on stdout instead of the scheduler topic."""

    def publish(self, events: Sequence[SchedulerEvent]) -> int:
        for e in events:
            sys.stdout.write(e.model_dump_json() + "\n")
        sys.stdout.flush()
        return len(events)


class PublishedLog:
    """Keys of the events already published, kept in a JSON file so a restart does not repeat them.

    Without a path it lives in memory only. Keys are forgotten ``retention_s`` after
    they were published: by then the source no longer reports that attempt.
    """

    def __init__(self, path: Path | None = None, retention_s: float = 7 * 86400.0) -> None:
        self.path, self.retention_s = path, retention_s
        self.keys: dict[str, float] = {}
        if path is not None and path.exists():
            self.keys = {str(k): float(v) for k, v in json.loads(path.read_text()).items()}

    def new(self, events: Sequence[SchedulerEvent], key: Callable[[SchedulerEvent], str]) -> list[SchedulerEvent]:
        seen: set[str] = set()
        out = []
        for e in events:
            k = key(e)
            if k not in self.keys and k not in seen:
                seen.add(k)
                out.append(e)
        return out

    def mark(self, events: Sequence[SchedulerEvent], key: Callable[[SchedulerEvent], str]) -> None:
        now = time.time()
        for e in events:
            self.keys[key(e)] = now
        horizon = now - self.retention_s
        self.keys = {k: t for k, t in self.keys.items() if t >= horizon}
        if self.path is not None:
            atomic_write(self.path, json.dumps(self.keys, sort_keys=True))


def atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so a crash leaves the old or the new file, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
