"""The run file: where a running ``firstfault up`` is, so other commands find it with nothing set.

``firstfault up`` without FIRSTFAULT_KAFKA_BOOTSTRAP starts its own broker on a new
port each time, so an exported address goes stale. It writes the broker, the store
and its pid to ``$XDG_RUNTIME_DIR/firstfault/up.json`` (else
``${XDG_CACHE_HOME:-~/.cache}/firstfault/up.json``; FIRSTFAULT_RUN_FILE overrides), and
removes it when it stops. ``ship``, ``diagnoses``, ``replay``, ``serve`` and ``topology``
take an explicit flag or variable first, then this file if its pid is alive.
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, ValidationError

from firstfault.rules.errors import FirstfaultError

RUN_FILE_VARIABLE = "FIRSTFAULT_RUN_FILE"
MEMORY = "memory"                     # the run file's `redis` when up has no Redis: the in-process store
NO_BROKER = "no broker: set FIRSTFAULT_KAFKA_BOOTSTRAP or start `firstfault up`"


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

    0600 in a 0700 directory: a Redis URL may carry a password.
    """
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


def read(path: Path) -> RunInfo | None:
    """The run file's content; None if there is none or it is not one of ours."""
    try:
        return RunInfo.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, ValidationError):
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


@dataclass(frozen=True)
class Lookup:
    path: Path
    info: RunInfo | None              # a live `up`, or None
    note: str | None = None           # why a run file there was ignored


def find_running(env: Mapping[str, str] | None = None) -> Lookup:
    return lookup(run_file_path(env))


def lookup(path: Path) -> Lookup:
    """The live `up` that ``path`` announces, or None and why the file there does not count."""
    if not path.exists():
        return Lookup(path, None)
    info = read(path)
    if info is None:
        return Lookup(path, None, f"ignoring {path}: not a firstfault run file")
    if not pid_alive(info.pid):
        return Lookup(path, None, f"ignoring stale run file {path}: `firstfault up` (pid {info.pid}) is not running")
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
