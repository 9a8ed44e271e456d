"""The REST service and the pages: ``create_app`` wires settings, store, engine, auth, metrics and pages."""
from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.staticfiles import StaticFiles

import firstfault
from firstfault.connectors.sinks.node_health import NodeHealthStore
from firstfault.connectors.sinks.redis_store import DiagnosisStore, StoreUnavailable
from firstfault.rules.catalog import load_catalog

from . import errors
from .auth import Auth
from .context import Publisher, ReadyCheck, ServiceContext
from .errors import ApiError
from .evidence import AnalyzeRequest
from .origin import HostCheckMiddleware, check_same_origin
from .query import plain_query
from .fleet import build_fleet_router
from .metrics import Metrics, MetricsMiddleware
from .routes import build_router
from .runner import EngineRunner
from .settings import ServiceSettings
from .ui import HERE, build_ui_router, render_error

DESCRIPTION = """Send one workload attempt's evidence, get its diagnosis; read the diagnoses the
service and the stream stored. Errors are always `{"error": {"code", "message", "limit"}}`;
`limit` names the configuration variable of a limit that was hit."""


def create_app(settings: ServiceSettings | None = None, store: DiagnosisStore | None = None,
               publisher: Publisher | None = None, kafka_ready: ReadyCheck | None = None,
               clock: Callable[[], float] = time.time) -> FastAPI:
    """Build the service.

    ``settings`` default to the ``FIRSTFAULT_*`` environment; ``store`` to one on
    ``settings.redis_url`` (in-process memory without a URL). ``publisher(diagnosis)``
    sends a diagnosis to the diagnoses topic and ``kafka_ready()`` says whether the
    broker is reachable; both may be sync or async and are optional. ``clock`` (seconds
    since the epoch) is when the fleet memory's policy is judged: now, unless a test says.
    """
    settings = settings or ServiceSettings.from_env()
    ctx = ServiceContext(
        settings=settings,
        store=store or DiagnosisStore(settings.redis_url, settings.redis_prefix, retention=settings.retention),
        catalog=load_catalog(settings.rules),       # fail at start, not on the first request
        runner=EngineRunner(settings), metrics=Metrics(), auth=Auth(settings),
        publisher=publisher, kafka_ready=kafka_ready,
        nodes=NodeHealthStore(settings.redis_url, settings.redis_prefix, clock=clock), clock=clock)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        ctx.runner.close()

    app = FastAPI(title="firstfault", version=firstfault.__version__,
                  description=DESCRIPTION, lifespan=lifespan,
                  dependencies=[Depends(plain_query), Depends(check_same_origin)])
    app.state.ctx = ctx
    errors.install(app, html=render_error, translate={
        StoreUnavailable: lambda exc: ApiError(503, "store_unavailable", f"the diagnoses store is unavailable: {exc}",
                                               headers={"Retry-After": "5"})})

    app.add_middleware(MetricsMiddleware, metrics=ctx.metrics)
    app.add_middleware(HostCheckMiddleware, settings=settings)     # outermost: before anything is read
    app.include_router(build_router(ctx))
    app.include_router(build_fleet_router(ctx))
    app.include_router(build_ui_router(ctx))
    app.mount("/ui/static", StaticFiles(directory=str(HERE / "static")), name="ui-static")
    app.openapi = lambda: _openapi(app)         # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document plus the analyze request body, which the route parses itself
    (it accepts three media types, so FastAPI cannot infer it)."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    body = AnalyzeRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(body.pop("$defs", {}))
    components["AnalyzeRequest"] = body
    app.openapi_schema = schema
    return schema
