"""``firstfault ship PATH``: publish a bundle as a cluster would produce it. PATH is anything
``analyze`` takes (a bundle, an archive, a bare log file or folder): the same intake reads it.

The scheduler start goes first, then every host's lines on its key in order
(Avro ``RawLine`` with the bundle path and line number, so references match the
offline path; application lines, metrics samples and scheduler logs name their workload,
node-scoped lines of the job's nodes do not and are routed by the extractor's allocation
timeline), then the scheduler end. Every file of the bundle travels: ``analyze`` and the
stream read the same lines. ``ship_many`` sends many bundles with one producer.
``--rate`` paces lines per second; the default is as fast as possible.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath

from firstfault.rules.errors import FirstfaultError
from firstfault.rules.extract import Extractor, HostResolver, source_of
from firstfault.rules.engine import intake_extra
from firstfault.rules.intake import open_input
from firstfault.rules.prefixes import read_head
from firstfault.schemas import RawLine, SchedulerEvent, WorkloadRecord
from firstfault.schemas.avro import encode
from firstfault.streams import kafka
from firstfault.streams.config import StreamConfig


class ShipError(FirstfaultError):
    """Records the broker did not confirm: it is gone, or did not answer in time."""


def confirm(prod, timeout: float, cfg: StreamConfig, gone: Callable[[], str | None] | None = None) -> None:
    """Wait for the broker to confirm every record sent; in one-second steps, so a broker known to be
    gone (``gone`` says why) fails the shipment at once instead of at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        left = prod.flush(max(0.0, min(1.0, deadline - time.monotonic())))
        if not left:
            return
        why = gone() if gone is not None else None
        if why:
            raise ShipError(f"{left} record(s) not delivered: {why}")
        if time.monotonic() >= deadline:
            raise ShipError(f"{left} record(s) not confirmed by the broker at {cfg.bootstrap} within {timeout:.0f} s")


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


def names_workload(source: str, host: str | None, workload: WorkloadRecord) -> bool:
    """Does a line of this bundle file carry the workload id, or is it routed by host and time?

    Application output, metrics samples and scheduler logs (slurmctld lines, ``kubectl get
    events``) are the workload's own. A node's syslog or Fabric Manager log is routed by the
    allocation timeline to every attempt on that node, as a node's shipper's lines are; except
    a node the job never held, which no allocation claims: the bundle names it as this
    workload's evidence, so it goes to this workload (``analyze`` reads it and scopes it out).
    """
    if source not in ("syslog", "fabricmanager"):
        return True
    return host not in workload.nodes


def bundle_records(path: str | Path, only: Callable[[str], bool] | None = None,
                   warn: Callable[[str], None] | None = None) -> tuple[WorkloadRecord, list[tuple[str, RawLine]]]:
    """(workload, [(key, RawLine)]) in shipping order: file by file, line by line. ``path`` is what
    ``analyze`` takes (a bundle, an archive, one log file, a folder of logs in any layout): the same
    intake gives the same workload record, so the stream's diagnosis is analyze's; ``warn`` hears
    of the files it skipped."""
    intake = open_input(path)
    for message in intake.warnings:
        if warn is not None:
            warn(message)
    bundle = intake.bundle
    wl = bundle.workload
    if extra := intake_extra(intake):
        wl = WorkloadRecord.model_validate({**wl.model_dump(), **(wl.model_extra or {}), **extra})
    hosts = HostResolver(wl)
    out: list[tuple[str, RawLine]] = []
    for f in bundle.files:
        source = f.kind                      # from its path, else as the intake sniffed it
        if source is None or (only is not None and not only(f.path)):
            continue
        # Metrics samples name their hosts themselves; the file is the workload's.
        host = None if source == "metrics" else hosts.file_host(f.path, source) or PurePosixPath(f.path).stem
        data = b"".join(f.open_chunks())
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        wid = wl.workload_id if names_workload(source, host, wl) else None
        # Lines routed by host and time say when they were written, as a node's shipper reading
        # them live would: their stamp read as ``analyze`` reads it (the year of a syslog stamp
        # from the workload's start), else the last stamp above, else the start.
        ctx = Extractor.context_for(wl, host) if wid is None else None
        written = wl.start_time
        for n, raw in enumerate(lines, 1):
            text = raw.decode("utf-8", "surrogateescape").rstrip("\r")
            if ctx is not None:
                written = read_head(text[:4096], ctx).stamp or written
            rec = RawLine(host=host, path=f.path, line=n, text=text, source=source, workload_id=wid,
                          ingest_ts=written if ctx is not None else None)
            out.append((host or wl.workload_id, rec))
    return wl, out


def ship(path: str | Path, cfg: StreamConfig, rate: float | None = None, end: bool = True,
         progress: Callable[[int, int], None] | None = None, start: bool = True,
         only: Callable[[str], bool] | None = None, gone: Callable[[], str | None] | None = None,
         warn: Callable[[str], None] | None = None) -> ShipStats:
    """Publish the bundle; ``only`` selects files by path, ``start``/``end`` the scheduler events
    (a late file is shipped on its own with both off); ``gone``: why the broker is known to be gone
    (None while it is not), checked while waiting for confirmations (:func:`confirm`)."""
    from firstfault.connectors.sinks.offset_index import OffsetIndex

    wl, records = bundle_records(path, only, warn)
    prod = kafka.producer(cfg)
    index = OffsetIndex.for_config(cfg)       # replay's time -> offset index (no-op without Redis)

    def delivered(err, msg) -> None:
        if err is None:
            index.note_message(msg)

    stats = ShipStats(files=len({r.path for _, r in records}))
    t0 = time.monotonic()
    if start:
        prod.produce(cfg.topic("scheduler"), key=wl.workload_id.encode(), value=scheduler_message("start", wl),
                     on_delivery=delivered)
        confirm(prod, 30, cfg, gone)
    for i, (key, rec) in enumerate(records, 1):
        value = encode(rec)
        while True:
            try:
                prod.produce(cfg.topic("raw"), key=key.encode(), value=value, on_delivery=delivered)
                break
            except BufferError:
                prod.poll(0.05)
                if gone is not None and (why := gone()):
                    raise ShipError(f"{len(prod)} record(s) not delivered: {why}") from None
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
    confirm(prod, 60, cfg, gone)
    if end:
        prod.produce(cfg.topic("scheduler"), key=wl.workload_id.encode(), value=scheduler_message("end", wl),
                     on_delivery=delivered)
        confirm(prod, 30, cfg, gone)
    index.close()
    if progress:
        progress(len(records), len(records))
    stats.seconds = time.monotonic() - t0
    return stats


def ship_many(paths: list[str | Path], cfg: StreamConfig, gone: Callable[[], str | None] | None = None) -> ShipStats:
    """Publish many bundles with one producer: every start, then every bundle's lines, then every end.

    Each flush waits for the broker, so one per phase instead of three per bundle (a test or a
    backfill of hundreds of bundles). The bundles must not share a node at a time unless they
    are meant to: node-scoped lines go to every attempt on the node.
    """
    from firstfault.connectors.sinks.offset_index import OffsetIndex

    bundles = [bundle_records(p) for p in paths]
    prod = kafka.producer(cfg)
    index = OffsetIndex.for_config(cfg)

    def delivered(err, msg) -> None:
        if err is None:
            index.note_message(msg)

    def send(topic: str, key: str, value: bytes) -> None:
        while True:
            try:
                prod.produce(topic, key=key.encode(), value=value, on_delivery=delivered)
                return
            except BufferError:
                prod.poll(0.05)
                if gone is not None and (why := gone()):
                    raise ShipError(f"{len(prod)} record(s) not delivered: {why}") from None

    def flush(timeout: float) -> None:
        confirm(prod, timeout, cfg, gone)

    stats = ShipStats(files=sum(len({r.path for _, r in records}) for _, records in bundles))
    t0 = time.monotonic()
    for wl, _ in bundles:
        send(cfg.topic("scheduler"), wl.workload_id, scheduler_message("start", wl))
    flush(30)
    for _, records in bundles:
        for key, rec in records:
            value = encode(rec)
            send(cfg.topic("raw"), key, value)
            stats.lines += 1
            stats.bytes += len(value)
    flush(60)
    for wl, _ in bundles:
        send(cfg.topic("scheduler"), wl.workload_id, scheduler_message("end", wl))
    flush(30)
    index.close()
    stats.seconds = time.monotonic() - t0
    return stats
