"""The correlator's per-attempt state and its decisions. Pure: no Faust, no Kafka, no I/O.

One ``WorkloadState`` per workload attempt (table key ``"<workload_id>:<attempt>"``):
the scheduler record, when the attempt ended, its events merged by signature (the
same order-free merge as the offline path, so memory grows with distinct signatures,
not lines), the bundle paths that contributed lines, and what was published.

Lifecycle, driven by :func:`decide`:

* running: a batch with an event the EARLY rules tag as a strong root triggers a
  diagnosis against the start record; if FINAL already attributes it, a
  ``provisional`` diagnosis (revision 0) goes out, at most once per distinct result;
* ended: after the grace (:func:`due_for_final`) the final diagnosis (revision 0), once the
  extractors have read every raw partition up to the end (:mod:`.progress`); past
  ``watermark_wait_s`` without that, a provisional that says what is missing, and the final
  only when the evidence completes (or, still behind, at the lateness horizon, saying so);
* no diagnosis made on evidence known to be incomplete (a running workload, extractors
  behind) carries a node drain or exclusion (:func:`held_back`);
* late evidence within ``lateness_s`` of the end: a revision (+1) only when the
  *result* changed (:func:`result_hash`), not merely the evidence;
* past the lateness horizon the state is closed (events dropped, a small tombstone
  kept so stragglers and redelivered records are ignored) and later expires.

Every diagnosis to publish is appended to ``pending`` (an outbox) in the same state
update that records it as published, so a worker that stores the state before
sending re-sends at most that same content after a crash, never a different one.

Functions mutate the state they are given and return what the caller needs.
"""
from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import to_json

from firstfault.rules.catalog import Catalog
from firstfault.rules.diagnose import diagnose
from firstfault.rules.early import may_be_strong_root, run_early
from firstfault.rules.engine import stream_inventory
from firstfault.rules.model import Ev
from firstfault.schemas import Diagnosis, Event, EventBatch, MissingEvidence, SchedulerEvent, WorkloadRecord

from .config import StreamConfig
from .line_ledger import claim_runs
from .metrics_reader import replacement_of

MAX_PROVISIONAL = 16          # distinct provisional results per attempt: a guard against a flapping cascade
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class Published(BaseModel):
    model_config = ConfigDict(extra="forbid")

    diagnosis_id: str
    revision: int
    provisional: bool
    result: str = Field(description="result_hash of the diagnosis")


class Pending(BaseModel):
    """A diagnosis recorded as published but not yet confirmed by every sink."""

    model_config = ConfigDict(extra="forbid")

    diagnosis: Diagnosis
    sent: bool = Field(default=False, description="delivered to the diagnoses topic")
    stored: bool = Field(default=False, description="saved in the diagnosis store")


class WorkloadState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workload_id: str
    attempt: int = 0
    partition: int | None = Field(default=None, description="input partition: where the table entry lives")
    first_seen: datetime
    workload: WorkloadRecord | None = None
    ended: bool = False
    end_time: datetime | None = Field(default=None, description="event time: the end record's end_time")
    end_record_ts: datetime | None = Field(default=None, description="the end record's Kafka timestamp")
    end_seen: datetime | None = Field(default=None, description="processing time: wall clock at the end event")
    last_input: datetime | None = Field(default=None, description="processing time: wall clock of the last batch merged")
    events: dict[str, Event] = Field(default_factory=dict, description="by signature")
    crossing_versions: dict[str, int] = Field(default_factory=dict, description=(
        "metrics crossings the extractor replaced: signature -> the samples the kept version was computed over"))
    paths: list[str] = Field(default_factory=list)
    metric_hosts: list[str] = Field(default_factory=list, description="hosts named by metrics samples")
    offsets: dict[str, int] = Field(default_factory=dict, description="highest input offset applied, per topic")
    lines_counted: dict[str, list[int]] = Field(default_factory=dict, description=(
        "per file, the raw lines the events count, as flat runs (line_ledger): a batch read again adds nothing"))
    root_arrived: bool = Field(default=False, description="a strong root arrived since the last provisional check")
    dirty: bool = Field(default=False, description="evidence changed since the last final or revision")
    provisional: list[Published] = Field(default_factory=list)
    published: Published | None = Field(default=None, description="the last final or revised diagnosis")
    pending: list[Pending] = Field(default_factory=list)
    closed_at: datetime | None = None
    dropped: int = Field(default=0, description="batches refused after the lateness horizon")

    @property
    def key(self) -> str:
        return state_key(self.workload_id, self.attempt)


_EVENT_JSON = Event.__pydantic_serializer__.to_json     # what model_dump_json() calls, without its wrapper
# id(state) -> signature -> (the event, its key's and its own JSON) as state_json last wrote them:
# beside the state, not in it (a state's equality is its content), and dropped when it is freed
_WRITTEN: dict[int, dict[str, tuple[Event, str]]] = {}


def state_json(state: WorkloadState) -> str:
    """The state's JSON, as the table and its changelog keep it, with its events last.

    A state is written whole after every window of batches, and most of it is its events, most of
    which did not change: each event's JSON is kept beside the (parsed) state and made again only for
    an event that is new or was replaced (merges replace events, never change them). Deterministic: the
    same state gives the same text, whatever was kept; ``WorkloadState.model_validate_json`` reads it."""
    head = state.model_dump_json(exclude={"events"})
    kept = _WRITTEN.get(id(state))
    if kept is None:
        kept = _WRITTEN[id(state)] = {}
        weakref.finalize(state, _WRITTEN.pop, id(state), None)
    parts = []
    for sig, ev in state.events.items():
        have = kept.get(sig)
        if have is None or have[0] is not ev:
            have = kept[sig] = (ev, to_json(sig).decode() + ":" + _EVENT_JSON(ev).decode())
        parts.append(have[1])
    if len(kept) > len(state.events):          # events gone (a retracted crossing): forget them
        for sig in [s for s in kept if s not in state.events]:
            del kept[sig]
    return head[:-1] + ',"events":{' + ",".join(parts) + "}}"


@dataclass(frozen=True)
class Now:
    """The two clocks: stream time (max Kafka timestamp seen; None before any) and the wall clock.

    ``behind``: the raw partitions the extractors have not read up to a state's end event
    (:mod:`.progress`); None when no extractor progress is known, and then nothing waits.
    """

    wall: datetime
    stream: datetime | None = None
    behind: Callable[["WorkloadState"], list[int]] | None = None


@dataclass(frozen=True)
class Wake:
    """When a state next needs the timer: once stream time reaches ``stream`` or the wall clock ``wall``."""

    stream: datetime | None
    wall: datetime | None

    def due(self, now: Now) -> bool:
        return ((self.stream is not None and now.stream is not None and now.stream >= self.stream)
                or (self.wall is not None and now.wall >= self.wall))


def state_key(workload_id: str, attempt: int) -> str:
    return f"{workload_id}:{attempt}"


def new_state(workload_id: str, attempt: int, wall_now: datetime, partition: int | None = None) -> WorkloadState:
    return WorkloadState(workload_id=workload_id, attempt=attempt, first_seen=wall_now, partition=partition)


def _redelivered(state: WorkloadState, topic: str, seq: int | None) -> bool:
    """At least once: a record at or below the highest offset applied was applied already.

    A workload's records share one partition per topic (keyed by workload_id), so
    offsets only grow; without this a redelivered batch would double its counts.
    """
    if seq is None:
        return False
    if seq <= state.offsets.get(topic, -1):
        return True
    state.offsets[topic] = seq
    return False


# ---------------------------------------------------------------- inputs

def apply_scheduler(state: WorkloadState, ev: SchedulerEvent, wall_now: datetime,
                    record_ts: datetime | None = None, seq: int | None = None) -> bool:
    """Apply a start or end event; True when the state changed."""
    if _redelivered(state, "scheduler", seq) or state.closed_at is not None:
        return False
    wl = ev.workload
    if ev.type == "start":
        if state.ended:
            return False                    # a start that overtook nothing: the end already came
        changed = state.workload is None or state.workload.canonical() != wl.canonical()
        state.workload = wl
        return changed
    if state.ended:
        if state.workload is not None and state.workload.canonical() == wl.canonical():
            return False
        state.workload = wl                 # a corrected end record: may revise, keeps the timing
        state.dirty = True
        return True
    state.workload = wl
    state.ended = True
    state.end_time = wl.end_time or ev.ts
    state.end_record_ts = record_ts
    state.end_seen = wall_now
    state.dirty = True
    return True


def strong_root_signatures(events: list[Event], catalog: Catalog) -> set[str]:
    """Signatures of the events the EARLY rules tag as a strong root (on copies). Asked of every batch
    of a running attempt: events of a kind no rule can make a strong root are not tried."""
    evs = [Ev.from_schema(e) for e in events if may_be_strong_root(catalog, e.kind)]
    kept, _ = run_early(catalog, evs)
    return {e.signature for e in kept if e.role == "root" and e.strength == "strong"}


def _signature(ev: Event) -> str:
    # Every extracted event has one; a hand-made one without must not collapse into the others.
    return ev.signature or f"{ev.kind}|{ev.host}|{ev.ref.path}:{ev.ref.line}"


def merge_events(events: dict[str, Event], versions: dict[str, int], batch: list[Event],
                 ledger: dict[str, list[int]] | None = None, files: list[str] = (),
                 lines: list[list[int]] = ()) -> None:
    """Fold a batch's events into ``events`` (by signature): the engine's order-free merge; for a
    metrics crossing the extractor replaced, the version over the most samples (``versions``:
    signature -> that number). Any order of the batches gives the same result. With ``ledger``
    (:mod:`.line_ledger`) an event whose lines the batch names counts only the lines not counted
    yet, so any re-delivery gives the same result too."""
    for i, ev in enumerate(batch):
        sig = _signature(ev)
        replaced = replacement_of(ev)
        if replaced is not None:
            _keep_latest(events, versions, sig, *replaced)
            continue
        if sig in versions:
            continue                        # a crossing's first version: a replacement of it came already
        runs = lines[i] if ledger is not None and i < len(lines) else None
        new = claim_runs(ledger, files, runs) if runs else ev.count
        have = events.get(sig)
        if have is None:
            if new:                         # else its lines count under another signature already
                events[sig] = ev if new == ev.count else ev.model_copy(update={"count": new})
            continue
        # Lines counted already still merge (stamps, ranks, the representative: idempotent), so a
        # re-read that lacks context a first read had (an inherited stamp) changes nothing either way.
        merged = Ev.from_schema(have)
        merged.merge(Ev.from_schema(ev))
        merged.count = have.count + new
        events[sig] = merged.to_schema()


def _keep_latest(events: dict[str, Event], versions: dict[str, int], sig: str, version: int,
                 ev: Event | None) -> None:
    """An extractor's samples only grow, so the version over more samples is the later one. A tie of
    two different versions (an extractor that restarted) goes to the smaller content: order-free too."""
    if sig in versions and (-version, _content(ev)) >= (-versions[sig], _content(events.get(sig))):
        return
    versions[sig] = version
    if ev is None:
        events.pop(sig, None)               # retracted: no crossing over the samples seen
    else:
        events[sig] = ev


def _content(ev: Event | None) -> str:
    return "" if ev is None else json.dumps(ev.model_dump(mode="json"), sort_keys=True)


def _unmarked(events: list[Event]) -> list[Event]:
    """The events as the engine makes them: replacements without their mark, retractions left out."""
    out = []
    for ev in events:
        replaced = replacement_of(ev)
        if replaced is None:
            out.append(ev)
        elif replaced[1] is not None:
            out.append(replaced[1])
    return out


def merge_batch(state: WorkloadState, batch: EventBatch, catalog: Catalog, seq: int | None = None,
                wall_now: datetime | None = None) -> bool:
    """Merge one EventBatch; True when it was applied (not a redelivery, not past the horizon)."""
    if _redelivered(state, "events", seq):
        return False
    if state.closed_at is not None:
        state.dropped += 1
        return False
    if wall_now is not None:
        state.last_input = wall_now
    if not state.ended and not state.root_arrived and strong_root_signatures(_unmarked(batch.events), catalog):
        state.root_arrived = True
    merge_events(state.events, state.crossing_versions, batch.events, state.lines_counted, batch.line_files,
                 batch.lines)
    if batch.paths:
        state.paths = sorted(set(state.paths) | set(batch.paths))
    if batch.metric_hosts:
        state.metric_hosts = sorted(set(state.metric_hosts) | set(batch.metric_hosts))
    state.dirty = True
    return True


# ---------------------------------------------------------------- clocks

def _end_anchor(state: WorkloadState) -> datetime | None:
    """The end on the stream clock: end_time, or the end record's own timestamp when that is later.

    Stream time is made of Kafka timestamps. A replayed or late-shipped end record
    carries a timestamp far past its end_time; measured from end_time alone the
    grace would be over before the extractor's last batches arrived.
    """
    stamps = [t for t in (state.end_time, state.end_record_ts) if t is not None]
    return max(stamps) if stamps else None


# The processing-time cap restarts while batches for the workload keep coming (the
# extractor may lag behind the scheduler's end event), but never beyond this many caps.
QUIET_CAP_MULTIPLE = 10


def _wall_deadline(state: WorkloadState, wall_after_s: float, quiet: bool) -> datetime | None:
    if state.end_seen is None:
        return None
    deadline = state.end_seen + timedelta(seconds=wall_after_s)
    if quiet and state.last_input is not None:
        deadline = min(max(deadline, state.last_input + timedelta(seconds=wall_after_s)),
                       state.end_seen + timedelta(seconds=wall_after_s * QUIET_CAP_MULTIPLE))
    return deadline


def _passed(state: WorkloadState, stream_time: datetime | None, wall_now: datetime,
            stream_after_s: float, wall_after_s: float, quiet: bool = False) -> bool:
    anchor = _end_anchor(state)
    if anchor is not None and stream_time is not None and stream_time >= anchor + timedelta(seconds=stream_after_s):
        return True
    deadline = _wall_deadline(state, wall_after_s, quiet)
    return deadline is not None and wall_now >= deadline


def due_for_final(state: WorkloadState, stream_time: datetime | None, wall_now: datetime,
                  cfg: StreamConfig) -> bool:
    """Ended, not finalized, and the grace is over: on stream time, or capped on the wall clock."""
    return (state.ended and state.published is None
            and _passed(state, stream_time, wall_now, cfg.grace_s, cfg.grace_cap_s, quiet=True))


def past_lateness(state: WorkloadState, stream_time: datetime | None, wall_now: datetime,
                  cfg: StreamConfig) -> bool:
    """The lateness horizon: ``lateness_s`` after the end, on either clock."""
    return state.ended and _passed(state, stream_time, wall_now, cfg.lateness_s, cfg.lateness_s)


def next_wake(state: WorkloadState, cfg: StreamConfig) -> Wake | None:
    """When the timer must next look at this state; None while only new input can change it."""
    if state.pending:
        return Wake(None, _EPOCH)
    if state.closed_at is not None:
        return Wake(None, state.closed_at + timedelta(seconds=cfg.lateness_s))
    if state.workload is None:
        return Wake(None, state.first_seen + timedelta(seconds=cfg.hold_s))
    if not state.ended:
        return None
    anchor = _end_anchor(state)
    final = state.published is None
    after = (cfg.grace_s, cfg.grace_cap_s) if final else (cfg.lateness_s, cfg.lateness_s)
    return Wake(anchor + timedelta(seconds=after[0]) if anchor else None,
                _wall_deadline(state, after[1], quiet=final))


def expired(state: WorkloadState, wall_now: datetime, cfg: StreamConfig) -> bool:
    """Delete it: a tombstone kept ``lateness_s`` past closing, or batches whose workload never started."""
    if state.pending:
        return False
    if state.closed_at is not None:
        return wall_now >= state.closed_at + timedelta(seconds=cfg.lateness_s)
    return state.workload is None and wall_now >= state.first_seen + timedelta(seconds=cfg.hold_s)


# ---------------------------------------------------------------- decisions

def result_hash(d: Diagnosis) -> str:
    """What a revision must change: the attribution and the recovery advice, not the evidence counts."""
    result = {
        "status": d.status, "domain": d.domain, "sub_domain": d.sub_domain,
        "root_cause": [d.root_cause.ref.path, d.root_cause.ref.line] if d.root_cause else None,
        "responsible_nodes": d.responsible_nodes, "suspect_nodes": d.suspect_nodes,
        "candidates": [[c.sub_domain, c.nodes] for c in d.candidates],
        "recovery": {"action": d.recovery.action, "nodes": d.recovery.nodes},
    }
    return hashlib.sha256(json.dumps(result, sort_keys=True).encode()).hexdigest()[:16]


def diagnose_state(state: WorkloadState, catalog: Catalog) -> Diagnosis:
    """The diagnosis of the evidence so far, exactly as the offline path would compute it."""
    assert state.workload is not None
    inventory = stream_inventory(state.workload, state.paths, state.metric_hosts)
    return diagnose(state.workload, [Ev.from_schema(e) for e in state.events.values()], catalog, inventory,
                    owned=True)


def _emit(state: WorkloadState, d: Diagnosis, revision: int, provisional: bool) -> Diagnosis:
    d = d.model_copy(update={"revision": revision, "provisional": provisional})
    record = Published(diagnosis_id=d.diagnosis_id, revision=revision, provisional=provisional,
                       result=result_hash(d))
    if provisional:
        state.provisional.append(record)
    else:
        state.published = record
    state.pending.append(Pending(diagnosis=d))
    return d


# Recovery actions that take a node out of service: never on evidence known to be incomplete.
NODE_ACTIONS = frozenset({"drain_nodes", "retry_excluding_nodes"})


def held_back(d: Diagnosis, why: str) -> Diagnosis:
    """``d`` without a node drain or exclusion: made on evidence the pipeline knows is incomplete
    (a running workload, extractors still behind), where a healthy node must not be taken out."""
    rec = d.recovery
    if rec.action not in NODE_ACTIONS:
        return d
    held = rec.model_copy(update={
        "action": "none", "nodes": [],
        "reason": f"held back: {why}; the final diagnosis decides ({rec.action} on "
                  f"{', '.join(rec.nodes) or 'no node'} on the evidence so far: {rec.reason})",
        "next_step": "wait for the final diagnosis before draining or excluding a node"})
    return d.model_copy(update={"recovery": held})


def _provisional(state: WorkloadState, catalog: Catalog) -> list[Diagnosis]:
    if not state.root_arrived:
        return []
    state.root_arrived = False
    if len(state.provisional) >= MAX_PROVISIONAL:
        return []
    d = diagnose_state(state, catalog)      # the start record: terminal state "unknown"
    d = held_back(d, "the workload is still running")
    if d.status != "attributed" or any(p.result == result_hash(d) for p in state.provisional):
        return []
    return [_emit(state, d, 0, True)]


def _incomplete(state: WorkloadState, catalog: Catalog, behind: list[int], cfg: StreamConfig) -> list[Diagnosis]:
    """Past the progress wait with extractors still behind: a provisional that says so, once per
    distinct result and only when evidence changed; the final waits for the evidence."""
    if not state.dirty or len(state.provisional) >= MAX_PROVISIONAL:
        return []
    state.dirty = state.root_arrived = False
    d = _noting_behind(diagnose_state(state, catalog), behind, cfg)
    if any(p.result == result_hash(d) for p in state.provisional):
        return []
    return [_emit(state, d, 0, True)]


def _noting_behind(d: Diagnosis, behind: list[int], cfg: StreamConfig) -> Diagnosis:
    d = d.model_copy(update={"missing_evidence": [*d.missing_evidence, extractors_behind(behind, cfg)]})
    return held_back(d, "the extractors have not read every raw partition up to the end event")


def close(state: WorkloadState, wall_now: datetime) -> None:
    """Past the horizon: keep only what identifies the attempt and what was published."""
    state.closed_at = wall_now
    state.events = {}
    state.crossing_versions = {}
    state.lines_counted = {}
    state.paths = []
    state.metric_hosts = []
    state.dirty = state.root_arrived = False


def waited_for_extractors(state: WorkloadState, wall_now: datetime, cfg: StreamConfig) -> bool:
    """The bound on the progress wait: ``watermark_wait_s`` after the end event was seen."""
    return state.end_seen is None or wall_now >= state.end_seen + timedelta(seconds=cfg.watermark_wait_s)


def extractors_behind(partitions: list[int], cfg: StreamConfig) -> MissingEvidence:
    """What a diagnosis made without the extractors' progress says about it."""
    names = ", ".join(str(p) for p in partitions)
    return MissingEvidence(kind="stream", detail=(
        f"the extractors had not read raw partition(s) {names} up to the end event "
        f"{cfg.watermark_wait_s:g} s after it: lines there are not in this diagnosis"))


def decide(state: WorkloadState, catalog: Catalog, now: Now, cfg: StreamConfig) -> list[Diagnosis]:
    """The diagnoses to publish now (also appended to ``state.pending``); may close the state."""
    if state.workload is None or state.closed_at is not None:
        return []
    if not state.ended:
        return _provisional(state, catalog)
    if state.published is None:
        if not due_for_final(state, now.stream, now.wall, cfg):
            return []
        behind = now.behind(state) if now.behind is not None and cfg.watermark_wait_s > 0 else []
        if behind:
            if not waited_for_extractors(state, now.wall, cfg):
                return []                   # the timer looks again; the last provisional view stands
            if now.wall < state.end_seen + timedelta(seconds=max(cfg.lateness_s, cfg.watermark_wait_s)):
                return _incomplete(state, catalog, behind, cfg)
        # Complete, or the lateness horizon came with extractors still behind: the last word then
        # says what is missing and drains nothing.
        state.dirty = state.root_arrived = False
        d = diagnose_state(state, catalog)
        if behind:
            d = _noting_behind(d, behind, cfg)
        return [_emit(state, d, 0, False)]
    if past_lateness(state, now.stream, now.wall, cfg):
        close(state, now.wall)
        return []
    if not state.dirty:
        return []
    state.dirty = False
    d = diagnose_state(state, catalog)
    if result_hash(d) == state.published.result:
        return []
    return [_emit(state, d, state.published.revision + 1, False)]


def settle(state: WorkloadState, has_store: bool) -> None:
    """Drop the outbox entries every sink has confirmed."""
    state.pending = [p for p in state.pending if not (p.sent and (p.stored or not has_store))]
