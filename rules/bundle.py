"""Open an evidence bundle: a directory, a ``.tar.gz`` or a ``.zip`` (contract section 1).

Files are read lazily in chunks, so a bundle of a million lines never sits in
memory whole. Archives are checked member by member: no absolute paths, no
``..``, no links, and size caps against decompression bombs.
"""
from __future__ import annotations

import io
import json
import tarfile
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pydantic import ValidationError

from firstfault.schemas import WorkloadRecord

from .errors import BundleError

CHUNK = 8 * 1024 * 1024
MAX_MEMBER_BYTES = 4 * 1024 ** 3         # one archive member, uncompressed
MAX_ARCHIVE_BYTES = 16 * 1024 ** 3       # all members, uncompressed
MAX_MEMBERS = 100_000


@dataclass(frozen=True)
class BundleFile:
    path: str                                   # bundle-relative, posix
    size: int
    open_chunks: Callable[[], Iterator[bytes]]
    source: str | None = None                   # sniffed source when the path does not say it

    @property
    def kind(self) -> str | None:
        """The file's source: from its bundle path, else as sniffed from its content."""
        return source_of(self.path) or self.source


@dataclass
class Bundle:
    workload: WorkloadRecord
    files: list[BundleFile]                     # sorted by path

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def parse_workload(data: bytes | str | Mapping, origin: str = "workload.json") -> WorkloadRecord:
    """Validate the scheduler record; the error names the field."""
    try:
        raw = json.loads(data) if isinstance(data, (bytes, str)) else dict(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{origin} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise BundleError(f"{origin} must hold a JSON object")
    try:
        return WorkloadRecord.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(root)"
        raise BundleError(f"{origin}: field '{where}': {first['msg']}") from None


def source_of(path: str) -> str | None:
    parts = PurePosixPath(path).parts
    if len(parts) >= 2 and parts[0] == "logs":
        return {"app": "app", "syslog": "syslog", "fabricmanager": "fabricmanager",
                "scheduler": "scheduler"}.get(parts[1])
    if len(parts) >= 1 and parts[0] == "metrics":
        return "metrics"
    return None


def _is_evidence(rel: str) -> bool:
    parts = PurePosixPath(rel).parts
    if len(parts) < 2 or any(p.startswith(".") for p in parts):
        return False
    if parts[0] == "logs" and len(parts) >= 3 and parts[1] in ("app", "syslog", "fabricmanager", "scheduler"):
        return True
    return parts[0] == "metrics" and rel.endswith(".jsonl")


def _file_chunks(path: Path) -> Callable[[], Iterator[bytes]]:
    def gen() -> Iterator[bytes]:
        with path.open("rb") as fh:
            while chunk := fh.read(CHUNK):
                yield chunk
    return gen


def _bytes_chunks(data: bytes) -> Callable[[], Iterator[bytes]]:
    def gen() -> Iterator[bytes]:
        for i in range(0, len(data), CHUNK):
            yield data[i:i + CHUNK]
    return gen


def open_bundle(path: str | Path) -> Bundle:
    p = Path(path)
    if not p.exists():
        raise BundleError(f"no such bundle: {p}")
    if p.is_dir():
        return _open_dir(p)
    name = p.name.lower()
    if name.endswith((".tar.gz", ".tgz", ".tar")):
        return open_archive(p.read_bytes(), "tar", str(p))
    if name.endswith(".zip"):
        return open_archive(p.read_bytes(), "zip", str(p))
    raise BundleError(f"{p} is neither a directory nor a .tar.gz/.zip bundle")


def _open_dir(root: Path) -> Bundle:
    wl = root / "workload.json"
    if not wl.is_file():
        raise BundleError(f"{root}: workload.json is missing")
    workload = parse_workload(wl.read_bytes())
    files = []
    for f in sorted(root.rglob("*")):
        if not f.is_file() or f.is_symlink():
            continue
        rel = f.relative_to(root).as_posix()
        if _is_evidence(rel):
            files.append(BundleFile(path=rel, size=f.stat().st_size, open_chunks=_file_chunks(f)))
    return Bundle(workload=workload, files=files)


def _strip_top(names: list[str]) -> str:
    """An archive holds the layout at its root or under one top folder."""
    if "workload.json" in names:
        return ""
    tops = {n.split("/", 1)[0] for n in names if "/" in n}
    for top in sorted(tops):
        if f"{top}/workload.json" in names:
            return top + "/"
    return ""


def _safe_name(name: str) -> str:
    if name.startswith("/") or "\\" in name or any(part == ".." for part in name.split("/")):
        raise BundleError(f"archive member {name!r} has an unsafe path")
    return name.lstrip("./") if name.startswith("./") else name


def open_archive(data: bytes, kind: str, origin: str = "archive",
                 max_member: int = MAX_MEMBER_BYTES, max_total: int = MAX_ARCHIVE_BYTES,
                 max_members: int = MAX_MEMBERS) -> Bundle:
    """Read a bundle archive held in memory (the CLI and the REST service share this)."""
    members: dict[str, bytes] = {}
    total = 0
    try:
        if kind == "zip":
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                infos = zf.infolist()
                if len(infos) > max_members:
                    raise BundleError(f"{origin}: more than {max_members} archive members")
                for info in infos:
                    if info.is_dir():
                        continue
                    name = _safe_name(info.filename)
                    if (info.external_attr >> 16) & 0o170000 == 0o120000:
                        raise BundleError(f"archive member {name!r} is a link")
                    if info.file_size > max_member or total + info.file_size > max_total:
                        raise BundleError(f"{origin}: archive expands beyond the size limit")
                    with zf.open(info) as fh:
                        blob = fh.read(max_member + 1)
                    if len(blob) > max_member:
                        raise BundleError(f"{origin}: archive member {name!r} exceeds the size limit")
                    total += len(blob)
                    members[name] = blob
        else:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf:
                count = 0
                for info in tf:
                    count += 1
                    if count > max_members:
                        raise BundleError(f"{origin}: more than {max_members} archive members")
                    if info.isdir():
                        continue
                    name = _safe_name(info.name)
                    if info.issym() or info.islnk() or not info.isfile():
                        raise BundleError(f"archive member {name!r} is a link or a special file")
                    if info.size > max_member or total + info.size > max_total:
                        raise BundleError(f"{origin}: archive expands beyond the size limit")
                    fh = tf.extractfile(info)
                    blob = fh.read() if fh else b""
                    total += len(blob)
                    members[name] = blob
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
        raise BundleError(f"{origin}: not a readable {kind} archive ({exc})") from None
    top = _strip_top(sorted(members))
    if f"{top}workload.json" not in members:
        raise BundleError(f"{origin}: workload.json is missing")
    workload = parse_workload(members[f"{top}workload.json"])
    return bundle_from_files(workload, {n[len(top):]: b for n, b in members.items() if n.startswith(top)})


def bundle_from_files(workload: WorkloadRecord, files: Mapping[str, bytes | str]) -> Bundle:
    """A bundle from in-memory file contents keyed by bundle-relative path."""
    out = []
    for rel in sorted(files):
        clean = _safe_name(rel)
        if not _is_evidence(clean):
            continue
        blob = files[rel]
        data = blob.encode("utf-8") if isinstance(blob, str) else bytes(blob)
        out.append(BundleFile(path=clean, size=len(data), open_chunks=_bytes_chunks(data)))
    return Bundle(workload=workload, files=out)
