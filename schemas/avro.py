"""Avro for the records that travel on Kafka, derived from the pydantic models.

``avro_schema(Model)`` builds the schema from the model; the committed
``avro/*.avsc`` files are that output (``python -m firstfault.schemas.avro``
rewrites them, and a test fails when they drift). Messages use Avro single-object
encoding: ``C3 01``, the 8-byte little-endian CRC-64-AVRO fingerprint of the
writer's schema, then the body, so every message names its schema.

A model may grow a field with a default: the schema it had before is kept in
``avro/compat/`` (``<Name>.<n>.avsc``), and a message written with it is read through
Avro schema resolution into today's model, so records already on a topic survive an
upgrade instead of being dead-lettered.
"""
from __future__ import annotations

import io
import json
import os
import types
import typing
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import fastavro
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form
from pydantic import BaseModel, ValidationError

from .diagnosis import Diagnosis
from .events import Event, EventBatch
from .records import RawLine, SchedulerEvent

NAMESPACE = "io.firstfault"
AVRO_DIR = Path(__file__).resolve().parent / "avro"
MAGIC = b"\xc3\x01"
JSON_MARK = "firstfault.json"        # a field whose value travels as a JSON string
TEXT_MARK = "firstfault.text"        # a str field that travels as Avro bytes (surrogateescape)
TOPIC_MODELS: dict[str, type[BaseModel]] = {
    "RawLine": RawLine, "SchedulerEvent": SchedulerEvent, "Event": Event, "EventBatch": EventBatch,
    "Diagnosis": Diagnosis,
}
_SCALARS = {str: "string", int: "long", float: "double", bool: "boolean", bytes: "bytes"}


def _is_any(tp: Any) -> bool:
    return tp is Any or tp is object


def _type(tp: Any, seen: set[str], model: str, field: str) -> Any:
    origin = get_origin(tp)
    if origin is typing.Annotated:
        return _type(get_args(tp)[0], seen, model, field)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp)]
        has_none = type(None) in args
        rest = [a for a in args if a is not type(None)]
        branches: list[Any] = []
        for a in rest:
            t = _type(a, seen, model, field)
            for b in (t if isinstance(t, list) else [t]):
                if b not in branches:
                    branches.append(b)
        return (["null"] if has_none else []) + branches if (has_none or len(branches) > 1) else branches[0]
    if origin is Literal:
        return "string"
    if origin in (list, tuple, set, frozenset):
        return {"type": "array", "items": _type(get_args(tp)[0], seen, model, field)}
    if origin is dict:
        key, val = get_args(tp)
        if _is_any(val):
            return {"type": "string", JSON_MARK: True}
        return {"type": "map", "values": _type(val, seen, model, field)}
    if _is_any(tp):
        return {"type": "string", JSON_MARK: True}
    if tp in _SCALARS:
        return _SCALARS[tp]
    if tp is datetime:
        return {"type": "long", "logicalType": "timestamp-micros"}
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return _record(tp, seen)
    raise TypeError(f"{model}.{field}: no Avro mapping for {tp!r}")


def _record(model: type[BaseModel], seen: set[str]) -> Any:
    name = model.__name__
    if name in seen:
        return f"{NAMESPACE}.{name}"
    seen.add(name)
    fields = []
    for fname, info in model.model_fields.items():
        t = _type(info.annotation, seen, name, fname)
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if extra.get("avro") == "bytes" and t == "string":
            # Raw text: bytes that are not UTF-8 must survive (an Avro string cannot hold them).
            t = {"type": "bytes", TEXT_MARK: "surrogateescape"}
        entry: dict[str, Any] = {"name": fname, "type": t}
        if info.description:
            entry["doc"] = info.description
        if isinstance(t, list) and t and t[0] == "null":
            entry["default"] = None
        elif info.default_factory in (list, dict) and isinstance(t, dict) and t.get("type") in ("array", "map"):
            # What an older writer did not send reads as empty (schema resolution needs it).
            entry["default"] = [] if t["type"] == "array" else {}
        fields.append(entry)
    if model.model_config.get("extra") == "allow":
        fields.append({"name": "extra", "type": {"type": "string", JSON_MARK: True},
                       "doc": "unknown keys, kept as JSON", "default": "{}"})
    return {"type": "record", "name": name, "namespace": NAMESPACE,
            "doc": (model.__doc__ or "").strip().split("\n")[0], "fields": fields}


def avro_schema(model: type[BaseModel]) -> dict[str, Any]:
    return _record(model, set())


@lru_cache(maxsize=None)
def _raw_schema(name: str) -> dict[str, Any]:
    return json.loads((AVRO_DIR / f"{name}.avsc").read_text())


@lru_cache(maxsize=None)
def _flat(name: str):
    from .avro_fast import compile_flat

    decoder = compile_flat(_raw_schema(name))
    if decoder is None:
        raise TypeError(f"{name} is not a flat record")
    return decoder


@lru_cache(maxsize=None)
def _needs_walk(name: str) -> bool:
    """Whether a record has JSON-marked fields or extras to convert (RawLine does not)."""
    return JSON_MARK in json.dumps(_raw_schema(name))


@lru_cache(maxsize=None)
def _text_fields(name: str) -> tuple[str, ...]:
    """Top-level fields of a record that are str in the model and bytes on the wire."""
    return tuple(f["name"] for f in _raw_schema(name)["fields"]
                 if isinstance(f["type"], dict) and f["type"].get(TEXT_MARK))


@lru_cache(maxsize=None)
def _parsed(name: str) -> tuple[Any, bytes]:
    schema = _raw_schema(name)
    parsed = parse_schema(schema, _write_hint=False)
    # The Rabin fingerprint of the Parsing Canonical Form, written little-endian (Avro spec).
    return parsed, _fp(parsed)


def _fp(parsed: Any) -> bytes:
    return int(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"), 16).to_bytes(8, "little")


@lru_cache(maxsize=None)
def _by_fingerprint() -> dict[bytes, str]:
    return {_parsed(n)[1]: n for n in TOPIC_MODELS}


@lru_cache(maxsize=None)
def _older() -> dict[bytes, tuple[str, Any]]:
    """Fingerprints of earlier schemas (avro/compat/) -> (model name, parsed writer schema)."""
    out: dict[bytes, tuple[str, Any]] = {}
    for path in sorted((AVRO_DIR / "compat").glob("*.avsc")):
        name = path.name.split(".")[0]
        if name in TOPIC_MODELS:
            parsed = parse_schema(json.loads(path.read_text()), _write_hint=False)
            out[_fp(parsed)] = (name, parsed)
    return out


def _to_avro(value: Any, schema: Any) -> Any:
    """Model dump -> Avro datum: JSON-marked fields become strings, extras fold in."""
    if isinstance(schema, dict) and schema.get(JSON_MARK):
        return json.dumps(value, sort_keys=True, default=str)
    return value


def _walk(datum: Any, schema: Any, encode: bool, names: dict[str, Any]) -> Any:
    if isinstance(schema, str):
        schema = names.get(schema, schema)
    if isinstance(schema, list):
        if datum is None:
            return None
        for branch in schema:
            b = names.get(branch, branch) if isinstance(branch, str) else branch
            if isinstance(b, dict) and b.get("type") == "record" and isinstance(datum, dict):
                return _walk(datum, b, encode, names)
            if isinstance(b, dict) and b.get("type") == "array" and isinstance(datum, list):
                return _walk(datum, b, encode, names)
            if isinstance(b, dict) and b.get("type") == "map" and isinstance(datum, dict):
                return _walk(datum, b, encode, names)
        return datum
    if not isinstance(schema, dict):
        return datum
    if schema.get(JSON_MARK):
        return json.dumps(datum, sort_keys=True, default=str) if encode else json.loads(datum)
    kind = schema.get("type")
    if kind == "record":
        names.setdefault(f"{NAMESPACE}.{schema['name']}", schema)
        out = {}
        src = dict(datum)
        for f in schema["fields"]:
            if f["name"] == "extra" and f["type"].get(JSON_MARK) if isinstance(f["type"], dict) else False:
                if encode:
                    known = {g["name"] for g in schema["fields"]}
                    out["extra"] = json.dumps({k: v for k, v in src.items() if k not in known}, sort_keys=True, default=str)
                else:
                    out.update(json.loads(src.get("extra") or "{}"))
                continue
            out[f["name"]] = _walk(src.get(f["name"]), f["type"], encode, names)
        return out
    if kind == "array":
        return [_walk(x, schema["items"], encode, names) for x in datum or []]
    if kind == "map":
        return {str(k): _walk(v, schema["values"], encode, names) for k, v in (datum or {}).items()}
    return datum


def _construct(model: type[BaseModel], values: dict[str, Any]) -> BaseModel:
    """``model_construct`` without its per-field default handling: every field is present."""
    obj = model.__new__(model)
    object.__setattr__(obj, "__dict__", values)
    object.__setattr__(obj, "__pydantic_fields_set__", set(values))
    object.__setattr__(obj, "__pydantic_extra__", None)
    object.__setattr__(obj, "__pydantic_private__", None)
    return obj


class EncodeError(ValueError):
    """A model instance Avro cannot carry (a number past a long, text that is not UTF-8...)."""


def encode(obj: BaseModel) -> bytes:
    """Single-object encoding of a model instance; EncodeError says why not."""
    name = type(obj).__name__
    parsed, fp = _parsed(name)
    try:
        datum = obj.model_dump(mode="python")
        for f in _text_fields(name):
            if isinstance(datum.get(f), str):
                datum[f] = datum[f].encode("utf-8", "surrogateescape")
        if _needs_walk(name):
            datum = _walk(datum, _raw_schema(name), True, {})
        buf = io.BytesIO()
        buf.write(MAGIC + fp)
        fastavro.schemaless_writer(buf, parsed, datum)
    except Exception as exc:  # fastavro raises ValueError, OverflowError, TypeError, UnicodeEncodeError...
        raise EncodeError(f"cannot encode {name}: {type(exc).__name__}: {str(exc)[:300]}") from None
    return buf.getvalue()


@lru_cache(maxsize=None)
def _native_eventbatch():
    """The C EventBatch reader when it is built and reads today's schema (its fingerprint), else None."""
    try:
        from . import _eventbatch
    except ImportError:
        return None
    return _eventbatch.read if _eventbatch.FINGERPRINT == _parsed("EventBatch")[1] else None


def _texts(name: str, datum: dict[str, Any]) -> dict[str, Any]:
    for f in _text_fields(name):
        if isinstance(datum.get(f), bytes):
            datum[f] = datum[f].decode("utf-8", "surrogateescape")
    return datum


def decode(data: bytes) -> BaseModel:
    """Decode a single-object-encoded message into its model; ValueError says why not."""
    if len(data) < 10 or data[:2] != MAGIC:
        raise ValueError("not Avro single-object encoding (missing C3 01 marker)")
    name = _by_fingerprint().get(data[2:10])
    writer = None
    if name is None and data[2:10] in _older():
        name, writer = _older()[data[2:10]]
    if name is None:
        raise ValueError(f"unknown schema fingerprint {data[2:10][::-1].hex()}")
    if name == "RawLine" and writer is None:
        # The hot path (every raw line): a flat record, read without fastavro's per-call set-up.
        try:
            datum = _flat("RawLine")(data[10:])
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"corrupt RawLine body: {exc}") from None
        if datum["line"] < 1 or not datum["path"]:
            raise ValueError("RawLine needs a path and a line number of at least 1")
        datum["text"] = datum["text"].decode("utf-8", "surrogateescape")
        return _construct(RawLine, datum)
    native = _native_eventbatch() if name == "EventBatch" and writer is None else None
    if native is not None and os.environ.get("FIRSTFAULT_PURE_PYTHON") != "1":
        try:      # the correlator's hot path: fastavro's dict, read in C (schemas/_eventbatch.c)
            datum = native(data[10:])
        except ValueError as exc:
            raise ValueError(f"corrupt {name} body: {exc}") from None
    else:
        parsed, _ = _parsed(name)
        try:
            datum = fastavro.schemaless_reader(io.BytesIO(data[10:]), writer or parsed, parsed if writer else None)
        except Exception as exc:  # fastavro raises several types on truncated or corrupt bodies
            raise ValueError(f"corrupt {name} body: {exc}") from None

    if not isinstance(datum, dict):
        raise ValueError(f"corrupt {name} body: not a record")
    try:
        datum = _texts(name, datum)
        if _needs_walk(name):
            datum = _walk(datum, _raw_schema(name), False, {})
        return TOPIC_MODELS[name].model_validate(datum)
    except ValidationError:       # names the field: the callers report it as it is
        raise
    except Exception as exc:      # a JSON field that is not JSON, or nested past the recursion limit
        raise ValueError(f"corrupt {name} body: {type(exc).__name__}: {str(exc)[:300]}") from None


def write_schemas(directory: Path = AVRO_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for name, model in TOPIC_MODELS.items():
        path = directory / f"{name}.avsc"
        path.write_text(json.dumps(avro_schema(model), indent=2, sort_keys=True) + "\n")
        out.append(path)
    return out


if __name__ == "__main__":
    for p in write_schemas():
        print(p)
