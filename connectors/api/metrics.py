"""Prometheus metrics: requests, latency, diagnoses by status and domain, engine time.

Each app owns its registry (tests build many apps in one process). With several
uvicorn workers, ``serve`` sets PROMETHEUS_MULTIPROC_DIR and /metrics aggregates
all workers' files, so a scrape sees the whole service, not one worker.
"""
from __future__ import annotations

import os
import time
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client import multiprocess
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Label values come from fixed sets: a client may send any method or path, and every new
# label value is a new series held for the process's life (/metrics needs no token).
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("firstfault_http_requests", "HTTP requests handled",
                                ["method", "route", "status"], registry=r)
        self.latency = Histogram("firstfault_http_request_duration_seconds", "HTTP request latency",
                                 ["method", "route"], buckets=_LATENCY_BUCKETS, registry=r)
        self.diagnoses = Counter("firstfault_diagnoses", "diagnoses produced by POST /v1/analyze",
                                 ["status", "domain"], registry=r)
        self.engine_seconds = Histogram("firstfault_engine_seconds",
                                        "engine time per analysis (parse, extract, diagnose)",
                                        buckets=_LATENCY_BUCKETS, registry=r)
        self.rejections = Counter("firstfault_limit_rejections", "requests refused by a limit",
                                  ["limit"], registry=r)

    def render(self) -> tuple[bytes, str]:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry), CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class MetricsMiddleware:
    """Counts and times every HTTP request by its route template (bounded label values)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = {"code": 500}

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route: Any = scope.get("route")
            # Route templates, never raw paths: unmatched paths share one label.
            template = (getattr(route, "path_format", None) or getattr(route, "path", None)
                        or ("/ui/static" if scope["path"].startswith("/ui/static/") else "unmatched"))
            method = scope.get("method", "GET")
            method = method if method in METHODS else "other"
            code = status["code"] if 100 <= status["code"] <= 599 else 500
            self.metrics.requests.labels(method, template, str(code)).inc()
            self.metrics.latency.labels(method, template).observe(time.perf_counter() - start)
