"""Records that travel between the shippers, the scheduler connectors and the engine."""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .workload import WorkloadRecord

SourceKind = Literal["app", "syslog", "fabricmanager", "scheduler", "metrics"]


class RawLine(BaseModel):
    """One raw log line exactly as the producing software wrote it.

    ``path`` and ``line`` are the bundle-relative file path and 1-based line
    number; the streaming path carries the same two fields so both paths
    produce identical evidence references.
    """

    model_config = ConfigDict(extra="forbid")

    host: str | None = Field(default=None, description="host that produced the line, if known")
    path: str = Field(min_length=1, description="bundle-relative path, e.g. logs/syslog/node-02.log")
    line: int = Field(ge=1, description="1-based line number in that file")
    text: str = Field(description="the line without its trailing newline")
    source: SourceKind | None = Field(default=None, description="derived from the path when absent")
    workload_id: str | None = Field(default=None, description="set when the shipper knows it")
    ingest_ts: datetime | None = Field(default=None, description="when the shipper read the line")


class SchedulerEvent(BaseModel):
    """A scheduler connector's view of a workload attempt starting or ending."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["start", "end"]
    workload: WorkloadRecord
    ts: datetime = Field(description="when the scheduler reported it (start or end time)")


class DeadLetter(BaseModel):
    """A message no worker could use, with why and where it came from (JSON on the dead-letter topic)."""

    model_config = ConfigDict(extra="forbid")

    reason: str
    stage: str = Field(description="which worker refused it: extractor | correlator | ...")
    topic: str
    partition: int
    offset: int
    key_b64: str | None = None
    value_b64: str | None = None
    timestamp_ms: int | None = None
