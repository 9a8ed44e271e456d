"""The fleet memory's store: each node's episodes, in Redis under FIRSTFAULT_REDIS_PREFIX.

Layout (the free-form part last, as in the diagnoses store):

* ``{prefix}node:{host}``: a hash, field ``{family}:{attempt}:{workload_id}`` -> the episode (JSON);
* ``{prefix}nodes``: the set of hosts with a record;
* ``{prefix}node-episodes:{attempt}:{workload_id}``: which fields that attempt wrote and at
  which stream revision, so a later revision replaces them and a late, lower one is ignored.

Everything here is derived from diagnoses: ``firstfault nodes --rebuild`` clears it and reads
the diagnoses topic from the beginning. Without a Redis URL the record lives in this process.
"""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Mapping
from datetime import datetime

from firstfault.rules.fleet import Episode, FleetReport, Policy, Topology, episodes_from, evaluate
from firstfault.schemas import Diagnosis

from .redis_store import StoreUnavailable

# KEYS: attempt key, nodes set. ARGV: revision (-1: none), node key prefix, [[host, field, episode]...]
_RECORD_LUA = """
local new_rev = tonumber(ARGV[1])
local cur = redis.call('HGET', KEYS[1], 'rev')
if cur then
  local c = tonumber(cur)
  if new_rev >= 0 and c >= 0 and new_rev < c then return 0 end
end
local old = redis.call('HGET', KEYS[1], 'fields')
if old then
  for _, hf in ipairs(cjson.decode(old)) do redis.call('HDEL', ARGV[2] .. hf[1], hf[2]) end
end
local keep = {}
for _, e in ipairs(cjson.decode(ARGV[3])) do
  redis.call('HSET', ARGV[2] .. e[1], e[2], e[3])
  redis.call('SADD', KEYS[2], e[1])
  table.insert(keep, {e[1], e[2]})
end
redis.call('HSET', KEYS[1], 'rev', ARGV[1], 'fields', #keep > 0 and cjson.encode(keep) or '[]')
return 1
"""


def _field(e: Episode) -> str:
    return f"{e.family}:{e.attempt}:{e.workload_id}"


class NodeHealthStore:
    """Episodes per node. ``NodeHealthStore(None)`` keeps them in this process."""

    def __init__(self, redis_url: str | None, prefix: str = "firstfault:") -> None:
        self.prefix = prefix
        self._lock = threading.Lock()
        self._mem: dict[str, dict[str, str]] = {}            # host -> field -> episode
        self._attempts: dict[str, tuple[int, list[tuple[str, str]]]] = {}
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
        kept ([] for a provisional, a late lower revision, or a diagnosis blaming no node)."""
        if d.provisional:
            return []
        eps = episodes_from(d, fallback_at)
        rev = -1 if d.revision is None else d.revision
        rows = [[e.host, _field(e), e.model_dump_json()] for e in eps]
        attempt_key = f"{self.prefix}node-episodes:{d.attempt}:{d.workload_id}"
        if self._r is not None:
            script = self._script
            done = self._call(lambda: script(keys=[attempt_key, f"{self.prefix}nodes"],
                                             args=[rev, f"{self.prefix}node:", json.dumps(rows)]))
            return eps if done else []
        with self._lock:
            cur = self._attempts.get(attempt_key)
            if cur is not None and rev >= 0 and cur[0] >= 0 and rev < cur[0]:
                return []
            for host, field in (cur[1] if cur else []):
                self._mem.get(host, {}).pop(field, None)
            for host, field, value in rows:
                self._mem.setdefault(host, {})[field] = value
            self._attempts[attempt_key] = (rev, [(h, f) for h, f, _ in rows])
        return eps

    def clear(self) -> int:
        """Forget every record (before a rebuild); returns the keys deleted."""
        if self._r is None:
            with self._lock:
                n = len(self._mem) + len(self._attempts)
                self._mem.clear()
                self._attempts.clear()
            return n
        r = self._r
        glob = "".join(f"[{c}]" if c in "*?[]\\" else c for c in self.prefix)

        def run() -> int:
            keys = [*r.scan_iter(f"{glob}node:*", count=500), *r.scan_iter(f"{glob}node-episodes:*", count=500),
                    f"{self.prefix}nodes"]
            n = 0
            for i in range(0, len(keys), 500):
                n += r.delete(*keys[i:i + 500])
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
        else:
            r = self._r

            def run() -> list[list[str]]:
                pipe = r.pipeline(transaction=False)
                for h in wanted:
                    pipe.hvals(self._node_key(h))
                return list(pipe.execute())
            raw = self._call(run)
        out = {}
        for h, values in zip(wanted, raw):
            eps = sorted((Episode.model_validate_json(v) for v in values), key=lambda e: (e.at, e.key, e.family))
            if eps:
                out[h] = eps
        return out

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
    A file that cannot be read raises TopologyError (a ValueError) naming it."""
    from ..topology_map import load_topology

    env = os.environ if env is None else env
    path = path or env.get("FIRSTFAULT_TOPOLOGY") or None
    return load_topology(path) if path else None


def fleet_report(store: NodeHealthStore, policy: Policy | None = None, topology: Topology | None = None,
                 at: datetime | None = None) -> FleetReport:
    """The policy evaluated over every node's record (FIRSTFAULT_AVOID_* unless ``policy``)."""
    return evaluate(store.records(), policy or Policy.from_env(os.environ), topology, at)
