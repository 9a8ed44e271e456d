"""``firstfault serve``: run the REST service and the diagnosis pages under uvicorn.

    firstfault serve [--host H] [--port P] [--redis-url URL] [--workers N]

Flags override FIRSTFAULT_HOST / FIRSTFAULT_PORT / FIRSTFAULT_REDIS_URL /
FIRSTFAULT_WORKERS. Without any token configured the service is unauthenticated,
so it refuses to listen anywhere but loopback.
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from urllib.parse import urlsplit, urlunsplit

from fastapi import FastAPI

from firstfault.rules.catalog import load_catalog
from firstfault.rules.errors import CatalogError

from .settings import ServiceSettings, env_name

DEFAULT_FACTORY = "firstfault.connectors.api.serve:app_from_env"


def app_from_env() -> FastAPI:
    """The uvicorn factory: every worker builds its app from the FIRSTFAULT_* environment."""
    from .app import create_app

    return create_app(ServiceSettings.from_env())


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _redact(url: str | None) -> str:
    if not url:
        return "in-process memory (not shared, lost on exit)"
    parts = urlsplit(url)
    if parts.password:
        netloc = f"{parts.username or ''}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="firstfault serve", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The REST service and the diagnosis pages: POST /v1/analyze takes what `firstfault analyze`\n"
                    "takes; the pages (/ui/) show each stored diagnosis. With no --redis-url it uses a running\n"
                    "`firstfault up`'s Redis, if that has one.",
        epilog="examples:\n"
               "  firstfault serve                                       http://127.0.0.1:8080/ui/\n"
               "  curl -F bundle=@slurm-1234.out http://127.0.0.1:8080/v1/analyze\n"
               "exit codes: 0 stopped; 2 it cannot start (a bad setting, a store that does not answer,\n"
               "  no token configured for an address other than loopback)")
    p.add_argument("--host", help=f"address to bind (default {env_name('host')} or 127.0.0.1)")
    p.add_argument("--port", type=int, help=f"port (default {env_name('port')} or 8080)")
    p.add_argument("--redis-url", help=f"diagnoses store (default {env_name('redis_url')}; none: in memory)")
    p.add_argument("--workers", type=int, help=f"worker processes (default {env_name('workers')} or 1)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="how much uvicorn logs on stderr (default info: one line per request)")
    return p


def serve_main(argv: Sequence[str] | None = None, *, factory: str = DEFAULT_FACTORY) -> int:
    """Entry point of ``firstfault serve``; returns the exit code.

    ``factory`` is the uvicorn import string of a zero-argument app factory: the
    streaming side can pass its own that calls ``create_app(publisher=..., kafka_ready=...)``.
    """
    args = build_parser().parse_args(argv)
    try:
        settings = ServiceSettings.from_env(host=args.host, port=args.port, redis_url=args.redis_url,
                                            workers=args.workers)
        load_catalog(settings.rules)
    except (ValueError, CatalogError) as exc:
        print(f"firstfault serve: {exc}", file=sys.stderr)
        return 2
    if settings.redis_url:            # a wrong store is one line now, not a 500 on every request
        from firstfault.streams.reach import Unreachable, check_redis

        try:
            check_redis(settings.redis_url, f"check --redis-url or {env_name('redis_url')}")
        except Unreachable as exc:
            print(f"firstfault serve: {exc}", file=sys.stderr)
            return 2
    if not settings.auth_enabled and not is_loopback(settings.host):
        print(f"firstfault serve: refusing to listen on {settings.host}: no tokens are configured, so the "
              f"service would be open to anyone. Set {env_name('read_tokens')} / {env_name('write_tokens')} "
              f"(or their _FILE variants), or bind 127.0.0.1.", file=sys.stderr)
        return 2

    # Workers are separate processes that read the environment: hand them the flags.
    for field in ("host", "port", "redis_url", "workers"):
        value = getattr(settings, field)
        if value is not None:
            os.environ[env_name(field)] = str(value)
    metrics_dir = None
    if settings.workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # Aggregate /metrics over the workers (see metrics.py). Must be set before they start.
        metrics_dir = tempfile.mkdtemp(prefix="firstfault-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir

    auth = ("bearer tokens required (read: read or write token; POST /v1/analyze: write token)"
            if settings.auth_enabled else
            f"UNAUTHENTICATED (no {env_name('read_tokens')} / {env_name('write_tokens')}): loopback only")
    print(f"firstfault serve: http://{settings.host}:{settings.port}  workers={settings.workers}\n"
          f"  store: {_redact(settings.redis_url)}\n  auth: {auth}", file=sys.stderr)
    if settings.workers > 1 and not settings.redis_url:
        print("  warning: without Redis each worker keeps its own diagnoses; reads may miss stored ones",
              file=sys.stderr)

    import uvicorn

    try:
        uvicorn.run(factory, factory=True, host=settings.host, port=settings.port, workers=settings.workers,
                    log_level=args.log_level, server_header=False, date_header=True)
    finally:
        if metrics_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(serve_main())
