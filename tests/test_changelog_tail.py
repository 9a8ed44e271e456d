"""The changelog's true end after recovery (issue 26, part 3), on the embedded broker.

Faust recovers a table only up to the end a ListOffsets answer gives, which Tansu can give a
few records short when they were produced in batches; ``read_tail`` reads on until a fetch
says the partition holds nothing more.
"""
from __future__ import annotations

import json
import uuid

from firstfault.streams import kafka, state_codec
from firstfault.streams.changelog_tail import TAIL_RECORDS, read_tail
from firstfault.streams.config import StreamConfig

pytest_plugins = ["conftest_kafka"]


def test_the_last_value_of_every_key_near_the_end_and_deletions(kafka_bootstrap):
    cfg = StreamConfig(bootstrap=kafka_bootstrap, prefix=f"tail-{uuid.uuid4().hex[:8]}.", partitions=2)
    topic = cfg.topic("workloads-changelog")
    kafka.ensure_topics(cfg, [topic])
    prod = kafka.producer(cfg, **{"linger.ms": 50})          # batched, as Faust's producer sends them
    last: dict[tuple[int, str], bytes | None] = {}
    n = TAIL_RECORDS + 500
    for i in range(n):
        p, key = i % 2, f"w-{i % 7}:0"
        value = state_codec.encode(json.dumps({"i": i}))
        prod.produce(topic, key=json.dumps(key).encode(), value=value, partition=p)
        last[(p, key)] = value
    prod.produce(topic, key=json.dumps("w-3:0").encode(), value=None, partition=1)     # a deletion
    last[(1, "w-3:0")] = None
    prod.produce(topic, key=b"not json", value=b"x", partition=0)                      # not the table's: skipped
    prod.flush(10)
    got = read_tail(cfg, topic, [0, 1], timeout_s=60)
    assert set(got) == {0, 1}
    assert {(p, k): v for p, kv in got.items() for k, v in kv.items()} == last
    assert read_tail(cfg, topic, []) == {}
