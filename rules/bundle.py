"""Open an evidence bundle: a directory, a ``.tar.gz`` or a ``.zip`` (contract section 1).

Files are read lazily in chunks, so a bundle of a million lines never sits in
memory whole. Archives are checked member by member: no absolute paths, no
``..``, no links, and size caps against decompression bombs. Members expand in
pieces: small ones stay in memory, the rest go to a private temporary folder
that lives as long as the Bundle, so a bomb costs disk up to the cap, not memory.
"""
from __future__ import annotations

import io
import itertools
import lzma
import os
import re
import shutil
import stat
import time
import weakref
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import IO, Any

from pydantic import ValidationError

from firstfault.schemas import WorkloadRecord

from .errors import AnalysisTimeout, BundleError
from .jsonsafe import load_json

CHUNK = 8 * 1024 * 1024
GZIP_MAGIC = b"\x1f\x8b"
GZIP_WBITS = 16 + zlib.MAX_WBITS          # a gzip header and trailer around the deflate stream
MAX_ARCHIVE_BYTES = 1024 ** 3            # uncompressed, any member and all together (the service's default)
MAX_MEMBER_BYTES = MAX_ARCHIVE_BYTES
MAX_MEMBERS = 100_000
MAX_WORKLOAD_BYTES = 64 * 1024 * 1024    # workload.json is read whole: a big one is not a record
MAX_DEPTH = 64                           # folder levels below the bundle root
ARCHIVE_BYTES_ENV = "FIRSTFAULT_MAX_ARCHIVE_BYTES"
_PIECE = 1024 * 1024                     # archive members expand this much at a time
_IN_MEMORY = 32 * 1024 * 1024            # members kept in memory, all together; the rest are spooled


class ArchiveLimitError(BundleError):
    """An archive passes a cap: ``limit`` is "bytes" or "members", ``cap`` its value."""

    def __init__(self, message: str, limit: str, cap: int) -> None:
        super().__init__(message)
        self.limit, self.cap = limit, cap


def archive_cap_from_env(environ: Mapping[str, str] | None = None) -> int:
    """FIRSTFAULT_MAX_ARCHIVE_BYTES (bytes; K/M/G/T suffixes are powers of 1024), else the default."""
    raw = (os.environ if environ is None else environ).get(ARCHIVE_BYTES_ENV, "").strip()
    if not raw:
        return MAX_ARCHIVE_BYTES
    try:
        return parse_size(raw)
    except ValueError as exc:
        raise BundleError(f"{ARCHIVE_BYTES_ENV}: {exc}") from None


def parse_size(text: str) -> int:
    """'1073741824', '512M', '4G', '1.5GiB' -> bytes (positive)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = 1
    if t[-1:] in "KMGT" and t[-1:]:
        scale = 1024 ** ("KMGT".index(t[-1]) + 1)
        t = t[:-1]
    try:
        value = int(float(t) * scale) if "." in t else int(t) * scale
    except (ValueError, OverflowError):
        raise ValueError(f"{text!r} is not a size in bytes (e.g. 1073741824, 512M, 4G)") from None
    if value <= 0:
        raise ValueError(f"{text!r} must be positive")
    return value


@dataclass(frozen=True)
class BundleFile:
    """One evidence file of a bundle: its path, size and a reader of its bytes in chunks."""

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
    """One workload attempt's evidence: the scheduler record and the files."""

    workload: WorkloadRecord
    files: list[BundleFile]                     # sorted by path

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def parse_workload(data: bytes | str | Mapping, origin: str = "workload.json") -> WorkloadRecord:
    """Validate the scheduler record; the error names the field."""
    raw = load_json(data, origin) if isinstance(data, (bytes, str)) else dict(data)
    if not isinstance(raw, dict):
        raise BundleError(f"{origin} must hold a JSON object")
    try:
        return WorkloadRecord.model_validate(raw)
    except RecursionError:          # a mapping handed in directly, nested past the stack
        raise BundleError(f"{origin}: nested too deeply") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(root)"
        raise BundleError(f"{origin}: field '{where}': {first['msg']}") from None


@lru_cache(maxsize=8192)
def source_of(path: str) -> str | None:
    """A bundle path's source by its folder (logs/app/... -> app); None outside the layout."""
    parts = PurePosixPath(path).parts
    if len(parts) >= 2 and parts[0] == "logs":
        return {"app": "app", "syslog": "syslog", "fabricmanager": "fabricmanager",
                "scheduler": "scheduler"}.get(parts[1])
    if len(parts) >= 1 and parts[0] == "metrics":
        return "metrics"
    return None


# Hidden files are not read (.git, .DS_Store, an editor's swap file), except logs a tool writes under a
# dot name: Nextflow's task logs (.command.log, .command.err, .command.out) and its run log
# (.nextflow.log). A hidden folder is never read.
_HIDDEN_LOG_SUFFIXES = (".log", ".err", ".out")


def hidden_log(name: str) -> bool:
    """A dot-named file that is read anyway: a log by its suffix."""
    return name.startswith(".") and len(name) > 1 and name.lower().endswith(_HIDDEN_LOG_SUFFIXES)


def is_hidden(parts: tuple[str, ...] | list[str]) -> bool:
    """Does a path (its parts) lie in a hidden folder, or name a hidden file that is not a log?"""
    if not parts:
        return False
    *folders, name = parts
    return any(p.startswith(".") for p in folders) or (name.startswith(".") and not hidden_log(name))


def _is_evidence(rel: str) -> bool:
    parts = PurePosixPath(rel).parts
    if len(parts) < 2 or is_hidden(parts):
        return False
    if parts[0] == "logs" and len(parts) >= 3 and parts[1] in ("app", "syslog", "fabricmanager", "scheduler"):
        return True
    return parts[0] == "metrics" and rel.endswith(".jsonl")


def _file_chunks(path: Path, piece: int = CHUNK) -> Callable[[], Iterator[bytes]]:
    def gen() -> Iterator[bytes]:
        with path.open("rb") as fh:
            # read(n) allocates n bytes before it reads: asking a 100 KiB file for 8 MiB maps and
            # unmaps 8 MiB each time (2.4x the read's cost over a thousand rank logs). Ask for what
            # the file holds, one byte more to see its end, and at least 64 KiB if it grows.
            left = os.fstat(fh.fileno()).st_size
            while chunk := fh.read(min(piece, max(left + 1, 65536))):
                left -= len(chunk)
                yield chunk
    return gen


def compressed_log(name: str) -> bool:
    """A log kept gzipped (logrotate's ``syslog.2.gz``, ``nvidia-bug-report.log.gz``), not an archive."""
    low = name.lower()
    return low.endswith(".gz") and not low.endswith((".tar.gz", ".tgz"))


def log_name(path: str) -> str:
    """The name a log goes by, a gzipped one's without its ".gz": what its host and rank are read from."""
    return path[:-3] if compressed_log(path) else path


def gunzipped(opener: Callable[[], Iterator[bytes]], origin: str, cap: int,
              piece: int = CHUNK) -> Callable[[], Iterator[bytes]]:
    """``opener``'s bytes as the gzip file they hold expands, in pieces of at most ``piece``; every member
    of a multi-member file in turn. Bytes that do not start as gzip are given as they are (a file
    named .gz that is not). Past ``cap`` expanded bytes the read stops with ArchiveLimitError; a
    damaged or cut stream is read up to the damage, as a log cut short is read up to its end."""
    def gen() -> Iterator[bytes]:
        pieces = iter(opener())
        head = b""
        for first in pieces:
            head += first
            if len(head) >= len(GZIP_MAGIC):
                break
        if not head.startswith(GZIP_MAGIC):
            if head:
                yield head
            yield from pieces
            return
        expanded = 0
        inflate: Any = None                 # None between members
        between = b""                       # read after a member ended, until the next one's magic shows
        for chunk in itertools.chain((head,), pieces):
            data = chunk
            if inflate is None:
                between += data
                if len(between) < len(GZIP_MAGIC):
                    continue
                if not between.startswith(GZIP_MAGIC):
                    return                  # padding after the last member
                data, between, inflate = between, b"", zlib.decompressobj(GZIP_WBITS)
            while True:
                try:
                    out = inflate.decompress(data, piece)
                except zlib.error:
                    return                  # damaged: what came before stands
                if out:
                    expanded += len(out)
                    if expanded > cap:
                        raise ArchiveLimitError(f"{origin}: expands beyond the size limit of {cap} bytes",
                                                "bytes", cap)
                    yield out
                if inflate.eof:             # this member ends; another may follow in what is left
                    data, inflate = inflate.unused_data, None
                    if len(data) < len(GZIP_MAGIC):
                        between = data
                        break
                    if not data.startswith(GZIP_MAGIC):
                        return
                    inflate = zlib.decompressobj(GZIP_WBITS)
                    continue
                data = inflate.unconsumed_tail
                if not data and len(out) < piece:
                    break                   # all in, and nothing held back by the piece size
    return gen


def gzip_size(where: Path | bytes) -> int:
    """A gzip file's expanded size as its trailer states it (the last member's, modulo 4 GiB): what
    progress counts on; never less than the file itself."""
    try:
        if isinstance(where, Path):
            size = where.stat().st_size
            with where.open("rb") as fh:
                magic = fh.read(2)
                fh.seek(max(0, size - 4))
                trailer = fh.read(4)
        else:
            size, magic, trailer = len(where), where[:2], where[-4:]
    except OSError:
        return 0
    if magic != GZIP_MAGIC or size < 18:
        return size
    return max(size, int.from_bytes(trailer, "little"))


def _log_file(rel: str, size: int, opener: Callable[[], Iterator[bytes]], cap: int,
              where: Path | bytes) -> BundleFile:
    """A bundle's log file; a gzipped one is read as it expands (``cap``: its expanded bytes)."""
    if not compressed_log(rel):
        return BundleFile(path=rel, size=size, open_chunks=opener)
    return BundleFile(path=rel, size=gzip_size(where), open_chunks=gunzipped(opener, rel, cap))


def _bytes_chunks(data: bytes) -> Callable[[], Iterator[bytes]]:
    def gen() -> Iterator[bytes]:
        for i in range(0, len(data), CHUNK):
            yield data[i:i + CHUNK]
    return gen


def open_bundle(path: str | Path, max_bytes: int | None = None) -> Bundle:
    """A bundle directory or archive; ``max_bytes`` caps an archive's expansion, and a gzipped
    log's (default: the env)."""
    p = Path(path)
    if not p.exists():
        raise BundleError(f"no such bundle: {p}")
    cap = archive_cap_from_env() if max_bytes is None else max_bytes
    if p.is_dir():
        return _open_dir(p, cap)
    kind = archive_kind(p)
    if kind is None:
        raise BundleError(f"{p} is neither a directory nor a .tar.gz/.zip bundle")
    return open_archive(p, kind, str(p), max_member=cap, max_total=cap)


def archive_kind(p: Path) -> str | None:
    name = p.name.lower()
    if name.endswith((".tar.gz", ".tgz", ".tar")):
        return "tar"
    return "zip" if name.endswith(".zip") else None


def read_workload_bytes(path: Path) -> bytes:
    """workload.json's bytes: a regular file of its bundle (a link may point within the bundle, not
    out of it), refused before reading when it is implausibly big."""
    try:
        if path.is_symlink():
            root, target = path.parent.resolve(strict=True), path.resolve(strict=True)
            if not target.is_relative_to(root):
                raise BundleError(f"{path}: a link to {target}, outside the bundle: copy the record into the bundle")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))   # a FIFO must not block
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise BundleError(f"{path}: not a regular file")
            if st.st_size > MAX_WORKLOAD_BYTES:
                raise BundleError(f"{path}: {st.st_size} bytes, more than a workload record can be "
                                  f"({MAX_WORKLOAD_BYTES} bytes)")
            data = f.read(MAX_WORKLOAD_BYTES + 1)
        if len(data) > MAX_WORKLOAD_BYTES:
            raise BundleError(f"{path}: more than a workload record can be ({MAX_WORKLOAD_BYTES} bytes)")
        return data
    except OSError as exc:
        raise BundleError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except RuntimeError:                    # a loop of links
        raise BundleError(f"{path}: a loop of links") from None


def read_workload(path: Path) -> WorkloadRecord:
    """workload.json from disk (see ``read_workload_bytes``)."""
    return parse_workload(read_workload_bytes(path))


def walk_files(root: Path, limit: int | None = None) -> list[Path]:
    """Regular files under ``root`` (no links, nothing hidden but ``hidden_log`` files), sorted as
    ``sorted(rglob)`` sorts.

    Iterative, unlike rglob in Python 3.11 (a 1,000-deep tree raised RecursionError);
    deeper than MAX_DEPTH or more than ``limit`` files is a BundleError naming the place.
    """
    out: list[Path] = []
    stack: list[tuple[Path, int]] = [(root, 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError as exc:
            raise BundleError(f"{folder}: cannot read the folder: {exc.strerror or exc}") from None
        for e in entries:
            if e.name.startswith(".") and not hidden_log(e.name):
                continue
            try:
                mode = e.stat(follow_symlinks=False).st_mode
            except OSError as exc:
                raise BundleError(f"{e.path}: cannot read: {exc.strerror or exc}") from None
            if stat.S_ISDIR(mode):
                if depth + 1 >= MAX_DEPTH:
                    rel = Path(e.path).relative_to(root).as_posix()
                    raise BundleError(f"{root}: folders nested deeper than {MAX_DEPTH} levels "
                                      f"({rel[:120]}{'…' if len(rel) > 120 else ''})")
                stack.append((Path(e.path), depth + 1))
            elif stat.S_ISREG(mode):
                out.append(Path(e.path))
                if limit is not None and len(out) > limit:
                    raise BundleError(f"{root}: more than {limit} files")
    return sorted(out)


def _open_dir(root: Path, cap: int = MAX_MEMBER_BYTES) -> Bundle:
    wl = root / "workload.json"
    if not wl.is_file():
        raise BundleError(f"{root}: workload.json is missing")
    workload = read_workload(wl)
    files = []
    for f in walk_files(root):
        rel = f.relative_to(root).as_posix()
        if _is_evidence(rel):
            files.append(_log_file(rel, f.stat().st_size, _file_chunks(f), cap, f))
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


_TRIED = re.compile(r"^- method (\w+): \w+\((['\"])(.*)\2\)$")
_COMPRESSION = {"gz": "gz", "tgz": "gz", "bz2": "bz2", "tbz2": "bz2", "xz": "xz", "txz": "xz"}


def _why_unreadable(exc: BaseException, origin: str) -> str:
    """An archive library's reason in one line. tarfile, trying each compression, lists one reason
    per method on lines of their own: the one the file's name says is the one that matters."""
    text = str(exc)
    tried = {m.group(1): m.group(3) for m in map(_TRIED.match, (ln.strip() for ln in text.splitlines())) if m}
    if tried:
        return tried.get(_COMPRESSION.get(origin.lower().rsplit(".", 1)[-1], "tar")) or next(iter(tried.values()))
    return " ".join(text.split()) or type(exc).__name__


def _safe_name(name: str) -> str:
    if name.startswith("/") or "\\" in name or any(part == ".." for part in name.split("/")):
        raise BundleError(f"archive member {name!r} has an unsafe path")
    return name.lstrip("./") if name.startswith("./") else name


def _wanted(name: str) -> bool:
    """Could this member be evidence or the record, with the layout at the root or under one folder?"""
    under = name.split("/", 1)[1] if "/" in name else ""
    return name == "workload.json" or under == "workload.json" or _is_evidence(name) or _is_evidence(under)


class _Spool:
    """Archive members as they expand, in pieces, against the caps; small ones kept in memory."""

    def __init__(self, origin: str, max_member: int, max_total: int, deadline: float | None) -> None:
        self.origin, self.max_member, self.max_total, self.deadline = origin, max_member, max_total, deadline
        self.total = 0                  # uncompressed bytes of every member, read or declared
        self.in_memory = 0
        self.members: dict[str, tuple[int, bytes | Path]] = {}
        self.dir: str | None = None

    def too_big(self, what: str) -> ArchiveLimitError:
        cap = min(self.max_member, self.max_total)
        return ArchiveLimitError(f"{self.origin}: {what} expands beyond the size limit of {cap} bytes",
                                 "bytes", cap)

    def declare(self, name: str, size: int) -> None:
        """A member's stated size, checked before any of it is read."""
        if size > self.max_member:
            raise self.too_big(f"archive member {name!r}")
        if self.total + size > self.max_total:
            raise self.too_big("the archive")

    def skip(self, size: int) -> None:
        self.total += size

    def add(self, name: str, fh: IO[bytes]) -> None:
        parts: list[bytes] = []
        size = 0
        out: IO[bytes] | None = None
        path: Path | None = None
        try:
            while piece := fh.read(_PIECE):
                size += len(piece)
                self.total += len(piece)
                if size > self.max_member:           # a zip member may lie about its size
                    raise self.too_big(f"archive member {name!r}")
                if self.total > self.max_total:
                    raise self.too_big("the archive")
                if self.deadline is not None and time.monotonic() > self.deadline:
                    raise AnalysisTimeout("the analysis passed its deadline while expanding the archive")
                if out is None and self.in_memory + size <= _IN_MEMORY and size <= CHUNK:
                    parts.append(piece)
                    continue
                if out is None:
                    path = self._file(len(self.members))
                    out = path.open("wb")
                    out.writelines(parts)
                    parts = []
                out.write(piece)
        finally:
            if out is not None:
                out.close()
        if path is not None:
            self.members[name] = (size, path)
        else:
            self.in_memory += size
            self.members[name] = (size, b"".join(parts))

    def _file(self, n: int) -> Path:
        if self.dir is None:
            import tempfile

            self.dir = tempfile.mkdtemp(prefix="firstfault-bundle-")
        return Path(self.dir) / f"{n}.part"

    def close(self) -> None:
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    def read(self, name: str) -> bytes:
        size, where = self.members[name]
        if size > MAX_WORKLOAD_BYTES:
            raise BundleError(f"{self.origin}: {name} is {size} bytes, more than a workload record can be "
                              f"({MAX_WORKLOAD_BYTES} bytes)")
        return where.read_bytes() if isinstance(where, Path) else where


def open_archive(data: bytes | str | Path, kind: str, origin: str = "archive",
                 max_member: int = MAX_MEMBER_BYTES, max_total: int = MAX_ARCHIVE_BYTES,
                 max_members: int = MAX_MEMBERS, deadline: float | None = None) -> Bundle:
    """Read a bundle archive, held in memory or at a path (the CLI and the REST service share this).

    Only members that can be evidence are kept; every member counts against the caps.
    ``deadline`` (``time.monotonic()``) stops a long expansion with AnalysisTimeout.
    """
    spool = _Spool(origin, max_member, max_total, deadline)
    try:
        names = _expand(data, kind, origin, max_members, spool)
        top = _strip_top(sorted(names))
        if f"{top}workload.json" not in spool.members:
            raise BundleError(f"{origin}: workload.json is missing")
        workload = parse_workload(spool.read(f"{top}workload.json"))
        files = {}
        for name, (size, where) in spool.members.items():
            if not name.startswith(top):
                continue
            rel = _safe_name(name[len(top):])
            if _is_evidence(rel):
                opener = _file_chunks(where) if isinstance(where, Path) else _bytes_chunks(where)
                files[rel] = _log_file(rel, size, opener, max_member, where)
    except BaseException:
        spool.close()
        raise
    bundle = Bundle(workload=workload, files=[files[k] for k in sorted(files)])
    if spool.dir is not None:
        weakref.finalize(bundle, shutil.rmtree, spool.dir, True)    # the files live as long as the bundle
    return bundle


def extract_archive(data: bytes | str | Path, kind: str, origin: str, dest: Path,
                    max_member: int = MAX_MEMBER_BYTES, max_total: int = MAX_ARCHIVE_BYTES,
                    max_members: int = MAX_MEMBERS) -> None:
    """Every regular member of an archive of logs in any layout (hidden ones but logs left out) into
    ``dest``, under the same checks and caps as ``open_archive`` (safe names, no links, sizes, count):
    a user's logs.tar.gz is read as the folder it was made from."""
    spool = _Spool(origin, max_member, max_total, None)
    try:
        # macOS's zip adds __MACOSX/ (resource forks of every file): not logs
        _expand(data, kind, origin, max_members, spool,
                wanted=lambda name: not is_hidden(PurePosixPath(name).parts) and not name.startswith("__MACOSX/"))
        for name, (_, where) in sorted(spool.members.items()):
            out = dest / name
            try:
                out.parent.mkdir(parents=True, exist_ok=True)
                if isinstance(where, Path):
                    shutil.move(str(where), out)
                else:
                    out.write_bytes(where)
            except OSError as exc:           # a member named both as a file and as a folder
                raise BundleError(f"{origin}: archive member {name!r} cannot be written out: "
                                  f"{exc.strerror or exc}") from None
    finally:
        spool.close()


def _source(data: bytes | str | Path) -> IO[bytes] | str | Path:
    return io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview)) else data


def _once(name: str, seen: set[str], origin: str, wanted: Callable[[str], bool]) -> None:
    """A record or evidence member named twice (``./workload.json`` is ``workload.json``) is an error:
    which one the archive means is not ours to guess (a zip reader would take the last)."""
    if name in seen and wanted(name):
        raise BundleError(f"{origin}: archive member {name!r} appears twice: keep one")
    seen.add(name)


def _expand(data: bytes | str | Path, kind: str, origin: str, max_members: int, spool: _Spool,
            wanted: Callable[[str], bool] = _wanted) -> list[str]:
    """Check every member and spool the ``wanted`` ones; returns the names of the regular files."""
    import tarfile          # only for an archive: not at start-up

    names: list[str] = []
    seen: set[str] = set()
    try:
        if kind == "zip":
            with zipfile.ZipFile(_source(data)) as zf:
                infos = zf.infolist()
                if len(infos) > max_members:
                    raise ArchiveLimitError(f"{origin}: more than {max_members} archive members",
                                            "members", max_members)
                for info in infos:
                    if info.is_dir():
                        continue
                    name = _safe_name(info.filename)
                    if (info.external_attr >> 16) & 0o170000 == 0o120000:
                        raise BundleError(f"archive member {name!r} is a link")
                    spool.declare(name, info.file_size)
                    _once(name, seen, origin, wanted)
                    names.append(name)
                    if not wanted(name):
                        spool.skip(info.file_size)
                        continue
                    with zf.open(info) as fh:
                        spool.add(name, fh)
        else:
            src = _source(data)
            opened = (tarfile.open(fileobj=src, mode="r:*") if not isinstance(src, (str, Path))
                      else tarfile.open(src, mode="r:*"))
            with opened as tf:
                count = 0
                for info in tf:
                    count += 1
                    if count > max_members:
                        raise ArchiveLimitError(f"{origin}: more than {max_members} archive members",
                                                "members", max_members)
                    if info.isdir():
                        continue
                    name = _safe_name(info.name)
                    if info.issym() or info.islnk() or not info.isfile():
                        raise BundleError(f"archive member {name!r} is a link or a special file")
                    spool.declare(name, info.size)
                    _once(name, seen, origin, wanted)
                    names.append(name)
                    if not wanted(name):
                        spool.skip(info.size)         # tarfile seeks past it (decompressing, not keeping)
                        continue
                    fh = tf.extractfile(info)
                    if fh is not None:
                        spool.add(name, fh)
    except (tarfile.TarError, zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, zlib.error,
            lzma.LZMAError, NotImplementedError, RuntimeError, ValueError, OverflowError) as exc:
        # Damaged or exotic archives fail in many ways (an encrypted zip: RuntimeError).
        if isinstance(exc, BundleError):
            raise
        raise BundleError(f"{origin}: not a readable {kind} archive ({_why_unreadable(exc, origin)})") from None
    return names


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
