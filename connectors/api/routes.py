"""The JSON API: analyze, read diagnoses, health, readiness and metrics."""
from __future__ import annotations

import re
import time
from urllib.parse import quote
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from pydantic import BeforeValidator

from firstfault.connectors.sinks.redis_store import CURSOR_PATTERN, InvalidCursor
from firstfault.rules.attempts import escalate
from firstfault.rules.engine import analyze_bundle
from firstfault.schemas import Diagnosis

from .context import ServiceContext, call_hook
from .errors import ApiError, responses
from .evidence import (JSON, LOG_TYPES, MAX_NAME_BYTES, MULTIPART, Evidence, bundle_from_body, check_media_type,
                       evidence_from_log, evidence_from_upload)
from .excerpts import context, excerpts
from .limits import read_body
from .models import DiagnosisPage, DiagnosisRecord, Health, NodeDiagnosisPage, Readiness

StatusFilter = Literal["attributed", "ambiguous", "unattributed", "no_failure"]
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _iso_only(value: object) -> object:
    # pydantic would read "0.5" as a Unix time; the API promises ISO-8601 date-times only.
    if isinstance(value, (int, float)) or (isinstance(value, str) and _NUMBER.fullmatch(value.strip())):
        raise ValueError("expected an ISO-8601 date-time, e.g. 2026-11-02T10:00:00Z")
    return value


IsoDateTime = Annotated[datetime, BeforeValidator(_iso_only)]
WorkloadId = Annotated[str, Path(min_length=1, max_length=256, description="the scheduler's workload id")]
Host = Annotated[str, Path(min_length=1, max_length=256)]
Limit = Annotated[int, Query(ge=1, le=500, description="page size")]
Cursor = Annotated[str | None, Query(max_length=1024, pattern=CURSOR_PATTERN,
                                     description="next_cursor of the previous page")]

ANALYZE_BODY = {
    "required": True,
    "content": {
        JSON: {"schema": {"$ref": "#/components/schemas/AnalyzeRequest"}},
        "application/gzip": {"schema": {"type": "string", "format": "binary"},
                             "description": "a .tar.gz bundle (layout at the root or under one folder)"},
        "application/zip": {"schema": {"type": "string", "format": "binary"}, "description": "a .zip bundle"},
        MULTIPART: {"schema": {"type": "object", "properties": {"bundle": {"type": "string", "format": "binary"}}},
                    "description": "the pages' upload form (curl -F bundle=@FILE): a bundle archive, the JSON form "
                                   "or one log file; a browser (Accept prefers text/html) is redirected (303) to "
                                   "the diagnosis page, any other client gets the diagnosis"},
        **{mt: {"schema": {"type": "string", "format": "binary"},
                "description": "one log file (slurm-1234.out, dmesg.txt), read as `firstfault analyze FILE` "
                               "reads it; `name` gives its file name"} for mt in LOG_TYPES},
    },
}


def page_url(d: Diagnosis) -> str:
    return f"/ui/diagnoses/{quote(d.workload_id, safe='/')}?attempt={d.attempt}"


def wants_page(accept: str | None) -> bool:
    """Does the client prefer an HTML page to JSON? A browser's form navigation does
    (``text/html,...,*/*;q=0.8``); curl's ``*/*`` and ``application/json`` do not."""
    ranges = []
    for item in (accept or "").split(","):
        mt, *params = [p.strip() for p in item.split(";")]
        q = next((p[2:] for p in params if p.startswith("q=")), "1")
        try:
            ranges.append((mt.lower(), float(q)))
        except ValueError:
            continue

    def quality(media: str) -> float:
        kind = media.split("/")[0] + "/*"
        for candidate in (media, kind, "*/*"):             # the most specific range decides (RFC 9110)
            found = [q for mt, q in ranges if mt == candidate]
            if found:
                return max(found)
        return 0.0

    return quality("text/html") > quality("application/json")


def _diagnosis_response(d: Diagnosis, headers: dict[str, str] | None = None, text: str | None = None) -> Response:
    # Exactly `firstfault analyze --json` (without its trailing newline); ``text``: d.to_json() made already.
    return Response(d.to_json() if text is None else text, media_type="application/json", headers=headers)


def build_router(ctx: ServiceContext) -> APIRouter:
    router = APIRouter()
    read = Depends(ctx.auth.dependency("read"))
    # The pages' upload form posts here with the pages' cookie (SameSite=Strict, so no other site can).
    write = Depends(ctx.auth.dependency("write", allow_cookie=True))
    settings = ctx.settings

    @router.post(
        "/v1/analyze", tags=["analyze"], dependencies=[write], response_class=JSONResponse,
        summary="Diagnose one workload attempt's evidence",
        description="The body is the JSON form, a bundle archive, or one log file (text/plain or "
                    "application/octet-stream, named by `name`: read as `firstfault analyze FILE` reads it). "
                    "Returns the diagnosis exactly as "
                    "`firstfault analyze --json` prints it, and keeps it in the diagnoses store (with the "
                    "lines around each log reference) unless `store=false`; the `X-Firstfault-Page` header "
                    "gives its page. `publish=true` sends it to the diagnoses topic (409 when no publisher "
                    "is configured). A form upload (multipart/form-data) is always stored; a browser's is "
                    "answered with a redirect to the page, any other client's with the diagnosis. "
                    "When stored and the store holds attempt N-1 of the workload, an attempt that fails like it "
                    "has its recovery escalated, and says so in `recovery.reason`.",
        openapi_extra={"requestBody": ANALYZE_BODY},
        responses={200: {"model": Diagnosis, "description": "the diagnosis",
                         "headers": {"X-Firstfault-Stored": {"description": "`true` if saved, `false` if this exact "
                                                             "diagnosis was already stored (absent with store=false)",
                                                             "schema": {"type": "string"}},
                                     "X-Firstfault-Page": {"description": "the stored diagnosis' page",
                                                           "schema": {"type": "string"}},
                                     "X-Firstfault-Published": {"description": "with publish=true: `true`",
                                                                "schema": {"type": "string"}}}},
                   303: {"description": "a browser's form upload (multipart/form-data, Accept preferring "
                                        "text/html) was diagnosed and stored: its page is in Location",
                         "headers": {"Location": {"description": "the diagnosis page", "schema": {"type": "string"}}}},
                   **responses(400, 401, 403, 409, 413, 415, 422, 503, 504)})
    async def analyze(request: Request,
                      store: Annotated[bool, Query(description="keep the diagnosis in the diagnoses store")] = True,
                      publish: Annotated[bool, Query(description="send it to the diagnoses topic")] = False,
                      name: Annotated[str | None, Query(
                          max_length=MAX_NAME_BYTES, description="with a text/plain or application/octet-stream "
                          "body: the log's file name (slurm-1234.out; the workload id is its stem); "
                          "default upload.log")] = None,
                      ) -> Response:
        try:
            return await _analyze(request, store, publish, name)
        except ApiError as exc:
            if exc.limit:
                ctx.metrics.rejections.labels(exc.limit).inc()
            raise

    async def _analyze(request: Request, store: bool, publish: bool, name: str | None) -> Response:
        if publish and ctx.publisher is None:
            raise ApiError(409, "publish_not_configured",
                           "publishing is not configured on this service (no diagnoses topic producer)")
        content_type = request.headers.get("content-type")
        mt = check_media_type(content_type)
        upload = mt == MULTIPART
        body = await read_body(request, settings)
        deadline = ctx.runner.deadline()

        def work() -> tuple[Diagnosis, datetime | None, dict[str, dict[str, str]] | None]:
            # Every step honours the deadline, so a request past its cap frees its thread.
            start = time.perf_counter()
            ev: Evidence | None = None
            try:
                if upload:
                    ev = evidence_from_upload(body, content_type or "", settings, deadline)
                elif mt in LOG_TYPES:
                    ev = evidence_from_log(body, name, settings, deadline)
                else:
                    ev = Evidence(bundle_from_body(body, content_type, settings, deadline))
                d = analyze_bundle(ev.bundle, ctx.catalog, intake=ev.intake, deadline=deadline).diagnosis
                # The lines around each reference, while the bundle is at hand (it is not kept).
                lines = excerpts(ev.bundle, d) if store or upload else None
                return d, ev.bundle.workload.end_time, lines
            finally:
                if ev is not None:
                    ev.close()
                ctx.metrics.engine_seconds.observe(time.perf_counter() - start)

        diagnosis, ended_at, lines = await ctx.runner.run(work, deadline)
        ctx.metrics.diagnoses.labels(diagnosis.status, diagnosis.domain).inc()
        headers: dict[str, str] = {}
        text: str | None = None             # the diagnosis as stored and answered: made once
        if store or upload:
            def keep() -> tuple[Diagnosis, bool, str]:
                # Attempt N failing like attempt N-1 escalates recovery (rules/attempts.py).
                d = escalate(diagnosis, ctx.store.latest(diagnosis.workload_id, diagnosis.attempt - 1)
                             if diagnosis.attempt > 0 else None)
                doc = d.to_json()
                saved = ctx.store.save(d, ended_at, lines=lines, doc=doc)
                if ctx.nodes is not None:        # the fleet memory: the episodes of this attempt
                    ctx.nodes.record(d, fallback_at=ended_at.isoformat() if ended_at else None)
                return d, saved, doc
            diagnosis, saved, text = await ctx.in_thread(keep)
            page = page_url(diagnosis)
            headers["X-Firstfault-Stored"] = "true" if saved else "false"
            headers["X-Firstfault-Page"] = page
            headers["Link"] = f'<{page}>; rel="alternate"; type="text/html"'
            if upload and wants_page(request.headers.get("accept")):
                return RedirectResponse(page, status_code=303, headers=headers)
        if publish:
            assert ctx.publisher is not None
            try:
                await call_hook(ctx.publisher, diagnosis)
            except Exception as exc:
                raise ApiError(503, "publish_failed", f"publishing the diagnosis failed: {exc}") from None
            headers["X-Firstfault-Published"] = "true"
        return _diagnosis_response(diagnosis, headers, text)

    # ":path": Kubernetes-style ids ("namespace/job") contain slashes.
    @router.get("/v1/diagnoses/{workload_id:path}", tags=["diagnoses"], dependencies=[read],
                response_model=DiagnosisRecord, summary="A workload attempt's latest diagnosis and revisions",
                responses=responses(401, 403, 404, 422, 503))
    async def get_diagnosis(workload_id: WorkloadId,
                            attempt: Annotated[int | None, Query(ge=0, description="default: the latest "
                                                                 "stored attempt")] = None) -> Response:
        def load() -> dict[str, Any] | None:
            latest = ctx.store.latest(workload_id, attempt)
            if latest is None:
                return None
            return {"workload_id": workload_id, "attempt": latest.attempt,
                    "attempts": ctx.store.attempts(workload_id), "diagnosis": latest.to_dict(),
                    "revisions": [r.to_dict() for r in ctx.store.revisions(workload_id, latest.attempt)]}

        found = await ctx.in_thread(load)
        if found is None:
            which = f" attempt {attempt}" if attempt is not None else ""
            raise ApiError(404, "not_found", f"no diagnosis stored for workload {workload_id!r}{which}")
        return JSONResponse(found)

    @router.get("/v1/lines/{workload_id:path}", tags=["diagnoses"], dependencies=[read],
                summary="A log reference of a stored diagnosis with 20 lines either side",
                responses=responses(401, 403, 404, 422, 503))
    async def lines(workload_id: WorkloadId,
                    path: Annotated[str, Query(min_length=1, max_length=1024, description="the reference's path")],
                    line: Annotated[int, Query(ge=1, le=2**31, description="the reference's line number")],
                    attempt: Annotated[int | None, Query(ge=0)] = None) -> Response:
        return JSONResponse(await load_context(ctx, workload_id, attempt, path, line))

    @router.get("/v1/diagnoses", tags=["diagnoses"], dependencies=[read], response_model=DiagnosisPage,
                summary="Recent diagnoses, newest first, filtered and paginated",
                description="Also says what the store keeps (FIRSTFAULT_STORE_MAX_DIAGNOSES, _MAX_BYTES, _TTL_DAYS) "
                            "and what it dropped to keep to it (`retention`).",
                responses=responses(401, 403, 422, 503))
    async def list_diagnoses(
            since: Annotated[IsoDateTime | None,
                             Query(description="ended at or after (ISO-8601; UTC if no zone)")] = None,
            until: Annotated[IsoDateTime | None, Query(description="ended at or before")] = None,
            status: StatusFilter | None = None,
            domain: Annotated[str | None, Query(max_length=64)] = None,
            node: Annotated[str | None, Query(max_length=256, description="blamed or suspected host")] = None,
            limit: Limit = 50, cursor: Cursor = None) -> Response:
        items, next_cursor = await _query(since=since, until=until, status=status, domain=domain, node=node,
                                          limit=limit, cursor=cursor)
        retention = await ctx.in_thread(ctx.store.retention_status)
        return JSONResponse({"items": [d.to_dict() for d in items], "next_cursor": next_cursor,
                             "retention": retention})

    @router.get("/v1/nodes/{host}/diagnoses", tags=["diagnoses"], dependencies=[read],
                response_model=NodeDiagnosisPage, summary="Diagnoses that blamed or suspected a host",
                responses=responses(401, 403, 422, 503))
    async def node_diagnoses(host: Host, limit: Limit = 50, cursor: Cursor = None) -> Response:
        items, next_cursor = await _query(node=host, limit=limit, cursor=cursor)
        out = [{"role": "responsible" if _blamed(d, host) else "suspect", "diagnosis": d.to_dict()} for d in items]
        return JSONResponse({"host": host, "items": out, "next_cursor": next_cursor})

    async def _query(**kwargs: Any) -> tuple[list[Diagnosis], str | None]:
        try:
            return await ctx.in_thread(ctx.store.query, **kwargs)
        except InvalidCursor as exc:
            raise ApiError(422, "invalid_cursor", f"cursor: {exc}") from None

    @router.get("/healthz", tags=["operations"], response_model=Health, summary="The process is up",
                responses=responses())
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.get("/readyz", tags=["operations"], response_model=Readiness,
                summary="The store and, when configured, Kafka are reachable",
                responses={503: {"model": Readiness, "description": "a dependency is not reachable"},
                           **responses()})
    async def readyz() -> JSONResponse:
        checks = {"store": await ctx.in_thread(ctx.store.ping)}
        if ctx.kafka_ready is not None:
            checks["kafka"] = await ctx.kafka_reachable()
        ready = all(checks.values())
        body = {"status": "ready" if ready else "not_ready", "checks": checks,
                "store_backend": ctx.store.backend, "rules_version": ctx.catalog.version}
        return JSONResponse(body, status_code=200 if ready else 503)

    @router.get("/metrics", tags=["operations"], response_class=Response, summary="Prometheus metrics",
                responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                                 "description": "Prometheus text exposition format"}, **responses()})
    async def metrics() -> Response:
        data, content_type = ctx.metrics.render()
        return Response(data, media_type=content_type)

    return router


def _blamed(d: Diagnosis, host: str) -> bool:
    return host in d.responsible_nodes or (d.root_cause is not None and d.root_cause.host == host)


async def load_context(ctx: ServiceContext, workload_id: str, attempt: int | None, path: str, line: int) -> dict:
    """The stored diagnosis' kept lines around ``path:line`` (404 when no such diagnosis)."""
    def load() -> dict | None:
        d = ctx.store.latest(workload_id, attempt)
        return None if d is None else context(d, ctx.store.lines(d.diagnosis_id), path, line)

    found = await ctx.in_thread(load)
    if found is None:
        which = f" attempt {attempt}" if attempt is not None else ""
        raise ApiError(404, "not_found", f"no diagnosis stored for workload {workload_id!r}{which}")
    return found
