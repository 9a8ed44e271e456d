"""What the diagnosis page shows, computed from a Diagnosis: headline, timeline, evidence.

Pure functions, no web framework: the page template only lays these out.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote, urlencode

from firstfault.rules.order import shown_at
from firstfault.rules.summary import coverage_phrase, inferred_record, percent
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


INFERRED_RECORD = "the inferred workload record"


def ref_text(r: Ref, d: Diagnosis | None = None) -> str:
    if d is not None and r.path == "workload.json" and inferred_record(d.missing_evidence):
        return INFERRED_RECORD          # a bare file or folder: there is no workload.json to point at
    return f"{r.path}:{r.line}"


def ref_url(d: Diagnosis, r: Ref | None) -> str:
    """The page showing a reference's line with 20 lines either side ("": nothing to link, no such file)."""
    if r is None or ref_text(r, d) == INFERRED_RECORD:
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
    at_least: bool = False      # the time is a lower bound (no stamp of its own: the stamped line above), shown ≥
    basis: str | None = None


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
        detail = f"{c.message}; covers {percent(c.coverage)} of the symptom lines"
        rows.append(Row(t, "", list(c.nodes), f"{c.domain} / {c.sub_domain}", len(c.evidence), detail,
                        ref_text(c.evidence[0], d) if c.evidence else "", False, True, f"ev-cand-{i}", True,
                        ref_url(d, c.evidence[0] if c.evidence else None)))
    if d.root_cause is not None:
        rc = d.root_cause
        rows.append(Row(root_t, _delta(root_t, root_t), [rc.host] if rc.host else [], rc.kind, 1, rc.message,
                        ref_text(rc.ref, d), True, True, "ev-root", href=ref_url(d, rc.ref),
                        at_least=rc.time_basis == "inherited", basis=rc.time_basis))
    for i, (s, first, last) in enumerate(spans):
        # Counts that are none are left out ("0 hosts" says nothing).
        detail = ", ".join(f"{n} {what}{'s' if n != 1 else ''}" for n, what in ((len(s.hosts), "host"),
                                                                               (len(s.ranks), "rank")) if n)
        if first and last and last > first:
            detail += f", over {_delta(last, first).lstrip('+')}"
        delta = _delta(first, root_t)
        bound = s.first_basis == "inherited" and first is not None
        if bound:
            detail += ", time is a lower bound (the stamped line above)"
            delta = "≥ " + delta if delta else delta
        elif first is None and s.explained and d.root_cause is not None:
            detail += ", no time of its own"
        detail = detail.removeprefix(", ")
        rows.append(Row(first, delta, s.hosts, s.kind, s.count, detail, ref_text(s.sample, d),
                        False, s.explained, f"ev-sym-{i}", href=ref_url(d, s.sample), at_least=bound,
                        basis=s.first_basis))
    floor = datetime.min.replace(tzinfo=timezone.utc)

    def order(r: Row) -> tuple:
        # As the JSON orders symptoms (rules/order.py shown_at): points where they are, a lower bound
        # at its bound but an explained one never before its cause; the root first at its instant.
        at = r.when if r.is_root or r.is_candidate else shown_at(r.when, r.basis, r.explained, root_t)
        return (at is None, at or floor, not r.is_root, r.basis not in ("stamped", "uptime"), r.when is None)

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
            title = (f"{s.kind} ×{s.count} on {len(s.hosts)} host(s): {'≥ ' if s.first_basis == 'inherited' else ''}"
                     f"{s.first} … {s.last}")
            title += "" if s.explained else " (not explained by the root cause)"
            label_at = "inside" if width >= 14 else ("before" if left > 60 else "after")
            # The count is the job's: on a lane that holds only some of the group's hosts it is not this
            # lane's, so the label names the kind alone (the title and the table give the job's count).
            whole = set(s.hosts) <= set(lane.hosts)
            if not whole:
                title += f" (job-wide; {', '.join(lane.hosts[:3])}{' …' if len(lane.hosts) > 3 else ''} "
                title += "logged part of it)"
            lane.marks.append(Mark("symptom", f"{s.kind} ×{s.count}" if whole else s.kind, left, width, title, row,
                                   s.explained, f"ev-sym-{i}", label_at))
        lane.rows = max(1, len(groups))
    shown = list(lanes.values())
    ticks = _ticks(t0, span)
    hidden = [h for lane in shown[MAX_LANES:] for h in lane.hosts]
    return {"lanes": shown[:MAX_LANES], "hidden_hosts": hidden, "rows": rows, "ticks": ticks, "row_px": ROW_PX,
            "window": f"{t0.strftime('%Y-%m-%d %H:%M:%S')} – {t1.strftime('%H:%M:%S')} UTC"}


def _ticks(t0: datetime, span_s: float, n: int = 4) -> list[dict[str, Any]]:
    """Axis labels over the whole axis (``span_s`` seconds from ``t0``), each label different: as
    precise as the spacing needs (milliseconds under a second apart, the date past a day)."""
    from datetime import timedelta

    step = span_s / n
    fmt = "%m-%d %H:%M" if span_s >= 86400 else ("%H:%M:%S" if step >= 1 else "%H:%M:%S.%f")
    out: list[dict[str, Any]] = []
    for i in range(n + 1):
        label = (t0 + timedelta(seconds=step * i)).strftime(fmt)
        label = label[:-3] if fmt.endswith("%f") else label
        if out and out[-1]["label"] == label:
            continue
        out.append({"left": round(2 + 96 * i / n, 2), "label": label})
    return out


def failed_at(d: Diagnosis) -> str | None:
    """When it went wrong: the root cause's onset, else the first candidate's, else the first symptom's."""
    if d.status == "no_failure":
        return None
    if d.root_cause is not None and (d.root_cause.onset or d.root_cause.timestamp):
        return d.root_cause.onset or d.root_cause.timestamp
    stamps = [c.onset for c in d.candidates if c.onset] or [s.first for s in d.symptoms if s.first]
    return min(stamps, key=lambda t: _parse_stamp(t) or datetime.max.replace(tzinfo=timezone.utc)) if stamps else None


def headline(d: Diagnosis) -> dict[str, str]:
    """The one line an on-call engineer reads first; ``why``: what the summary adds to the sentence
    (the summary opens with the root's own sentence, which the header must not print twice)."""
    if d.status == "attributed" and d.root_cause is not None:
        sentence = d.root_cause.message
        why = d.summary
        if why.startswith(sentence.rstrip(".")):
            why = why[len(sentence.rstrip(".")):].lstrip(". ")
        return {"title": f"{d.root_cause.host or 'unknown host'} · {d.domain} / {d.sub_domain}",
                "sentence": sentence, "why": why}
    if d.status == "ambiguous":
        return {"title": f"Ambiguous: {len(d.candidates)} causes fit",
                "sentence": "; ".join(f"{c.sub_domain} on {', '.join(c.nodes) or 'unknown hosts'}"
                                      for c in d.candidates), "why": d.summary}
    if d.status == "unattributed":
        # The suspect and why first (the summary says it); what to collect is the next step, not the cause.
        who = f" — suspects: {', '.join(d.suspect_nodes)}" if d.suspect_nodes else ""
        return {"title": f"No root cause proven{who}",
                "sentence": d.summary or "no line proves a cause", "why": ""}
    return {"title": "Completed — no failure", "sentence": f"terminal state {d.terminal_state}", "why": d.summary}


def diagnosis_view(d: Diagnosis) -> dict[str, Any]:
    edges: dict[str, list[Any]] = {}
    for e in d.explains:
        edges.setdefault(e.target, []).append(e)
    root_ref = d.root_cause.ref if d.root_cause else None
    return {"d": d, "headline": headline(d), "timeline": timeline(d), "edges": edges,
            "root_ref": ref_text(root_ref, d) if root_ref else None, "ref_text": lambda r: ref_text(r, d),
            "ref_url": lambda r: ref_url(d, r), "root_url": ref_url(d, root_ref),
            "coverage": coverage_phrase(d.status, d.symptom_coverage, d.symptoms)}
