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
    """A zig-zag varint at pos -> (value, next pos); an Avro long is 64 bits, 10 bytes at most."""
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            if result >> 64:
                raise ValueError("long past 64 bits")
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift == 70:
            raise ValueError("varint longer than 10 bytes")


def compile_flat(schema: dict[str, Any]):
    """A decoder function for a flat record schema, or None when the schema is not flat.

    The decoder is generated straight-line code for this schema (no loop over a field plan,
    the one-byte varint inlined): the raw topic decodes every line, so a few attribute
    loads and branches per field are most of its cost.
    """
    plan = flat_plan(schema)
    return None if plan is None else _generate(plan)


def flat_plan(schema: dict[str, Any]) -> list[tuple[str, str, bool]] | None:
    """(field, string|bytes|long|ts, nullable) per field of a flat record schema, else None."""
    plan: list[tuple[str, str, bool]] = []
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
        if not str(f["name"]).isidentifier():
            return None
        plan.append((f["name"], kind, nullable))
    return plan


def _generate(plan: list[tuple[str, str, bool]]):
    code = ["def decode(body):", "    pos = 0", "    size = len(body)", "    try:"]
    for i, (name, kind, nullable) in enumerate(plan):
        pad = "        "
        var = f"v{i}"
        if nullable:
            # One byte: zig-zag 0 (null) or 2 (the value).
            code += [f"{pad}branch = body[pos]", f"{pad}pos += 1",
                     f"{pad}if branch == 0:", f"{pad}    {var} = None",
                     f"{pad}elif branch != 2:", f"{pad}    raise ValueError({f'bad union branch for {name}'!r})",
                     f"{pad}else:"]
            pad += "    "
        # Most lengths and line numbers fit one or two bytes: those inline, longer ones by _long.
        code += [f"{pad}b = body[pos]",
                 f"{pad}if b < 0x80:",
                 f"{pad}    n = (b >> 1) ^ -(b & 1)", f"{pad}    pos += 1",
                 f"{pad}elif body[pos + 1] < 0x80:",
                 f"{pad}    n = (b & 0x7F) | (body[pos + 1] << 7)", f"{pad}    n = (n >> 1) ^ -(n & 1)",
                 f"{pad}    pos += 2",
                 f"{pad}else:", f"{pad}    n, pos = _long(body, pos)"]
        if kind in ("string", "bytes"):
            code += [f"{pad}if n < 0 or pos + n > size:",
                     f"{pad}    raise ValueError({f'bad {kind} length for {name}'!r})",
                     f"{pad}{var} = body[pos:pos + n]" + (".decode('utf-8')" if kind == "string" else ""),
                     f"{pad}pos += n"]
        elif kind == "ts":
            code += [f"{pad}{var} = _EPOCH + timedelta(microseconds=n)"]
        else:
            code += [f"{pad}{var} = n"]
    code += ["    except IndexError:", "        raise ValueError('truncated record') from None",
             # A timestamp-micros past datetime's years 1..9999: refused like any corrupt body.
             "    except OverflowError:", "        raise ValueError('timestamp out of range') from None",
             "    if pos != size:", "        raise ValueError('trailing bytes after the record')",
             "    return {" + ", ".join(f"{name!r}: v{i}" for i, (name, _, _) in enumerate(plan)) + "}"]
    scope: dict[str, Any] = {"_long": _long, "_EPOCH": _EPOCH, "timedelta": timedelta}
    exec(compile("\n".join(code), "<avro_fast decoder>", "exec"), scope)      # names are identifiers: checked
    return scope["decode"]
