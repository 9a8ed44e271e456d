"""Structured events: what extraction makes of raw lines, and what the rules read."""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

FieldValue = str | int | float | bool | None

StampQuality = Literal[
    "exact",       # the line carried a full date and time
    "no_year",     # RFC 3164 / glog stamp, year taken from the scheduler record
    "uptime",      # dmesg uptime anchored on the host's boot time
    "inherited",   # no stamp on the line; taken from the nearest stamped line above it
    "order_only",  # dmesg uptime without a boot time: orderable within the host only
    "none",        # nothing to go on
]


class Ref(BaseModel):
    """A raw-line reference: bundle-relative path and 1-based line number."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    path: str
    line: int = Field(ge=1)

    def key(self) -> tuple[str, int]:
        return (self.path, self.line)


class GpuRef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    pci: str | None = Field(default=None, description="normalized PCI bus id dddd:bb:dd.f")
    index: int | None = Field(default=None, description="GPU index where a mapping exists")


class Event(BaseModel):
    """One signature: one or many raw lines that extraction judged to be the same thing.

    A single matching line is an event with ``count`` 1. Repeats of the same
    signature (kind, host, gpu and the pattern's ``group_by`` fields) are merged:
    counts add, ranks union, first/last stamps take min/max and the representative
    (fields, ref, text) is the earliest occurrence. The merge is associative and
    commutative, so batching and arrival order never change the result.
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)

    kind: str
    pattern: str = Field(description="id of the extraction pattern that produced it")
    source: Literal["app", "syslog", "fabricmanager", "scheduler", "metrics"]
    host: str | None = None
    gpu: GpuRef | None = None
    rank: int | None = Field(default=None, description="the representative's rank")
    stamp: datetime | None = Field(default=None, description="UTC time of the first occurrence")
    last_stamp: datetime | None = None
    onset: datetime | None = Field(default=None, description="estimated start of what the line reports")
    stamp_quality: StampQuality = "none"
    fields: dict[str, FieldValue] = Field(default_factory=dict)
    ref: Ref
    text: str = Field(default="", description="the representative raw line (truncated)")
    count: int = Field(default=1, ge=1)
    ranks: list[int] = Field(default_factory=list)
    signature: str = Field(default="", description="merge key")


class EventBatch(BaseModel):
    """The extractor's output for one workload from one input batch: aggregated events.

    Keyed by ``workload_id`` on the structured-events topic; the correlator merges
    batches with the same order-free merge as the offline path.
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)

    workload_id: str
    attempt: int = 0
    events: list[Event]
    paths: list[str] = Field(default_factory=list, description="bundle paths that contributed lines (evidence inventory)")
    metric_hosts: list[str] = Field(default_factory=list,
                                    description="hosts named by the metrics samples read (evidence inventory)")
    line_files: list[str] = Field(default_factory=list, description="the files ``lines`` names, by index")
    lines: list[list[int]] = Field(default_factory=list, description=(
        "per event, in order: the raw lines it was made of in this batch, as runs (index in line_files, "
        "first line, last line); so a batch read twice adds nothing. Empty, or an event's [] : not known "
        "(counted as delivered)"))

    @model_validator(mode="after")
    def _lines_match_events(self) -> "EventBatch":
        if self.lines and len(self.lines) != len(self.events):
            raise ValueError(f"lines has {len(self.lines)} entries for {len(self.events)} events")
        for runs in self.lines:
            if len(runs) % 3 or any(not 0 <= runs[i] < len(self.line_files) or not 1 <= runs[i + 1] <= runs[i + 2]
                                    for i in range(0, len(runs), 3)):
                raise ValueError("lines: each run is (file index, first line, last line), first <= last")
        return self
