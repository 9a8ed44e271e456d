"""Turn a POST /v1/analyze body into the engine's Bundle: JSON form, bundle archive or one log file.

Both forms end in the same ``Bundle`` the CLI builds (``open_archive`` /
``bundle_from_files``), so the diagnosis is byte-identical to ``firstfault analyze``.
Runs in an engine thread: JSON parsing and decompression are CPU work too.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from email.parser import BytesParser
from email.policy import HTTP
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from firstfault.rules.bundle import Bundle, bundle_from_files, compressed_log, open_archive, parse_workload
from firstfault.rules.errors import BundleError
from firstfault.rules.intake import Intake, open_input
from firstfault.rules.jsonsafe import JsonLimitError, load_json
from firstfault.schemas import WorkloadRecord

from .errors import ApiError
from .limits import check_file_count, check_lines, classify_archive_error
from .settings import ServiceSettings

JSON = "application/json"
MULTIPART = "multipart/form-data"           # the pages' upload form
# One log file as its bytes (curl --data-binary): read as `firstfault analyze FILE` reads it.
LOG_TYPES = ("text/plain", "application/octet-stream")
DEFAULT_NAME = "upload.log"                 # a file that comes without a name
MAX_NAME_BYTES = 255                        # what a file system takes for one name
ARCHIVE_TYPES = {
    "application/gzip": "tar", "application/x-gzip": "tar",     # a .tar.gz bundle
    "application/zip": "zip", "application/x-zip-compressed": "zip",
}


class AnalyzeRequest(BaseModel):
    """The JSON form of one workload attempt's evidence (documented request schema)."""

    model_config = ConfigDict(extra="forbid")

    workload: WorkloadRecord = Field(description="the workload.json object; its instants must fall in the "
                                                 "years 1970 to 2999")
    files: dict[str, str] = Field(
        default_factory=dict,
        description="file text keyed by bundle path, e.g. logs/syslog/node-02.log; paths outside the "
                    "bundle layout are ignored, as in a bundle directory. Bytes that are not UTF-8 may be "
                    "sent as lone surrogates U+DC80..U+DCFF (Python's surrogateescape).")


class _Envelope(BaseModel):
    # What is checked before the workload record goes through the engine's own parser.
    model_config = ConfigDict(extra="forbid")

    workload: dict[str, Any]
    files: dict[str, str] = Field(default_factory=dict)


# The engine adds slack around the job window; near datetime.min/max that overflows.
# No training job ran before 1970 or after 2999, so the service refuses those instants.
_EARLIEST = datetime(1970, 1, 1, tzinfo=timezone.utc)
_LATEST = datetime(3000, 1, 1, tzinfo=timezone.utc)


def check_workload_times(workload: WorkloadRecord) -> WorkloadRecord:
    stamps = {"start_time": workload.start_time, "end_time": workload.end_time}
    stamps.update({f"boot_times.{h}": t for h, t in workload.boot_times.items()})
    for field, t in stamps.items():
        if t is not None and not _EARLIEST <= t < _LATEST:
            raise ApiError(422, "invalid_workload", f"workload: field '{field}': {t.isoformat()} is outside "
                                                    "the supported years 1970 to 2999")
    return workload


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def _unsafe(path: str) -> bool:
    return path.startswith("/") or "\\" in path or ".." in path.split("/") or "\x00" in path


def _encode(text: str) -> bytes:
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:          # a lone surrogate outside U+DC80..U+DCFF: keep the line, mark the byte
        return text.encode("utf-8", "replace")


def from_json(body: bytes, settings: ServiceSettings, deadline: float | None = None) -> Bundle:
    try:
        raw = load_json(body, "the body")          # nesting and integer digits bounded, naming the field
    except JsonLimitError as exc:
        raise ApiError(422, "invalid_request", str(exc)) from None
    except BundleError as exc:
        raise ApiError(400, "invalid_json", str(exc)) from None
    if isinstance(raw, dict) and isinstance(raw.get("files"), dict):
        check_file_count(len(raw["files"]), settings)   # before validating a huge map
    try:
        env = _Envelope.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(body)"
        raise ApiError(422, "invalid_request", f"{where}: {first['msg']}") from None
    for path in env.files:
        if _unsafe(path):
            raise ApiError(422, "invalid_bundle", f"files.{path}: unsafe path (absolute, '..' or backslash)")
    try:
        workload = check_workload_times(parse_workload(env.workload, origin="workload"))
    except BundleError as exc:
        raise ApiError(422, "invalid_workload", str(exc)) from None
    try:
        bundle = bundle_from_files(workload, {p: _encode(t) for p, t in env.files.items()})
    except BundleError as exc:
        raise ApiError(422, "invalid_bundle", str(exc)) from None
    check_lines(bundle, settings, deadline)
    return bundle


def from_archive(body: bytes, kind: str, settings: ServiceSettings, deadline: float | None = None) -> Bundle:
    cap = settings.max_archive_bytes
    try:
        # One uncompressed cap for any member and for all of them together.
        bundle = open_archive(body, kind, origin="request body", max_member=cap, max_total=cap,
                              max_members=settings.max_files, deadline=deadline)
    except BundleError as exc:
        raise classify_archive_error(exc) from None
    check_workload_times(bundle.workload)
    check_lines(bundle, settings, deadline)
    return bundle


def check_media_type(content_type: str | None) -> str:
    """The body's media type, or 415 before any of the body is read."""
    mt = media_type(content_type)
    if mt != JSON and mt != MULTIPART and mt not in ARCHIVE_TYPES and mt not in LOG_TYPES:
        raise ApiError(415, "unsupported_media_type",
                       f"Content-Type {mt or '(none)'!r} is not one of application/json, application/gzip "
                       "(a .tar.gz bundle), application/zip, text/plain or application/octet-stream "
                       "(one log file), multipart/form-data (a file upload)")
    return mt


def bundle_from_body(body: bytes, content_type: str | None, settings: ServiceSettings,
                     deadline: float | None = None) -> Bundle:
    mt = check_media_type(content_type)
    if mt == JSON:
        return from_json(body, settings, deadline)
    if mt not in ARCHIVE_TYPES:
        raise ValueError(f"{mt} is one log file, not a bundle: use evidence_from_log")
    return from_archive(body, ARCHIVE_TYPES[mt], settings, deadline)


@dataclass
class Evidence:
    bundle: Bundle
    intake: Intake | None = None        # set for a bare log file: what was inferred to build the bundle
    tmp: tempfile.TemporaryDirectory | None = None      # holds the uploaded file until the analysis is done

    def close(self) -> None:
        if self.tmp is not None:
            self.tmp.cleanup()


def file_name(given: str | None) -> str:
    """The base name a client gave its file (the workload id is its stem, as for `analyze FILE`):
    no folder of the client's reaches the server's disk. Longer than MAX_NAME_BYTES characters is
    refused (422); a name of fewer characters but more UTF-8 bytes than a file system takes is
    shortened, its extension kept; a NUL (no file system takes one) becomes ``_``."""
    name = PurePosixPath((given or "").replace("\\", "/")).name.replace("\x00", "_")
    if len(name) > MAX_NAME_BYTES:
        raise ApiError(422, "invalid_upload", f"the file name is longer than {MAX_NAME_BYTES} characters")
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) > MAX_NAME_BYTES:
        suffix = PurePosixPath(name).suffix
        suffix = suffix if len(suffix.encode("utf-8", "surrogateescape")) <= 32 else ""
        room = MAX_NAME_BYTES - len(suffix.encode("utf-8", "surrogateescape"))
        stem = raw[:len(raw) - len(suffix.encode("utf-8", "surrogateescape"))][:room]
        name = stem.decode("utf-8", "ignore") + suffix
    return name if name not in ("", ".", "..") else DEFAULT_NAME


def upload_part(body: bytes, content_type: str) -> tuple[str, bytes]:
    """The uploaded file of a multipart/form-data body: (its base name, its bytes)."""
    head = b"Content-Type: " + content_type.encode("latin-1", "replace") + b"\r\n\r\n"
    msg = BytesParser(policy=HTTP).parsebytes(head + body)
    if not msg.is_multipart():
        raise ApiError(422, "invalid_upload", "the form body is not multipart/form-data with a boundary")
    for part in msg.iter_parts():
        if part.get_filename() is not None:
            data = part.get_payload(decode=True) or b""
            name = file_name(part.get_filename())
            if not data:
                raise ApiError(422, "invalid_upload", f"the uploaded file {name!r} is empty")
            return name, data
    raise ApiError(422, "invalid_upload", "the form holds no file: choose a bundle or a log file")


def evidence_from_upload(body: bytes, content_type: str, settings: ServiceSettings,
                         deadline: float | None = None) -> Evidence:
    """A file from the upload form (see ``evidence_from_file``)."""
    name, data = upload_part(body, content_type)
    return evidence_from_file(name, data, settings, deadline)


def evidence_from_log(body: bytes, name: str | None, settings: ServiceSettings,
                      deadline: float | None = None) -> Evidence:
    """A text/plain or application/octet-stream body: one file named ``name`` (see ``evidence_from_file``)."""
    if not body:
        raise ApiError(422, "invalid_upload", "the body is empty: post the text of a log file")
    return evidence_from_file(file_name(name), body, settings, deadline)


def evidence_from_file(name: str, data: bytes, settings: ServiceSettings,
                       deadline: float | None = None) -> Evidence:
    """One file: a bundle archive, the JSON form, or one log file as `firstfault analyze FILE`
    reads it (kind sniffed, nodes and window inferred); a gzipped log by its name
    (``nvidia-bug-report.log.gz``) as it expands, any other gzip as a bundle archive."""
    if data[:2] == b"\x1f\x8b" and not compressed_log(name):
        return Evidence(from_archive(data, "tar", settings, deadline))
    if data[:4] == b"PK\x03\x04":
        return Evidence(from_archive(data, "zip", settings, deadline))
    if name.endswith(".json") and data.lstrip()[:1] == b"{":
        return Evidence(from_json(data, settings, deadline))
    tmp = tempfile.TemporaryDirectory(prefix="ff-upload-")
    try:
        path = Path(tmp.name) / name
        path.write_bytes(data)
        intake = open_input(path, max_archive_bytes=settings.max_archive_bytes)
        check_workload_times(intake.bundle.workload)
        check_lines(intake.bundle, settings, deadline)
    except BundleError as exc:
        tmp.cleanup()
        raise classify_archive_error(exc) from None     # a gzipped log past the cap: 413, else 422
    except BaseException:
        tmp.cleanup()
        raise
    return Evidence(intake.bundle, intake, tmp)
