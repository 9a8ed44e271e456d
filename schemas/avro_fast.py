"""A small Avro binary decoder for flat records (strings, bytes, longs and their null unions).

The raw topic carries one record per log line, so decoding is the extractor's hot
path: fastavro's per-call set-up costs more than the record itself. This reads
exactly the Avro binary encoding (zig-zag varints, length-prefixed UTF-8, union
branch index) for the flat schemas it is built from, and refuses anything else.
``tests/test_schemas.py`` checks it agrees with fastavro.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _long(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def compile_flat(schema: dict[str, Any]):
    """A decoder function for a flat record schema, or None when the schema is not flat."""
    plan: list[tuple[str, str, bool]] = []          # (field, string|bytes|long|ts, nullable)
    for f in schema["fields"]:
        t, nullable = f["type"], False
        if isinstance(t, list):
            if len(t) != 2 or t[0] != "null":
                return None
            t, nullable = t[1], True
        if t == "string":
            kind = "string"
        elif t == "bytes" or (isinstance(t, dict) and t.get("type") == "bytes" and "logicalType" not in t):
            kind = "bytes"
        elif t == "long":
            kind = "long"
        elif isinstance(t, dict) and t.get("type") == "long" and t.get("logicalType") == "timestamp-micros":
            kind = "ts"
        else:
            return None
        plan.append((f["name"], kind, nullable))

    def decode(body: bytes) -> dict[str, Any]:
        pos, out = 0, {}
        try:
            for name, kind, nullable in plan:
                if nullable:
                    branch = body[pos]           # one byte: zig-zag 0 (null) or 2 (the value)
                    pos += 1
                    if branch == 0:
                        out[name] = None
                        continue
                    if branch != 2:
                        raise ValueError(f"bad union branch for {name}")
                b = body[pos]
                if b < 0x80:                     # most lengths and line numbers fit one byte
                    value, pos = (b >> 1) ^ -(b & 1), pos + 1
                else:
                    value, pos = _long(body, pos)
                if kind == "string" or kind == "bytes":
                    if value < 0 or pos + value > len(body):
                        raise ValueError(f"bad {kind} length for {name}")
                    chunk = body[pos:pos + value]
                    out[name] = chunk.decode("utf-8") if kind == "string" else chunk
                    pos += value
                elif kind == "ts":
                    out[name] = _EPOCH + timedelta(microseconds=value)
                else:
                    out[name] = value
        except IndexError:
            raise ValueError("truncated record") from None
        if pos != len(body):
            raise ValueError("trailing bytes after the record")
        return out

    return decode
