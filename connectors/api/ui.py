"""Server-rendered pages for people: a diagnosis page and an index of recent diagnoses.

The page answers the on-call questions in order: did it fail and do we know why
(status colour, one big root-cause line, the recovery action), where and when
(a per-host timeline with the root cause marked and the symptoms it explains),
and how do we know (the evidence trail with raw-line references).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path as FsPath
from typing import Annotated, Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from firstfault.connectors.sinks.redis_store import InvalidCursor
from firstfault.schemas import Diagnosis, Ref

from .auth import UI_COOKIE
from .context import ServiceContext
from .errors import ApiError

HERE = FsPath(__file__).resolve().parent
templates = Jinja2Templates(directory=str(HERE / "templates"))
STATUSES = ("attributed", "ambiguous", "unattributed", "no_failure")
MAX_LANES = 40
HTML = {"text/html": {"schema": {"type": "string"}}}


def _html_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    text = {401: "Login needed (the page carries a token form)", 403: "The token may not read",
            404: "No such diagnosis", 422: "Invalid parameter", 500: "Unexpected error",
            503: "The diagnoses store is unavailable"}
    return {s: {"description": text[s], "content": HTML} for s in sorted({*statuses, 500})}


def _parse_stamp(s: str | None) -> datetime | None:
    if not s:
        return None
    try:
        t = datetime.fromisoformat(s)
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def ref_text(r: Ref) -> str:
    return f"{r.path}:{r.line}"


def _delta(t: datetime | None, origin: datetime | None) -> str:
    if t is None or origin is None:
        return ""
    s = (t - origin).total_seconds()
    sign = "+" if s >= 0 else "−"
    s = abs(s)
    if s < 60:
        return f"{sign}{s:.1f} s"
    if s < 3600:
        return f"{sign}{int(s // 60)} min {int(s % 60)} s"
    return f"{sign}{s / 3600:.1f} h"


ROW_PX = 14                     # one symptom group per row inside a lane


@dataclass
class Mark:
    kind: str                   # "root" or "symptom"
    label: str
    left: float                 # percent of the axis
    width: float
    title: str
    row: int = 0
    explained: bool = True
    anchor: str = ""
    label_at: str = "after"     # "inside" a wide bar, "after" or "before" a narrow one


@dataclass
class Lane:
    hosts: list[str]
    role: str                   # responsible | suspect | candidate | ""
    marks: list[Mark] = field(default_factory=list)
    rows: int = 1

    @property
    def label(self) -> str:
        return self.hosts[0] if len(self.hosts) == 1 else f"{self.hosts[0]} +{len(self.hosts) - 1}"


@dataclass
class Row:
    when: datetime | None
    delta: str
    hosts: list[str]
    kind: str
    count: int
    detail: str
    ref: str
    is_root: bool
    explained: bool
    anchor: str


def _roles(d: Diagnosis) -> dict[str, str]:
    """Hosts in reading order (blamed, suspected, candidates, the rest) with their role."""
    role: dict[str, str] = {}
    for h in d.responsible_nodes:
        role.setdefault(h, "responsible")
    if d.root_cause and d.root_cause.host:
        role.setdefault(d.root_cause.host, "responsible")
    for h in d.suspect_nodes:
        role.setdefault(h, "suspect")
    for c in d.candidates:
        for h in c.nodes:
            role.setdefault(h, "candidate")
    for s in d.symptoms:
        for h in sorted(s.hosts) or ["(no host)"]:
            role.setdefault(h, "")
    return role


def _rows(d: Diagnosis, root_t: datetime | None, spans: list[tuple[Any, datetime | None, datetime | None]]) -> list[Row]:
    rows: list[Row] = []
    if d.root_cause is not None:
        rc = d.root_cause
        rows.append(Row(root_t, _delta(root_t, root_t), [rc.host] if rc.host else [], rc.kind, 1, rc.message,
                        ref_text(rc.ref), True, True, "ev-root"))
    for i, (s, first, last) in enumerate(spans):
        detail = f"{len(s.hosts)} host{'s' if len(s.hosts) != 1 else ''}"
        if s.ranks:
            detail += f", {len(s.ranks)} rank{'s' if len(s.ranks) != 1 else ''}"
        if first and last and last > first:
            detail += f", over {_delta(last, first).lstrip('+')}"
        rows.append(Row(first, _delta(first, root_t), s.hosts, s.kind, s.count, detail, ref_text(s.sample),
                        False, s.explained, f"ev-sym-{i}"))
    rows.sort(key=lambda r: (r.when is None, r.when or datetime.min.replace(tzinfo=timezone.utc), not r.is_root))
    return rows


def timeline(d: Diagnosis) -> dict[str, Any]:
    """Host lanes over one time axis: the root cause as a marker, each symptom group as a bar.

    Hosts that saw exactly the same symptom groups share a lane ("gpu-001 +30"), so a
    512-node job still fits a screen; within a lane each group has its own row.
    """
    root_t = _parse_stamp(d.root_cause.onset or d.root_cause.timestamp) if d.root_cause else None
    spans = [(s, _parse_stamp(s.first), _parse_stamp(s.last)) for s in d.symptoms]
    times = [t for t in [root_t, *(a for _, a, _ in spans), *(b for _, _, b in spans)] if t is not None]
    rows = _rows(d, root_t, spans)
    if not times:
        return {"lanes": [], "rows": rows, "ticks": [], "hidden_hosts": [], "row_px": ROW_PX}

    t0, t1 = min(times), max(times)
    span = max((t1 - t0).total_seconds(), 1.0)

    def pos(t: datetime) -> float:
        return round(2 + 96 * (t - t0).total_seconds() / span, 2)

    roles = _roles(d)
    root_host = (d.root_cause.host or "(unknown host)") if d.root_cause is not None and root_t else None
    if root_host:
        roles.setdefault(root_host, "responsible")
    seen: dict[str, list[int]] = {h: [] for h in roles}
    for i, (s, first, _) in enumerate(spans):
        if first is not None:
            for h in s.hosts or ["(no host)"]:
                seen[h].append(i)
    # One lane per (role, root marker, symptom groups) pattern, in host reading order.
    lanes: dict[tuple[str, bool, tuple[int, ...]], Lane] = {}
    for h, role in roles.items():
        key = (role, h == root_host, tuple(seen[h]))
        if not key[2] and not role and not key[1]:
            continue
        lanes.setdefault(key, Lane([], role)).hosts.append(h)
    for (_, has_root, groups), lane in lanes.items():
        if has_root and d.root_cause is not None and root_t is not None:
            lane.marks.append(Mark("root", d.root_cause.kind, pos(root_t), 0, d.root_cause.message, anchor="ev-root"))
        for row, i in enumerate(groups):
            s, first, last = spans[i]
            assert first is not None
            left = pos(first)
            width = max(round(pos(last or first) - left, 2), 0.4)
            title = f"{s.kind} ×{s.count} on {len(s.hosts)} host(s): {s.first} … {s.last}"
            title += "" if s.explained else " (not explained by the root cause)"
            label_at = "inside" if width >= 14 else ("before" if left > 60 else "after")
            lane.marks.append(Mark("symptom", f"{s.kind} ×{s.count}", left, width, title, row, s.explained,
                                   f"ev-sym-{i}", label_at))
        lane.rows = max(1, len(groups))
    shown = list(lanes.values())
    ticks = [{"left": round(2 + 96 * i / 4, 2),
              "label": (t0 + (t1 - t0) * (i / 4)).strftime("%H:%M:%S")} for i in range(5)]
    hidden = [h for lane in shown[MAX_LANES:] for h in lane.hosts]
    return {"lanes": shown[:MAX_LANES], "hidden_hosts": hidden, "rows": rows, "ticks": ticks, "row_px": ROW_PX,
            "window": f"{t0.strftime('%Y-%m-%d %H:%M:%S')} – {t1.strftime('%H:%M:%S')} UTC"}


def headline(d: Diagnosis) -> dict[str, str]:
    """The one line an on-call engineer reads first."""
    if d.status == "attributed" and d.root_cause is not None:
        return {"title": f"{d.root_cause.host or 'unknown host'} · {d.domain} / {d.sub_domain}",
                "sentence": d.root_cause.message}
    if d.status == "ambiguous":
        return {"title": f"Ambiguous: {len(d.candidates)} causes fit",
                "sentence": "; ".join(f"{c.sub_domain} on {', '.join(c.nodes) or 'unknown hosts'}"
                                      for c in d.candidates)}
    if d.status == "unattributed":
        who = f" — suspects: {', '.join(d.suspect_nodes)}" if d.suspect_nodes else ""
        return {"title": f"No root cause proven{who}",
                "sentence": "; ".join(m.detail for m in d.missing_evidence[:3]) or "insufficient evidence"}
    return {"title": "Completed — no failure", "sentence": f"terminal state {d.terminal_state}"}


def diagnosis_view(d: Diagnosis) -> dict[str, Any]:
    edges: dict[str, list[Any]] = {}
    for e in d.explains:
        edges.setdefault(e.target, []).append(e)
    root_ref = d.root_cause.ref if d.root_cause else None
    return {"d": d, "headline": headline(d), "timeline": timeline(d), "edges": edges,
            "root_ref": ref_text(root_ref) if root_ref else None, "ref_text": ref_text}


def _parse_filter_time(raw: str | None, label: str, notes: list[str]) -> datetime | None:
    if not raw:
        return None
    try:
        t = datetime.fromisoformat(raw)
    except ValueError:
        notes.append(f"ignored {label}: {raw!r} is not a date and time")
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def render_error(request: Request, exc: ApiError) -> Response:
    """The HTML form of an API error on a /ui/ page (a login form for 401/403)."""
    login = exc.status in (401, 403)
    return templates.TemplateResponse(request, "message.html", {
        "title": "Sign in" if login else f"{exc.status}", "message": exc.message, "login": login,
        "next": request.url.path}, status_code=exc.status, headers=exc.headers)


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
        form = {"status": status or "", "domain": domain or "", "node": node or "",
                "since": since or "", "until": until or ""}
        next_url = None
        if next_cursor:
            next_url = "/ui/?" + urlencode({**{k: v for k, v in form.items() if v}, "cursor": next_cursor})
        return templates.TemplateResponse(request, "index.html", {
            "items": items, "form": form, "statuses": STATUSES, "notes": notes, "next_url": next_url,
            "headline": headline})

    @router.get("/diagnoses/{workload_id}", dependencies=[read], response_class=HTMLResponse,
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
        return templates.TemplateResponse(request, "diagnosis.html", {
            **diagnosis_view(d), "revisions": revisions, "attempts": attempts})

    @router.get("/login", response_class=HTMLResponse, summary="Token form for the pages (HTML)",
                responses=_html_responses(422))
    async def login_form(request: Request, next: Annotated[str, Query(max_length=512)] = "/ui/") -> Response:
        return templates.TemplateResponse(request, "message.html", {
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
        form = parse_qs((await request.body())[:8192].decode("utf-8", "replace"))
        token = (form.get("token") or [""])[0].strip()
        target = _safe_next((form.get("next") or ["/ui/"])[0])
        if ctx.auth.enabled and ctx.auth.token_level(token) is None:
            raise ApiError(401, "invalid_token", "that token is not valid",
                           headers={"WWW-Authenticate": 'Bearer realm="firstfault", error="invalid_token"'})
        resp = RedirectResponse(target, status_code=303)
        if ctx.auth.enabled:
            resp.set_cookie(UI_COOKIE, token, httponly=True, samesite="strict", path="/ui",
                            secure=request.url.scheme == "https")
        return resp

    return router


def _safe_next(target: str) -> str:
    # Only same-site page paths: never an open redirect.
    return target if target.startswith("/ui/") and not target.startswith("//") and "\\" not in target else "/ui/"
