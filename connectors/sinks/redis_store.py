"""The diagnoses store shared by the stream (correlator) and the REST service.

One document per (diagnosis_id, revision), written once. Per workload attempt
the store keeps a *latest* pointer and the superseded versions, plus sorted-set
indexes of attempts, all scored by the attempt's end time in ms: by time,
status, domain and every blamed or suspected node. Indexes point at attempts,
not documents, so a query lists each attempt's latest diagnosis exactly once.

Two backends, one behaviour: Redis (a save is one Lua script, so the correlator
and the service can write the same attempt concurrently) and an in-process dict
store for a service run without Redis. Everything above the few backend
primitives (pagination, filtering, parsing) is shared code.
"""
from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol, TypeVar

from firstfault.schemas import Diagnosis

log = logging.getLogger(__name__)

_SCAN_BATCH = 200           # index entries fetched per round trip while filtering
_MAX_ATTEMPTS = 10_000
T = TypeVar("T")


class StoreUnavailable(RuntimeError):
    """The backing store cannot be reached; the message says why."""


class InvalidCursor(ValueError):
    """A pagination cursor that this store did not issue."""


@dataclass(frozen=True)
class _Entry:
    """What one save writes, computed once and handed to either backend."""

    doc_key: str
    doc: str
    latest_key: str
    revs_key: str
    meta_key: str                       # set of the index keys the attempt is listed in
    attempts_key: str
    attempt: int
    member: str                         # index member: "<attempt>:<workload_id>"
    revision: int                       # -1 when the diagnosis carries none
    score: int                          # end time, ms since the epoch
    index_keys: tuple[str, ...]


class _Keys:
    """Key layout. The free-form part (workload id, host...) always comes last, so no
    value can make one key look like another."""

    def __init__(self, prefix: str) -> None:
        self.p = prefix

    def doc(self, diagnosis_id: str, revision: int | None) -> str:
        return f"{self.p}doc:{'n' if revision is None else revision}:{diagnosis_id}"

    def latest(self, member: str) -> str:
        return f"{self.p}latest:{member}"

    def revs(self, member: str) -> str:
        return f"{self.p}revs:{member}"

    def meta(self, member: str) -> str:
        return f"{self.p}meta:{member}"

    def attempts(self, workload_id: str) -> str:
        return f"{self.p}attempts:{workload_id}"

    def time_index(self) -> str:
        return f"{self.p}idx:time"

    def status_index(self, status: str) -> str:
        return f"{self.p}idx:status:{status}"

    def domain_index(self, domain: str) -> str:
        return f"{self.p}idx:domain:{domain}"

    def node_index(self, host: str) -> str:
        return f"{self.p}idx:node:{host}"

    def lines(self, diagnosis_id: str) -> str:
        return f"{self.p}lines:{diagnosis_id}"


# ---------------------------------------------------------------- backends

class _Backend(Protocol):
    def save(self, entry: _Entry) -> bool: ...
    def latest_doc_keys(self, latest_keys: Sequence[str]) -> list[str | None]: ...
    def mget(self, keys: Sequence[str]) -> list[str | None]: ...
    def put(self, key: str, value: str) -> None: ...
    def lrange(self, key: str) -> list[str]: ...
    def zcard(self, key: str) -> int: ...
    def zrev_by_score(self, key: str, high: float, low: float, offset: int, count: int) -> list[tuple[str, float]]: ...
    def ping(self) -> bool: ...


# KEYS: doc, latest, revs, meta, attempts
# ARGV: doc_json, doc_key, revision, attempt, member, score, index keys...
# The new document replaces the latest unless both carry stream revisions and
# the new one is lower (a late replay): then it only joins the revisions.
_SAVE_LUA = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX') then return 0 end
local new_rev = tonumber(ARGV[3])
local cur = redis.call('HMGET', KEYS[2], 'key', 'rev')
if cur[1] then
  local cur_rev = tonumber(cur[2])
  if new_rev >= 0 and cur_rev >= 0 and new_rev < cur_rev then
    redis.call('RPUSH', KEYS[3], ARGV[2])
    return 1
  end
  redis.call('RPUSH', KEYS[3], cur[1])
  for _, idx in ipairs(redis.call('SMEMBERS', KEYS[4])) do redis.call('ZREM', idx, ARGV[5]) end
  redis.call('DEL', KEYS[4])
end
redis.call('HSET', KEYS[2], 'key', ARGV[2], 'rev', ARGV[3])
redis.call('ZADD', KEYS[5], tonumber(ARGV[4]), ARGV[4])
for i = 7, #ARGV do
  redis.call('ZADD', ARGV[i], tonumber(ARGV[6]), ARGV[5])
  redis.call('SADD', KEYS[4], ARGV[i])
end
return 1
"""


class _RedisBackend:
    def __init__(self, url: str) -> None:
        import redis
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeout

        # Short timeouts: a dead Redis must become a prompt 503, not a hung request.
        self._r = redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=2.0,
                                       socket_timeout=5.0, health_check_interval=30)
        self._save = self._r.register_script(_SAVE_LUA)
        self._down: tuple[type[BaseException], ...] = (RedisConnectionError, RedisTimeout, OSError)

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except self._down as exc:
            raise StoreUnavailable(f"redis unavailable: {exc}") from None

    def save(self, e: _Entry) -> bool:
        keys = [e.doc_key, e.latest_key, e.revs_key, e.meta_key, e.attempts_key]
        args: list[Any] = [e.doc, e.doc_key, e.revision, e.attempt, e.member, e.score, *e.index_keys]
        return bool(self._call(lambda: self._save(keys=keys, args=args)))

    def latest_doc_keys(self, latest_keys: Sequence[str]) -> list[str | None]:
        if not latest_keys:
            return []

        def run() -> list[str | None]:
            pipe = self._r.pipeline(transaction=False)
            for k in latest_keys:
                pipe.hget(k, "key")
            return list(pipe.execute())
        return self._call(run)

    def mget(self, keys: Sequence[str]) -> list[str | None]:
        return list(self._call(lambda: self._r.mget(list(keys)))) if keys else []

    def put(self, key: str, value: str) -> None:
        self._call(lambda: self._r.set(key, value))

    def lrange(self, key: str) -> list[str]:
        return list(self._call(lambda: self._r.lrange(key, 0, -1)))

    def zcard(self, key: str) -> int:
        return int(self._call(lambda: self._r.zcard(key)))

    def zrev_by_score(self, key: str, high: float, low: float, offset: int, count: int) -> list[tuple[str, float]]:
        rows = self._call(lambda: self._r.zrevrangebyscore(key, high, low, start=offset, num=count,
                                                           withscores=True))
        return [(m, float(s)) for m, s in rows]

    def ping(self) -> bool:
        try:
            return bool(self._r.ping())
        except Exception as exc:    # any failure means "not ready"
            log.warning("redis ping failed: %s", exc)
            return False


class _MemoryBackend:
    """The same primitives on dicts under one lock; ``save`` mirrors the Lua script."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kv: dict[str, str] = {}
        self._latest: dict[str, tuple[str, int]] = {}
        self._lists: dict[str, list[str]] = {}
        self._sets: dict[str, set[str]] = {}
        self._zsets: dict[str, dict[str, float]] = {}

    def save(self, e: _Entry) -> bool:
        with self._lock:
            if e.doc_key in self._kv:
                return False
            self._kv[e.doc_key] = e.doc
            revs = self._lists.setdefault(e.revs_key, [])
            cur = self._latest.get(e.latest_key)
            if cur is not None:
                if e.revision >= 0 and cur[1] >= 0 and e.revision < cur[1]:
                    revs.append(e.doc_key)
                    return True
                revs.append(cur[0])
                for idx in self._sets.pop(e.meta_key, set()):
                    self._zsets.get(idx, {}).pop(e.member, None)
            self._latest[e.latest_key] = (e.doc_key, e.revision)
            self._zsets.setdefault(e.attempts_key, {})[str(e.attempt)] = float(e.attempt)
            for idx in e.index_keys:
                self._zsets.setdefault(idx, {})[e.member] = float(e.score)
                self._sets.setdefault(e.meta_key, set()).add(idx)
            return True

    def latest_doc_keys(self, latest_keys: Sequence[str]) -> list[str | None]:
        with self._lock:
            return [cur[0] if (cur := self._latest.get(k)) else None for k in latest_keys]

    def mget(self, keys: Sequence[str]) -> list[str | None]:
        with self._lock:
            return [self._kv.get(k) for k in keys]

    def put(self, key: str, value: str) -> None:
        with self._lock:
            self._kv[key] = value

    def lrange(self, key: str) -> list[str]:
        with self._lock:
            return list(self._lists.get(key, []))

    def zcard(self, key: str) -> int:
        with self._lock:
            return len(self._zsets.get(key, {}))

    def zrev_by_score(self, key: str, high: float, low: float, offset: int, count: int) -> list[tuple[str, float]]:
        with self._lock:
            rows = [(m, s) for m, s in self._zsets.get(key, {}).items() if low <= s <= high]
        # Redis's order: score descending, then member descending (bytewise; UTF-8
        # preserves code point order, so Python's str comparison agrees).
        rows.sort(key=lambda r: (r[1], r[0]), reverse=True)
        return rows[offset:offset + count]

    def ping(self) -> bool:
        return True


# ---------------------------------------------------------------- the store

def epoch_ms(when: datetime) -> int:
    """A datetime as ms since the epoch; naive datetimes are taken as UTC."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return int(when.timestamp() * 1000)


def blamed_or_suspected(d: Diagnosis) -> list[str]:
    """Every host the diagnosis blamed (responsible, root cause) or suspected (suspects, candidates)."""
    hosts = set(d.responsible_nodes) | set(d.suspect_nodes)
    for c in d.candidates:
        hosts.update(c.nodes)
    if d.root_cause is not None and d.root_cause.host:
        hosts.add(d.root_cause.host)
    return sorted(h for h in hosts if h)


def _encode_cursor(score: float, member: str) -> str:
    raw = json.dumps([score, member], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        score, member = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if not isinstance(member, str) or isinstance(score, bool) or not isinstance(score, (int, float)):
            raise ValueError
        return float(score), member
    except (ValueError, TypeError):     # binascii.Error and JSONDecodeError are ValueErrors
        raise InvalidCursor("cursor is not one this service issued") from None


class DiagnosisStore:
    """Diagnoses by workload attempt, with time, status, domain and node indexes.

    ``DiagnosisStore(None)`` keeps everything in this process (``backend == "memory"``);
    a ``redis://`` URL selects Redis (``backend == "redis"``). Both behave the same.
    Redis failures raise :class:`StoreUnavailable`.
    """

    def __init__(self, redis_url: str | None, prefix: str = "firstfault:") -> None:
        self.prefix = prefix
        self._k = _Keys(prefix)
        self._b: _Backend
        if redis_url:
            self._b = _RedisBackend(redis_url)
            self.backend = "redis"
        else:
            log.warning("no Redis URL configured: diagnoses are kept in this process's memory only "
                        "and are lost when it exits (set FIRSTFAULT_REDIS_URL to keep them)")
            self._b = _MemoryBackend()
            self.backend = "memory"

    # -- writing

    def save(self, diagnosis: Diagnosis, ended_at: datetime | None = None) -> bool:
        """Store one diagnosis; False (and no change) when this (diagnosis_id, revision) is stored.

        It becomes its attempt's latest unless both it and the current latest carry
        a stream ``revision`` and its own is lower (a late replay). The version it
        replaces, or the late one itself, goes to the attempt's revisions. The
        attempt is indexed at ``ended_at``, else at the time of the save.
        """
        d, k = diagnosis, self._k
        member = f"{d.attempt}:{d.workload_id}"
        index_keys = [k.time_index(), k.status_index(d.status), k.domain_index(d.domain)]
        index_keys += [k.node_index(h) for h in blamed_or_suspected(d)]
        return self._b.save(_Entry(
            doc_key=k.doc(d.diagnosis_id, d.revision), doc=d.to_json(), latest_key=k.latest(member),
            revs_key=k.revs(member), meta_key=k.meta(member), attempts_key=k.attempts(d.workload_id),
            attempt=d.attempt, member=member, revision=-1 if d.revision is None else d.revision,
            score=epoch_ms(ended_at or datetime.now(timezone.utc)), index_keys=tuple(index_keys)))

    def save_lines(self, diagnosis_id: str, lines: dict[str, dict[str, str]]) -> None:
        """Keep the lines around a diagnosis' references ({path: {line number: text}})."""
        self._b.put(self._k.lines(diagnosis_id), json.dumps(lines, sort_keys=True, ensure_ascii=False))

    # -- reading

    def lines(self, diagnosis_id: str) -> dict[str, dict[str, str]] | None:
        """The lines kept with :meth:`save_lines`, or None when none were kept."""
        raw = self._b.mget([self._k.lines(diagnosis_id)])[0]
        return json.loads(raw) if raw else None

    def _docs(self, doc_keys: Sequence[str | None]) -> list[Diagnosis | None]:
        present = [k for k in doc_keys if k is not None]
        loaded = dict(zip(present, self._b.mget(present)))
        return [Diagnosis.model_validate_json(doc) if k is not None and (doc := loaded.get(k)) else None
                for k in doc_keys]

    def _latest_of(self, members: Sequence[str]) -> list[Diagnosis | None]:
        return self._docs(self._b.latest_doc_keys([self._k.latest(m) for m in members]))

    def attempts(self, workload_id: str) -> list[int]:
        """The attempts stored for a workload, highest first."""
        rows = self._b.zrev_by_score(self._k.attempts(workload_id), float("inf"), float("-inf"), 0, _MAX_ATTEMPTS)
        return [int(m) for m, _ in rows]

    def latest(self, workload_id: str, attempt: int | None = None) -> Diagnosis | None:
        """The attempt's latest diagnosis; the highest stored attempt's when ``attempt`` is None."""
        if attempt is None:
            top = self._b.zrev_by_score(self._k.attempts(workload_id), float("inf"), float("-inf"), 0, 1)
            if not top:
                return None
            attempt = int(top[0][0])
        return self._latest_of([f"{attempt}:{workload_id}"])[0]

    def revisions(self, workload_id: str, attempt: int) -> list[Diagnosis]:
        """The attempt's superseded diagnoses (the latest excluded), lowest revision first;
        equal or absent revisions keep their save order."""
        docs = self._docs(self._b.lrange(self._k.revs(f"{attempt}:{workload_id}")))
        return sorted((d for d in docs if d is not None), key=lambda d: -1 if d.revision is None else d.revision)

    def query(self, since: datetime | None = None, until: datetime | None = None, status: str | None = None,
              domain: str | None = None, node: str | None = None, limit: int = 50,
              cursor: str | None = None) -> tuple[list[Diagnosis], str | None]:
        """The latest diagnoses of attempts indexed within [since, until], newest first.

        Returns one page and the cursor for the next (None after the last page).
        Raises InvalidCursor for a cursor this store did not issue.
        """
        if limit < 1:
            raise ValueError("limit must be at least 1")
        k = self._k
        indexes = [k.time_index()]
        indexes += [k.status_index(status)] if status else []
        indexes += [k.domain_index(domain)] if domain else []
        indexes += [k.node_index(node)] if node else []
        # Walk the smallest index; the other filters are checked on the documents.
        index = min(indexes, key=self._b.zcard) if len(indexes) > 1 else indexes[0]
        low = float(epoch_ms(since)) if since else float("-inf")
        high = float(epoch_ms(until)) if until else float("inf")
        after = _decode_cursor(cursor) if cursor else None
        if after is not None:
            high = min(high, after[0])

        # Collect one item more than the page: it tells whether a next page exists.
        found: list[tuple[Diagnosis, float, str]] = []
        offset = 0
        while len(found) <= limit:
            rows = self._b.zrev_by_score(index, high, low, offset, _SCAN_BATCH)
            if not rows:
                break
            offset += len(rows)
            if after is not None:       # resume strictly after the cursor's (score, member)
                rows = [(m, s) for m, s in rows if s < after[0] or (s == after[0] and m < after[1])]
            for (member, score), d in zip(rows, self._latest_of([m for m, _ in rows])):
                if d is None or (status and d.status != status) or (domain and d.domain != domain):
                    continue
                if node and node not in blamed_or_suspected(d):
                    continue
                found.append((d, score, member))
                if len(found) > limit:
                    break
        page = found[:limit]
        next_cursor = _encode_cursor(page[-1][1], page[-1][2]) if len(found) > limit else None
        return [d for d, _, _ in page], next_cursor

    def for_node(self, host: str, limit: int = 50, cursor: str | None = None) -> tuple[list[Diagnosis], str | None]:
        """Diagnoses that blamed or suspected ``host``, newest first (see :meth:`query`)."""
        return self.query(node=host, limit=limit, cursor=cursor)

    def ping(self) -> bool:
        return self._b.ping()
