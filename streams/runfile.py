"""The run file: where a running ``firstfault up`` is, so other commands find it with nothing set.

``firstfault up`` without FIRSTFAULT_KAFKA_BOOTSTRAP starts its own broker on a new
port each time, so an exported address goes stale. It writes the broker, the store
and its pid to ``$XDG_RUNTIME_DIR/firstfault/up.json`` (else
``${XDG_CACHE_HOME:-~/.cache}/firstfault/up.json``; FIRSTFAULT_RUN_FILE overrides), and
removes it when it stops. ``ship``, ``diagnoses``, ``replay``, ``serve`` and ``topology``
take an explicit flag or variable first, then this file if its pid is alive.

The file steers other commands, so it is believed only when it is what `up` writes: a
regular file (never followed through a symlink), yours, writable by nobody else, at most
64 KiB, naming a live process that started when the one that wrote it did (a pid is
reused; a forged file names any live one). Anything else is ignored, and said so.
"""
from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from firstfault.rules.errors import FirstfaultError

RUN_FILE_VARIABLE = "FIRSTFAULT_RUN_FILE"
MEMORY = "memory"                     # the run file's `redis` when up has no Redis: the in-process store
NO_BROKER = "no broker: set FIRSTFAULT_KAFKA_BOOTSTRAP or start `firstfault up`"
MAX_BYTES = 64 * 1024                 # a run file is a few hundred bytes: more is not one of ours


class NoBroker(FirstfaultError):
    """Nothing was given and no `firstfault up` is running."""


class RunInfo(BaseModel):
    bootstrap: str
    redis: str = MEMORY               # a Redis URL, or "memory"
    prefix: str = "firstfault."
    pid: int
    started_at: str                   # ISO-8601, UTC
    rules_version: str
    log_file: str | None = None
    pid_start: str | None = None      # "<boot id>:<start tick>" of pid (process_start): that process, not a later one
    # The correlator's waits (grace_cap_s, watermark_wait_s, lateness_s), so `diagnoses` says how long a final takes.
    timings: dict[str, float] = Field(default_factory=dict)

    @property
    def redis_url(self) -> str | None:
        return None if self.redis == MEMORY else self.redis


def run_file_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get(RUN_FILE_VARIABLE):
        return Path(env[RUN_FILE_VARIABLE]).expanduser()
    runtime = env.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime):
        return Path(runtime) / "firstfault" / "up.json"
    cache = env.get("XDG_CACHE_HOME", "")
    base = Path(cache) if cache and os.path.isabs(cache) else Path(env.get("HOME") or Path.home()) / ".cache"
    return base / "firstfault" / "up.json"


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def write(info: RunInfo, path: Path) -> None:
    """Atomically: a reader sees the old file, the new one or none, never half of one.

    0600 in a 0700 directory: a Redis URL may carry a password. A writer naming its own pid
    records when it started. A symlink at ``path`` is replaced, its target left alone.
    """
    if info.pid == os.getpid() and info.pid_start is None:
        info = info.model_copy(update={"pid_start": process_start(info.pid)})
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=".up-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(info.model_dump_json(indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Untrusted(Exception):
    """A file at the run file's path that is not one `up` wrote: why, in a few words."""


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, if it can be a run file; else :class:`Untrusted` (FileNotFoundError if none).

    Opened without following a symlink or waiting on a FIFO; checked on the open file, so what is
    read is what was checked; never more than MAX_BYTES + 1 read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Untrusted("a symbolic link, not a file `firstfault up` wrote") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted("not a regular file")
        if st.st_uid != os.geteuid():
            raise Untrusted(f"owned by uid {st.st_uid}, not by you (uid {os.geteuid()})")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise Untrusted(f"writable by others (mode {stat.S_IMODE(st.st_mode):o})")
        if st.st_size > MAX_BYTES:
            raise Untrusted(f"larger than {MAX_BYTES // 1024} KiB ({st.st_size} bytes)")
        chunks, left = [], MAX_BYTES + 1
        while left > 0 and (chunk := os.read(fd, left)):
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:                 # it grew while we read
            raise Untrusted(f"larger than {MAX_BYTES // 1024} KiB")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _load(path: Path) -> RunInfo:
    """What the run file says; FileNotFoundError if there is none, :class:`Untrusted` if it is not ours."""
    data = _read_bytes(path)
    try:
        return RunInfo.model_validate_json(data)
    except (ValueError, ValidationError):
        raise Untrusted("not a firstfault run file") from None


def fresh_log(path: Path) -> int:
    """An append-only descriptor on a new, empty, private file at ``path`` (`up`'s log beside the run file).

    Whatever was there, a symlink planted to make `up` overwrite its target say, is unlinked, never
    followed; O_EXCL|O_NOFOLLOW, so nothing put there meanwhile is written through either."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.unlink(missing_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, 0o600)


def read(path: Path) -> RunInfo | None:
    """The run file's content; None if there is none or it is not one of ours."""
    try:
        return _load(path)
    except (OSError, Untrusted):
        return None


def remove(path: Path, pid: int) -> bool:
    """Remove the run file if it is ``pid``'s (a newer `up` may have replaced it)."""
    info = read(path)
    if info is None or info.pid != pid:
        return False
    path.unlink(missing_ok=True)
    return True


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:           # someone else's process: it exists
        return True
    try:                              # Linux: a zombie is dead for our purpose
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (OSError, IndexError):
        return True


def process_start(pid: int) -> str | None:
    """``"<boot id>:<start time in clock ticks>"`` of a process (Linux /proc); None where it cannot be read.

    Unlike the pid it is not handed on: a later process given the same pid started later, and
    any other process a forged file names started at another time than the one recorded."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return f"{boot}:{int(fields[19])}"          # field 22 of stat; fields[0] is field 3 (state)
    except (OSError, IndexError, ValueError):
        return None


def _not_running(info: RunInfo) -> str | None:
    """Why the `up` that wrote ``info`` is not running; None if it is."""
    if not pid_alive(info.pid):
        return f"`firstfault up` (pid {info.pid}) is not running"
    now = process_start(info.pid)
    if now is None or now == info.pid_start:          # without /proc, liveness is all there is to know
        return None
    if info.pid_start is None:                         # forged, or written by an older firstfault
        return f"it records no start time, so pid {info.pid} cannot be confirmed as the `firstfault up` that wrote it"
    return f"pid {info.pid} is another process, not the `firstfault up` that wrote it"


@dataclass(frozen=True)
class Lookup:
    path: Path
    info: RunInfo | None              # a live `up`, or None
    note: str | None = None           # why a run file there was ignored


def find_running(env: Mapping[str, str] | None = None) -> Lookup:
    return lookup(run_file_path(env))


def lookup(path: Path) -> Lookup:
    """The live `up` that ``path`` announces, or None and why the file there does not count."""
    try:
        info = _load(path)
    except FileNotFoundError:
        return Lookup(path, None)
    except Untrusted as exc:
        return Lookup(path, None, f"ignoring {path}: {exc}")
    except OSError as exc:
        return Lookup(path, None, f"ignoring {path}: {exc.strerror or exc}")
    why = _not_running(info)
    if why is not None:
        return Lookup(path, None, f"ignoring stale run file {path}: {why}")
    return Lookup(path, info)


@dataclass(frozen=True)
class Resolved:
    bootstrap: str
    redis_url: str | None
    prefix: str | None
    run: RunInfo | None = None        # the `up` it came from, or None: given explicitly
    path: Path | None = None          # that `up`'s run file


def resolve(bootstrap: str | None, redis_url: str | None = None, prefix: str | None = None,
            env: Mapping[str, str] | None = None) -> Resolved:
    """Flag, else FIRSTFAULT_ variable, else a live run file; else :class:`NoBroker`.

    Only a bootstrap taken from the run file brings that `up`'s Redis and topic prefix
    along (each unless given explicitly): with an explicit broker the run file is not read.
    """
    env = os.environ if env is None else env
    redis_url = redis_url or env.get("FIRSTFAULT_REDIS_URL") or None
    prefix = prefix or env.get("FIRSTFAULT_TOPIC_PREFIX") or None
    explicit = bootstrap or env.get("FIRSTFAULT_KAFKA_BOOTSTRAP")
    if explicit:
        return Resolved(explicit, redis_url, prefix)
    found = find_running(env)
    if found.info is None:
        raise NoBroker(NO_BROKER + (f" ({found.note})" if found.note else ""))
    info = found.info
    return Resolved(info.bootstrap, redis_url or info.redis_url, prefix or info.prefix, info, found.path)


def stored_redis(redis_url: str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """The Redis a command without a broker (``serve``) uses: explicit, else a live `up`'s, else None."""
    env = os.environ if env is None else env
    explicit = redis_url or env.get("FIRSTFAULT_REDIS_URL")
    if explicit:
        return explicit
    info = find_running(env).info
    return info.redis_url if info else None
