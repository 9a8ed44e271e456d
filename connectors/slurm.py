"""Slurm connector: ``sacct --json`` / ``squeue --json`` -> SchedulerEvent start and end records.

Run it beside slurmctld (anywhere ``sacct`` and ``squeue`` work)::

    FIRSTFAULT_KAFKA_BOOTSTRAP=kafka:9092 python -m firstfault.connectors.slurm \
        --state /var/lib/firstfault/slurm.json

**Workload and attempt.** ``workload_id`` is ``slurm-<job id>``. One *attempt* is one
execution of the training program:

* every numeric job step (``<id>.0``, ``<id>.1``, ... one per ``srun``) is an attempt, so
  a batch script that retries ``srun`` after a failure gives attempts 0, 1, 2 ...;
* an incarnation of the job with no numeric step (``python train.py`` straight from the
  batch script) is one attempt, the allocation itself;
* requeued incarnations (``sacct --duplicates``) continue the numbering in start order.

So ``attempt`` is the ordinal of the execution across the job's history. It never
changes once given: steps only get appended, and the history of a requeued job is
read by job id (all incarnations) rather than from the polling window. The
``batch``, ``extern`` and ``interactive`` steps are bookkeeping, not attempts.

**State and exit code.** ``state`` is Slurm's word (``FAILED``, ``TIMEOUT``,
``NODE_FAIL``, ``OUT_OF_MEMORY``...); a cancellation names who did it as the text
``sacct`` prints, ``CANCELLED by <user>`` (JSON gives the user name, not the uid).
When the scheduler ended the job (TIMEOUT, NODE_FAIL, PREEMPTED, DEADLINE, BOOT_FAIL)
the last step, which Slurm records as merely ``CANCELLED``, takes the job's state.
``exit_code`` is ``"N:M"`` (exit status : signal), as ``sacct`` prints it.

**Slurm 22.05** (Debian 12's ``slurm-wlm``; tested against a real cluster in
tests/test_slurm_real.py) prints an older JSON (``openapi/dbv0.0.38``): one state word
instead of a list, step ids as ``0``/``"batch"`` beside ``job_id``, ``null`` for empty
strings, ``signal_id``, no ``restart_cnt`` (an incarnation's rank in start order stands
in; a first incarnation ended by ``scontrol requeue`` says ``REQUEUED``), "Nothing found"
as an error for an empty selection, and every exited job or step as
``{"status": "SUCCESS", "return_code": 0}`` whatever its status: exit codes then come from
``sacct --parsable2`` for the same selection (one more query to slurmdbd per query).

**Position.** A state file keeps the polling watermark and the keys already
published. Each poll asks ``squeue`` which jobs run now (slurmctld's live view: a
start is seen even while slurmdbd lags), ``sacct`` for everything active since the
watermark minus an overlap, and ``sacct -j`` for every job that started but whose
end was not published yet, whatever its age. Records are published first, the state
file is replaced (atomically) only after the broker confirmed them: a crash in
between re-sends that one poll's records, which the correlator recognises as
unchanged; nothing is ever skipped.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from firstfault.schemas import SchedulerEvent, WorkloadRecord
from firstfault.streams.config import StreamConfig

from .hostlist import expand
from .metrics_names import METRICS_PORT
from .publish import ConnectorMetrics, PrintPublisher, SchedulerPublisher, atomic_write

log = logging.getLogger("firstfault.connectors.slurm")

# Base job states (data_parser JOB_STATE flags that are equalities); anything else in
# ``state.current`` is a flag such as COMPLETING or REQUEUED.
BASE_STATES = ("PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT",
               "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY")
NOT_ENDED = frozenset({"PENDING", "RUNNING", "SUSPENDED"})
# The scheduler ended the job: its last step only says CANCELLED (or FAILED). Slurm 22.05
# records an incarnation ended by ``scontrol requeue`` as REQUEUED.
SCHEDULER_ENDED = frozenset({"TIMEOUT", "NODE_FAIL", "PREEMPTED", "DEADLINE", "BOOT_FAIL", "REQUEUED"})
BOOKKEEPING_STEPS = frozenset({"batch", "extern", "interactive", "pending"})


# ---------------------------------------------------------------- sacct / squeue JSON

def _num(value: Any) -> int | None:
    """data_parser numbers are plain or ``{"set", "infinite", "number"}``; unset/infinite -> None."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        # Slurm 22.05 (openapi v0.0.38) writes null where data_parser writes "" or leaves the key out.
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


class Tres(_Loose):
    type: str
    name: str = ""
    count: int = 0


class ExitCode(_Loose):
    """PROCESS_EXIT_CODE: status flags, return code, signal."""

    status: list[str] = Field(default_factory=list)
    return_code: Any = None
    signal: dict[str, Any] = Field(default_factory=dict)

    @field_validator("status", mode="before")
    @classmethod
    def _listify(cls, v: Any) -> list[str]:
        return [v] if isinstance(v, str) else (v or [])

    def text(self) -> str | None:
        """``N:M`` as sacct prints ExitCode; None while pending."""
        if "PENDING" in self.status:
            return None
        rc = _num(self.return_code) or 0
        sig = _num(self.signal.get("id", self.signal.get("signal_id"))) or 0     # 22.05: signal_id
        return f"{rc}:{sig}"


class StepId(_Loose):
    id: str
    name: str = ""

    @model_validator(mode="before")
    @classmethod
    def _qualify(cls, data: Any) -> Any:
        # 22.05 gives {"job_id": 7, "id": 0 | "batch"}; data_parser, "7.0" / "7.batch".
        if isinstance(data, dict) and "." not in str(data.get("id", ".")) and data.get("job_id") is not None:
            return {**data, "id": f"{data['job_id']}.{data['id']}"}
        return data


class StepNodes(_Loose):
    count: int | None = None
    expr: str = Field(default="", alias="range")
    names: list[str] = Field(default_factory=list, alias="list")


class SacctStep(_Loose):
    step: StepId
    state: list[str] = Field(default_factory=list)
    exit_code: ExitCode = Field(default_factory=ExitCode)
    time: dict[str, Any] = Field(default_factory=dict)
    nodes: StepNodes = Field(default_factory=StepNodes)
    tres: dict[str, Any] = Field(default_factory=dict)
    kill_request_user: str = ""

    @field_validator("state", mode="before")
    @classmethod
    def _listify(cls, v: Any) -> list[str]:
        return [v] if isinstance(v, str) else (v or [])

    @property
    def number(self) -> int | None:
        """``"4471823.0"`` -> 0; batch/extern/interactive -> None."""
        tail = self.step.id.rsplit(".", 1)[-1] if "." in self.step.id else ""
        return int(tail) if tail.isdigit() else None


class SacctJob(_Loose):
    job_id: int
    name: str = ""
    user: str = ""
    account: str = ""
    partition: str = ""
    cluster: str = ""
    nodes: str = ""
    state: dict[str, Any] = Field(default_factory=dict)
    exit_code: ExitCode = Field(default_factory=ExitCode)
    time: dict[str, Any] = Field(default_factory=dict)
    restart_cnt: int = 0
    kill_request_user: str = ""
    failed_node: str = ""
    tres: dict[str, Any] = Field(default_factory=dict)
    steps: list[SacctStep] = Field(default_factory=list)


class SacctOutput(_Loose):
    """``sacct --json``: data_parser's ``openapi_slurmdbd_jobs_resp``."""

    jobs: list[SacctJob] = Field(default_factory=list)
    meta: dict[str, Any] = Field(default_factory=dict)
    errors: list[Any] = Field(default_factory=list)


class SqueueJob(_Loose):
    job_id: int
    name: str = ""
    user_name: str = ""
    account: str = ""
    partition: str = ""
    cluster: str = ""
    nodes: str = ""
    job_state: list[str] = Field(default_factory=list)
    start_time: Any = None
    time_limit: Any = None
    restart_cnt: int = 0
    tres_alloc_str: str = ""
    state_reason: str = ""

    @field_validator("job_state", mode="before")
    @classmethod
    def _listify(cls, v: Any) -> list[str]:
        return [v] if isinstance(v, str) else (v or [])


class SqueueOutput(_Loose):
    """``squeue --json``: data_parser's ``openapi_job_info_resp``."""

    jobs: list[SqueueJob] = Field(default_factory=list)


# ---------------------------------------------------------------- mapping

def base_state(words: Iterable[str] | str) -> str:
    """The base state among data_parser's state words (the rest are flags); 22.05 gives one word."""
    words = [words] if isinstance(words, str) else list(words)
    return next((w for w in words if w in BASE_STATES), words[0] if words else "UNKNOWN")


def state_word(state: str, kill_user: str = "") -> str:
    """The contract's ``state``: Slurm's word, a cancellation with its requester as sacct prints it."""
    if state == "CANCELLED" and kill_user:
        return f"CANCELLED by {kill_user}"
    return state


def gpus_in_tres(tres: Sequence[Tres] | Sequence[dict[str, Any]]) -> int | None:
    """Total GPUs in a TRES list: the untyped ``gres/gpu`` if tracked, else the sum of typed ones."""
    items = [t if isinstance(t, Tres) else Tres.model_validate(t) for t in tres]
    gpus = [t for t in items if t.type == "gres" and (t.name == "gpu" or t.name.startswith("gpu:"))]
    plain = [t.count for t in gpus if t.name == "gpu"]
    if plain:
        return plain[0]
    typed = sum(t.count for t in gpus)
    return typed or None


def gpus_in_tres_str(tres: str) -> int | None:
    """``cpu=2,mem=1G,node=2,gres/gpu=16`` (squeue's tres_alloc_str) -> 16."""
    plain, typed = None, 0
    for part in (tres or "").split(","):
        key, _, value = part.partition("=")
        if not value.isdigit():
            continue
        if key == "gres/gpu":
            plain = int(value)
        elif key.startswith("gres/gpu:"):
            typed += int(value)
    return plain if plain is not None else (typed or None)


def per_node(total: int | None, nodes: int) -> int | None:
    if not total or nodes <= 0 or total % nodes:
        return None          # uneven placement: block rank->host inference would lie
    return total // nodes


def _utc(epoch: int | None) -> datetime | None:
    return datetime.fromtimestamp(epoch, timezone.utc) if epoch and epoch > 0 else None


@dataclass(frozen=True)
class Execution:
    """One attempt: a numeric step, or an incarnation's allocation when it has none."""

    job: SacctJob
    step: SacctStep | None
    attempt: int
    last_in_incarnation: bool


def executions(records: Sequence[SacctJob]) -> list[Execution]:
    """A job's incarnations (requeues) in start order -> its attempts, numbered."""
    ordered = sorted(records, key=lambda j: (_num(j.time.get("start")) or 2**62, j.restart_cnt,
                                             _num(j.time.get("submission")) or 0))
    out: list[Execution] = []
    for i, job in enumerate(ordered):
        if "restart_cnt" not in job.model_fields_set:      # 22.05 does not say: the incarnation's rank
            job = job.model_copy(update={"restart_cnt": i})
        steps = sorted((s for s in job.steps if s.number is not None), key=lambda s: s.number)
        if not steps:
            out.append(Execution(job, None, len(out), True))
            continue
        for i, step in enumerate(steps):
            out.append(Execution(job, step, len(out), i == len(steps) - 1))
    return out


def _record(ex: Execution, ended: bool) -> WorkloadRecord | None:
    job, step = ex.job, ex.step
    if step is not None:
        start = _num(step.time.get("start"))
        end = _num(step.time.get("end"))
        nodes = step.nodes.names or expand(step.nodes.expr) or expand(job.nodes)
        step_gpus = gpus_in_tres(step.tres.get("allocated") or [])
        gpn = per_node(step_gpus, len(nodes)) if step_gpus else \
            per_node(gpus_in_tres(job.tres.get("allocated") or []), len(expand(job.nodes)))
        state = base_state(step.state)
        job_state = base_state(job.state.get("current") or [])
        if ex.last_in_incarnation and job_state in SCHEDULER_ENDED and state in ("CANCELLED", "FAILED"):
            state = job_state
        word = state_word(state, step.kill_request_user or job.kill_request_user)
        exit_code = step.exit_code.text()
    else:
        start = _num(job.time.get("start"))
        end = _num(job.time.get("end"))
        nodes = expand(job.nodes)
        gpn = per_node(gpus_in_tres(job.tres.get("allocated") or []), len(nodes))
        word = state_word(base_state(job.state.get("current") or []), job.kill_request_user)
        exit_code = job.exit_code.text()
    start_dt = _utc(start)
    if start_dt is None or not nodes:
        return None                      # never ran (pending, or cancelled while pending)
    extra: dict[str, Any] = {
        "user": job.user, "job_name": job.name, "partition": job.partition, "account": job.account,
        "cluster": job.cluster, "slurm_job_id": str(job.job_id), "restart_cnt": job.restart_cnt,
        "slurm_step": step.step.id if step is not None else None,
    }
    if job.failed_node:
        extra["failed_node"] = job.failed_node
    limit = _num(job.time.get("limit"))
    data = {
        "workload_id": f"slurm-{job.job_id}", "attempt": ex.attempt, "scheduler": "slurm",
        "state": word if ended else "RUNNING",
        "exit_code": exit_code if ended else None,
        "start_time": start_dt,
        "end_time": (_utc(end) or start_dt) if ended else None,
        "nodes": nodes, "gpus_per_node": gpn,
        "time_limit_s": limit * 60 if limit is not None else None,
        **extra,
    }
    return WorkloadRecord.model_validate(data)


def _ended(ex: Execution) -> bool:
    if ex.step is not None:
        return base_state(ex.step.state) not in NOT_ENDED and bool(_num(ex.step.time.get("end")))
    return base_state(ex.job.state.get("current") or []) not in NOT_ENDED and bool(_num(ex.job.time.get("end")))


def _squeue_start(job: SqueueJob) -> SchedulerEvent | None:
    """A running job slurmdbd has not reported yet: the first incarnation's first attempt."""
    if base_state(job.job_state) != "RUNNING" or job.restart_cnt:
        return None                      # requeued: its attempt number needs the history from sacct
    start = _utc(_num(job.start_time))
    nodes = expand(job.nodes)
    if start is None or not nodes:
        return None
    limit = _num(job.time_limit)
    wl = WorkloadRecord.model_validate({
        "workload_id": f"slurm-{job.job_id}", "attempt": 0, "scheduler": "slurm", "state": "RUNNING",
        "start_time": start, "nodes": nodes, "gpus_per_node": per_node(gpus_in_tres_str(job.tres_alloc_str), len(nodes)),
        "time_limit_s": limit * 60 if limit is not None else None,
        "user": job.user_name, "job_name": job.name, "partition": job.partition, "account": job.account,
        "cluster": job.cluster, "slurm_job_id": str(job.job_id), "restart_cnt": 0, "slurm_step": None,
    })
    return SchedulerEvent(type="start", workload=wl, ts=start)


# ---------------------------------------------------------------- Slurm 22.05 exit codes

def exit_codes_unreliable(doc: dict[str, Any]) -> bool:
    """Slurm 22.05's ``sacct --json`` (openapi/dbv0.0.38) prints every job and step that exited,
    whatever its status, as ``{"status": "SUCCESS", "return_code": 0}``; only signals survive."""
    return str(doc.get("meta", {}).get("plugin", {}).get("type", "")).startswith("openapi/dbv0.0.3")


EXIT_CODE_FORMAT = "--format=JobIDRaw,Start,ExitCode"
NOTHING_FOUND = 9003          # ESLURM_REST_EMPTY_RESULT: 22.05's "Nothing found with query"


def parse_exit_codes(text: str) -> dict[tuple[str, int], str]:
    """``sacct --parsable2 --noheader`` with EXIT_CODE_FORMAT and SLURM_TIME_FORMAT=%s -> {(id, start): "N:M"}."""
    out: dict[tuple[str, int], str] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) >= 3 and parts[1].isdigit() and ":" in parts[2]:
            out[(parts[0], int(parts[1]))] = parts[2]
    return out


def _exit_doc(code: str) -> dict[str, Any]:
    rc, _, sig = code.partition(":")
    rc_n, sig_n = int(rc or 0), int(sig or 0)
    status = "SIGNALED" if sig_n else ("ERROR" if rc_n else "SUCCESS")
    return {"status": [status], "return_code": rc_n, "signal": {"id": sig_n}}


def patch_exit_codes(doc: dict[str, Any], codes: dict[tuple[str, int], str]) -> dict[str, Any]:
    """Put sacct's text exit codes into its JSON, matching job/step id and start time (requeues share ids)."""
    for job in doc.get("jobs", []):
        code = codes.get((str(job.get("job_id")), _num((job.get("time") or {}).get("start")) or 0))
        if code:
            job["exit_code"] = _exit_doc(code)
        for step in job.get("steps") or []:
            sid = StepId.model_validate({"job_id": job.get("job_id"), **(step.get("step") or {})}).id
            code = codes.get((sid, _num((step.get("time") or {}).get("start")) or 0))
            if code:
                step["exit_code"] = _exit_doc(code)
    return doc


def _parse(model: type[BaseModel], doc: dict[str, Any] | BaseModel) -> Any:
    return doc if isinstance(doc, model) else model.model_validate(doc)


def scheduler_events(sacct: Sequence[dict[str, Any] | SacctOutput],
                     squeue: dict[str, Any] | SqueueOutput | None = None) -> list[SchedulerEvent]:
    """Every start and end event the given ``sacct --json`` (and ``squeue --json``) outputs imply.

    Pure: same input, same list, ordered by time then key. A job seen in several
    outputs takes its record from the last one (the freshest read).
    """
    by_job: dict[int, dict[tuple[int, int, int], SacctJob]] = {}
    for doc in sacct:
        parsed = _parse(SacctOutput, doc)
        fresh: dict[int, dict[tuple[int, int, int], SacctJob]] = {}
        for job in parsed.jobs:
            key = (_num(job.time.get("submission")) or 0, _num(job.time.get("start")) or 0, job.restart_cnt)
            fresh.setdefault(job.job_id, {})[key] = job
        by_job.update(fresh)             # a later read replaces the whole history of a job
    # Why the controller ended a job (TimeLimit, NodeDown, NonZeroExitCode...): accounting has no
    # such word for ended jobs; slurmctld keeps it MinJobAge (300 s by default) after the end.
    reasons = {} if squeue is None else {
        j.job_id: j.state_reason for j in _parse(SqueueOutput, squeue).jobs
        if j.state_reason not in ("", "None") and base_state(j.job_state) not in NOT_ENDED}
    events: dict[tuple[str, int, str], SchedulerEvent] = {}
    for job_id, records in by_job.items():
        history = executions(list(records.values()))
        for ex in history:
            ended = _ended(ex)
            rec = _record(ex, ended)
            if rec is None:
                continue
            if ended and ex is history[-1] and job_id in reasons:
                rec = WorkloadRecord.model_validate({**rec.model_dump(), "reason": reasons[job_id]})
            start_rec = rec if not ended else WorkloadRecord.model_validate(
                {**rec.model_dump(), "state": "RUNNING", "exit_code": None, "end_time": None})
            events[(rec.workload_id, rec.attempt, "start")] = SchedulerEvent(type="start", workload=start_rec,
                                                                             ts=rec.start_time)
            if ended:
                events[(rec.workload_id, rec.attempt, "end")] = SchedulerEvent(type="end", workload=rec,
                                                                               ts=rec.end_time or rec.start_time)
    if squeue is not None:
        for job in _parse(SqueueOutput, squeue).jobs:
            ev = _squeue_start(job)
            if ev is not None:
                events.setdefault((ev.workload.workload_id, 0, "start"), ev)
    return sorted(events.values(), key=lambda e: (e.ts, e.workload.workload_id, e.workload.attempt,
                                                  0 if e.type == "start" else 1))


def event_key(ev: SchedulerEvent) -> str:
    return f"{ev.workload.workload_id}|{ev.workload.attempt}|{ev.type}"


# ---------------------------------------------------------------- position

class PositionState(BaseModel):
    """The state file: the watermark and what was published, so a restart neither misses nor repeats."""

    model_config = ConfigDict(extra="forbid")

    version: int = 1
    watermark: float | None = Field(default=None, description="unix time the last successful poll began")
    published: dict[str, float] = Field(default_factory=dict,
                                        description="event key -> event time; ends pruned once out of the window")
    open_jobs: list[int] = Field(default_factory=list, description="jobs with a published start and no end yet")

    @classmethod
    def load(cls, path: Path) -> "PositionState":
        if not path.exists():
            return cls()
        return cls.model_validate_json(path.read_text())

    def save(self, path: Path) -> None:
        atomic_write(path, self.model_dump_json(indent=1))


# ---------------------------------------------------------------- the poller

class SlurmError(RuntimeError):
    pass


def _when(ts: float) -> str:
    # sacct reads times without a zone in the local zone of the machine it runs on: ours.
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ts))


class SlurmConnector:
    def __init__(self, state_path: Path, publisher: Any, sacct: str = "sacct", squeue: str | None = "squeue",
                 overlap_s: float = 900.0, lookback_s: float = 86400.0, retention_s: float = 7 * 86400.0,
                 extra_args: Sequence[str] = (), timeout_s: float = 120.0,
                 metrics: ConnectorMetrics | None = None) -> None:
        self.state_path = Path(state_path)
        self.publisher, self.sacct, self.squeue = publisher, sacct, squeue
        self.overlap_s, self.lookback_s, self.timeout_s = overlap_s, lookback_s, timeout_s
        self.retention_s = max(retention_s, overlap_s + 3600.0)
        self.extra_args = list(extra_args)
        self.metrics = metrics
        self.state = PositionState.load(self.state_path)

    def _text(self, argv: list[str], env: dict[str, str] | None = None) -> str:
        try:
            out = subprocess.run(argv, capture_output=True, timeout=self.timeout_s, check=False,
                                 env={**os.environ, **env} if env else None)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmError(f"{argv[0]}: {exc}") from None
        if out.returncode != 0:
            raise SlurmError(f"{' '.join(argv[:2])} exited {out.returncode}: {out.stderr.decode(errors='replace')[:300]}")
        return out.stdout.decode(errors="replace")

    def _sacct(self, selection: list[str]) -> dict[str, Any]:
        """``sacct --json`` for a selection; on 22.05 its exit codes come from the text form (one more call)."""
        doc = self._run([self.sacct, "--json", "--allusers", "--duplicates", *selection, *self.extra_args])
        if exit_codes_unreliable(doc) and doc.get("jobs"):
            text = self._text([self.sacct, "--parsable2", "--noheader", "--allusers", "--duplicates", EXIT_CODE_FORMAT,
                               *selection, *self.extra_args], env={"SLURM_TIME_FORMAT": "%s"})
            patch_exit_codes(doc, parse_exit_codes(text))
        return doc

    def _run(self, argv: list[str]) -> dict[str, Any]:
        stdout = self._text(argv)
        try:
            doc = json.loads(stdout)
        except ValueError as exc:
            raise SlurmError(f"{argv[0]} printed no JSON: {exc}") from None
        # 22.05 reports an empty selection (a quiet window, jobs slurmdbd has not recorded yet) as an error
        errors = [e for e in doc.get("errors") or []
                  if not (isinstance(e, dict) and e.get("error_number") == NOTHING_FOUND)]
        if errors:
            raise SlurmError(f"{argv[0]} reported errors: {errors[:3]}")
        return doc

    def read(self, now: float) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """One poll's ``sacct`` outputs (oldest view first: later ones win) and ``squeue``'s."""
        since = (self.state.watermark - self.overlap_s) if self.state.watermark else now - self.lookback_s
        window = self._sacct(["--starttime", _when(since), "--endtime", "now"])
        running = None
        if self.squeue:
            try:
                running = self._run([self.squeue, "--json", *self.extra_args])
            except SlurmError as exc:        # slurmctld busy or down: accounting alone still works
                log.warning("squeue failed, using sacct alone this round: %s", exc)
        records = window.get("jobs", [])
        in_window = {j.get("job_id") for j in records}
        # Requeued: restart_cnt (24.11), else (22.05 has none) a REQUEUED incarnation, several
        # incarnations, or the controller's count.
        requeued = {j.get("job_id") for j in records
                    if j.get("restart_cnt") or base_state((j.get("state") or {}).get("current") or []) == "REQUEUED"}
        requeued |= {i for i, n in Counter(j.get("job_id") for j in records).items() if n > 1}
        requeued |= {j.get("job_id") for j in (running or {}).get("jobs", []) if j.get("restart_cnt")}
        # Jobs open in our books whatever their age, and the whole history of requeued ones
        # (``-j`` without ``-S`` reads from the epoch), so attempt numbers never shift.
        by_id = sorted((set(self.state.open_jobs) - in_window) | requeued)
        docs = [window]
        if by_id:
            docs.append(self._sacct(["--jobs", ",".join(map(str, by_id))]))
        return docs, running

    def poll(self, now: float | None = None) -> list[SchedulerEvent]:
        """One round: read, publish what is new, then advance. Returns what was published."""
        now = time.time() if now is None else now
        docs, running = self.read(now)
        events = scheduler_events(docs, running)
        new = [e for e in events if event_key(e) not in self.state.published]
        if new:
            self.publisher.publish(new)          # raises unless the broker confirmed all of them
        for e in new:
            self.state.published[event_key(e)] = e.ts.timestamp()
        self._bookkeep(now)
        self.state.save(self.state_path)
        if self.metrics is not None:
            self.metrics.ok()
        return new

    def _bookkeep(self, now: float) -> None:
        keys = self.state.published
        started = {k.rsplit("|", 1)[0] for k in keys if k.endswith("|start")}
        ended = {k.rsplit("|", 1)[0] for k in keys if k.endswith("|end")}
        self.state.open_jobs = sorted({int(w.split("|")[0].removeprefix("slurm-")) for w in started - ended})
        self.state.watermark = now
        # Forget finished attempts only long after they left the query window: a requeued
        # job's history is re-read by id, and its old attempts must still count as sent.
        horizon = now - self.retention_s
        for w in [w for w in ended if keys.get(f"{w}|end", now) < horizon]:
            keys.pop(f"{w}|start", None)
            keys.pop(f"{w}|end", None)

    def run(self, interval_s: float, stop: Any = None) -> None:
        while stop is None or not stop.is_set():
            try:
                published = self.poll()
                if published:
                    log.info("published %d scheduler events", len(published))
            except Exception as exc:     # sacct down, broker down: keep the position, try again
                if self.metrics is not None:
                    self.metrics.failed(str(exc))
                log.warning("slurm poll failed, will retry: %s", exc)
            if stop is not None:
                stop.wait(interval_s)
            else:
                time.sleep(interval_s)


# ---------------------------------------------------------------- command line

def slurm_parser(module: str, description: str, commands: str) -> argparse.ArgumentParser:
    """Options every Slurm worker shares: the broker, the part of the site its ``commands`` see, the metrics port."""
    env = os.environ.get
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    p.add_argument("--kafka-bootstrap", default=env("FIRSTFAULT_KAFKA_BOOTSTRAP"))
    p.add_argument("--clusters", default=env("FIRSTFAULT_SLURM_CLUSTERS"),
                   help=f"{commands} --clusters (FIRSTFAULT_SLURM_CLUSTERS)")
    p.add_argument("--partition", default=env("FIRSTFAULT_SLURM_PARTITION"),
                   help=f"{commands} --partition (FIRSTFAULT_SLURM_PARTITION)")
    p.add_argument("--metrics-port", type=int, default=int(env("FIRSTFAULT_METRICS_PORT", str(METRICS_PORT))))
    return p


def slurm_start(parser: argparse.ArgumentParser, argv: Sequence[str] | None, name: str,
                command: str) -> tuple[argparse.Namespace, list[str]] | None:
    """The start of a Slurm worker's ``main``: its arguments, logging, and the ``--clusters``/``--partition``
    arguments for its Slurm commands; None (having said why) when ``command`` is not on PATH."""
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not shutil.which(command):
        print(f"firstfault {name}: {command} is not on PATH", file=sys.stderr)
        return None
    extra: list[str] = []
    if args.clusters:
        extra += ["--clusters", args.clusters]
    if args.partition:
        extra += ["--partition", args.partition]
    return args, extra


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = slurm_parser("firstfault.connectors.slurm", __doc__.split("\n")[0], "sacct/squeue")
    p.add_argument("--state", default=env("FIRSTFAULT_SLURM_STATE", "firstfault-slurm-state.json"),
                   help="position file (FIRSTFAULT_SLURM_STATE)")
    p.add_argument("--interval", type=float, default=float(env("FIRSTFAULT_SLURM_INTERVAL_S", "30")),
                   help="seconds between polls (FIRSTFAULT_SLURM_INTERVAL_S)")
    p.add_argument("--overlap", type=float, default=float(env("FIRSTFAULT_SLURM_OVERLAP_S", "900")),
                   help="re-read this much before the watermark: slurmdbd lag (FIRSTFAULT_SLURM_OVERLAP_S)")
    p.add_argument("--lookback", type=float, default=float(env("FIRSTFAULT_SLURM_LOOKBACK_S", "86400")),
                   help="first run: how far back to start (FIRSTFAULT_SLURM_LOOKBACK_S)")
    p.add_argument("--no-squeue", action="store_true", help="sacct only (no slurmctld access)")
    p.add_argument("--retention", type=float, default=float(env("FIRSTFAULT_SLURM_RETENTION_S", str(7 * 86400))),
                   help="how long finished attempts stay in the state file (FIRSTFAULT_SLURM_RETENTION_S)")
    p.add_argument("--once", action="store_true", help="one poll, then exit")
    p.add_argument("--dry-run", action="store_true",
                   help="one poll from --lookback, print the events as JSON lines; publish and save nothing")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    started = slurm_start(build_parser(), argv, "slurm", "sacct")
    if started is None:
        return 2
    args, extra = started
    # /healthz: a poll runs up to three Slurm commands (120 s each) and a publish, every --interval.
    metrics = ConnectorMetrics("slurm", stale_after_s=args.interval + 600.0)
    if args.dry_run:
        publisher: Any = PrintPublisher()
        state = Path(tempfile.mkdtemp(prefix="firstfault-slurm-")) / "state.json"
    else:
        cfg = StreamConfig.from_env(bootstrap=args.kafka_bootstrap)
        if not cfg.bootstrap:
            print("firstfault slurm: set FIRSTFAULT_KAFKA_BOOTSTRAP or --kafka-bootstrap (or use --dry-run)",
                  file=sys.stderr)
            return 2
        publisher = SchedulerPublisher(cfg, metrics)
        state = Path(args.state)
    conn = SlurmConnector(state, publisher, squeue=None if args.no_squeue else "squeue", overlap_s=args.overlap,
                          lookback_s=args.lookback, retention_s=args.retention, extra_args=extra,
                          metrics=metrics)
    try:
        if args.once or args.dry_run:
            conn.poll()
            return 0
        metrics.serve(args.metrics_port)
        conn.run(args.interval)
    except (SlurmError, ValidationError) as exc:
        print(f"firstfault slurm: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
