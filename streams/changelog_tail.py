"""The changelog's true end, read after Faust recovered a table.

Faust recovers a table up to the high watermark a ListOffsets request reports. On the
embedded broker (Tansu) that answer can fall a few records short when records were produced
in batches (stack.md §3): the last states written before a rebalance or a crash were then
missing after it, and a workload came out diagnosed on old evidence. A fetch reports the high
watermark right, so this reads each recovered partition again from a little before the
reported end until the fetch says there is nothing more (``enable.partition.eof``) and gives
the last value per key found there; the caller puts those in the table. Keys whose last record
lies before that stretch were recovered by Faust already.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from . import kafka
from .config import StreamConfig

log = logging.getLogger("firstfault.changelog")

TAIL_RECORDS = 2000            # read again before the reported end: far more than Tansu's shortfall
IDLE_S = 0.1                   # at every partition's end, and nothing more for this long: done


def read_tail(cfg: StreamConfig, topic: str, partitions: list[int], timeout_s: float = 60.0,
              client: Any = None) -> dict[int, dict[str, bytes | None]]:
    """partition -> {key: its last value (None: deleted)} over the last records of each partition,
    up to the end a fetch reports. Keys are the table's JSON-encoded strings; values as stored."""
    if not partitions:
        return {}
    c = client or kafka.consumer(cfg, group=f"{cfg.app_id}-tail-{time.monotonic_ns()}",
                                 **{"enable.partition.eof": True})
    out: dict[int, dict[str, bytes | None]] = {p: {} for p in partitions}
    try:
        starts = []
        for p in partitions:
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10.0)
            starts.append(TopicPartition(topic, p, max(low if low >= 0 else 0, high - TAIL_RECORDS)))
        c.assign(starts)
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout_s
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            msgs = c.consume(num_messages=1000, timeout=0.2)
            if not msgs and at_end >= set(partitions) and time.monotonic() - quiet_since >= IDLE_S:
                return out
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        at_end.add(m.partition())
                    continue
                quiet_since = time.monotonic()
                at_end.discard(m.partition())
                key = m.key()
                if key is None:
                    continue
                try:
                    k = json.loads(key)
                except ValueError:
                    continue                     # not a record this table wrote
                if isinstance(k, str):
                    out[m.partition()][k] = m.value()
        raise TimeoutError(f"the end of {topic} was not reached within {timeout_s:g} s")
    finally:
        if client is None:
            c.close()
