"""The correlator's input positions: what it has merged is below them, whatever order a window's
batches are handled in (the extractors' progress reports count on it).

In process: the correlator of ``make_app``, never started (its broker address is never dialled);
the records are real EventBatches, its table is Faust's memory store, and only the changelog send
is left out.
"""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from firstfault.schemas import EventBatch
from firstfault.schemas.avro import encode
from firstfault.streams.config import StreamConfig
from firstfault.streams.correlator import make_app


def _record(topic: str, offset: int, workload_id: str) -> SimpleNamespace:
    batch = EventBatch(workload_id=workload_id, attempt=0, events=[])
    return SimpleNamespace(topic=topic, partition=1, offset=offset, timestamp=0, key=workload_id.encode(),
                           value=encode(batch))


def test_a_window_handled_workload_by_workload_counts_up_to_its_highest_offset(tmp_path):
    cfg = StreamConfig(bootstrap="127.0.0.1:9", prefix="positions.", partitions=2, app_id="positions-correlator")
    core = make_app(cfg).correlator
    core.table.send_changelog = lambda *args, **kwargs: None
    topic = cfg.topic("events")
    # Offsets 76 (a), 77 (b), 78 (a): merged as a's group [76, 78], then b's [77].
    window = [_record(topic, 76, "a"), _record(topic, 77, "b"), _record(topic, 78, "a")]
    asyncio.run(core.on_batches(window))
    assert core._events_position(1) == 79
    # A record handled again (re-delivery) does not move the position back.
    asyncio.run(core.on_batches([_record(topic, 70, "b")]))
    assert core._events_position(1) == 79
