"""Query strings taken at their word: each parameter once, as written.

Starlette keeps the last of a repeated parameter (a proxy or a cache in front may keep the
first), and pydantic reads ``"\\n5"`` or ``" 5"`` as the number 5: a request the OpenAPI
document says is invalid would be answered as if it were another one. Every route refuses
such a query with 422 instead (a global dependency of the app). A text parameter (``name``,
``node``, ``path``...) is not converted, so its value is taken exactly as written.
"""
from __future__ import annotations

from types import UnionType
from typing import Any, Union, get_args, get_origin

from fastapi import Request

from .errors import ApiError


def _free_text(annotation: Any) -> bool:
    """Is a parameter declared as plain text (``str``, ``str | None``)? Its value is taken as written:
    nothing strips or converts it, so blanks and control characters are part of it."""
    if annotation is str:
        return True
    args = get_args(annotation)
    return get_origin(annotation) in (Union, UnionType) and bool(args) and all(a in (str, type(None)) for a in args)


def _text_params(route: Any) -> frozenset[str]:
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return frozenset()
    return frozenset(f.alias for f in dependant.query_params if _free_text(f.field_info.annotation))


def plain_query(request: Request) -> None:
    """Refuse a repeated query parameter, or a value that a conversion would read as another one (a
    number, a flag, a time with blanks or control characters around it). Text parameters are taken
    as written: their schema allows any characters, so the service must too."""
    text = _text_params(request.scope.get("route"))
    seen: set[str] = set()
    for key, value in request.query_params.multi_items():
        if key in seen:
            raise ApiError(422, "invalid_request", f"query parameter {key!r} is given more than once")
        seen.add(key)
        if key in text:
            continue
        if value != value.strip() or any(ord(c) < 0x20 or ord(c) == 0x7f for c in value):
            raise ApiError(422, "invalid_request",
                           f"query parameter {key!r} has blanks around it or control characters")
