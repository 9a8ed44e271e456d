"""Alerting sink: diagnoses -> webhooks (generic JSON, Slack incoming webhook, PagerDuty Events v2).

Run it beside the correlator::

    FIRSTFAULT_KAFKA_BOOTSTRAP=kafka:9092 FIRSTFAULT_ALERTS_CONFIG=/etc/firstfault/alerts.yaml \
        python -m firstfault.connectors.sinks.alerts

Configuration (YAML, validated by :class:`AlertConfig`; secrets are never in it, only
the names of the ``FIRSTFAULT_*`` variables that hold them)::

    webhooks:
      - name: oncall
        format: pagerduty                      # json | slack | pagerduty
        url: https://events.pagerduty.com/v2/enqueue
        routing_key_env: FIRSTFAULT_ALERT_PAGERDUTY_ROUTING_KEY
        statuses: [attributed]                 # default: attributed, ambiguous, unattributed
        domains: [gpu, interconnect, host]     # default: every domain
      - name: ml-platform
        format: slack
        url_env: FIRSTFAULT_ALERT_SLACK_URL
    queue_max: 10000                           # per webhook
    backoff_initial_s: 1
    backoff_max_s: 300

Behaviour:

* ``submit`` never blocks and never does I/O: it filters (status, domain, provisional),
  deduplicates by ``diagnosis_id`` and appends to each matching webhook's bounded
  queue. One sender thread per webhook posts in order.
* 2xx: delivered. 408, 429, 5xx and network errors: retried with exponential
  backoff (``Retry-After`` honoured), the alert keeps its place at the head. Other
  4xx: the receiver will never take that body; it is dropped and counted.
* A dead webhook makes its queue wait; when the queue is full the oldest alert is
  dropped and counted (``firstfault_alerts_dropped_total{reason="queue_full"}``).
  Queue depth and the oldest alert's age are exported.
* The runner commits a diagnoses-topic offset only once every alert of the records
  before it was delivered or dropped: a restart re-reads what was still queued
  (at-least-once; the receiver may see an alert twice across a crash, never zero times).
"""
from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import BaseModel, ConfigDict, Field, model_validator

from firstfault.rules.summary import node_blame
from firstfault.schemas import Diagnosis, WorkloadRecord

from .. import metrics_names as M
from ..enrich import EnrichedDiagnosis, Inventory, correlate, enrich, recent_failed

log = logging.getLogger("firstfault.alerts")

ALERTABLE = ("attributed", "ambiguous", "unattributed")


class WebhookConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    format: Literal["json", "slack", "pagerduty"] = "json"
    url: str | None = None
    url_env: str | None = Field(default=None, pattern=r"^FIRSTFAULT_[A-Z0-9_]+$")
    routing_key_env: str | None = Field(default=None, pattern=r"^FIRSTFAULT_[A-Z0-9_]+$")
    routing_key: str | None = Field(default=None, description="tests only; production reads routing_key_env")
    statuses: list[Literal["attributed", "ambiguous", "unattributed", "no_failure"]] = Field(
        default_factory=lambda: list(ALERTABLE))
    domains: list[str] | None = Field(default=None, description="None: every domain")
    include_provisional: bool = False
    timeout_s: float = Field(default=10.0, gt=0)

    @model_validator(mode="after")
    def _where(self) -> "WebhookConfig":
        if not (self.url or self.url_env):
            raise ValueError(f"webhook {self.name}: give url or url_env")
        if self.format == "pagerduty" and not (self.routing_key or self.routing_key_env):
            raise ValueError(f"webhook {self.name}: PagerDuty needs routing_key_env")
        return self

    def resolved_url(self, env: dict[str, str] | os._Environ[str] = os.environ) -> str:
        url = self.url or env.get(self.url_env or "", "")
        if not url:
            raise ValueError(f"webhook {self.name}: {self.url_env} is not set")
        return url

    def wants(self, d: Diagnosis) -> bool:
        if d.provisional and not self.include_provisional:
            return False
        if d.status not in self.statuses:
            return False
        if self.domains is None:
            return True
        if d.status == "ambiguous":           # the shared domain is "ambiguous": look at the candidates'
            return any(c.domain in self.domains for c in d.candidates)
        return d.domain in self.domains


class AlertConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    webhooks: list[WebhookConfig] = Field(min_length=1)
    queue_max: int = Field(default=10_000, ge=1)
    dedup_max: int = Field(default=100_000, ge=1)
    backoff_initial_s: float = Field(default=1.0, gt=0)
    backoff_max_s: float = Field(default=300.0, gt=0)
    jitter: float = Field(default=0.2, ge=0, le=1)
    correlation_window_s: float = Field(default=3600.0, ge=0)
    link_base_url: str | None = Field(default=None, description="service URL; alerts link to /ui/diagnoses/<id>")
    source: str = "firstfault"

    @classmethod
    def load(cls, path: str) -> "AlertConfig":
        with open(path, encoding="utf-8") as fh:
            return cls.model_validate(yaml.safe_load(fh) or {})


# ---------------------------------------------------------------- payloads

def summary(e: EnrichedDiagnosis) -> str:
    d = e.diagnosis
    who = ", ".join(d.responsible_nodes) or ", ".join(d.suspect_nodes) or "-"
    if d.status == "attributed":
        head = f"{d.workload_id}#{d.attempt} {d.terminal_state}: {d.domain}/{d.sub_domain} on {who}"
        if d.root_cause is not None:
            head += f" ({d.root_cause.message})"
    elif d.status == "ambiguous":
        subs = ", ".join(f"{c.sub_domain} on {','.join(c.nodes) or '?'}" for c in d.candidates)
        head = f"{d.workload_id}#{d.attempt} {d.terminal_state}: ambiguous, {subs}"
    else:
        head = f"{d.workload_id}#{d.attempt} {d.terminal_state}: {d.status}" + (f", suspects {who}" if d.suspect_nodes else "")
    for c in e.correlated:
        head += f". {c.message}"
    return head


def severity(d: Diagnosis) -> str:
    """PagerDuty severity: a node to drain is critical; an attributed fault an error; the rest a warning."""
    if d.recovery.action == "drain_nodes":
        return "critical"
    if d.status == "attributed" and d.domain != "scheduler":
        return "error"
    return "warning" if d.status != "no_failure" else "info"


def _link(cfg: AlertConfig, d: Diagnosis) -> str | None:
    if not cfg.link_base_url:
        return None
    return f"{cfg.link_base_url.rstrip('/')}/ui/diagnoses/{d.workload_id}?attempt={d.attempt}"


def payload_json(e: EnrichedDiagnosis, cfg: AlertConfig) -> dict[str, Any]:
    return {"type": "firstfault.diagnosis", "summary": summary(e), "link": _link(cfg, e.diagnosis), **e.to_dict()}


def payload_slack(e: EnrichedDiagnosis, cfg: AlertConfig) -> dict[str, Any]:
    """Slack incoming webhook: ``text`` (the notification) and Block Kit ``blocks``."""
    d, w = e.diagnosis, e.workload
    text = summary(e)
    facts = [f"*status* {d.status}", f"*cause* {d.domain}/{d.sub_domain}",
             f"*{node_blame(d.domain, d.responsible_nodes).replace(' ', '* ', 1)}", f"*recovery* {d.recovery.action}"]
    if w.user or w.job_name:
        facts.append(f"*job* {w.job_name or '-'} ({w.user or '?'}, {w.partition or w.namespace or '-'})")
    if e.topology.racks:
        facts.append(f"*rack* {', '.join(e.topology.racks)}")
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": text[:3000]}},
        {"type": "section", "fields": [{"type": "mrkdwn", "text": f} for f in facts[:10]]},
    ]
    link = _link(cfg, d)
    ctx = [{"type": "mrkdwn", "text": f"diagnosis `{d.diagnosis_id}`"}]
    if link:
        ctx.append({"type": "mrkdwn", "text": f"<{link}|open in firstfault>"})
    blocks.append({"type": "context", "elements": ctx})
    return {"text": text, "blocks": blocks}


def payload_pagerduty(e: EnrichedDiagnosis, cfg: AlertConfig, routing_key: str) -> dict[str, Any]:
    """PagerDuty Events API v2 trigger. One alert per workload attempt: revisions update it."""
    d, w = e.diagnosis, e.workload
    details = {"workload_id": d.workload_id, "attempt": d.attempt, "status": d.status,
               "terminal_state": d.terminal_state, "responsible_nodes": d.responsible_nodes,
               "suspect_nodes": d.suspect_nodes, "recovery": d.recovery.model_dump(), "diagnosis_id": d.diagnosis_id,
               "user": w.user, "job_name": w.job_name, "racks": e.topology.racks,
               "correlated": [c.message for c in e.correlated]}
    pd_payload: dict[str, Any] = {
        "summary": summary(e)[:1024], "source": (d.responsible_nodes or [d.workload_id])[0],
        "severity": severity(d), "component": d.domain, "group": w.partition or w.namespace or "",
        "class": f"{d.domain}/{d.sub_domain}", "custom_details": details,
    }
    if d.root_cause is not None and d.root_cause.timestamp:
        pd_payload["timestamp"] = d.root_cause.timestamp
    body: dict[str, Any] = {"routing_key": routing_key, "event_action": "trigger",
                            "dedup_key": f"firstfault/{d.workload_id}/{d.attempt}"[:255],
                            "payload": pd_payload, "client": cfg.source}
    link = _link(cfg, d)
    if link:
        body["client_url"] = link
        body["links"] = [{"href": link, "text": "firstfault diagnosis"}]
    return body


# ---------------------------------------------------------------- the sink

@dataclass
class Alert:
    diagnosis_id: str
    body: bytes
    enqueued: float
    origin: tuple[int, int] | None = None         # (partition, offset) of the diagnoses record
    attempts: int = 0
    not_before: float = 0.0


class AlertMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.depth = Gauge(M.ALERT_QUEUE_DEPTH, "alerts waiting per webhook", ["webhook"], registry=r)
        self.oldest = Gauge(M.ALERT_OLDEST_AGE, "age of the oldest waiting alert", ["webhook"], registry=r)
        self.sent = Counter(M.base_name(M.ALERTS_SENT), "alerts delivered", ["webhook"], registry=r)
        self.failures = Counter(M.base_name(M.ALERT_ATTEMPT_FAILURES), "failed delivery attempts", ["webhook"],
                                registry=r)
        self.dropped = Counter(M.base_name(M.ALERTS_DROPPED), "alerts given up", ["webhook", "reason"], registry=r)
        self.skipped = Counter(M.base_name(M.ALERTS_SKIPPED), "diagnoses not alerted", ["reason"], registry=r)


class Webhook:
    """One receiver: a bounded FIFO and the thread that empties it."""

    def __init__(self, cfg: WebhookConfig, sink: "AlertSink") -> None:
        self.cfg, self.sink = cfg, sink
        self.url = cfg.resolved_url()
        self.routing_key = cfg.routing_key or (os.environ.get(cfg.routing_key_env or "") if cfg.format == "pagerduty"
                                               else None)
        if cfg.format == "pagerduty" and not self.routing_key:
            raise ValueError(f"webhook {cfg.name}: {cfg.routing_key_env} is not set")
        self.queue: collections.deque[Alert] = collections.deque()
        self.cond = threading.Condition()
        m = sink.metrics
        m.depth.labels(cfg.name).set_function(lambda: len(self.queue))
        m.oldest.labels(cfg.name).set_function(self._oldest_age)
        self.thread = threading.Thread(target=self._loop, name=f"alerts-{cfg.name}", daemon=True)

    def _oldest_age(self) -> float:
        q = self.queue
        return max(0.0, time.time() - q[0].enqueued) if q else 0.0

    def body(self, e: EnrichedDiagnosis) -> bytes:
        c = self.sink.cfg
        if self.cfg.format == "slack":
            doc = payload_slack(e, c)
        elif self.cfg.format == "pagerduty":
            doc = payload_pagerduty(e, c, self.routing_key or "")
        else:
            doc = payload_json(e, c)
        return json.dumps(doc, sort_keys=True, default=str).encode()

    def put(self, alert: Alert) -> None:
        with self.cond:
            if len(self.queue) >= self.sink.cfg.queue_max:
                lost = self.queue.popleft()      # keep the newest: the oldest is the least actionable
                self.sink.metrics.dropped.labels(self.cfg.name, "queue_full").inc()
                self.sink._settled(lost)
                log.warning("webhook %s: queue full, dropped alert %s", self.cfg.name, lost.diagnosis_id)
            self.queue.append(alert)
            self.cond.notify()

    def _post(self, body: bytes) -> tuple[int, float | None]:
        req = urllib.request.Request(self.url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "firstfault-alerts"})
        try:
            with urllib.request.urlopen(req, timeout=self.cfg.timeout_s) as resp:
                resp.read()
                return resp.status, None
        except urllib.error.HTTPError as exc:
            retry = exc.headers.get("Retry-After") if exc.headers else None
            try:
                wait = float(retry) if retry else None
            except ValueError:
                wait = None
            return exc.code, wait
        except (urllib.error.URLError, OSError):
            return 0, None                   # connection refused, reset, timeout: retry

    def _loop(self) -> None:
        sink = self.sink
        while True:
            with self.cond:
                while not self.queue and not sink.stopping.is_set():
                    self.cond.wait(0.5)           # put() and close() notify; the timeout is a safety net
                if sink.stopping.is_set():
                    return
                head = self.queue[0]
                delay = head.not_before - time.monotonic()
                if delay > 0:
                    self.cond.wait(min(delay, 0.5))
                    continue
            status, retry_after = self._post(head.body)
            with self.cond:
                if not self.queue or self.queue[0] is not head:
                    continue                 # dropped meanwhile (queue full)
                if 200 <= status < 300:
                    self.queue.popleft()
                    sink.metrics.sent.labels(self.cfg.name).inc()
                    sink._settled(head)
                elif status in (408, 429) or status == 0 or status >= 500:
                    head.attempts += 1
                    sink.metrics.failures.labels(self.cfg.name).inc()
                    head.not_before = time.monotonic() + sink.backoff(head.attempts, retry_after)
                else:
                    self.queue.popleft()
                    sink.metrics.dropped.labels(self.cfg.name, "rejected").inc()
                    sink._settled(head)
                    log.error("webhook %s refused alert %s with HTTP %s; dropped", self.cfg.name,
                              head.diagnosis_id, status)


class AlertSink:
    """Filter, deduplicate and queue diagnoses for every configured webhook. ``submit`` never blocks."""

    def __init__(self, cfg: AlertConfig, metrics: AlertMetrics | None = None,
                 inventory: Inventory | None = None, rng: random.Random | None = None) -> None:
        self.cfg = cfg
        self.metrics = metrics or AlertMetrics()
        self.inventory = inventory.table() if inventory else None
        self.rng = rng or random.Random()
        self.stopping = threading.Event()
        self.seen: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.recent: collections.deque[EnrichedDiagnosis] = collections.deque(maxlen=10_000)
        self.hooks = [Webhook(w, self) for w in cfg.webhooks]
        self._lock = threading.Lock()
        self._inflight: collections.Counter[tuple[int, int]] = collections.Counter()
        for h in self.hooks:
            h.thread.start()

    def backoff(self, attempts: int, retry_after: float | None) -> float:
        base = min(self.cfg.backoff_max_s, self.cfg.backoff_initial_s * (2 ** (attempts - 1)))
        if retry_after is not None:
            base = max(base, min(retry_after, self.cfg.backoff_max_s))
        return base * (1 + self.cfg.jitter * self.rng.random())

    def submit(self, d: Diagnosis, workload: WorkloadRecord | None = None,
               origin: tuple[int, int] | None = None) -> int:
        """Queue ``d`` for every webhook that wants it; returns how many queues took it."""
        if d.diagnosis_id in self.seen:
            self.metrics.skipped.labels("duplicate").inc()
            return 0
        self.seen[d.diagnosis_id] = None
        while len(self.seen) > self.cfg.dedup_max:
            self.seen.popitem(last=False)
        hooks = [h for h in self.hooks if h.cfg.wants(d)]
        if not hooks:
            self.metrics.skipped.labels("filtered").inc()
            return 0
        enriched = self.enrich(d, workload)
        now = time.time()
        for h in hooks:
            alert = Alert(d.diagnosis_id, h.body(enriched), now, origin)
            if origin is not None:
                with self._lock:
                    self._inflight[origin] += 1
            h.put(alert)
        return len(hooks)

    def enrich(self, d: Diagnosis, workload: WorkloadRecord | None) -> EnrichedDiagnosis:
        e = enrich(d, workload, self.inventory)
        if e.workload.end_time is None or d.status == "no_failure" or not e.topology.hosts:
            return e
        peers = recent_failed(self.recent, e.workload.end_time, self.cfg.correlation_window_s)
        mine = correlate([e, *peers], self.cfg.correlation_window_s)[0]
        self.recent.append(e)
        return mine

    def _settled(self, alert: Alert) -> None:
        if alert.origin is None:
            return
        with self._lock:
            self._inflight[alert.origin] -= 1
            if self._inflight[alert.origin] <= 0:
                del self._inflight[alert.origin]

    def pending_origins(self) -> set[tuple[int, int]]:
        with self._lock:
            return set(self._inflight)

    def depth(self) -> int:
        return sum(len(h.queue) for h in self.hooks)

    def drain(self, timeout_s: float) -> bool:
        """Wait until every queue is empty (tests, shutdown); False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self.depth() and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.depth() == 0

    def close(self) -> None:
        self.stopping.set()
        for h in self.hooks:
            with h.cond:
                h.cond.notify_all()
        for h in self.hooks:
            h.thread.join(5)


# ---------------------------------------------------------------- the runner (diagnoses topic)

@dataclass
class CommitTracker:
    """Offsets that may be committed: below the first record with an alert still queued."""

    next_offset: dict[int, int] = field(default_factory=dict)

    def safe(self, pending: set[tuple[int, int]]) -> dict[int, int]:
        out = {}
        for part, nxt in self.next_offset.items():
            waiting = [off for p, off in pending if p == part]
            out[part] = min(waiting) if waiting else nxt
        return out


class WorkloadBook:
    """Latest scheduler record per workload attempt (bounded), for enrichment."""

    def __init__(self, max_items: int = 100_000) -> None:
        self.max_items = max_items
        self.items: collections.OrderedDict[tuple[str, int], WorkloadRecord] = collections.OrderedDict()

    def put(self, wl: WorkloadRecord) -> None:
        key = (wl.workload_id, wl.attempt)
        self.items[key] = wl
        self.items.move_to_end(key)
        while len(self.items) > self.max_items:
            self.items.popitem(last=False)

    def get(self, workload_id: str, attempt: int) -> WorkloadRecord | None:
        return self.items.get((workload_id, attempt))


def run(cfg_stream: Any, sink: AlertSink, group: str, stop: threading.Event,
        on_idle: Callable[[], None] | None = None, poll_s: float = 0.5, health: Any | None = None) -> None:
    """Read diagnoses (and, for enrichment, the whole scheduler topic) until ``stop`` is set.

    ``health`` (a :class:`firstfault.streams.health.Health`): beaten every loop turn, ready
    once the consumer group assigned this sink its diagnoses partitions.
    """
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    from firstfault.schemas import SchedulerEvent
    from firstfault.schemas.avro import decode
    from firstfault.streams import kafka

    diag_topic, sched_topic = cfg_stream.topic("diagnoses"), cfg_stream.topic("scheduler")
    consumer = kafka.consumer(cfg_stream, group)
    if health is not None:
        health.not_ready("waiting for the consumer group to assign the diagnoses partitions")
        consumer.subscribe([diag_topic], on_assign=lambda _c, _p: health.ready(),
                           on_revoke=lambda _c, _p: health.not_ready("rebalancing"))
    else:
        consumer.subscribe([diag_topic])
    sched = kafka.consumer(cfg_stream, f"{group}-scheduler-{os.getpid()}")
    meta = sched.list_topics(sched_topic, timeout=10).topics.get(sched_topic)
    parts = sorted(meta.partitions) if meta and meta.partitions else []
    sched.assign([TopicPartition(sched_topic, p, OFFSET_BEGINNING) for p in parts])
    book = WorkloadBook()
    commits = CommitTracker()
    committed: dict[int, int] = {}
    try:
        while not stop.is_set():
            if health is not None:
                health.beat()
            for msg in sched.consume(num_messages=500, timeout=0.05) or []:
                if msg.error() is None and msg.value():
                    try:
                        ev = decode(msg.value())
                        if isinstance(ev, SchedulerEvent):
                            book.put(ev.workload)
                    except ValueError:
                        pass
            msgs = consumer.consume(num_messages=200, timeout=poll_s) or []
            for msg in msgs:
                if msg.error() is not None:
                    continue
                origin = (msg.partition(), msg.offset())
                commits.next_offset[msg.partition()] = msg.offset() + 1
                try:
                    d = decode(msg.value()) if msg.value() else None
                except ValueError as exc:
                    log.warning("undecodable diagnoses record %s: %s", origin, exc)
                    continue
                if isinstance(d, Diagnosis):
                    sink.submit(d, book.get(d.workload_id, d.attempt), origin)
            safe = commits.safe(sink.pending_origins())
            todo = {p: o for p, o in safe.items() if committed.get(p) != o}
            if todo:
                consumer.commit(offsets=[TopicPartition(diag_topic, p, o) for p, o in todo.items()],
                                asynchronous=False)
                committed.update(todo)
            if not msgs and on_idle is not None:
                on_idle()
    finally:
        consumer.close()
        sched.close()


def main(argv: Sequence[str] | None = None) -> int:
    from firstfault.streams.config import StreamConfig
    from firstfault.streams.health import Health

    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m firstfault.connectors.sinks.alerts", description=__doc__.split("\n")[0])
    p.add_argument("--config", default=env("FIRSTFAULT_ALERTS_CONFIG"), help="alerts YAML (FIRSTFAULT_ALERTS_CONFIG)")
    p.add_argument("--inventory", default=env("FIRSTFAULT_INVENTORY"), help="inventory YAML (FIRSTFAULT_INVENTORY)")
    p.add_argument("--kafka-bootstrap", default=env("FIRSTFAULT_KAFKA_BOOTSTRAP"))
    p.add_argument("--group", default=env("FIRSTFAULT_ALERTS_GROUP", "firstfault-alerts"))
    p.add_argument("--metrics-port", type=int, default=int(env("FIRSTFAULT_METRICS_PORT", str(M.METRICS_PORT))))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.config:
        print("firstfault alerts: set --config or FIRSTFAULT_ALERTS_CONFIG", file=sys.stderr)
        return 2
    cfg_stream = StreamConfig.from_env(bootstrap=args.kafka_bootstrap)
    if not cfg_stream.bootstrap:
        print("firstfault alerts: set FIRSTFAULT_KAFKA_BOOTSTRAP", file=sys.stderr)
        return 2
    try:
        cfg = AlertConfig.load(args.config)
        inventory = Inventory.load(args.inventory) if args.inventory else None
        sink = AlertSink(cfg, inventory=inventory)
    except (OSError, ValueError) as exc:
        print(f"firstfault alerts: {exc}", file=sys.stderr)
        return 2
    health = Health(sink.metrics.registry, "alerts", stale_after_s=120.0)
    health.serve(args.metrics_port)              # /metrics, /healthz, /readyz
    stop = threading.Event()
    try:
        run(cfg_stream, sink, args.group, stop, health=health)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        sink.drain(10)
        sink.close()
        health.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
