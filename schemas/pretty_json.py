"""``json.dumps(value, sort_keys=True, ensure_ascii=False, indent=2)``, the same text made faster.

With ``indent`` the standard library's C encoder is not used: its pure-Python encoder yields every
token through nested generators, and a diagnosis of a big workload has thousands of them (the
service encodes each one it answers and stores). This writes the same text by appending to one
list, with the C string encoder for keys and strings. Anything it does not know (a value that is
not JSON's, keys of mixed types, a cycle) is left to ``json.dumps``, so errors are its errors.
"""
from __future__ import annotations

import json
from typing import Any

try:                                    # the C escaper json.dumps(ensure_ascii=False) uses when it is there
    from _json import encode_basestring as _quote
except ImportError:                     # pragma: no cover - CPython always has _json
    from json.encoder import py_encode_basestring as _quote

_INF = float("inf")
_DEPTH = 200                            # deeper values are left to json.dumps (its recursion error)


class _Unknown(Exception):
    """A value this encoder leaves to json.dumps."""


def dumps_sorted_indented(value: Any) -> str:
    """Exactly ``json.dumps(value, sort_keys=True, ensure_ascii=False, indent=2)``."""
    parts: list[str] = []
    try:
        _value(value, parts, "\n", 0)
    except _Unknown:
        return json.dumps(value, sort_keys=True, ensure_ascii=False, indent=2)
    return "".join(parts)


def _value(value: Any, out: list[str], nl: str, depth: int) -> None:
    # Exact types first (the common case); subclasses of str/int/float are json's to write.
    t = type(value)
    if t is str:
        out.append(_quote(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif t is int:
        out.append(int.__repr__(value))
    elif t is float:
        out.append(_float(value))
    elif t is dict:
        _dict(value, out, nl, depth)
    elif t is list or t is tuple:
        _list(value, out, nl, depth)
    else:
        raise _Unknown


def _float(value: float) -> str:
    if value != value:
        return "NaN"
    if value == _INF:
        return "Infinity"
    if value == -_INF:
        return "-Infinity"
    return float.__repr__(value)


def _dict(value: dict, out: list[str], nl: str, depth: int) -> None:
    if not value:
        out.append("{}")
        return
    if depth >= _DEPTH:
        raise _Unknown
    try:
        keys = sorted(value)
    except TypeError:
        raise _Unknown from None
    inner = nl + "  "
    sep = "{" + inner
    for key in keys:
        if type(key) is not str:
            raise _Unknown              # json.dumps' own conversion of non-str keys (and its errors)
        out.append(sep)
        out.append(_quote(key))
        out.append(": ")
        _value(value[key], out, inner, depth + 1)
        sep = "," + inner
    out.append(nl + "}")


def _list(value: list | tuple, out: list[str], nl: str, depth: int) -> None:
    if not value:
        out.append("[]")
        return
    if depth >= _DEPTH:
        raise _Unknown
    inner = nl + "  "
    sep = "[" + inner
    for item in value:
        out.append(sep)
        _value(item, out, inner, depth + 1)
        sep = "," + inner
    out.append(nl + "]")
