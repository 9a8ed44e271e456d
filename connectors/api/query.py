"""Query strings taken at their word: each parameter once, as written.

Starlette keeps the last of a repeated parameter (a proxy or a cache in front may keep the
first), and pydantic reads ``"\\n5"`` or ``" 5"`` as the number 5: a request the OpenAPI
document says is invalid would be answered as if it were another one. Every route refuses
such a query with 422 instead (a global dependency of the app).
"""
from __future__ import annotations

from fastapi import Request

from .errors import ApiError


def plain_query(request: Request) -> None:
    """Refuse a repeated query parameter, or a value with surrounding blanks or control characters."""
    seen: set[str] = set()
    for key, value in request.query_params.multi_items():
        if key in seen:
            raise ApiError(422, "invalid_request", f"query parameter {key!r} is given more than once")
        seen.add(key)
        if value != value.strip() or any(ord(c) < 0x20 or ord(c) == 0x7f for c in value):
            raise ApiError(422, "invalid_request",
                           f"query parameter {key!r} has blanks around it or control characters")
