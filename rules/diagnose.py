"""Events of one workload attempt -> its Diagnosis: EARLY, FINAL, then the contract's object.

Deterministic: output depends only on the workload record, the set of events
(their content, not their order) and the catalog.
"""
from __future__ import annotations

import hashlib
import heapq
import json
from datetime import timedelta
from collections import defaultdict
from collections.abc import Iterable, Mapping
from operator import attrgetter
from typing import Any

from firstfault.schemas import (
    Candidate, Diagnosis, EvidenceStep, ExplainsEdge, MissingEvidence, Recovery, Ref, RootCause,
    Symptom, WorkloadRecord,
)

from .bundle import source_of
from .catalog import Catalog
from .early import run_early
from .final import SCHEDULER_RECORD, DEFAULT_SETTINGS, FinalContext, reachable
from .model import Ev
from .order import POINT, basis_of, shown_at
from .python import ordered as final_rules
from .python.final_rules import responsible
from .stamps import iso_z
from .summary import write_summary

WORKLOAD_REF = "workload.json"
# Node-scoped lines (kernel, driver, Fabric Manager) belong to a workload only within
# this horizon around its run; the stream routes them with the same horizon.
EVIDENCE_HORIZON_S = 3600.0
NODE_SCOPED = ("syslog", "fabricmanager")


def in_horizon(workload: WorkloadRecord, ev: Ev) -> bool:
    # Only a node's own log reaches beyond the workload; a kernel line pasted into the job's
    # output file is the job's evidence whatever its stamp says.
    if ev.source not in NODE_SCOPED or ev.stamp is None or source_of(ev.path) not in NODE_SCOPED:
        return True
    span = timedelta(seconds=EVIDENCE_HORIZON_S)
    if ev.stamp < workload.start_time - span:
        return False
    return workload.end_time is None or ev.stamp <= workload.end_time + span


def scheduler_event(workload: WorkloadRecord) -> Ev:
    """The scheduler's end of the attempt, as an event the EARLY rules can tag."""
    fields: dict[str, Any] = {"state": workload.state, "terminal_state": workload.terminal_state,
                              "exit_code": None if workload.exit_code is None else str(workload.exit_code)}
    return Ev(kind="scheduler_end", pattern="workload", source="scheduler", path=WORKLOAD_REF, line=1,
              text=f"state={workload.state} exit_code={workload.exit_code}", stamp=workload.end_time,
              last_stamp=workload.end_time, onset=workload.end_time,
              quality="exact" if workload.end_time else "none", fields=fields,
              signature="scheduler_end")


# No cycle check: canonical forms are lists of scalars and one fields dict (the output is the same).
_CANONICAL_JSON = json.JSONEncoder(sort_keys=True, default=str, check_circular=False)


def _canonical_dumps() -> Any:
    """``_CANONICAL_JSON.encode`` for the events' lists, its C encoder made once: ``encode`` builds a new
    one a call, a third of the cost of a small list. The same text (json.encoder.iterencode's
    one-shot path with the encoder's own settings); the plain ``encode`` where C is not there."""
    c_make = getattr(json.encoder, "c_make_encoder", None)
    if c_make is None:
        return _CANONICAL_JSON.encode
    enc = _CANONICAL_JSON
    c_encode = c_make(None, enc.default, json.encoder.encode_basestring_ascii, None, enc.key_separator,
                      enc.item_separator, enc.sort_keys, enc.skipkeys, enc.allow_nan)
    return lambda value: "".join(c_encode(value, 0))


_DUMPS_LIST = _canonical_dumps()
# json.dumps(detail, sort_keys=True, default=str) without an encoder made for every step
_DETAIL_JSON = json.JSONEncoder(sort_keys=True, default=str)


def diagnosis_id(workload: WorkloadRecord, events: Iterable[Ev], inventory: Mapping[str, Any], version: str) -> str:
    """Content hash of the inputs' canonical form (the extracted events, not raw bytes) and the catalog."""
    digest = hashlib.sha256()
    dumps = _CANONICAL_JSON.encode         # json.dumps(..., sort_keys=True, default=str), one encoder
    digest.update(dumps(workload.canonical()).encode())
    dumps_list = _DUMPS_LIST
    for ev in sorted(events, key=_SIGNATURE):
        digest.update(dumps_list(ev.canonical()).encode())
    # Lists in any order hash alike; their members may be dicts (inferred facts), so sort by canonical form.
    digest.update(dumps({k: sorted(v, key=dumps) if isinstance(v, (set, list, tuple)) else v
                         for k, v in sorted(inventory.items())}).encode())
    digest.update(version.encode())
    return "sha256:" + digest.hexdigest()[:32]


_SIGNATURE, _COUNT, _HOST, _RANKS = attrgetter("signature"), attrgetter("count"), attrgetter("host"), attrgetter("ranks")
_ZONE = attrgetter("stamp.tzinfo")
_BY_TIME, _BY_PLACE = attrgetter("stamp", "path", "line"), attrgetter("path", "line")
_BY_TIME_SIG, _BY_PLACE_SIG = attrgetter("stamp", "path", "line", "signature"), attrgetter("path", "line", "signature")


def in_time_order(events: Iterable[Ev], signature: bool = False) -> list[Ev]:
    """``sorted(events, key=Ev.order_key)`` (then by signature, if asked), without a key tuple and a naive
    copy of the stamp made in Python for each event. Stamps that share one tzinfo object (or have none)
    compare as their naive forms do (Python compares them without asking the zone), so the stamped
    events sort on C getters and the unstamped follow them; stamps of several zones sort by
    ``order_key`` itself."""
    events = list(events)
    stamped = [e for e in events if e.stamp is not None]
    if len(set(map(id, map(_ZONE, stamped)))) > 1:
        return sorted(events, key=(lambda e: (e.order_key(), e.signature)) if signature else Ev.order_key)
    unstamped = [e for e in events if e.stamp is None] if len(stamped) < len(events) else []
    stamped.sort(key=_BY_TIME_SIG if signature else _BY_TIME)
    unstamped.sort(key=_BY_PLACE_SIG if signature else _BY_PLACE)
    return stamped + unstamped


def _first_refs(keys: Iterable[tuple[str, int]], limit: int) -> list[tuple[str, int]]:
    """``sorted(keys)[:limit]``: a step may touch thousands of lines and shows the first ``limit``."""
    return heapq.nsmallest(limit, keys)


def _refs(events: Iterable[Ev], limit: int) -> list[Ref]:
    keys = _first_refs({(e.path, e.line) for e in events}, limit)
    return [Ref(path=p, line=n) for p, n in keys]


def _gpu(ev: Ev) -> str | int | None:
    return ev.gpu_index if ev.gpu_index is not None else ev.pci


def _message(ev: Ev, catalog: Catalog) -> str:
    if ev.output:
        return ev.output
    summary = catalog.taxonomy.get(ev.domain or "", {}).get(ev.sub_domain or "", {}).get("summary", ev.kind)
    where = f" on {ev.host}" if ev.host else ""
    return f"{summary}{where}"


def _first(evs: list[Ev]) -> tuple[str | None, str | None]:
    """A group's first time and its basis: a point when a line of its own stamp is the earliest
    (or ties it), else the inherited lower bound of an unstamped line."""
    timed = [(e.stamp, e.quality not in POINT) for e in evs if e.stamp is not None]
    if not timed:
        return None, None
    stamp, bound = min(timed)
    quality = next(e.quality for e in evs if e.stamp == stamp and (e.quality not in POINT) == bound)
    return iso_z(stamp), basis_of(quality)


def _symptoms(ctx: FinalContext, cause_at: str | None = None) -> list[Symptom]:
    # Ambiguous: a symptom is explained when a candidate explains it (whichever is the cause),
    # so the flags agree with the coverage the candidates are shown with.
    roots = list(ctx.chosen) or [m for c in ctx.candidates for m in c["members"]]
    explained: set[int] = set()
    for root in roots:
        explained.update(map(id, reachable(ctx, root)))
    members: dict[str, list[Ev]] = defaultdict(list)
    left_out = ctx.excluded | {id(r) for r in ctx.chosen}
    roots_shown = ctx.status != "attributed" and not ctx.candidates     # no cause, no candidates: roots are listed
    for ev in ctx.events:
        if ev.role in ("symptom", "marker") or (ev.role == "root" and (roots_shown or id(ev) in ctx.explained_by)):
            if id(ev) not in left_out and ev.kind != SCHEDULER_RECORD:
                members[ev.kind].append(ev)     # the workload record is the job's end, not a symptom line
    out = []
    for kind, evs in members.items():
        evs = in_time_order(evs)
        first, basis = _first(evs)
        lasts = [e.last_stamp or e.stamp for e in evs if (e.last_stamp or e.stamp) is not None]
        out.append(Symptom(
            kind=kind, count=sum(map(_COUNT, evs)),
            hosts=sorted(h for h in set(map(_HOST, evs)) if h),
            ranks=sorted(set().union(*map(_RANKS, evs))),
            first=first, last=iso_z(max(lasts)) if lasts else None, first_basis=basis,
            sample=evs[0].ref(), explained=explained.issuperset(map(id, evs)) and bool(roots),
        ))

    def order(s: Symptom) -> tuple:
        at = shown_at(s.first, s.first_basis, s.explained, cause_at)    # a bound never before its cause
        # At one instant a point comes first: a bound says "at or after" it.
        return (at is None, at or "", s.first_basis not in ("stamped", "uptime"), s.first is None, s.first or "", s.kind)

    out.sort(key=order)
    return out


def _explains(ctx: FinalContext) -> list[ExplainsEdge]:
    if not ctx.chosen:
        return []
    chain = {id(r) for r in ctx.chosen}
    for r in ctx.chosen:
        chain |= {id(t) for t in reachable(ctx, r) if t.role == "root"}
    agg: dict[tuple, int] = defaultdict(int)
    for e in ctx.edges:
        if id(e.source) in chain:
            agg[(e.rule_id, e.join, e.source.path, e.source.line, e.target.kind)] += e.target.count
    return [ExplainsEdge(rule_id=r, join=j, source=Ref(path=p, line=n), target=k, count=c)
            for (r, j, p, n, k), c in sorted(agg.items())]


def _evidence(ctx: FinalContext, early_steps: Mapping[str, Mapping[str, Any]], catalog: Catalog) -> list[EvidenceStep]:
    limit = int(ctx.settings["max_refs"])
    steps = []
    order = {r.id: i for i, r in enumerate(catalog.early)}
    for rid in sorted(early_steps, key=lambda r: (order.get(r, 1 << 30), r)):
        st = early_steps[rid]
        refs = _first_refs(st["refs"], limit)
        steps.append(EvidenceStep(rule_id=rid, stage="early", action=st["action"], count=st["count"],
                                  events=[Ref(path=p, line=n) for p, n in refs], detail={}))
    for st in ctx.steps:
        steps.append(EvidenceStep(rule_id=st.rule_id, stage="final", action=st.action,
                                  count=sum(e.count for e in st.events), events=_refs(st.events, limit),
                                  detail=json.loads(_DETAIL_JSON.encode(st.detail))))
    return steps


def diagnose(workload: WorkloadRecord, events: Iterable[Ev], catalog: Catalog,
             inventory: Mapping[str, Any] | None = None, owned: bool = False) -> Diagnosis:
    """``owned``: the events are this call's to change (made for it, never read again); else it
    works on copies, so the caller's stay as extracted (the stream keeps them in state)."""
    inventory = dict(inventory or {})
    evs = [e for e in events if e.source not in NODE_SCOPED or in_horizon(workload, e)]    # the rest are the job's
    did = diagnosis_id(workload, evs, inventory, catalog.version)
    work = evs if owned else [e.copy() for e in evs]
    work.append(scheduler_event(workload))
    work = in_time_order(work, signature=True)
    kept, trail = run_early(catalog, work)
    settings = {**DEFAULT_SETTINGS, **dict(catalog.settings), "_inventory": inventory}
    ctx = FinalContext(workload=workload, catalog=catalog, events=kept, settings=settings)
    for rule in final_rules():
        rule.fn(ctx)
    return _assemble(ctx, trail.steps, catalog, did)


def _first_onset(members: list[Ev]) -> str | None:
    stamps = [t for t in (m.corrected_onset or m.stamp for m in members) if t is not None]
    return iso_z(min(stamps)) if stamps else None


def _assemble(ctx: FinalContext, early_steps, catalog: Catalog, did: str) -> Diagnosis:
    wl = ctx.workload
    status = ctx.status or "unattributed"
    root = None
    domain, sub = "unknown", "unattributed"
    candidates: list[Candidate] = []
    if status == "no_failure":
        domain, sub = "none", "none"
    elif status == "attributed":
        first = ctx.chosen[0]           # the FINAL stage put the initiating report first
        domain, sub = first.domain or "unknown", first.sub_domain or "unattributed"
        root = RootCause(
            kind=first.kind, domain=domain, sub_domain=sub, host=first.host, gpu=_gpu(first), rank=first.rank,
            timestamp=iso_z(first.stamp), onset=iso_z(first.corrected_onset), time_basis=basis_of(first.quality),
            fields={k: v for k, v in sorted(first.fields.items()) if v is not None and not isinstance(v, (list, dict))},
            ref=first.ref(), text=first.text, message=_message(first, catalog),
        )
    elif status == "ambiguous":
        sub = "ambiguous"
        doms = {c["domain"] for c in ctx.candidates}
        domain = doms.pop() if len(doms) == 1 else "ambiguous"
        for c in ctx.candidates:
            members = c["members"]
            candidates.append(Candidate(
                domain=c["domain"] or "unknown", sub_domain=c["sub_domain"],
                nodes=sorted({m.host for m in members if m.host}) if c["domain"] != "scheduler" else [],
                coverage=c["coverage"], evidence=_refs(members, int(ctx.settings["max_refs"])),
                message=_message(members[0], catalog), onset=_first_onset(members)))
    rec = ctx.recovery or {"action": "notify_owner", "nodes": []}
    symptoms = _symptoms(ctx, (root.onset or root.timestamp) if root is not None else None)
    summary = write_summary(ctx, status, root, candidates, sum(s.count for s in symptoms))
    return Diagnosis(
        workload_id=wl.workload_id, attempt=wl.attempt, terminal_state=wl.terminal_state, status=status,
        domain=domain, sub_domain=sub, root_cause=root, responsible_nodes=responsible(ctx),
        suspect_nodes=sorted(h for h in ctx.suspects if h),
        candidates=candidates, symptoms=symptoms, evidence=_evidence(ctx, early_steps, catalog),
        explains=_explains(ctx), symptom_coverage=round(float(ctx.coverage), 4),
        missing_evidence=[MissingEvidence(**m) for m in ctx.missing],
        recovery=Recovery(action=rec["action"], nodes=sorted(rec["nodes"]), reason=rec.get("reason", ""),
                          next_step=rec.get("next_step", "")),
        summary=summary,
        rules_version=catalog.version, diagnosis_id=did,
    )
