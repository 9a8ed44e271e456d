"""The scheduler record of one workload attempt (``workload.json``)."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

TERMINAL_STATES = (
    "completed", "failed", "timeout", "cancelled", "node_fail", "preempted",
    "out_of_memory", "boot_fail", "deadline", "unknown",
)

# Slurm's own words (sacct(1) JOB STATE CODES) -> normalized terminal state.
_SLURM_STATES = {
    "COMPLETED": "completed", "FAILED": "failed", "TIMEOUT": "timeout",
    "CANCELLED": "cancelled", "NODE_FAIL": "node_fail", "PREEMPTED": "preempted",
    "OUT_OF_MEMORY": "out_of_memory", "BOOT_FAIL": "boot_fail", "DEADLINE": "deadline",
}
# Kubernetes: pod/job phase, optionally "/reason".
_K8S_REASONS = {
    "OOMKilled": "out_of_memory", "DeadlineExceeded": "deadline",
    "BackoffLimitExceeded": "failed", "Evicted": "failed", "Error": "failed",
    "Preempted": "preempted", "PreemptionByScheduler": "preempted",
    "NodeLost": "node_fail", "NodeNotReady": "node_fail",
}


def normalize_terminal_state(state: str) -> str:
    """Map the scheduler's own word for the outcome to the contract's terminal state."""
    raw = (state or "").strip()
    if not raw:
        return "unknown"
    head = raw.split()[0].upper()          # "CANCELLED by 1234" -> CANCELLED
    if head in _SLURM_STATES:
        return _SLURM_STATES[head]
    phase, _, reason = raw.partition("/")
    phase = phase.strip().lower()
    reason = reason.strip()
    if phase == "succeeded" or phase == "complete" or phase == "completed":
        return "completed"
    if reason in _K8S_REASONS:
        return _K8S_REASONS[reason]
    if phase == "failed":
        return "failed"
    return "unknown"


_EARLIEST = datetime(1970, 1, 1, tzinfo=timezone.utc)
_LATEST = datetime(2999, 12, 31, tzinfo=timezone.utc)
# Integers travel as Avro longs (SchedulerEvent, Diagnosis): bigger ones are refused here,
# naming the field, instead of failing at encode time deep in a worker.
MAX_LONG = 2 ** 63 - 1
MAX_RANKS = 1 << 20                      # a million GPUs in one job: past any cluster built
Long = Annotated[int, Field(ge=-MAX_LONG - 1, le=MAX_LONG)]


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def _boot_utc(v: datetime) -> datetime:
    # Uptime stamps are boot + seconds: a boot near datetime's limits overflows.
    v = _utc(v)
    if not _EARLIEST <= v <= _LATEST:
        raise ValueError("must be between 1970 and 2999")
    return v


BootTime = Annotated[datetime, AfterValidator(_boot_utc)]


# An extra key ``ship`` sets on the record of a bare input: the file kinds and facts its intake inferred.
INTAKE_EXTRA = "firstfault_intake"


class WorkloadRecord(BaseModel):
    """``workload.json``: what the scheduler knows of one workload attempt.

    Unknown extra keys are kept (``model_extra``), never rejected.
    """

    model_config = ConfigDict(extra="allow", frozen=False)

    workload_id: str = Field(min_length=1, max_length=256)
    attempt: int = Field(default=0, ge=0, le=MAX_LONG)
    scheduler: str = Field(default="slurm", min_length=1)
    state: str = Field(min_length=1)
    exit_code: str | int | None = None
    start_time: datetime
    end_time: datetime | None = None
    nodes: list[str] = Field(default_factory=list)
    gpus_per_node: int | None = Field(default=None, ge=1, le=1024)
    ranks: dict[Long, str] = Field(default_factory=dict)
    time_limit_s: int | None = Field(default=None, ge=0, le=MAX_LONG)
    pods: dict[str, str] = Field(default_factory=dict)
    timezone: str = "UTC"
    boot_times: dict[str, BootTime] = Field(default_factory=dict)

    @field_validator("start_time", "end_time")
    @classmethod
    def _as_utc(cls, v: datetime | None) -> datetime | None:
        return None if v is None else _utc(v)



    @field_validator("nodes")
    @classmethod
    def _nodes_unique(cls, v: list[str]) -> list[str]:
        if any(not n or not isinstance(n, str) for n in v):
            raise ValueError("node names must be non-empty strings")
        return list(dict.fromkeys(v))   # allocation order matters for block placement

    @field_validator("timezone")
    @classmethod
    def _tz_known(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown IANA time zone {v!r}") from exc
        return v

    @model_validator(mode="after")
    def _window(self) -> "WorkloadRecord":
        if self.end_time is not None and self.end_time < self.start_time:
            raise ValueError("end_time is before start_time")
        # Rules enumerate every rank (nodes x gpus_per_node): 20,000 x 1,024 took 59 s and 3 GB.
        if self.gpus_per_node and len(self.nodes) * self.gpus_per_node > MAX_RANKS:
            raise ValueError(f"nodes x gpus_per_node is {len(self.nodes) * self.gpus_per_node}, "
                             f"more than {MAX_RANKS} GPUs")
        return self

    @field_validator("start_time", "end_time", mode="after")
    @classmethod
    def _plausible(cls, v: datetime | None) -> datetime | None:
        # Stamps far outside this range overflow date arithmetic (year-less stamps, horizons).
        if v is not None and not (_EARLIEST <= v <= _LATEST):
            raise ValueError("must be between 1970 and 2999")
        return v

    @property
    def terminal_state(self) -> str:
        return normalize_terminal_state(self.state)

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def host_of_rank(self, rank: int) -> str | None:
        """Rank -> host from the explicit map, else block placement by gpus_per_node."""
        if rank in self.ranks:
            return self.ranks[rank]
        if self.gpus_per_node and self.nodes and rank >= 0:
            idx = rank // self.gpus_per_node
            if idx < len(self.nodes):
                return self.nodes[idx]
        return None

    def canonical(self) -> dict[str, Any]:
        """A stable JSON-able form used for content hashing (what a shipped bare input's intake
        inferred is left out: it is hashed with the inventory it lands in, as offline)."""
        out = self.model_dump(mode="json", exclude_none=False)
        out.pop(INTAKE_EXTRA, None)
        return out
