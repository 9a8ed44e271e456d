"""Server-rendered pages for people: a diagnosis page and an index of recent diagnoses.

The page answers the on-call questions in order: did it fail and do we know why
(status colour, one big root-cause line, the recovery action), where and when
(a per-host timeline with the root cause marked and the symptoms it explains),
and how do we know (the evidence trail with raw-line references). The content
comes from ``ui_view``; this module serves it (routes, login, HTML errors).
"""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path as FsPath
from typing import Annotated, Any
from urllib.parse import parse_qs, quote, urlencode

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from firstfault.connectors.sinks.redis_store import InvalidCursor
from firstfault.schemas import Diagnosis

from .auth import UI_COOKIE
from .context import ServiceContext
from .errors import ApiError
from .limits import MAX_FORM_BYTES, read_body
from .fleet import build_report, node_report
from .routes import load_context
from .ui_view import diagnosis_view, failed_at, headline

HERE = FsPath(__file__).resolve().parent
templates = Jinja2Templates(directory=str(HERE / "templates"))


def _when(stamp: str | None) -> str:
    """An ISO stamp as people read it: '2026-11-05 11:00:02.000 UTC' (milliseconds, no 'T')."""
    return "no time" if not stamp else stamp.replace("T", " ").rstrip("Z")[:23] + " UTC"


templates.env.filters["when"] = _when
STATUSES = ("attributed", "ambiguous", "unattributed", "no_failure")
HTML = {"text/html": {"schema": {"type": "string"}}}
NODE_BADGE = {"avoid": "attributed", "watch": "ambiguous", "ok": "no_failure"}     # the status colours


def _html_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    text = {401: "Login needed (the page carries a token form)", 403: "The token may not read",
            404: "No such diagnosis", 422: "Invalid parameter", 500: "Unexpected error",
            503: "The diagnoses store is unavailable"}
    return {s: {"description": text[s], "content": HTML} for s in sorted({*statuses, 500})}


def _parse_filter_time(raw: str | None, label: str, notes: list[str]) -> datetime | None:
    if not raw:
        return None
    try:
        t = datetime.fromisoformat(raw)
    except ValueError:
        notes.append(f"ignored {label}: {raw!r} is not a date and time")
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


# Pages show raw log text: escaped by Jinja, and fenced by a strict policy besides.
# Inline style attributes position the timeline marks, hence 'unsafe-inline' for styles only.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                               "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _page(request: Request, name: str, context: dict[str, Any], status_code: int = 200,
          headers: dict[str, str] | None = None) -> Response:
    return templates.TemplateResponse(request, name, context, status_code=status_code,
                                      headers={**PAGE_HEADERS, **(headers or {})})


def render_error(request: Request, exc: ApiError) -> Response:
    """The HTML form of an API error on a /ui/ page (a login form for 401/403)."""
    login = exc.status in (401, 403) and exc.code != "cross_site_request"
    return _page(request, "message.html", {
        "title": "Sign in" if login else f"{exc.status}", "message": exc.message, "login": login,
        "next": request.url.path + (f"?{request.url.query}" if request.url.query else "")},
        status_code=exc.status, headers=exc.headers)


def retention_note(kept: dict[str, Any]) -> str:
    """What the store's retention dropped, in one sentence for the index page."""
    ttl = f", {kept['ttl_days']:g} days" if kept["ttl_days"] else ""
    oldest = f"; the oldest kept was stored {_when(kept['oldest_kept_stored_at'])}" if kept["oldest_kept_stored_at"] else ""
    return (f"{kept['dropped']} older diagnoses were dropped to keep the store within its retention (at most "
            f"{kept['max_diagnoses']} diagnoses, {kept['max_bytes']} bytes{ttl}: FIRSTFAULT_STORE_MAX_DIAGNOSES, "
            f"_MAX_BYTES, _TTL_DAYS){oldest}")


def build_ui_router(ctx: ServiceContext) -> APIRouter:
    router = APIRouter(prefix="/ui", tags=["ui"])
    read = Depends(ctx.auth.dependency("read", allow_cookie=True))

    @router.get("/", dependencies=[read], response_class=HTMLResponse, summary="Recent diagnoses (HTML)",
                responses=_html_responses(401, 403, 422, 503))
    async def index(request: Request,
                    status: Annotated[str | None, Query(max_length=32)] = None,
                    domain: Annotated[str | None, Query(max_length=64)] = None,
                    node: Annotated[str | None, Query(max_length=256)] = None,
                    since: Annotated[str | None, Query(max_length=64)] = None,
                    until: Annotated[str | None, Query(max_length=64)] = None,
                    cursor: Annotated[str | None, Query(max_length=1024)] = None) -> Response:
        # Filters come from an HTML form: empty means "any", a bad value is noted, not an error page.
        notes: list[str] = []
        if status and status not in STATUSES:
            notes.append(f"ignored status {status!r}")
            status = None
        filters = {"status": status or None, "domain": domain or None, "node": node or None,
                   "since": _parse_filter_time(since, "since", notes),
                   "until": _parse_filter_time(until, "until", notes)}
        try:
            items, next_cursor = await ctx.in_thread(ctx.store.query, limit=50, cursor=cursor or None, **filters)
        except InvalidCursor:
            notes.append("ignored an invalid page cursor")
            items, next_cursor = await ctx.in_thread(ctx.store.query, limit=50, **filters)
        kept = await ctx.in_thread(ctx.store.retention_status)
        if kept["dropped"]:
            notes.append(retention_note(kept))
        form = {"status": status or "", "domain": domain or "", "node": node or "",
                "since": since or "", "until": until or ""}
        next_url = None
        if next_cursor:
            next_url = "/ui/?" + urlencode({**{k: v for k, v in form.items() if v}, "cursor": next_cursor})
        return _page(request, "index.html", {
            "items": items, "form": form, "statuses": STATUSES, "notes": notes, "next_url": next_url,
            "headline": headline, "failed_at": failed_at})

    @router.get("/diagnoses/{workload_id:path}", dependencies=[read], response_class=HTMLResponse,
                summary="One diagnosis, readable at a glance (HTML)",
                responses=_html_responses(401, 403, 404, 422, 503))
    async def page(request: Request, workload_id: Annotated[str, Path(min_length=1, max_length=256)],
                   attempt: Annotated[int | None, Query(ge=0)] = None) -> Response:
        def load() -> tuple[Diagnosis | None, list[Diagnosis], list[int]]:
            d = ctx.store.latest(workload_id, attempt)
            if d is None:
                return None, [], []
            return d, ctx.store.revisions(workload_id, d.attempt), ctx.store.attempts(workload_id)

        d, revisions, attempts = await ctx.in_thread(load)
        if d is None:
            which = f" attempt {attempt}" if attempt is not None else ""
            raise ApiError(404, "not_found", f"no diagnosis stored for workload {workload_id!r}{which}")
        return _page(request, "diagnosis.html", {
            **diagnosis_view(d), "revisions": revisions, "attempts": attempts})

    @router.get("/lines/{workload_id:path}", dependencies=[read], response_class=HTMLResponse,
                summary="A log reference with 20 lines either side (HTML)",
                responses=_html_responses(401, 403, 404, 422, 503))
    async def lines(request: Request, workload_id: Annotated[str, Path(min_length=1, max_length=256)],
                    path: Annotated[str, Query(min_length=1, max_length=1024)],
                    line: Annotated[int, Query(ge=1, le=2**31)],
                    attempt: Annotated[int | None, Query(ge=0)] = None) -> Response:
        found = await load_context(ctx, workload_id, attempt, path, line)
        back = f"/ui/diagnoses/{quote(workload_id, safe='/')}?attempt={found['attempt']}"
        return _page(request, "lines.html", {**found, "back": back})

    @router.get("/nodes", dependencies=[read], response_class=HTMLResponse,
                summary="Nodes: episodes, recommendation (avoid, watch, ok) and why, a page at a time (HTML)",
                responses=_html_responses(401, 403, 422, 503))
    async def nodes(request: Request, cursor: Annotated[str | None, Query(max_length=256)] = None) -> Response:
        report, nxt = await ctx.in_thread(build_report, ctx, cursor or None)
        return _page(request, "nodes.html", {"report": report, "nodes": report["nodes"], "one": False,
                                             "badge": NODE_BADGE,
                                             "next_url": f"/ui/nodes?{urlencode({'cursor': nxt})}" if nxt else None})

    @router.get("/nodes/{node}", dependencies=[read], response_class=HTMLResponse,
                summary="One node's episodes, recommendation and why (HTML)",
                responses=_html_responses(401, 403, 422, 503))
    async def node(request: Request, node: Annotated[str, Path(min_length=1, max_length=256)]) -> Response:
        one = await ctx.in_thread(node_report, ctx, node)
        return _page(request, "nodes.html", {"report": one, "nodes": [one.node], "one": True, "badge": NODE_BADGE})

    @router.get("/login", response_class=HTMLResponse, summary="Token form for the pages (HTML)",
                responses=_html_responses(422))
    async def login_form(request: Request, next: Annotated[str, Query(max_length=512)] = "/ui/") -> Response:
        return _page(request, "message.html", {
            "title": "Sign in", "message": "Paste a read or write token.", "login": True, "next": _safe_next(next)})

    # POST on its own path: one method per path keeps each path's Allow header exact.
    @router.post("/session", summary="Keep a token in a cookie for the pages", status_code=303,
                 responses={303: {"description": "token accepted; redirect to the page"},
                            **_html_responses(401)},
                 openapi_extra={"requestBody": {"required": True, "content": {
                     "application/x-www-form-urlencoded": {"schema": {
                         "type": "object", "required": ["token"],
                         "properties": {"token": {"type": "string"}, "next": {"type": "string"}}}}}}})
    async def login(request: Request) -> Response:
        # No token is known before the body is read: cap it first (16 KiB), never read it whole.
        body = await read_body(request, ctx.settings, cap=MAX_FORM_BYTES)
        form = parse_qs(body.decode("utf-8", "replace"))
        token = (form.get("token") or [""])[0].strip()
        target = _safe_next((form.get("next") or ["/ui/"])[0])
        if ctx.auth.enabled and ctx.auth.token_level(token) is None:
            raise ApiError(401, "invalid_token", "that token is not valid",
                           headers={"WWW-Authenticate": 'Bearer realm="firstfault", error="invalid_token"'})
        resp = RedirectResponse(target, status_code=303)
        if ctx.auth.enabled:
            # Path=/: the pages' upload form posts to /v1/analyze, which takes this cookie as a write
            # token. SameSite=Strict and the same-origin check (origin.py) keep other sites from using it.
            resp.delete_cookie(UI_COOKIE, path="/ui")      # the narrower one earlier versions set
            resp.set_cookie(UI_COOKIE, token, httponly=True, samesite="strict", path="/",
                            secure=request.url.scheme == "https")
        return resp

    return router


def _safe_next(target: str) -> str:
    # Only same-site page paths: never an open redirect.
    return target if target.startswith("/ui/") and not target.startswith("//") and "\\" not in target else "/ui/"
