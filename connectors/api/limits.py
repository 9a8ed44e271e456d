"""Request limits: body size, archive expansion, file and line counts, engine time.

Each violation is an :class:`ApiError` whose ``limit`` is the environment
variable that sets it, so the person who hits it knows what to ask for.
"""
from __future__ import annotations

import time

from fastapi import Request

from firstfault.rules.bundle import ArchiveLimitError, Bundle
from firstfault.rules.errors import AnalysisTimeout, BundleError

from .errors import ApiError
from .settings import ServiceSettings, env_name


def too_large(field: str, message: str, code: str) -> ApiError:
    return ApiError(413, code, f"{message} ({env_name(field)})", limit=env_name(field))


# The login form holds a token and a page path: anything bigger is not a login.
MAX_FORM_BYTES = 16 * 1024


async def read_body(request: Request, settings: ServiceSettings, cap: int | None = None) -> bytes:
    """The request body, refused as soon as it passes ``cap`` (default FIRSTFAULT_MAX_BODY_BYTES,
    which also bounds any smaller cap): before a byte is read when Content-Length says so."""
    limit = min(cap, settings.max_body_bytes) if cap is not None else settings.max_body_bytes

    def refuse(what: str) -> ApiError:
        if limit == settings.max_body_bytes:
            return too_large("max_body_bytes", f"request body {what} {limit} bytes", "body_too_large")
        return ApiError(413, "body_too_large", f"request body {what} {limit} bytes, the most this route reads")

    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise refuse(f"of {declared} bytes exceeds")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():   # also catches chunked bodies that declare no length
        size += len(chunk)
        if size > limit:
            raise refuse("exceeds")
        chunks.append(chunk)
    return b"".join(chunks)


def check_file_count(count: int, settings: ServiceSettings) -> None:
    if count > settings.max_files:
        raise too_large("max_files", f"{count} files exceed the cap of {settings.max_files}", "too_many_files")


def check_lines(bundle: Bundle, settings: ServiceSettings, deadline: float | None = None) -> int:
    """Count the evidence lines (a final line without a newline counts) against FIRSTFAULT_MAX_LINES."""
    total = 0
    for f in bundle.files:
        last = b""
        for chunk in f.open_chunks():
            if deadline is not None and time.monotonic() > deadline:
                raise AnalysisTimeout("the analysis passed its deadline while counting lines")
            total += chunk.count(b"\n")
            if chunk:
                last = chunk
        if last and not last.endswith(b"\n"):
            total += 1
        if total > settings.max_lines:
            raise too_large("max_lines", f"the evidence has more than {settings.max_lines} lines", "too_many_lines")
    return total


def classify_archive_error(exc: BundleError) -> ApiError:
    """Map the bundle reader's archive-limit refusals to 413 naming our limit; anything else is 422."""
    if isinstance(exc, ArchiveLimitError):
        if exc.limit == "members":
            return too_large("max_files", str(exc), "too_many_files")
        return too_large("max_archive_bytes", str(exc), "archive_too_large")
    return ApiError(422, "invalid_bundle", str(exc))
