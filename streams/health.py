"""One port per long-running process: ``/metrics``, ``/healthz`` and ``/readyz``.

Every stream worker and connector serves, on ``FIRSTFAULT_METRICS_PORT``
(default :data:`~firstfault.connectors.metrics_names.METRICS_PORT`; ``0`` = off):

* ``/metrics``: its own Prometheus ``CollectorRegistry`` (text exposition, or
  OpenMetrics when the scraper asks for it);
* ``/healthz`` (liveness): 200 while the process loop touches :meth:`Health.beat`
  at least every ``stale_after_s`` seconds, 503 with the age of the last beat once it
  does not. Before the first beat the process is starting: 200 for ``startup_s``
  (a correlator recovering its table, an extractor connecting), 503 after that;
* ``/readyz`` (readiness): 200 once the process said it is ready (:meth:`Health.ready`,
  e.g. the extractor got its partition assignment, the correlator's Faust app
  started, a connector completed a poll), otherwise 503 with a one-line reason. A
  process that is not alive is not ready either.

The server is the standard library's ``ThreadingHTTPServer`` in a daemon thread: it
never touches the process loop, and :meth:`Health.beat` is one float store, cheap
enough to call on every turn of a loop.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from firstfault.connectors.metrics_names import METRICS_PORT

log = logging.getLogger("firstfault.health")

METRICS_PATH, LIVE_PATH, READY_PATH = "/metrics", "/healthz", "/readyz"
PATHS = (METRICS_PATH, LIVE_PATH, READY_PATH)
PORT_VARIABLE = "FIRSTFAULT_METRICS_PORT"
HOST_VARIABLE = "FIRSTFAULT_METRICS_HOST"       # the address they bind: 0.0.0.0 unless set (`up`: 127.0.0.1)


def port_from_env(env: Mapping[str, str] | None = None) -> tuple[int, bool]:
    """(port, explicitly set?) from ``FIRSTFAULT_METRICS_PORT``; unset or blank means the default."""
    raw = (os.environ if env is None else env).get(PORT_VARIABLE, "").strip()
    if not raw:
        return METRICS_PORT, False
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(f"{PORT_VARIABLE}: not a port number: {raw!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{PORT_VARIABLE}: not a port number: {raw!r}")
    return port, True


class Health:
    """A process's liveness heartbeat, its readiness, and the HTTP server answering for both."""

    def __init__(self, registry: CollectorRegistry | None, name: str, *, stale_after_s: float = 120.0,
                 startup_s: float = 300.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.name = name
        self.stale_after_s = stale_after_s
        self.startup_s = startup_s
        self._clock = clock
        self._born = clock()
        self._beat: float | None = None
        self._not_ready: str | None = "starting"
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ the process's side

    def beat(self) -> None:
        """The process loop is alive (call it on every turn; it is one store)."""
        self._beat = self._clock()

    def ready(self) -> None:
        self._not_ready = None

    def not_ready(self, reason: str) -> None:
        self._not_ready = reason or "not ready"

    @property
    def is_ready(self) -> bool:
        return self._not_ready is None

    # ------------------------------------------------------------ the probes' side

    def liveness(self) -> tuple[bool, str]:
        now = self._clock()
        last = self._beat
        if last is None:
            age = now - self._born
            if age <= self.startup_s:
                return True, f"starting ({age:.0f}s of {self.startup_s:.0f}s allowed)"
            return False, f"no heartbeat {age:.0f}s after start (allowed {self.startup_s:.0f}s)"
        age = now - last
        if age > self.stale_after_s:
            return False, f"stale: last heartbeat {age:.0f}s ago (allowed {self.stale_after_s:.0f}s)"
        return True, f"ok: last heartbeat {age:.1f}s ago"

    def readiness(self) -> tuple[bool, str]:
        live, why = self.liveness()
        if not live:
            return False, why
        reason = self._not_ready
        return (True, "ready") if reason is None else (False, reason)

    # ------------------------------------------------------------ the server

    def serve(self, port: int, addr: str | None = None, required: bool = True) -> int | None:
        """Serve on ``port`` (0: do not) at ``addr`` (default FIRSTFAULT_METRICS_HOST, else 0.0.0.0 so
        that a container's probes reach it; ``up`` sets 127.0.0.1 for its workers); returns the port or None.

        A port that cannot be bound raises when ``required`` (the operator asked for
        it), else is logged and skipped (the default port, taken by another process
        on this host).
        """
        if not port:
            return None
        addr = addr or os.environ.get(HOST_VARIABLE, "").strip() or "0.0.0.0"
        try:
            return self.start(port, addr)
        except OSError as exc:
            if required:
                raise OSError(exc.errno, f"{self.name}: cannot serve /metrics, /healthz, /readyz on "
                                         f"{addr}:{port} ({exc.strerror}); set {PORT_VARIABLE}") from None
            log.warning("%s: port %s is taken (%s); serving no /metrics, /healthz, /readyz. Set %s to another "
                        "port, or 0", self.name, port, exc.strerror, PORT_VARIABLE)
            return None

    def start(self, port: int = 0, addr: str = "127.0.0.1") -> int:
        """Bind exactly ``addr:port`` (0: any free port) and serve in a daemon thread; returns the port."""
        if self._server is not None:
            return self.port
        server = ThreadingHTTPServer((addr, port), _handler(self))
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name=f"health-{self.name}", daemon=True)
        self._thread.start()
        log.info("%s: /metrics, /healthz, /readyz on %s:%s", self.name, addr, self.port)
        return self.port

    @property
    def port(self) -> int | None:
        return self._server.server_address[1] if self._server is not None else None

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None


class LagSeries:
    """One worker's ``CONSUMER_LAG`` series, replaced as a whole so a revoked partition's series goes away."""

    def __init__(self, gauge: Any, worker: str, names: Mapping[str, str] | None = None) -> None:
        self.gauge, self.worker = gauge, worker
        self.names = dict(names or {})           # topic -> the label it gets (the logical name)
        self._shown: set[tuple[str, str]] = set()

    def show(self, lags: Mapping[tuple[str, int], int]) -> None:
        now = {}
        for (topic, partition), lag in lags.items():
            now[(self.names.get(topic, topic), str(partition))] = lag
        for topic, partition in self._shown - now.keys():
            try:
                self.gauge.remove(self.worker, topic, partition)
            except KeyError:
                pass
        for (topic, partition), lag in now.items():
            self.gauge.labels(self.worker, topic, partition).set(lag)
        self._shown = set(now)


class RulesMetrics:
    """Which rule catalog a worker runs (``RULES_VERSION_INFO``, 1 on its current version) and the
    published catalogs it refused (``RULES_LOAD_FAILURES``); :class:`~.rules_feed.RulesFollower` sets them."""

    def __init__(self, registry: CollectorRegistry) -> None:
        from prometheus_client import Counter, Gauge

        from firstfault.connectors import metrics_names as M

        self.info = Gauge(M.RULES_VERSION_INFO, "the rule catalog this worker diagnoses with (value 1)",
                          ["worker", "rules_version"], registry=registry)
        self.failures = Counter(M.base_name(M.RULES_LOAD_FAILURES),
                                "published rule catalogs this worker could not load (it kept the one it had)",
                                ["worker"], registry=registry)

    def loaded(self, worker: str, version: str, was: str | None = None) -> None:
        self.failures.labels(worker)                 # the series exists (0) before anything failed
        if was is not None and was != version:
            try:
                self.info.remove(worker, was)
            except KeyError:
                pass
        self.info.labels(worker, version).set(1)

    def refused(self, worker: str) -> None:
        self.failures.labels(worker).inc()


def _handler(health: Health) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "firstfault-health"

        def _answer(self, body: bool) -> None:
            path = self.path.split("?", 1)[0]
            if path == METRICS_PATH:
                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                try:
                    data = encoder(health.registry)
                except Exception as exc:           # a broken collector: say so, do not kill the thread
                    log.exception("%s: collecting metrics failed", health.name)
                    self._send(500, f"collecting metrics failed: {exc}\n".encode(), "text/plain; charset=utf-8", body)
                    return
                self._send(200, data, content_type, body)
            elif path in (LIVE_PATH, READY_PATH):
                ok, why = health.liveness() if path == LIVE_PATH else health.readiness()
                self._send(200 if ok else 503, f"{why}\n".encode(), "text/plain; charset=utf-8", body)
            else:
                self._send(404, f"not found; try {', '.join(PATHS)}\n".encode(), "text/plain; charset=utf-8", body)

        def _send(self, status: int, data: bytes, content_type: str, body: bool) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if body:
                self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            self._answer(body=True)

        def do_HEAD(self) -> None:  # noqa: N802
            self._answer(body=False)

        def log_message(self, format: str, *args: object) -> None:  # probes every few seconds: not for the log
            log.debug("%s: %s", health.name, format % args)

    return Handler
