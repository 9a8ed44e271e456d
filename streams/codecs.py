"""Turn Kafka messages into records, whatever the producer sent.

The raw topic takes Avro ``RawLine`` (single-object encoding) from ``firstfault ship``,
JSON from existing shippers (Fluent Bit ``log``, Vector ``message``, rsyslog omkafka
templates with ``msg``/``message``; host in ``host``/``hostname``; path and line
when known) and plain text (host from the key or a ``host`` header). Anything else
raises ``RecordError`` with the reason, for the dead-letter topic.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from pydantic import ValidationError

from firstfault.rules.errors import RecordError
from firstfault.schemas import EventBatch, RawLine, SchedulerEvent
from firstfault.schemas.avro import MAGIC, decode

_TEXT_KEYS = ("log", "message", "msg", "MESSAGE")
_HOST_KEYS = ("host", "hostname", "HOSTNAME", "_HOSTNAME", "fromhost")
_PATH_KEYS = ("path", "file", "filename", "log_file", "_path")
_LINE_KEYS = ("line", "lineno", "offset_line", "line_number")


def _header(headers: Sequence[tuple[str, bytes]] | None, name: str) -> str | None:
    for k, v in headers or ():
        if k == name and v is not None:
            return v.decode("utf-8", "replace")
    return None


def _from_json(doc: dict[str, Any], key: str | None, headers) -> RawLine:
    text = next((doc[k] for k in _TEXT_KEYS if isinstance(doc.get(k), str)), None)
    if text is None:
        raise RecordError(f"JSON record has none of the text fields {', '.join(_TEXT_KEYS)}")
    host = next((doc[k] for k in _HOST_KEYS if isinstance(doc.get(k), str) and doc[k]), None) or key \
        or _header(headers, "host")
    path = next((doc[k] for k in _PATH_KEYS if isinstance(doc.get(k), str) and doc[k]), None) \
        or _header(headers, "path")
    line = next((doc[k] for k in _LINE_KEYS if isinstance(doc.get(k), int)), None)
    if line is None and (h := _header(headers, "line")) and h.isdigit():
        line = int(h)
    if not host and not path:
        raise RecordError("record names neither a host nor a path")
    path = path or f"logs/syslog/{host}.log"
    return RawLine(host=host, path=path, line=max(int(line or 1), 1), text=text.rstrip("\n"),
                   workload_id=doc.get("workload_id") if isinstance(doc.get("workload_id"), str) else None)


def decode_raw(value: bytes | None, key: bytes | None, headers=None) -> RawLine:
    """A raw-topic message -> RawLine, or RecordError saying why not."""
    if value is None or value == b"":
        raise RecordError("empty message")
    key_s = key.decode("utf-8", "replace") if key else None
    if value[:2] == MAGIC:
        try:
            rec = decode(value)
        except ValueError as exc:
            raise RecordError(str(exc)) from None
        if not isinstance(rec, RawLine):
            raise RecordError(f"a {type(rec).__name__} record on the raw topic")
        return rec
    if value[:1] == b"{":
        try:
            doc = json.loads(value)
        except (ValueError, UnicodeDecodeError) as exc:
            raise RecordError(f"invalid JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise RecordError("JSON record is not an object")
        try:
            return _from_json(doc, key_s, headers)
        except ValidationError as exc:
            raise RecordError(f"invalid raw record: {exc.errors()[0]['msg']}") from None
    host = _header(headers, "host") or key_s
    path = _header(headers, "path") or (f"logs/syslog/{host}.log" if host else None)
    if path is None:
        raise RecordError("plain-text line with no host (key or 'host' header)")
    line = _header(headers, "line")
    text = value.decode("utf-8", "surrogateescape").rstrip("\r\n")
    return RawLine(host=host, path=path, line=int(line) if line and line.isdigit() and int(line) > 0 else 1,
                   text=text, workload_id=_header(headers, "workload_id"))


def decode_scheduler(value: bytes | None) -> SchedulerEvent:
    if not value:
        raise RecordError("empty message")
    try:
        if value[:2] == MAGIC:
            rec = decode(value)
            if not isinstance(rec, SchedulerEvent):
                raise RecordError(f"a {type(rec).__name__} record on the scheduler topic")
            return rec
        return SchedulerEvent.model_validate_json(value)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise RecordError(f"invalid scheduler event: field '{'.'.join(map(str, err['loc']))}': {err['msg']}") from None
    except ValueError as exc:
        raise RecordError(str(exc)) from None


def decode_batch(value: bytes | None) -> EventBatch:
    if not value:
        raise RecordError("empty message")
    try:
        rec = decode(value)
    except ValueError as exc:
        raise RecordError(str(exc)) from None
    if not isinstance(rec, EventBatch):
        raise RecordError(f"a {type(rec).__name__} record on the events topic")
    return rec


def now_ms() -> int:
    return int(datetime.now(timezone.utc).timestamp() * 1000)
