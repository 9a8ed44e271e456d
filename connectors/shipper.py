"""``firstfault ship PATH``: publish a bundle as a cluster would produce it.

The scheduler start goes first, then every host's lines on its key in order
(Avro ``RawLine`` with the bundle path and line number, so references match the
offline path; application lines and metrics samples name their workload, node-scoped
lines do not and are routed by the extractor's allocation timeline), then the scheduler end.
``--rate`` paces lines per second; the default is as fast as possible.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath

from firstfault.rules.bundle import open_bundle
from firstfault.rules.extract import HostResolver, source_of
from firstfault.schemas import RawLine, SchedulerEvent, WorkloadRecord
from firstfault.schemas.avro import encode
from firstfault.streams import kafka
from firstfault.streams.config import StreamConfig


@dataclass
class ShipStats:
    lines: int = 0
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0


def start_record(workload: WorkloadRecord) -> WorkloadRecord:
    """What the scheduler knows at start: the allocation, not the outcome."""
    data = workload.model_dump(mode="json")
    data.update(state="RUNNING", end_time=None, exit_code=None)
    return WorkloadRecord.model_validate(data)


def scheduler_message(kind: str, workload: WorkloadRecord) -> bytes:
    ts = workload.start_time if kind == "start" else (workload.end_time or datetime.now(timezone.utc))
    rec = start_record(workload) if kind == "start" else workload
    return encode(SchedulerEvent(type=kind, workload=rec, ts=ts))


def bundle_records(path: str | Path, only: Callable[[str], bool] | None = None
                   ) -> tuple[WorkloadRecord, list[tuple[str, RawLine]]]:
    """(workload, [(key, RawLine)]) in shipping order: file by file, line by line."""
    bundle = open_bundle(path)
    wl = bundle.workload
    hosts = HostResolver(wl)
    out: list[tuple[str, RawLine]] = []
    for f in bundle.files:
        source = source_of(f.path)
        if source is None or (only is not None and not only(f.path)):
            continue
        # Metrics samples name their hosts themselves; the file is the workload's.
        host = None if source == "metrics" else hosts.file_host(f.path, source) or PurePosixPath(f.path).stem
        data = b"".join(f.open_chunks())
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        for n, raw in enumerate(lines, 1):
            rec = RawLine(host=host, path=f.path, line=n, text=raw.decode("utf-8", "surrogateescape").rstrip("\r"),
                          source=source, workload_id=wl.workload_id if source in ("app", "metrics") else None)
            out.append((host or wl.workload_id, rec))
    return wl, out


def ship(path: str | Path, cfg: StreamConfig, rate: float | None = None, end: bool = True,
         progress: Callable[[int, int], None] | None = None, start: bool = True,
         only: Callable[[str], bool] | None = None) -> ShipStats:
    """Publish the bundle; ``only`` selects files by path, ``start``/``end`` the scheduler events
    (a late file is shipped on its own with both off)."""
    from firstfault.connectors.sinks.offset_index import OffsetIndex

    wl, records = bundle_records(path, only)
    prod = kafka.producer(cfg)
    index = OffsetIndex(cfg.redis_url, cfg.prefix)       # replay's time -> offset index (no-op without Redis)

    def delivered(err, msg) -> None:
        if err is None:
            index.note_message(msg)

    stats = ShipStats(files=len({r.path for _, r in records}))
    t0 = time.monotonic()
    if start:
        prod.produce(cfg.topic("scheduler"), key=wl.workload_id.encode(), value=scheduler_message("start", wl),
                     on_delivery=delivered)
        prod.flush(30)
    for i, (key, rec) in enumerate(records, 1):
        value = encode(rec)
        while True:
            try:
                prod.produce(cfg.topic("raw"), key=key.encode(), value=value, on_delivery=delivered)
                break
            except BufferError:
                prod.poll(0.05)
        stats.lines += 1
        stats.bytes += len(value)
        if rate:
            ahead = i / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
        if i % 10000 == 0:
            prod.poll(0)
            if progress:
                progress(i, len(records))
    prod.flush(60)
    if end:
        prod.produce(cfg.topic("scheduler"), key=wl.workload_id.encode(), value=scheduler_message("end", wl),
                     on_delivery=delivered)
        prod.flush(30)
    index.close()
    if progress:
        progress(len(records), len(records))
    stats.seconds = time.monotonic() - t0
    return stats
