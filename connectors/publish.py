"""What the scheduler connectors share: publishing SchedulerEvents, and their metrics.

Events go to the scheduler topic as Avro ``SchedulerEvent`` keyed by ``workload_id``
(the correlator and every extractor read them there). ``publish`` returns only once
the broker confirmed every record, so a connector may advance its position after it.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from firstfault.schemas import SchedulerEvent
from firstfault.schemas.avro import encode
from firstfault.streams import kafka
from firstfault.streams.config import StreamConfig

from . import metrics_names as M

log = logging.getLogger("firstfault.connectors")


class PublishError(RuntimeError):
    """The broker did not confirm every record; the caller must not advance."""


class ConnectorMetrics:
    """The scheduler connectors' own metrics, in a registry of their own (tests make many)."""

    def __init__(self, connector: str, registry: CollectorRegistry | None = None) -> None:
        self.connector = connector
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.events = Counter(M.base_name(M.SCHEDULER_EVENTS), "scheduler start/end events published",
                              ["scheduler", "type"], registry=self.registry)
        self.errors = Counter(M.base_name(M.CONNECTOR_ERRORS), "failed polls or watches",
                              ["connector"], registry=self.registry)
        self.last_success = Gauge(M.CONNECTOR_LAST_SUCCESS, "unix time of the last successful poll",
                                  ["connector"], registry=self.registry)

    def ok(self) -> None:
        self.last_success.labels(self.connector).set(time.time())

    def failed(self) -> None:
        self.errors.labels(self.connector).inc()

    def serve(self, port: int) -> None:
        """Expose /metrics on ``port`` (0: do not)."""
        if port:
            start_http_server(port, addr="0.0.0.0", registry=self.registry)


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
