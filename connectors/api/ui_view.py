"""What the diagnosis page shows, computed from a Diagnosis: headline, timeline, evidence.

Pure functions, no web framework: the page template only lays these out.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote, urlencode

from firstfault.schemas import Diagnosis, Ref

MAX_LANES = 40                  # lanes drawn; hosts beyond are listed by name
ROW_PX = 14                     # one symptom group per row inside a lane
Span = tuple[Any, datetime | None, datetime | None]     # (symptom, first, last)


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


def ref_url(d: Diagnosis, r: Ref | None) -> str:
    """The page showing a reference's line with 20 lines either side."""
    if r is None:
        return ""
    return (f"/ui/lines/{quote(d.workload_id, safe='/')}?"
            + urlencode({"attempt": d.attempt, "path": r.path, "line": r.line}))


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
    is_candidate: bool = False
    href: str = ""


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


def _rows(d: Diagnosis, root_t: datetime | None, spans: list[Span]) -> list[Row]:
    rows: list[Row] = []
    for i, c in enumerate(d.candidates):
        t = _parse_stamp(c.onset)
        detail = f"{c.message}; covers {round(100 * c.coverage)}% of the symptom lines"
        rows.append(Row(t, "", list(c.nodes), f"{c.domain} / {c.sub_domain}", len(c.evidence), detail,
                        ref_text(c.evidence[0]) if c.evidence else "", False, True, f"ev-cand-{i}", True,
                        ref_url(d, c.evidence[0] if c.evidence else None)))
    if d.root_cause is not None:
        rc = d.root_cause
        rows.append(Row(root_t, _delta(root_t, root_t), [rc.host] if rc.host else [], rc.kind, 1, rc.message,
                        ref_text(rc.ref), True, True, "ev-root", href=ref_url(d, rc.ref)))
    for i, (s, first, last) in enumerate(spans):
        detail = f"{len(s.hosts)} host{'s' if len(s.hosts) != 1 else ''}"
        if s.ranks:
            detail += f", {len(s.ranks)} rank{'s' if len(s.ranks) != 1 else ''}"
        if first and last and last > first:
            detail += f", over {_delta(last, first).lstrip('+')}"
        delta = _delta(first, root_t)
        if s.explained and d.root_cause is not None and (first is None or (root_t is not None and first < root_t)):
            # An echo never shows before its cause: its stamp was inherited from a line above.
            detail += ", time is a lower bound (the stamped line above)" if first else ", no time of its own"
            delta = "≥ " + delta if first else delta
        rows.append(Row(first, delta, s.hosts, s.kind, s.count, detail, ref_text(s.sample),
                        False, s.explained, f"ev-sym-{i}", href=ref_url(d, s.sample)))
    floor = datetime.min.replace(tzinfo=timezone.utc)

    def order(r: Row) -> tuple:
        if d.root_cause is not None and (r.is_root or r.explained):
            # The root and its echoes: the root first, echoes no earlier than it.
            at = root_t if root_t is not None else None
            when = max(r.when, at) if (r.when is not None and at is not None) else (at or r.when)
            return (when is None and at is not None, when or floor, not r.is_root)
        return (r.when is None, r.when or floor, True)

    rows.sort(key=order)
    return rows


def timeline(d: Diagnosis) -> dict[str, Any]:
    """Host lanes over one time axis: the root cause as a marker, each symptom group as a bar.

    Hosts that saw exactly the same symptom groups share a lane ("gpu-001 +30"), so a
    512-node job still fits a screen; within a lane each group has its own row.
    """
    root_t = _parse_stamp(d.root_cause.onset or d.root_cause.timestamp) if d.root_cause else None
    spans = [(s, _parse_stamp(s.first), _parse_stamp(s.last)) for s in d.symptoms]
    cand_t = [_parse_stamp(c.onset) for c in d.candidates]
    times = [t for t in [root_t, *cand_t, *(a for _, a, _ in spans), *(b for _, _, b in spans)] if t is not None]
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
    cands: dict[str, list[int]] = {h: [] for h in roles}
    for i, c in enumerate(d.candidates):
        if cand_t[i] is not None:
            for h in c.nodes or ["(unknown host)"]:
                cands.setdefault(h, []).append(i)
                roles.setdefault(h, "candidate")
                seen.setdefault(h, [])
    # One lane per (role, root marker, candidates, symptom groups) pattern, in host reading order.
    lanes: dict[tuple[str, bool, tuple[int, ...], tuple[int, ...]], Lane] = {}
    for h, role in roles.items():
        key = (role, h == root_host, tuple(cands.get(h, ())), tuple(seen[h]))
        if not key[3] and not key[2] and not role and not key[1]:
            continue
        lanes.setdefault(key, Lane([], role)).hosts.append(h)
    for (_, has_root, lane_cands, groups), lane in lanes.items():
        if has_root and d.root_cause is not None and root_t is not None:
            lane.marks.append(Mark("root", d.root_cause.kind, pos(root_t), 0, d.root_cause.message, anchor="ev-root"))
        for i in lane_cands:
            c, t = d.candidates[i], cand_t[i]
            assert t is not None
            lane.marks.append(Mark("candidate", c.sub_domain, pos(t), 0, f"candidate: {c.sub_domain} — {c.message}",
                                   anchor=f"ev-cand-{i}"))
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


def failed_at(d: Diagnosis) -> str | None:
    """When it went wrong: the root cause's onset, else the first candidate's, else the first symptom's."""
    if d.status == "no_failure":
        return None
    if d.root_cause is not None and (d.root_cause.onset or d.root_cause.timestamp):
        return d.root_cause.onset or d.root_cause.timestamp
    stamps = [c.onset for c in d.candidates if c.onset] or [s.first for s in d.symptoms if s.first]
    return min(stamps, key=lambda t: _parse_stamp(t) or datetime.max.replace(tzinfo=timezone.utc)) if stamps else None


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
        # The suspect and why first (the summary says it); what to collect is the next step, not the cause.
        who = f" — suspects: {', '.join(d.suspect_nodes)}" if d.suspect_nodes else ""
        return {"title": f"No root cause proven{who}",
                "sentence": d.summary or "no line proves a cause"}
    return {"title": "Completed — no failure", "sentence": f"terminal state {d.terminal_state}"}


def diagnosis_view(d: Diagnosis) -> dict[str, Any]:
    edges: dict[str, list[Any]] = {}
    for e in d.explains:
        edges.setdefault(e.target, []).append(e)
    root_ref = d.root_cause.ref if d.root_cause else None
    return {"d": d, "headline": headline(d), "timeline": timeline(d), "edges": edges,
            "root_ref": ref_text(root_ref) if root_ref else None, "ref_text": ref_text,
            "ref_url": lambda r: ref_url(d, r), "root_url": ref_url(d, root_ref)}
