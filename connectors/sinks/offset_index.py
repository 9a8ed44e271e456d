"""A time -> offset index in Redis, for brokers whose own time index cannot be trusted.

Tansu answers ``offsets_for_times`` from broker append time per batch and returns
offset 0 for records stamped in the past (stack.md §1), so ``firstfault replay``
cannot seek by time there. The pipeline notes, for every (topic, partition, hour),
the FIRST offset it saw; a reader starts from the smallest noted offset of the
hour containing ``since`` or any later hour and filters on the record timestamp.
Taking the minimum over later hours too keeps the start safe when producer clocks
put a later offset in an earlier hour.

Layout: one sorted set per topic, ``{redis_prefix}offset-index:{topic}``, member
``"{partition}:{bucket}"``, score = first offset. ``ZADD LT`` keeps the minimum
across processes and restarts without a script. The key starts with
``FIRSTFAULT_REDIS_PREFIX`` like every key firstfault writes (two deployments
can share a Redis), and names the full topic (its topic prefix included).

``note()`` is a dict update; ``flush()`` sends only what is new (in steady state one
member per partition per hour) in one pipeline, and never raises: an index outage
must not stop the extractor, it only makes a later replay scan more.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

import redis

if TYPE_CHECKING:
    from firstfault.streams.config import StreamConfig

log = logging.getLogger("firstfault.offset_index")

HOUR_MS = 3_600_000


class OffsetIndex:
    """First offset per (topic, partition, time bucket); disabled when ``redis_url`` is None."""

    def __init__(self, redis_url: str | None, prefix: str = "firstfault:", bucket_ms: int = HOUR_MS,
                 flush_interval_s: float = 1.0) -> None:
        self.prefix = prefix
        self.bucket_ms = bucket_ms
        self.flush_interval_s = flush_interval_s
        self._redis = redis.Redis.from_url(redis_url, socket_timeout=2, socket_connect_timeout=2) \
            if redis_url else None
        # (topic, partition, bucket) -> first offset: not yet sent / what Redis already holds (or lower)
        self._dirty: dict[tuple[str, int, int], int] = {}
        self._sent: dict[tuple[str, int, int], int] = {}
        self._next_flush = time.monotonic() + flush_interval_s
        self._failures = 0

    @classmethod
    def for_config(cls, cfg: StreamConfig, **kwargs) -> OffsetIndex:
        """The index of a ``StreamConfig``: its Redis (None: disabled) under its Redis key prefix."""
        return cls(cfg.redis_url, cfg.redis_prefix, **kwargs)

    @property
    def enabled(self) -> bool:
        return self._redis is not None

    def key(self, topic: str) -> str:
        return f"{self.prefix}offset-index:{topic}"

    # ------------------------------------------------------------ writing
    def note(self, topic: str, partition: int, offset: int, timestamp_ms: int | None) -> None:
        """Remember ``offset`` if it is the first seen in its hour; flushes at most once a second."""
        if self._redis is None or timestamp_ms is None or timestamp_ms <= 0 or offset < 0:
            return
        key = (topic, partition, timestamp_ms // self.bucket_ms)
        sent = self._sent.get(key)
        if sent is not None and sent <= offset:
            return                                        # the common case: one dict lookup
        have = self._dirty.get(key)
        if have is None or offset < have:
            self._dirty[key] = offset
        if time.monotonic() >= self._next_flush:
            self.flush()

    def note_message(self, msg) -> None:
        """``note`` for a confluent-kafka Message (consumed, or from a delivery report)."""
        ts_type, ts = msg.timestamp()
        self.note(msg.topic(), msg.partition(), msg.offset(), ts if ts_type else None)

    def flush(self) -> bool:
        """Send what is new in one pipeline; False (and kept for the next try) if Redis failed."""
        self._next_flush = time.monotonic() + self.flush_interval_s * (1 + min(self._failures, 30))
        if self._redis is None or not self._dirty:
            return True
        dirty, self._dirty = self._dirty, {}
        by_topic: dict[str, dict[str, int]] = {}
        for (topic, part, bucket), off in dirty.items():
            by_topic.setdefault(topic, {})[f"{part}:{bucket}"] = off
        try:
            pipe = self._redis.pipeline(transaction=False)
            for topic, members in by_topic.items():
                pipe.zadd(self.key(topic), members, lt=True)
            pipe.execute()
        except redis.RedisError as exc:
            self._failures += 1
            if self._failures in (1, 10) or self._failures % 100 == 0:
                log.warning("offset index: Redis write failed (%s); %d attempts so far", exc, self._failures)
            for key, off in dirty.items():            # merge back, keeping minima
                if key not in self._dirty or off < self._dirty[key]:
                    self._dirty[key] = off
            return False
        self._failures = 0
        self._sent.update(dirty)
        if len(self._sent) > 100_000:        # long-lived workers: forget old hours (Redis keeps the minima)
            self._sent.clear()
        return True

    def close(self) -> None:
        self.flush()
        if self._redis is not None:
            self._redis.close()

    # ------------------------------------------------------------ reading
    def entries(self, topic: str) -> dict[int, dict[int, int]]:
        """partition -> bucket -> first offset, as stored."""
        if self._redis is None:
            return {}
        out: dict[int, dict[int, int]] = {}
        for member, score in self._redis.zrange(self.key(topic), 0, -1, withscores=True):
            part, bucket = (member.decode() if isinstance(member, bytes) else member).split(":", 1)
            out.setdefault(int(part), {})[int(bucket)] = int(score)
        return out

    def start_offsets(self, topic: str, since_ms: int) -> dict[int, int]:
        """partition -> an offset at or before the first record stamped at or after ``since_ms``.

        Partitions with nothing noted at or after ``since`` are left out: the caller
        starts those from the beginning (0), which is always safe.
        """
        since_bucket = since_ms // self.bucket_ms
        out: dict[int, int] = {}
        for part, buckets in self.entries(topic).items():
            later = [off for b, off in buckets.items() if b >= since_bucket]
            if later:
                out[part] = min(later)
        return out

    def forget(self, topics: Iterable[str]) -> None:
        """Drop the index of these topics (tests, or a topic recreated from scratch)."""
        if self._redis is not None:
            self._redis.delete(*[self.key(t) for t in topics])
