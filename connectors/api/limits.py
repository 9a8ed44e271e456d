"""Request limits: body size, archive expansion, file and line counts, engine time.

Each violation is an :class:`ApiError` whose ``limit`` is the environment
variable that sets it, so the person who hits it knows what to ask for.
"""
from __future__ import annotations

from fastapi import Request

from firstfault.rules.bundle import Bundle

from .errors import ApiError
from .settings import ServiceSettings, env_name


def too_large(field: str, message: str, code: str) -> ApiError:
    return ApiError(413, code, f"{message} ({env_name(field)})", limit=env_name(field))


async def read_body(request: Request, settings: ServiceSettings) -> bytes:
    """The request body, refused as soon as it passes FIRSTFAULT_MAX_BODY_BYTES."""
    cap = settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise too_large("max_body_bytes", f"request body of {declared} bytes exceeds {cap} bytes", "body_too_large")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():   # also catches chunked bodies that declare no length
        size += len(chunk)
        if size > cap:
            raise too_large("max_body_bytes", f"request body exceeds {cap} bytes", "body_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def check_file_count(count: int, settings: ServiceSettings) -> None:
    if count > settings.max_files:
        raise too_large("max_files", f"{count} files exceed the cap of {settings.max_files}", "too_many_files")


def check_lines(bundle: Bundle, settings: ServiceSettings) -> int:
    """Count the evidence lines (a final line without a newline counts) against FIRSTFAULT_MAX_LINES."""
    total = 0
    for f in bundle.files:
        last = b""
        for chunk in f.open_chunks():
            total += chunk.count(b"\n")
            if chunk:
                last = chunk
        if last and not last.endswith(b"\n"):
            total += 1
        if total > settings.max_lines:
            raise too_large("max_lines", f"the evidence has more than {settings.max_lines} lines", "too_many_lines")
    return total


def classify_archive_error(message: str) -> ApiError:
    """Map the bundle reader's archive-limit refusals to 413 naming our limit; anything else is 422.

    The reader (rules/bundle.py) reports limits only in its message, so the
    phrases are matched here; tests pin each of them.
    """
    if "archive members" in message and "more than" in message:
        return too_large("max_files", message, "too_many_files")
    if "size limit" in message:
        return too_large("max_archive_bytes", message, "archive_too_large")
    return ApiError(422, "invalid_bundle", message)
