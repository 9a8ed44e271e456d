"""The fleet memory's store: each node's episodes, in Redis under FIRSTFAULT_REDIS_PREFIX.

Layout (the free-form part last, as in the diagnoses store):

* ``{prefix}node:{host}``: a hash, field ``{family}:{attempt}:{workload_id}`` -> the episode (JSON);
* ``{prefix}nodes``: the set of hosts with a record;
* ``{prefix}node-episodes:{attempt}:{workload_id}``: which fields that attempt wrote and at
  which stream revision, so a later revision replaces them and a late, lower one is ignored;
* ``{prefix}node-log``: a stream of every write (``s``: its sequence number, ``a``: the attempt,
  ``r``: the revision, ``e``: the episodes), capped; readers keep their fleet state current
  from it (``changes``) instead of re-reading every node (``snapshot``, when they fall behind);
* ``{prefix}node-seq``, ``{prefix}node-watermark`` (the newest episode's time, never past the
  writer's clock) and ``{prefix}node-times`` (attempts by episode time): an attempt whose
  episodes are older than the watermark minus the retention (the policy window, its margin
  and a day) is dropped, a few per write, and one that old is not written.

Everything here is derived from diagnoses: ``firstfault nodes --rebuild`` clears it and reads
the diagnoses topic from the beginning. Without a Redis URL the record lives in this process.
"""
from __future__ import annotations

import heapq
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from firstfault.rules.fleet import Episode, FleetReport, Policy, Topology, episodes_from
from firstfault.rules.fleet_index import to_us
from firstfault.schemas import Diagnosis

from .redis_store import StoreUnavailable

LOG_MAX = 20_000            # changelog entries kept: a reader further behind re-reads every node
PRUNE_PER_WRITE = 64        # old attempts dropped per write at most (bounded work per diagnosis)

# KEYS: attempt key, nodes set, seq, log stream, times zset, watermark.
# ARGV: revision (-1: none), node key prefix, [[host, field, episode]...], attempt id, episode time (ms, '' if
# none), now (ms), retention (ms), log cap, attempt key prefix.
# Returns 0: a late lower revision (ignored); 2: older than the record keeps (ignored); 1: written.
_RECORD_LUA = """
local new_rev = tonumber(ARGV[1])
local cur = redis.call('HGET', KEYS[1], 'rev')
if cur then
  local c = tonumber(cur)
  if new_rev >= 0 and c >= 0 and new_rev < c then return 0 end
end
local when = tonumber(ARGV[5])
local wm = tonumber(redis.call('GET', KEYS[6]) or '')
if when then
  local mark = math.min(when, tonumber(ARGV[6]))
  if (not wm) or mark > wm then
    wm = mark
    redis.call('SET', KEYS[6], string.format('%.0f', wm))
  end
end
local cut = wm and (wm - tonumber(ARGV[7]))
if when and cut and when < cut then return 2 end
local function forget(hf)
  redis.call('HDEL', ARGV[2] .. hf[1], hf[2])
  if redis.call('EXISTS', ARGV[2] .. hf[1]) == 0 then redis.call('SREM', KEYS[2], hf[1]) end
end
local old = redis.call('HGET', KEYS[1], 'fields')
if old then
  for _, hf in ipairs(cjson.decode(old)) do forget(hf) end
end
local keep = {}
for _, e in ipairs(cjson.decode(ARGV[3])) do
  redis.call('HSET', ARGV[2] .. e[1], e[2], e[3])
  redis.call('SADD', KEYS[2], e[1])
  table.insert(keep, {e[1], e[2]})
end
local seq = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[1], 'rev', ARGV[1], 'fields', #keep > 0 and cjson.encode(keep) or '[]', 'seq', seq)
redis.call('ZADD', KEYS[5], when or wm or tonumber(ARGV[6]), ARGV[4])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[8], '*', 's', seq, 'a', ARGV[4], 'r', ARGV[1], 'e', ARGV[3])
if cut then
  for _, a in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', '(' .. string.format('%.0f', cut),
                                'LIMIT', 0, tonumber(ARGV[10]))) do
    local f = redis.call('HGET', ARGV[9] .. a, 'fields')
    if f then
      for _, hf in ipairs(cjson.decode(f)) do forget(hf) end
    end
    redis.call('DEL', ARGV[9] .. a)
    redis.call('ZREM', KEYS[5], a)
  end
end
return 1
"""


def _field(e: Episode) -> str:
    return f"{e.family}:{e.attempt}:{e.workload_id}"


@dataclass(frozen=True)
class LogEntry:
    """One write of the record: attempt ``key`` (``attempt:workload_id``) now has these episodes."""

    seq: int
    key: str
    revision: int | None
    episodes: list[Episode]


@dataclass(frozen=True)
class Position:
    """Where a reader is in the changelog: the last sequence number it has, and (Redis) the stream id."""

    seq: int
    stream_id: str | None = None


class LogGap(RuntimeError):
    """The changelog no longer holds what a reader missed: it must read a snapshot."""


def retention_of(policy: Policy) -> timedelta:
    """How long the store keeps episodes behind its watermark: what the fleet state may still
    count (the window, behind the margin of final steps) and a day for slow steps."""
    return timedelta(days=policy.window_days + policy.retain_margin_days + 1.0)


def _env_policy() -> Policy:
    try:
        return Policy.from_env(os.environ)
    except ValueError:           # a bad variable is reported by whoever evaluates the policy
        return Policy()


class NodeHealthStore:
    """Episodes per node. ``NodeHealthStore(None)`` keeps them in this process.

    ``retention``: how long behind the watermark episodes are kept (default: the
    FIRSTFAULT_AVOID_* policy's, :func:`retention_of`); ``clock``: caps the watermark, so an
    episode stamped in the future cannot make the record drop the present.
    """

    def __init__(self, redis_url: str | None, prefix: str = "firstfault:", retention: timedelta | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.prefix = prefix
        self.retention = retention if retention is not None else retention_of(_env_policy())
        self.clock = clock
        self._lock = threading.Lock()
        self._mem: dict[str, dict[str, str]] = {}           # host -> field -> episode (JSON, as in Redis)
        # Plain values only (strings, numbers, tuples of them): the garbage collector skips them.
        self._attempts: dict[str, tuple[int, tuple[tuple[str, str], ...], int]] = {}   # id -> (rev, fields, ms)
        self._times: list[tuple[int, str]] = []              # (time ms, attempt id), a lazy heap
        self._log: deque[tuple[int, str, int | None, tuple[str, ...]]] = deque(maxlen=LOG_MAX)   # as in Redis
        self._seq = 0
        self._watermark: int | None = None
        self._r = None
        if redis_url:
            import redis
            from redis.exceptions import ConnectionError as RedisConnectionError
            from redis.exceptions import TimeoutError as RedisTimeout

            self._r = redis.Redis.from_url(redis_url, decode_responses=True, socket_connect_timeout=2.0,
                                           socket_timeout=5.0, health_check_interval=30)
            self._script = self._r.register_script(_RECORD_LUA)
            self._down: tuple[type[BaseException], ...] = (RedisConnectionError, RedisTimeout, OSError)
        self.backend = "redis" if self._r is not None else "memory"

    def _node_key(self, host: str) -> str:
        return f"{self.prefix}node:{host}"

    def _call(self, fn):
        try:
            return fn()
        except self._down as exc:
            raise StoreUnavailable(f"redis unavailable: {exc}") from None

    # -- writing

    def record(self, d: Diagnosis, fallback_at: str | None = None) -> list[Episode]:
        """Keep the diagnosis' episodes, replacing its attempt's earlier ones; returns what was
        kept ([] for a provisional, a late lower revision, a diagnosis blaming no node, or one
        older than the record keeps)."""
        if d.provisional:
            return []
        eps = episodes_from(d, fallback_at)
        rev = -1 if d.revision is None else d.revision
        attempt = f"{d.attempt}:{d.workload_id}"
        when = to_us(eps[0].when) // 1000 if eps else None       # ms, exactly (every episode has one time)
        now = int(self.clock() * 1000)
        keep = int(self.retention.total_seconds() * 1000)
        if self._r is not None:
            rows = [[e.host, _field(e), e.model_dump_json()] for e in eps]
            script = self._script
            p = self.prefix
            done = self._call(lambda: script(
                keys=[f"{p}node-episodes:{attempt}", f"{p}nodes", f"{p}node-seq", f"{p}node-log", f"{p}node-times",
                      f"{p}node-watermark"],
                args=[rev, f"{p}node:", json.dumps(rows), attempt, "" if when is None else when, now, keep, LOG_MAX,
                      f"{p}node-episodes:", PRUNE_PER_WRITE]))
            return eps if done == 1 else []
        with self._lock:
            cur = self._attempts.get(attempt)
            if cur is not None and rev >= 0 and cur[0] >= 0 and rev < cur[0]:
                return []
            if when is not None:
                mark = min(when, now)
                self._watermark = mark if self._watermark is None else max(self._watermark, mark)
            cut = None if self._watermark is None else self._watermark - keep
            if when is not None and cut is not None and when < cut:
                return []
            self._forget(cur[1] if cur else ())
            rows = tuple(e.model_dump_json() for e in eps)
            for e, row in zip(eps, rows):
                self._mem.setdefault(e.host, {})[_field(e)] = row
            at = when if when is not None else (self._watermark if self._watermark is not None else now)
            self._attempts[attempt] = (rev, tuple((e.host, _field(e)) for e in eps), at)
            heapq.heappush(self._times, (at, attempt))
            self._seq += 1
            self._log.append((self._seq, attempt, d.revision, rows))
            if cut is not None:
                self._prune(cut)
        return eps

    def _forget(self, fields: Iterable[tuple[str, str]]) -> None:
        for host, field in fields:
            mine = self._mem.get(host)
            if mine is not None:
                mine.pop(field, None)
                if not mine:
                    del self._mem[host]

    def _prune(self, cut: int) -> None:
        n = 0
        while self._times and self._times[0][0] < cut and n < PRUNE_PER_WRITE:
            at, attempt = heapq.heappop(self._times)
            cur = self._attempts.get(attempt)
            if cur is not None and cur[2] == at:          # else a later write moved it: a stale heap entry
                self._forget(cur[1])
                del self._attempts[attempt]
                n += 1

    def clear(self) -> int:
        """Forget every record (before a rebuild); returns the keys deleted."""
        if self._r is None:
            with self._lock:
                n = len(self._mem) + len(self._attempts)
                self._mem.clear()
                self._attempts.clear()
                self._times.clear()
                self._watermark = None
                # The sequence goes on, so a reader sees the gap and reads the (empty) record afresh.
                self._seq += 1
                self._log.clear()
            return n
        r = self._r
        glob = "".join(f"[{c}]" if c in "*?[]\\" else c for c in self.prefix)

        def run() -> int:
            keys = [*r.scan_iter(f"{glob}node:*", count=500), *r.scan_iter(f"{glob}node-episodes:*", count=500),
                    f"{self.prefix}nodes", f"{self.prefix}node-log", f"{self.prefix}node-times",
                    f"{self.prefix}node-watermark"]
            n = 0
            for i in range(0, len(keys), 500):
                n += r.delete(*keys[i:i + 500])
            r.incr(f"{self.prefix}node-seq")              # the gap sends readers to a fresh snapshot
            return n
        return self._call(run)

    # -- reading

    def hosts(self) -> list[str]:
        if self._r is None:
            with self._lock:
                return sorted(h for h, eps in self._mem.items() if eps)
        return sorted(self._call(lambda: self._r.smembers(f"{self.prefix}nodes")))

    def episodes(self, host: str) -> list[Episode]:
        return self.records([host]).get(host, [])

    def records(self, hosts: Iterable[str] | None = None) -> dict[str, list[Episode]]:
        """host -> its episodes (oldest first); every host with a record when ``hosts`` is None."""
        wanted = list(self.hosts() if hosts is None else hosts)
        if self._r is None:
            with self._lock:
                raw = [list(self._mem.get(h, {}).values()) for h in wanted]
            got = {h: [Episode.model_validate_json(v) for v in values] for h, values in zip(wanted, raw)}
        else:
            got = dict(zip(wanted, self._raw(wanted)))
        out = {}
        for h, eps in got.items():
            if eps:
                out[h] = sorted(eps, key=lambda e: (e.at, e.key, e.family))
        return out

    def _raw(self, hosts: list[str]) -> list[list[Episode]]:
        r = self._r
        assert r is not None

        def run() -> list[list[str]]:
            pipe = r.pipeline(transaction=False)
            for h in hosts:
                pipe.hvals(self._node_key(h))
            return list(pipe.execute())
        return [[Episode.model_validate_json(v) for v in values] for values in self._call(run)]

    # -- following

    def changes(self, after: Position, limit: int = 5000) -> tuple[list[LogEntry], Position]:
        """The writes after ``after`` (at most ``limit``), and the position after them. Raises
        LogGap when the changelog no longer holds them all (the reader takes a snapshot)."""
        if self._r is None:
            with self._lock:
                if self._seq == after.seq:
                    return [], after
                rows = []
                for row in reversed(self._log):         # the newest last: read back to the reader
                    if row[0] <= after.seq:
                        break
                    rows.append(row)
            entries = [LogEntry(seq, key, rev, [Episode.model_validate_json(v) for v in eps])
                       for seq, key, rev, eps in rows[::-1][:limit]]
        else:
            r = self._r
            start = "-" if after.stream_id is None else f"({after.stream_id}"
            raw = self._call(lambda: r.xrange(f"{self.prefix}node-log", min=start, max="+", count=limit))
            if not raw:
                seq = int(self._call(lambda: r.get(f"{self.prefix}node-seq")) or 0)
                if seq != after.seq:
                    raise LogGap(f"the changelog is at {seq}, the reader at {after.seq}")
                return [], after
            entries = [LogEntry(int(f["s"]), f["a"], None if int(f["r"]) < 0 else int(f["r"]),
                                [Episode.model_validate_json(row[2]) for row in json.loads(f["e"])])
                       for _, f in raw]
            after = Position(after.seq, raw[-1][0])
        if not entries or entries[0].seq != after.seq + 1:
            raise LogGap(f"the reader is at {after.seq}, the changelog's oldest is "
                         f"{entries[0].seq if entries else 'past it'}")
        return entries, Position(entries[-1].seq, after.stream_id)

    def snapshot(self) -> tuple[list[LogEntry], Position]:
        """Every kept attempt (oldest episodes first) and the changelog position it reflects."""
        if self._r is None:
            with self._lock:
                raw = [v for fields in self._mem.values() for v in fields.values()]
                pos = Position(self._seq)
            by: dict[str, list[Episode]] = {}
            for v in raw:
                e = Episode.model_validate_json(v)
                by.setdefault(e.key, []).append(e)
        else:
            r = self._r
            p = self.prefix

            def head() -> list:
                pipe = r.pipeline(transaction=True)
                pipe.get(f"{p}node-seq")
                pipe.xrevrange(f"{p}node-log", count=1)
                pipe.smembers(f"{p}nodes")
                return pipe.execute()
            seq, last, hosts = self._call(head)
            pos = Position(int(seq or 0), last[0][0] if last else None)
            by = {}
            for eps in self._raw(sorted(hosts)):
                for e in eps:
                    by.setdefault(e.key, []).append(e)
        rows = sorted(by.items(), key=lambda kv: (kv[1][0].at, kv[0]))
        return [LogEntry(0, k, eps[0].revision, sorted(eps, key=lambda e: (e.host, e.family))) for k, eps in rows], pos

    def ping(self) -> bool:
        if self._r is None:
            return True
        try:
            return bool(self._r.ping())
        except Exception:
            return False


# ---------------------------------------------------------------- the report the CLI, API and pages share

def topology_from_env(path: str | None = None, env: Mapping[str, str] | None = None) -> Topology | None:
    """The topology named by ``path`` or FIRSTFAULT_TOPOLOGY; None when neither is set.
    A file that cannot be read raises TopologyError (a ValueError) naming it. The file is parsed
    once and again only when it changes (``cached_topology``): the service asks on every request."""
    from ..topology_map import cached_topology

    env = os.environ if env is None else env
    path = path or env.get("FIRSTFAULT_TOPOLOGY") or None
    return cached_topology(path, env) if path else None


def fleet_report(store: NodeHealthStore, policy: Policy | None = None, topology: Topology | None = None,
                 at: datetime | None = None, clock: Callable[[], float] = time.time) -> FleetReport:
    """The policy (FIRSTFAULT_AVOID_* unless ``policy``) over every node's record, judged at
    ``at``, by default the clock's now: never the newest episode's time, so a node's verdict
    does not move because an unrelated diagnosis arrived."""
    from .fleet_memory import FleetMemory

    memory = FleetMemory(store, clock=clock, keep_from=at)
    report, _ = memory.report(policy or Policy.from_env(os.environ), topology, at)
    return report
