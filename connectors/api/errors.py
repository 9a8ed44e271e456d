"""One JSON error shape for every failure: ``{"error": {"code", "message", "limit"}}``.

Routes raise :class:`ApiError`; FastAPI's own validation errors and Starlette's
404/405 are mapped to the same shape, so a client parses one model.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)


class ErrorDetail(BaseModel):
    code: str = Field(description="stable machine-readable reason, e.g. body_too_large, invalid_workload")
    message: str = Field(description="one human sentence; names the field or the limit")
    limit: str | None = Field(description="the configuration variable of the limit that was hit, else null")


class ErrorBody(BaseModel):
    error: ErrorDetail


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, limit: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.limit = status, code, message, limit
        self.headers = headers or {}


HtmlRenderer = Callable[[Request, "ApiError"], Response]


def error_response(status: int, code: str, message: str, limit: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    body = ErrorBody(error=ErrorDetail(code=code, message=message, limit=limit))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


_DESCRIPTIONS = {
    400: "Malformed request (e.g. the body is not valid JSON)",
    401: "Missing or unknown bearer token",
    403: "The token may not do this (a read token on a write route)",
    404: "Not found",
    409: "Asked for something this deployment is not configured for",
    413: "A size limit was exceeded; `limit` names it",
    415: "Unsupported Content-Type",
    422: "Invalid parameter, workload record or bundle; the message names the field",
    500: "Unexpected server error",
    503: "A dependency (store, publisher) is unavailable or the engine is saturated",
    504: "The engine exceeded the per-request time cap",
}


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries for the given error statuses (500 always included)."""
    return {s: {"model": ErrorBody, "description": _DESCRIPTIONS[s]} for s in sorted({*statuses, 500})}


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(str(p) for p in loc)


def install(app: FastAPI, html: HtmlRenderer | None = None, html_prefix: str = "/ui/",
            translate: Mapping[type[Exception], Callable[[Exception], ApiError]] | None = None) -> None:
    """Map every error to the JSON model; on pages under ``html_prefix``, to ``html`` instead.

    ``translate`` turns other exception types (e.g. the store's) into an ApiError.
    """

    def respond(request: Request, exc: ApiError) -> Response:
        if html is not None and request.url.path.startswith(html_prefix):
            return html(request, exc)
        return error_response(exc.status, exc.code, exc.message, exc.limit, exc.headers)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> Response:
        return respond(request, exc)

    for exc_type, to_api_error in (translate or {}).items():
        def make(convert: Callable[[Exception], ApiError]) -> Callable[[Request, Exception], Any]:
            async def handler(request: Request, exc: Exception) -> Response:
                return respond(request, convert(exc))
            return handler
        app.add_exception_handler(exc_type, make(to_api_error))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        return respond(request, ApiError(422, "invalid_parameter", f"{_field(first['loc'])}: {first['msg']}"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return respond(request, ApiError(exc.status_code, code, str(exc.detail), None, dict(exc.headers or {})))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return respond(request, ApiError(500, "internal_error",
                                         f"unexpected {type(exc).__name__}; see the service log"))
