"""JSON from users (workload.json, request bodies), parsed with every limit turned into BundleError.

Python's own parser raises RecursionError on deep nesting and ValueError on an
integer past 4,300 digits; both are bad input, not crashes. Nesting is bounded
well below the interpreter's limit too, so no later step (validation, dumping the
record, Avro) can recurse out on a record that parsed.
"""
from __future__ import annotations

import json
import re
from typing import Any

from .errors import BundleError

MAX_DEPTH = 64                                 # objects and arrays inside one another
MAX_INT_DIGITS = 4300                          # Python's default int <-> str limit
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.S)


class JsonLimitError(BundleError):
    """Valid JSON past a limit (nesting, integer digits); the message names the field."""


class _BigInt(str):
    """Stands for an integer too long to convert; found after parsing to name its field."""


def _parse_int(text: str) -> int | _BigInt:
    return _BigInt(text) if len(text.lstrip("-")) > MAX_INT_DIGITS else int(text)


def _where(path: list[str | int]) -> str:
    shown = ".".join(str(p) for p in path[:6])
    return (shown + (".…" if len(path) > 6 else "")) or "(root)"


def _check(value: Any, origin: str) -> None:
    """Depth and oversized integers, walked without recursion; the error names the field."""
    stack: list[tuple[Any, list[str | int]]] = [(value, [])]
    while stack:
        node, path = stack.pop()
        if isinstance(node, _BigInt):
            raise JsonLimitError(f"{origin}: field '{_where(path)}': an integer of {len(node.lstrip('-'))} digits "
                              f"(at most {MAX_INT_DIGITS})")
        if isinstance(node, (dict, list)):
            if len(path) >= MAX_DEPTH:
                raise JsonLimitError(f"{origin}: field '{_where(path)}': nested deeper than {MAX_DEPTH} levels")
            items = node.items() if isinstance(node, dict) else enumerate(node)
            stack.extend((v, path + [k]) for k, v in items)


def _deep_key(text: str) -> str:
    """The top-level key under which nesting runs past MAX_DEPTH (only for the error message)."""
    depth, key, after_string = 0, "(root)", None
    for m in _TOKEN.finditer(text):
        tok = m.group()
        if tok[0] == '"':
            if depth == 1 and text[m.end():m.end() + 64].lstrip().startswith(":"):
                after_string = tok[1:-1][:64]
            continue
        if tok in "[{":
            depth += 1
            if depth == 2 and after_string is not None:
                key = after_string
            if depth > MAX_DEPTH:
                return key
        else:
            depth -= 1
    return key


def load_json(data: bytes | str, origin: str) -> Any:
    """``json.loads`` that raises only BundleError for bad input, naming ``origin`` and the field."""
    try:
        value = json.loads(data, parse_int=_parse_int)
    except RecursionError:
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        raise JsonLimitError(f"{origin}: field '{_deep_key(text)}': nested deeper than {MAX_DEPTH} levels") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{origin} is not valid JSON: {exc}") from None
    except ValueError as exc:          # any other limit of the parser
        raise BundleError(f"{origin} is not valid JSON: {exc}") from None
    _check(value, origin)
    return value
