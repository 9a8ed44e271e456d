"""Records that travel between the shippers, the scheduler connectors and the engine."""
from __future__ import annotations

import base64
import hashlib
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .workload import WorkloadRecord

# "mixed": a file of no known kind (a bare log a user shipped, sniffed as analyze sniffs it): every
# source's patterns apply to it, as offline.
SourceKind = Literal["app", "syslog", "fabricmanager", "scheduler", "metrics", "mixed"]
MAX_LONG = 2 ** 63 - 1                  # what an Avro long holds
DEAD_LETTER_HEAD = 64 * 1024            # bytes of a refused record a dead letter carries at most


def line_text(text: str) -> str:
    """A line as ``str.encode("utf-8", "surrogateescape")`` gives its bytes back.

    Bytes that are not UTF-8 arrive as surrogate escapes (U+DC80..U+DCFF) and stay so.
    Any other lone surrogate (a JSON ``"\\ud800"``) is taken as the bytes it would be
    written as (surrogatepass), so every line has one byte form and nothing raises later.
    """
    try:
        text.encode("utf-8", "surrogateescape")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "surrogateescape")


def utf8(value: str) -> str:
    """A name (host, path, workload) Avro's ``string`` can carry: unencodable characters become '?'."""
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return value.encode("utf-8", "replace").decode("utf-8")


class RawLine(BaseModel):
    """One raw log line exactly as the producing software wrote it.

    ``path`` and ``line`` are the bundle-relative file path and 1-based line
    number; the streaming path carries the same two fields so both paths
    produce identical evidence references.
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)

    host: str | None = Field(default=None, description="host that produced the line, if known")
    path: str = Field(min_length=1, description="bundle-relative path, e.g. logs/syslog/node-02.log")
    line: int = Field(ge=1, le=MAX_LONG, description="1-based line number in that file")
    # Avro bytes: a line that is not UTF-8 travels exactly as written (surrogate escapes in str).
    text: str = Field(description="the line without its trailing newline, byte for byte",
                      json_schema_extra={"avro": "bytes"})
    source: SourceKind | None = Field(default=None, description="derived from the path when absent")
    workload_id: str | None = Field(default=None, description="set when the shipper knows it")
    ingest_ts: datetime | None = Field(default=None, description="when the shipper read the line")

    @field_validator("text")
    @classmethod
    def _bytes_form(cls, v: str) -> str:
        return line_text(v)

    @field_validator("host", "path", "workload_id")
    @classmethod
    def _names(cls, v: str | None) -> str | None:
        return None if v is None else utf8(v)

    def raw(self) -> bytes:
        """The line's bytes, as the producing software wrote them."""
        return self.text.encode("utf-8", "surrogateescape")


class SchedulerEvent(BaseModel):
    """A scheduler connector's view of a workload attempt starting or ending."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    type: Literal["start", "end"]
    workload: WorkloadRecord
    ts: datetime = Field(description="when the scheduler reported it (start or end time)")


class DeadLetter(BaseModel):
    """A message no worker could use, with why and where it came from (JSON on the dead-letter topic).

    A record too large to copy whole (over ``DEAD_LETTER_HEAD``) is kept as its head, its
    size and its SHA-256, so the dead letter itself always fits the producer's limit.
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)

    reason: str
    stage: str = Field(description="which worker refused it: extractor | correlator | ...")
    topic: str
    partition: int
    offset: int
    key_b64: str | None = None
    value_b64: str | None = Field(default=None, description="the value, or its head when value_truncated")
    timestamp_ms: int | None = None
    step: str | None = Field(default=None, description="where it failed: decode | extract | encode | publish | ...")
    value_size: int | None = Field(default=None, description="size of the whole value in bytes")
    value_sha256: str | None = Field(default=None, description="hex SHA-256 of the whole value")
    value_truncated: bool = False
    key_truncated: bool = False

    @classmethod
    def of(cls, reason: str, stage: str, topic: str, partition: int, offset: int, key: bytes | None,
           value: bytes | None, timestamp_ms: int | None = None, step: str | None = None,
           head: int = DEAD_LETTER_HEAD) -> "DeadLetter":
        """A dead letter that always serializes and stays small, whatever the record was."""
        b64 = (lambda b: base64.b64encode(b).decode("ascii") if b is not None else None)
        return cls(reason=utf8(str(reason))[:4000], stage=stage, topic=utf8(topic), partition=partition,
                   offset=offset, key_b64=b64(key[:head] if key is not None else None),
                   value_b64=b64(value[:head] if value is not None else None), timestamp_ms=timestamp_ms,
                   step=step, value_size=len(value) if value is not None else None,
                   value_sha256=hashlib.sha256(value).hexdigest() if value is not None else None,
                   value_truncated=value is not None and len(value) > head,
                   key_truncated=key is not None and len(key) > head)


class Progress(BaseModel):
    """An extractor's progress on one raw partition (JSON on the compacted progress topic).

    ``position`` is the next offset it will read: every record before it was extracted and
    its events delivered. ``high`` is the partition's high watermark its last fetch saw
    (-1: unknown). ``position >= high`` means it had read everything the broker had, which
    is how an idle partition is caught up too. ``events_end`` maps each events partition to
    the offset after the last EventBatch this worker delivered there, so the correlator can
    tell it has merged them.
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)

    topic: str
    partition: int = Field(ge=0)
    position: int
    high: int
    ts_ms: int = Field(description="the extractor's wall clock when it saw this")
    worker: str
    events_end: dict[int, int] = Field(default_factory=dict)
    done_ts_ms: int = Field(default=-1, description=(
        "the latest record time (Kafka timestamp) among the records before position: once past an "
        "attempt's end record's time, every line shipped before that end was read (-1: none)"))
    fresh: bool = Field(default=True, description=(
        "the consumer had drained what it had fetched when this was reported, so ``high`` is a recent "
        "fetch's; False while it works through a backlog (high can be many seconds old)"))
    held: list[str] = Field(default_factory=list, description=(
        "workload ids and hosts whose lines this worker read but holds, unrouted (their start event is "
        "not known yet): an attempt named here, or on a host named here, is not complete"))

    @property
    def caught_up(self) -> bool:
        return self.high >= 0 and self.position >= self.high

    def held_disjoint(self, keys: frozenset[str]) -> bool:
        """None of ``keys`` (an attempt's workload id and hosts) has lines held unrouted here."""
        return not keys or keys.isdisjoint(self.held)
