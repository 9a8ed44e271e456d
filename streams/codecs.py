"""Turn Kafka messages into records, whatever the producer sent.

The raw topic takes Avro ``RawLine`` (single-object encoding) from ``firstfault ship``,
JSON from existing shippers (Fluent Bit ``log``, Vector ``message``, rsyslog omkafka
templates with ``msg``/``message``; host in ``host``/``hostname``; path, source and
line when known) and plain text (kcat: host from the key or a ``host`` header, path,
source, line and workload_id from headers). Anything else raises ``RecordError`` with
the reason, for the dead-letter topic.

A shipper names files by their place on the node (``/var/log/syslog``); evidence names
them by their place in a bundle (``logs/syslog/node-02.log``), which is also what tells
the engine a line is node-scoped. ``bundle_path`` maps one to the other. Shippers that
send no line number get the message's Kafka offset + 1 instead: unique, and in file
order, since a file's lines share a key and so a partition.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import PurePosixPath
from typing import Any

from pydantic import ValidationError

from firstfault.rules.errors import RecordError
from firstfault.rules.extract import source_of
from firstfault.schemas import EventBatch, RawLine, SchedulerEvent
from firstfault.schemas.avro import MAGIC, _construct, _flat, _parsed, _raw_schema, decode
from firstfault.schemas.avro_fast import flat_plan
from firstfault.schemas.records import MAX_LONG

_TEXT_KEYS = ("log", "message", "msg", "MESSAGE")
_HOST_KEYS = ("host", "hostname", "HOSTNAME", "_HOSTNAME", "fromhost")
_PATH_KEYS = ("path", "file", "filename", "log_file", "_path")
_LINE_KEYS = ("line", "lineno", "offset_line", "line_number")


_SOURCES = ("app", "syslog", "fabricmanager", "scheduler")
# Where distributions and NVIDIA's packages write node-scoped logs (basename -> source),
# also once rotated: syslog.1, messages-20261102, kern.log.2.gz.
_NODE_FILES = {"syslog": "syslog", "messages": "syslog", "kern.log": "syslog", "kern": "syslog",
               "dmesg": "syslog", "daemon.log": "syslog", "journal": "syslog",
               "fabricmanager.log": "fabricmanager", "nv-fabricmanager.log": "fabricmanager"}
_ROTATED = re.compile(r"(?:\.\d+|-\d{8})?(?:\.gz)?$")


def bundle_path(host: str | None, path: str | None, source: str | None = None) -> tuple[str, str]:
    """A shipper's (host, file path, declared source) -> (bundle path, source).

    Bundle paths pass through. Otherwise the source is the declared one, else the
    file's well-known name, else ``app``; a host's syslog or Fabric Manager log becomes
    ``logs/<source>/<host>.log``, a scheduler log ``logs/scheduler/<name>.log``, an
    application file ``logs/app/<host>.<name>.log``
    (the engine finds the host in the name before the first dot).
    """
    if source is not None and source not in _SOURCES:
        raise RecordError(f"unknown source {source!r}: one of {', '.join(_SOURCES)}")
    if path and source_of(path) is not None:
        return path, source or source_of(path)
    name = PurePosixPath(path).name if path else ""
    if source is None:
        source = _NODE_FILES.get(_ROTATED.sub("", name, count=1)) or (
            "syslog" if path and "/journal/" in path else "syslog" if not path else "app")
    if source == "scheduler":
        # The workload's scheduler log (slurmctld lines, `kubectl get events`): not a node's, so
        # named by its file; it reaches a workload only with a workload_id (header or field).
        stem = PurePosixPath(name).stem or host or "scheduler"
        return f"logs/scheduler/{stem}.log", source
    if source != "app":
        if not host:
            raise RecordError(f"a {source} line with no host")
        return f"logs/{source}/{host}.log", source
    stem = PurePosixPath(name).stem or "app"
    if not host:
        return f"logs/app/{stem}.log", source
    return (f"logs/app/{host}.log" if stem == host else f"logs/app/{host}.{stem}.log"), source


def _line_no(line: object, offset: int | None) -> int:
    if isinstance(line, int) and 1 <= line <= MAX_LONG:
        return line
    if isinstance(line, str) and 0 < len(line) <= 18 and line.isdigit() and int(line) >= 1:
        return int(line)
    return offset + 1 if offset is not None and offset >= 0 else 1


def _header(headers: Sequence[tuple[str, bytes]] | None, name: str) -> str | None:
    for k, v in headers or ():
        if k == name and v is not None:
            return v.decode("utf-8", "replace")
    return None


def _from_json(doc: dict[str, Any], key: str | None, headers, offset: int | None) -> RawLine:
    text = next((doc[k] for k in _TEXT_KEYS if isinstance(doc.get(k), str)), None)
    if text is None:
        raise RecordError(f"JSON record has none of the text fields {', '.join(_TEXT_KEYS)}")
    host = next((doc[k] for k in _HOST_KEYS if isinstance(doc.get(k), str) and doc[k]), None) or key \
        or _header(headers, "host")
    path = next((doc[k] for k in _PATH_KEYS if isinstance(doc.get(k), str) and doc[k]), None) \
        or _header(headers, "path")
    source = doc.get("source") if isinstance(doc.get("source"), str) and doc["source"] else _header(headers, "source")
    line = next((doc[k] for k in _LINE_KEYS if isinstance(doc.get(k), int)), None) or _header(headers, "line")
    if not host and not path:
        raise RecordError("record names neither a host nor a path")
    path, source = bundle_path(host, path, source)
    wid = doc.get("workload_id") if isinstance(doc.get("workload_id"), str) else _header(headers, "workload_id")
    return RawLine(host=host, path=path, line=_line_no(line, offset), text=text.rstrip("\r\n"), source=source,
                   workload_id=wid or None)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(map(str, err["loc"]))
    return f"field '{loc}': {err['msg']}" if loc else err["msg"]


def decode_raw(value: bytes | None, key: bytes | None, headers=None, offset: int | None = None) -> RawLine:
    """A raw-topic message -> RawLine, or RecordError saying why not. ``offset`` numbers unnumbered lines.

    Bytes that are not UTF-8 are kept (surrogate escapes in ``text``), in JSON strings as in
    plain text: the line is diagnosed from the bytes its program wrote, as ``analyze`` does.
    """
    try:
        return _decode_raw(value, key, headers, offset)
    except ValidationError as exc:
        raise RecordError(f"invalid raw record: {_first_error(exc)}") from None
    except RecursionError:
        raise RecordError("raw record nested too deeply") from None


def _decode_raw(value: bytes | None, key: bytes | None, headers, offset: int | None) -> RawLine:
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
            doc = json.loads(value.decode("utf-8", "surrogateescape"))
        except ValueError as exc:
            raise RecordError(f"invalid JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise RecordError("JSON record is not an object")
        return _from_json(doc, key_s, headers, offset)
    host = _header(headers, "host") or key_s
    path = _header(headers, "path")
    if not host and not path:
        raise RecordError("plain-text line with no host (key or 'host' header) and no 'path' header")
    path, source = bundle_path(host, path, _header(headers, "source"))
    text = value.decode("utf-8", "surrogateescape").rstrip("\r\n")
    return RawLine(host=host, path=path, line=_line_no(_header(headers, "line"), offset), text=text, source=source,
                   workload_id=_header(headers, "workload_id"))


def raw_lines(values: Sequence[bytes | None]) -> tuple[list[RawLine | None], list[bytes | None]]:
    """A batch's Avro ``RawLine`` values decoded in one pass, and each line's bytes.

    The extractor's hot path: no per-record dispatch, format sniffing or validation wrapper.
    None where ``decode_raw`` must decide (JSON, plain text, an older schema, a body this
    refuses): it gives the record or the reason to dead-letter it, exactly as alone.
    The bytes are the line as its program wrote them (``RawLine.raw()``), for the prefilter.
    Decoded in C when the extension is built (``FIRSTFAULT_PURE_PYTHON=1``: in Python regardless).
    """
    native = None if os.environ.get("FIRSTFAULT_PURE_PYTHON") == "1" else _native_decoder()
    if native is not None:
        return native(values, _raw_head(), RawLine)
    return _raw_lines_py(values)


def _raw_lines_py(values: Sequence[bytes | None]) -> tuple[list[RawLine | None], list[bytes | None]]:
    """``raw_lines`` in Python: what the C decoder does, and its fallback."""
    head = _raw_head()
    flat = _flat("RawLine")
    recs: list[RawLine | None] = []
    texts: list[bytes | None] = []
    for value in values:
        if value is None or not value.startswith(head):
            recs.append(None)
            texts.append(None)
            continue
        try:
            datum = flat(value[10:])
            raw = datum["text"]
            if datum["line"] < 1 or not datum["path"]:
                raise ValueError("RawLine needs a path and a line number of at least 1")
            datum["text"] = raw.decode("utf-8", "surrogateescape")
        except (ValueError, UnicodeDecodeError):
            recs.append(None)
            texts.append(None)
            continue
        recs.append(_construct(RawLine, datum))
        texts.append(raw)
    return recs, texts


@lru_cache(maxsize=None)
def _native_decoder() -> Callable[..., tuple[list[RawLine | None], list[bytes | None]]] | None:
    """The C extension's ``decode_many`` when it is built and reads today's RawLine schema, else None."""
    try:
        from firstfault.schemas import _rawline
    except ImportError:
        return None
    return _rawline.decode_many if _rawline.PLAN == tuple(flat_plan(_raw_schema("RawLine")) or ()) else None


@lru_cache(maxsize=None)
def _raw_head() -> bytes:
    """The first ten bytes of every RawLine written with today's schema: marker and fingerprint."""
    return MAGIC + _parsed("RawLine")[1]


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
        raise RecordError(f"invalid scheduler event: {_first_error(exc)}") from None
    except (ValueError, RecursionError) as exc:
        raise RecordError(str(exc) or type(exc).__name__) from None


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
