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

Retention (:class:`Retention`, ``FIRSTFAULT_STORE_*``): at most ``max_diagnoses`` attempts
and ``max_bytes`` of documents and kept lines, none stored longer ago than ``ttl_days``
(by its last write). Whoever writes enforces it in the same script as the save, oldest
write first, a bounded batch per call; readers sweep now and then, so an idle store still
expires. The attempt just written, and the newest one, are never dropped for a cap. An
attempt keeps at most :data:`MAX_REVISIONS` superseded versions. What was dropped is
counted (``retention_status``), and the listing says so. (Attempts stored by a version
without retention are not counted: they stay until ``firstfault`` keys are cleared.)
"""
from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol, TypeVar

from firstfault.schemas import Diagnosis

log = logging.getLogger(__name__)

_SCAN_BATCH = 200           # index entries fetched per round trip while filtering
_MAX_ATTEMPTS = 10_000
MAX_REVISIONS = 64          # superseded versions kept per attempt (the oldest go first)
DROP_BATCH = 100            # attempts dropped by one save or sweep at most (bounded work per call)
SWEEP_EVERY_S = 5.0         # how often a reader sweeps expired attempts
T = TypeVar("T")
MiB = 1024 * 1024


@dataclass(frozen=True)
class Retention:
    """How much the store keeps: attempts, bytes (documents and kept lines) and age (days since
    the attempt's last write; 0 keeps them until a cap drops them)."""

    max_diagnoses: int = 100_000
    max_bytes: int = 1024 * MiB
    ttl_days: float = 90.0

    ENV = {"max_diagnoses": "FIRSTFAULT_STORE_MAX_DIAGNOSES", "max_bytes": "FIRSTFAULT_STORE_MAX_BYTES",
           "ttl_days": "FIRSTFAULT_STORE_TTL_DAYS"}

    def __post_init__(self) -> None:
        for field, low in (("max_diagnoses", 1), ("max_bytes", 1), ("ttl_days", 0)):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < low:
                raise ValueError(f"{self.ENV[field]}: must be a number of at least {low}, got {value!r}")

    @property
    def ttl_ms(self) -> int:
        return int(self.ttl_days * 86_400_000)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Retention":
        """From FIRSTFAULT_STORE_MAX_DIAGNOSES, _MAX_BYTES (512M, 4G...) and _TTL_DAYS; ValueError names a bad one."""
        from firstfault.rules.bundle import parse_size

        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for field, var in cls.ENV.items():
            raw = env.get(var, "").strip()
            if not raw:
                continue
            try:
                values[field] = (parse_size(raw) if field == "max_bytes" else
                                 int(raw) if field == "max_diagnoses" else float(raw))
            except ValueError:
                raise ValueError(f"{var}: not a valid value: {raw[:40]!r}") from None
        return cls(**values)

    def describe(self) -> str:
        ttl = f", {self.ttl_days:g} days" if self.ttl_days else ""
        return f"at most {self.max_diagnoses} diagnoses, {self.max_bytes} bytes{ttl}"


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
    lines_key: str = ""
    lines: str = ""                     # the kept lines (JSON), "" for none


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

    # retention: attempts by last write (ms), their bytes, the total, and what was dropped
    def stored(self) -> str:
        return f"{self.p}ret:stored"

    def sizes(self) -> str:
        return f"{self.p}ret:size"

    def total(self) -> str:
        return f"{self.p}ret:bytes"

    def dropped(self) -> str:
        return f"{self.p}ret:dropped"

    def doc_id(self, doc_key: str) -> str:
        """The diagnosis id of a document key (``{p}doc:{rev}:{id}``)."""
        return doc_key[len(self.p) + 4:].split(":", 1)[-1]


# ---------------------------------------------------------------- backends

class _Backend(Protocol):
    def save(self, entry: _Entry, now_ms: int, retention: Retention) -> bool: ...
    def sweep(self, now_ms: int, retention: Retention) -> int: ...
    def retention_status(self) -> dict[str, Any]: ...
    def latest_doc_keys(self, latest_keys: Sequence[str]) -> list[str | None]: ...
    def mget(self, keys: Sequence[str]) -> list[str | None]: ...
    def lrange(self, key: str) -> list[str]: ...
    def zcard(self, key: str) -> int: ...
    def zrev_by_score(self, key: str, high: float, low: float, offset: int, count: int) -> list[tuple[str, float]]: ...
    def ping(self) -> bool: ...


# KEYS: doc, latest, revs, meta, attempts, lines, ret:stored, ret:size, ret:bytes, ret:dropped
# ARGV: mode ('save' | 'sweep'), doc_json, doc_key, revision, attempt, member, score, lines_json ('' for
# none), now (ms), max attempts, max bytes, ttl (ms, 0: none), key prefix, drop batch, max revisions,
# index keys...
# A save: the new document replaces the latest unless both carry stream revisions and
# the new one is lower (a late replay): then it only joins the revisions. Either way the
# attempt's bytes and last write are recorded, its oldest revisions past the cap dropped,
# and then (as a sweep does) the oldest attempts past the TTL or a cap, never this one.
# Returns {saved (0/1), attempts dropped}.
_SAVE_LUA = """
local P = ARGV[13]
local now = tonumber(ARGV[9])
local storedK, sizeK, bytesK, droppedK = KEYS[7], KEYS[8], KEYS[9], KEYS[10]

local function doc_id(dk)
  local rest = string.sub(dk, #P + 5)
  return string.match(rest, '^[^:]*:(.*)$') or rest
end

local function drop(m, why)
  local latest, revs, meta = P .. 'latest:' .. m, P .. 'revs:' .. m, P .. 'meta:' .. m
  local docs = redis.call('LRANGE', revs, 0, -1)
  local cur = redis.call('HGET', latest, 'key')
  if cur then table.insert(docs, cur) end
  for _, dk in ipairs(docs) do
    redis.call('DEL', dk, P .. 'lines:' .. doc_id(dk))
  end
  for _, idx in ipairs(redis.call('SMEMBERS', meta)) do redis.call('ZREM', idx, m) end
  local attempt, wid = string.match(m, '^([^:]*):(.*)$')
  if attempt then redis.call('ZREM', P .. 'attempts:' .. wid, attempt) end
  redis.call('DEL', meta, latest, revs)
  local size = tonumber(redis.call('HGET', sizeK, m) or '0')
  local at = redis.call('ZSCORE', storedK, m)
  redis.call('HDEL', sizeK, m)
  redis.call('DECRBY', bytesK, size)
  redis.call('ZREM', storedK, m)
  redis.call('HINCRBY', droppedK, 'count', 1)
  redis.call('HINCRBY', droppedK, 'bytes', size)
  redis.call('HINCRBY', droppedK, 'by_' .. why, 1)
  redis.call('HSET', droppedK, 'last_at', string.format('%.0f', now))
  if at then
    local prev = tonumber(redis.call('HGET', droppedK, 'newest_stored_at') or '-1')
    if tonumber(at) > prev then redis.call('HSET', droppedK, 'newest_stored_at', at) end
  end
end

local function sweep(protect)
  local n, batch = 0, tonumber(ARGV[14])
  local ttl = tonumber(ARGV[12])
  if ttl > 0 then
    local cut = '(' .. string.format('%.0f', now - ttl)
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', storedK, '-inf', cut, 'LIMIT', 0, batch)) do
      if m ~= protect then
        drop(m, 'ttl')
        n = n + 1
      end
    end
  end
  local max_count, max_bytes = tonumber(ARGV[10]), tonumber(ARGV[11])
  while n < batch do
    local kept = redis.call('ZCARD', storedK)
    local over_count = kept > max_count
    local over_bytes = tonumber(redis.call('GET', bytesK) or '0') > max_bytes
    if kept <= 1 or not (over_count or over_bytes) then break end      -- the newest always stays
    local oldest = redis.call('ZRANGE', storedK, 0, 1)
    local victim = oldest[1]
    if victim == protect then victim = oldest[2] end
    if not victim then break end
    drop(victim, over_count and 'count' or 'bytes')
    n = n + 1
  end
  return n
end

if ARGV[1] == 'sweep' then return {0, sweep('')} end

local member = ARGV[6]
local charged = 0
local saved = 0
if redis.call('SET', KEYS[1], ARGV[2], 'NX') then
  saved = 1
  charged = string.len(ARGV[2])
end
if ARGV[8] ~= '' and redis.call('SET', KEYS[6], ARGV[8], 'NX') then
  charged = charged + string.len(ARGV[8])
end
if saved == 0 and charged == 0 then return {0, 0} end
if saved == 1 then
  local new_rev = tonumber(ARGV[4])
  local cur = redis.call('HMGET', KEYS[2], 'key', 'rev')
  local late = false
  if cur[1] then
    local cur_rev = tonumber(cur[2])
    if new_rev >= 0 and cur_rev >= 0 and new_rev < cur_rev then
      redis.call('RPUSH', KEYS[3], ARGV[3])
      late = true
    else
      redis.call('RPUSH', KEYS[3], cur[1])
      for _, idx in ipairs(redis.call('SMEMBERS', KEYS[4])) do redis.call('ZREM', idx, member) end
      redis.call('DEL', KEYS[4])
    end
  end
  if not late then
    redis.call('HSET', KEYS[2], 'key', ARGV[3], 'rev', ARGV[4])
    redis.call('ZADD', KEYS[5], tonumber(ARGV[5]), ARGV[5])
    for i = 16, #ARGV do
      redis.call('ZADD', ARGV[i], tonumber(ARGV[7]), member)
      redis.call('SADD', KEYS[4], ARGV[i])
    end
  end
end
redis.call('HINCRBY', sizeK, member, charged)
redis.call('INCRBY', bytesK, charged)
redis.call('ZADD', storedK, now, member)
local max_revs = tonumber(ARGV[15])
while redis.call('LLEN', KEYS[3]) > max_revs do
  local dk = redis.call('LPOP', KEYS[3])
  local freed = redis.call('STRLEN', dk)
  redis.call('DEL', dk)
  local id, shared = doc_id(dk), false
  local cur = redis.call('HGET', KEYS[2], 'key')
  if cur and doc_id(cur) == id then shared = true end
  if not shared then
    for _, other in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
      if doc_id(other) == id then shared = true break end
    end
  end
  if not shared then
    local lk = P .. 'lines:' .. id
    freed = freed + redis.call('STRLEN', lk)
    redis.call('DEL', lk)
  end
  redis.call('HINCRBY', sizeK, member, -freed)
  redis.call('DECRBY', bytesK, freed)
end
return {saved, sweep(member)}
"""


def _status(kept: int, total: int, oldest_ms: float | None, dropped: Mapping[str, Any]) -> dict[str, Any]:
    def n(key: str) -> int:
        return int(float(dropped.get(key) or 0))

    def iso(ms: Any) -> str | None:
        if ms is None or ms == "" or float(ms) < 0:
            return None
        return datetime.fromtimestamp(float(ms) / 1000, timezone.utc).isoformat().replace("+00:00", "Z")

    return {"kept": kept, "bytes": max(0, total), "oldest_kept_stored_at": iso(oldest_ms),
            "dropped": n("count"), "dropped_bytes": n("bytes"),
            "dropped_by": {"count": n("by_count"), "bytes": n("by_bytes"), "ttl": n("by_ttl")},
            "last_dropped_at": iso(dropped.get("last_at")),
            "newest_dropped_stored_at": iso(dropped.get("newest_stored_at"))}


class _RedisBackend:
    def __init__(self, url: str, keys: _Keys) -> None:
        import redis
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeout

        # Short timeouts: a dead Redis must become a prompt 503, not a hung request.
        self._r = redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=2.0,
                                       socket_timeout=5.0, health_check_interval=30)
        self._k = keys
        self._save = self._r.register_script(_SAVE_LUA)
        self._down: tuple[type[BaseException], ...] = (RedisConnectionError, RedisTimeout, OSError)

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except self._down as exc:
            raise StoreUnavailable(f"redis unavailable: {exc}") from None

    def _run(self, mode: str, e: _Entry | None, now_ms: int, r: Retention) -> tuple[int, int]:
        k = self._k
        none = f"{k.p}none"
        keys = ([e.doc_key, e.latest_key, e.revs_key, e.meta_key, e.attempts_key, e.lines_key or none]
                if e is not None else [none] * 6) + [k.stored(), k.sizes(), k.total(), k.dropped()]
        args: list[Any] = [mode]
        args += ([e.doc, e.doc_key, e.revision, e.attempt, e.member, e.score, e.lines] if e is not None
                 else ["", "", -1, 0, "", 0, ""])
        args += [now_ms, r.max_diagnoses, r.max_bytes, r.ttl_ms, k.p, DROP_BATCH, MAX_REVISIONS]
        args += list(e.index_keys) if e is not None else []
        saved, dropped = self._call(lambda: self._save(keys=keys, args=args))
        return int(saved), int(dropped)

    def save(self, e: _Entry, now_ms: int, retention: Retention) -> bool:
        return bool(self._run("save", e, now_ms, retention)[0])

    def sweep(self, now_ms: int, retention: Retention) -> int:
        return self._run("sweep", None, now_ms, retention)[1]

    def retention_status(self) -> dict[str, Any]:
        k = self._k

        def run() -> dict[str, Any]:
            pipe = self._r.pipeline(transaction=False)
            pipe.zcard(k.stored())
            pipe.get(k.total())
            pipe.zrange(k.stored(), 0, 0, withscores=True)
            pipe.hgetall(k.dropped())
            kept, total, oldest, dropped = pipe.execute()
            return _status(int(kept), int(total or 0), oldest[0][1] if oldest else None, dropped)
        return self._call(run)

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


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


class _MemoryBackend:
    """The same primitives on dicts under one lock; ``save`` and ``sweep`` mirror the Lua script."""

    def __init__(self, keys: _Keys) -> None:
        self._k = keys
        self._lock = threading.Lock()
        self._kv: dict[str, str] = {}
        self._latest: dict[str, tuple[str, int]] = {}
        self._lists: dict[str, list[str]] = {}
        self._sets: dict[str, set[str]] = {}
        self._zsets: dict[str, dict[str, float]] = {}
        self._stored: OrderedDict[str, int] = OrderedDict()     # member -> last write (ms), oldest first
        self._sizes: dict[str, int] = {}
        self._bytes = 0
        self._dropped: dict[str, Any] = {}

    def save(self, e: _Entry, now_ms: int, retention: Retention) -> bool:
        with self._lock:
            charged = 0
            saved = e.doc_key not in self._kv
            if saved:
                self._kv[e.doc_key] = e.doc
                charged += _size(e.doc)
            if e.lines and e.lines_key not in self._kv:
                self._kv[e.lines_key] = e.lines
                charged += _size(e.lines)
            if not saved and not charged:
                return False
            if saved:
                revs = self._lists.setdefault(e.revs_key, [])
                cur = self._latest.get(e.latest_key)
                late = cur is not None and e.revision >= 0 and cur[1] >= 0 and e.revision < cur[1]
                if late:
                    revs.append(e.doc_key)
                else:
                    if cur is not None:
                        revs.append(cur[0])
                        for idx in self._sets.pop(e.meta_key, set()):
                            self._zsets.get(idx, {}).pop(e.member, None)
                    self._latest[e.latest_key] = (e.doc_key, e.revision)
                    self._zsets.setdefault(e.attempts_key, {})[str(e.attempt)] = float(e.attempt)
                    for idx in e.index_keys:
                        self._zsets.setdefault(idx, {})[e.member] = float(e.score)
                        self._sets.setdefault(e.meta_key, set()).add(idx)
            self._sizes[e.member] = self._sizes.get(e.member, 0) + charged
            self._bytes += charged
            self._stored.pop(e.member, None)
            self._stored[e.member] = now_ms
            self._trim_revisions(e)
            self._sweep(now_ms, retention, protect=e.member)
            return saved

    def _trim_revisions(self, e: _Entry) -> None:
        revs = self._lists.get(e.revs_key, [])
        while len(revs) > MAX_REVISIONS:
            dk = revs.pop(0)
            freed = _size(self._kv.pop(dk, ""))
            did = self._k.doc_id(dk)
            cur = self._latest.get(e.latest_key)
            if not (cur and self._k.doc_id(cur[0]) == did) and not any(self._k.doc_id(o) == did for o in revs):
                freed += _size(self._kv.pop(self._k.lines(did), ""))
            self._sizes[e.member] = self._sizes.get(e.member, 0) - freed
            self._bytes -= freed

    def _drop(self, m: str, why: str, now_ms: int) -> None:
        k = self._k
        docs = self._lists.pop(k.revs(m), [])
        cur = self._latest.pop(k.latest(m), None)
        if cur is not None:
            docs.append(cur[0])
        for dk in docs:
            self._kv.pop(dk, None)
            self._kv.pop(k.lines(k.doc_id(dk)), None)
        for idx in self._sets.pop(k.meta(m), set()):
            self._zsets.get(idx, {}).pop(m, None)
        attempt, _, wid = m.partition(":")
        attempts = self._zsets.get(k.attempts(wid))
        if attempts is not None:
            attempts.pop(attempt, None)
            if not attempts:
                del self._zsets[k.attempts(wid)]
        size = self._sizes.pop(m, 0)
        self._bytes -= size
        at = self._stored.pop(m, None)
        d = self._dropped
        for key, inc in (("count", 1), ("bytes", size), (f"by_{why}", 1)):
            d[key] = d.get(key, 0) + inc
        d["last_at"] = now_ms
        if at is not None and at > d.get("newest_stored_at", -1):
            d["newest_stored_at"] = at

    def _sweep(self, now_ms: int, r: Retention, protect: str = "") -> int:
        n = 0
        if r.ttl_ms > 0:
            cut = now_ms - r.ttl_ms
            expired = []
            for m, at in self._stored.items():      # oldest write first
                if len(expired) >= DROP_BATCH:
                    break
                if at < cut and m != protect:
                    expired.append(m)
                elif at >= cut:
                    break
            for m in expired:
                self._drop(m, "ttl", now_ms)
                n += 1
        while n < DROP_BATCH:
            over_count = len(self._stored) > r.max_diagnoses
            over_bytes = self._bytes > r.max_bytes
            if len(self._stored) <= 1 or not (over_count or over_bytes):      # the newest always stays
                break
            victim = next((m for m in self._stored if m != protect), None)
            if victim is None:
                break
            self._drop(victim, "count" if over_count else "bytes", now_ms)
            n += 1
        return n

    def sweep(self, now_ms: int, retention: Retention) -> int:
        with self._lock:
            return self._sweep(now_ms, retention)

    def retention_status(self) -> dict[str, Any]:
        with self._lock:
            oldest = next(iter(self._stored.values()), None)
            return _status(len(self._stored), self._bytes, oldest, dict(self._dropped))

    def latest_doc_keys(self, latest_keys: Sequence[str]) -> list[str | None]:
        with self._lock:
            return [cur[0] if (cur := self._latest.get(k)) else None for k in latest_keys]

    def mget(self, keys: Sequence[str]) -> list[str | None]:
        with self._lock:
            return [self._kv.get(k) for k in keys]

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


# A page cursor is the position of the last item shown, ``<end time ms>:<attempt member>``: any
# string of that form is a position (the next page starts strictly after it), so the API can
# state exactly which cursors are valid (CURSOR_PATTERN) and answer every one of them.
CURSOR_PATTERN = r"^-?[0-9]{1,16}:[0-9]{1,19}:[\s\S]*$"
_CURSOR = re.compile(CURSOR_PATTERN)


def _encode_cursor(score: float, member: str) -> str:
    return f"{int(score)}:{member}"


def _decode_cursor(cursor: str) -> tuple[float, str]:
    if not _CURSOR.match(cursor):
        raise InvalidCursor("cursor is not one this service issued (<end time ms>:<attempt>:<workload id>)")
    score, _, member = cursor.partition(":")
    return float(int(score)), member


class DiagnosisStore:
    """Diagnoses by workload attempt, with time, status, domain and node indexes.

    ``DiagnosisStore(None)`` keeps everything in this process (``backend == "memory"``);
    a ``redis://`` URL selects Redis (``backend == "redis"``). Both behave the same.
    Redis failures raise :class:`StoreUnavailable`.
    """

    def __init__(self, redis_url: str | None, prefix: str = "firstfault:", retention: Retention | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.prefix = prefix
        self._k = _Keys(prefix)
        self._b: _Backend
        if retention is None:
            try:
                retention = Retention.from_env()
            except ValueError as exc:       # the service refuses to start on it; a stream worker goes on
                log.error("%s; keeping the default retention (%s)", exc, Retention().describe())
                retention = Retention()
        self.retention = retention
        self.clock = clock
        self._next_sweep = 0.0
        if redis_url:
            self._b = _RedisBackend(redis_url, self._k)
            self.backend = "redis"
        else:
            log.warning("no Redis URL configured: diagnoses are kept in this process's memory only "
                        "and are lost when it exits (set FIRSTFAULT_REDIS_URL to keep them)")
            self._b = _MemoryBackend(self._k)
            self.backend = "memory"

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    # -- writing

    def save(self, diagnosis: Diagnosis, ended_at: datetime | None = None,
             lines: dict[str, dict[str, str]] | None = None, doc: str | None = None) -> bool:
        """Store one diagnosis; False (and no change) when this (diagnosis_id, revision) is stored.

        It becomes its attempt's latest unless both it and the current latest carry
        a stream ``revision`` and its own is lower (a late replay). The version it
        replaces, or the late one itself, goes to the attempt's revisions. The
        attempt is indexed at ``ended_at``, else at the time of the save. ``lines``:
        the lines around its references ({path: {line number: text}}), kept with it.
        ``doc``: ``diagnosis.to_json()`` when the caller has made it already (the service answers with it).
        The retention is enforced in the same step (the oldest attempts past a cap or
        the TTL are dropped, never this one).
        """
        d, k = diagnosis, self._k
        member = f"{d.attempt}:{d.workload_id}"
        index_keys = [k.time_index(), k.status_index(d.status), k.domain_index(d.domain)]
        index_keys += [k.node_index(h) for h in blamed_or_suspected(d)]
        return self._b.save(_Entry(
            doc_key=k.doc(d.diagnosis_id, d.revision), doc=d.to_json() if doc is None else doc, latest_key=k.latest(member),
            revs_key=k.revs(member), meta_key=k.meta(member), attempts_key=k.attempts(d.workload_id),
            attempt=d.attempt, member=member, revision=-1 if d.revision is None else d.revision,
            score=epoch_ms(ended_at or datetime.now(timezone.utc)), index_keys=tuple(index_keys),
            lines_key=k.lines(d.diagnosis_id),
            lines=json.dumps(lines, sort_keys=True, ensure_ascii=False) if lines is not None else ""),
            self._now_ms(), self.retention)

    def sweep(self, force: bool = False) -> int:
        """Drop what the retention no longer keeps (expired, past a cap), a bounded batch; returns how
        many attempts were dropped. Readers call it now and then (every SWEEP_EVERY_S), ``force`` now."""
        now = self.clock()
        if not force and now < self._next_sweep:
            return 0
        self._next_sweep = now + SWEEP_EVERY_S
        return self._b.sweep(int(now * 1000), self.retention)

    def retention_status(self) -> dict[str, Any]:
        """The retention (its caps) and what it did: attempts kept and their bytes, the oldest kept
        one's last write, and what was dropped (how many, their bytes, by which cap, the newest of them)."""
        r = self.retention
        return {"max_diagnoses": r.max_diagnoses, "max_bytes": r.max_bytes, "ttl_days": r.ttl_days,
                **self._b.retention_status()}

    # -- reading

    def lines(self, diagnosis_id: str) -> dict[str, dict[str, str]] | None:
        """The lines kept with the diagnosis (``save(..., lines=)``), or None when none were kept."""
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
        self.sweep()                    # an idle store still expires what its TTL no longer keeps
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
