"""The engine's public face: a bundle (or its files, or raw line records) in, a Diagnosis out.

``analyze_path`` serves the CLI, ``analyze_files`` the REST service, and
``extract_records`` + ``diagnose`` the stream; all three share one extraction and
one rule run, so they agree on the same evidence.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from firstfault.schemas import Diagnosis, WorkloadRecord
from firstfault.schemas.workload import INTAKE_EXTRA

from .bundle import Bundle, bundle_from_files, parse_workload
from .collect import fewer_collections
from .errors import AnalysisTimeout, BundleError
from .intake import Intake, open_input
from .catalog import Catalog, load_catalog
from .diagnose import diagnose
from . import fanout
from .extract import MAX_LINE, ExtractStats, Extractor, LineMemory, source_of, year_anchors_extra
from .model import Ev, EventSet
from .telemetry import (
    MetricsRead, crossing_events, crossings, line_texts, read_metrics_file, unparsed_events, wanted_lines,
)

if TYPE_CHECKING:
    from firstfault.schemas import RawLine      # the stream's records: not imported by analyze

Progress = Callable[[int, int], None]        # (bytes done, bytes total)


@dataclass
class Analysis:
    """What an analysis gives: the diagnosis, the extraction's counts and the events."""

    diagnosis: Diagnosis
    stats: ExtractStats
    events: list[Ev] = field(default_factory=list)


def inventory_from_paths(workload: WorkloadRecord, paths: Iterable[str],
                         metric_hosts: set[str] | None = None,
                         kinds: Mapping[str, str | None] | None = None) -> dict[str, Any]:
    """Which evidence exists, from the bundle paths that held at least one line.

    The offline path passes its non-empty files; the stream passes the paths its
    lines came from, so both see the same inventory.
    """
    from .extract import HostResolver

    hosts = HostResolver(workload)
    syslog_hosts, app_hosts = set(), set()
    kinds = kinds or {}
    for path in paths:
        src = source_of(path) or kinds.get(path)
        host = hosts.file_host(path, src or "app")
        if src == "syslog" and not host:
            host = hosts.sole
        if src == "syslog" and host:
            syslog_hosts.add(host)
        elif src == "app" and host:
            app_hosts.add(host)
    inv: dict[str, Any] = {"syslog_hosts": sorted(syslog_hosts), "app_hosts": sorted(app_hosts)}
    if metric_hosts is not None:
        inv["has_metrics"] = True
        inv["metric_hosts"] = sorted(metric_hosts)
    return inv


def intake_extra(intake: Intake) -> dict[str, Any]:
    """What ``analyze`` knew of a bare input beyond its lines (the file kinds it sniffed, what it
    inferred): ``ship`` puts it on the workload record so the stream diagnoses as ``analyze`` does."""
    kinds = {f.path: f.source for f in intake.bundle.files if f.source and not source_of(f.path)}
    facts = intake.facts()
    extra: dict[str, Any] = {"kinds": kinds, "facts": facts}
    if intake.year_anchors:
        extra["year_anchors"] = year_anchors_extra(intake.year_anchors)
    return {INTAKE_EXTRA: extra} if kinds or facts or intake.year_anchors else {}


def stream_inventory(workload: WorkloadRecord, paths: Iterable[str], metric_hosts: Iterable[str]) -> dict[str, Any]:
    """The inventory from what the stream saw: paths (metrics files among them) and metric hosts,
    and for a shipped bare input what its intake inferred (``intake_extra``)."""
    paths = list(paths)
    has_metrics = any(source_of(p) == "metrics" for p in paths)
    shipped = (workload.model_extra or {}).get(INTAKE_EXTRA)
    shipped = shipped if isinstance(shipped, dict) else {}
    kinds = shipped.get("kinds") if isinstance(shipped.get("kinds"), dict) else None
    inventory = inventory_from_paths(workload, [p for p in paths if source_of(p) != "metrics"],
                                     set(metric_hosts) if has_metrics else None, kinds=kinds)
    if isinstance(shipped.get("facts"), dict):
        inventory.update(shipped["facts"])
    return inventory


def _feeds(f, workload: WorkloadRecord, deadline: float | None = None, hosts: Any = None) -> bool:
    """Does this file count as evidence of the workload? Any line for an application file;
    for a node-scoped file, a line inside the evidence horizon (or one with no stamp).
    ``hosts``: the workload's HostResolver, built once by the caller (512 nodes cost 0.1 ms a build)."""
    from .diagnose import EVIDENCE_HORIZON_S, NODE_SCOPED
    from .extract import HostResolver, _whole_lines
    from .prefixes import read_head

    if not f.size:
        return False
    source = f.kind
    if source not in NODE_SCOPED:
        return True
    hosts = hosts or HostResolver(workload)
    ctx = Extractor.context_for(workload, hosts.file_host(f.path, source))
    span = timedelta(seconds=EVIDENCE_HORIZON_S)
    lo = workload.start_time - span
    hi = workload.end_time + span if workload.end_time else None
    chunks = f.open_chunks() if deadline is None else _pieces(f.open_chunks(), DEADLINE_PIECE)
    for chunk in _whole_lines(chunks):
        _check(deadline)
        for raw in chunk.split(b"\n"):
            if not raw and chunk.endswith(b"\n"):
                continue
            stamp = read_head(raw[:4096].decode("utf-8", "replace"), ctx).stamp
            if stamp is None or (stamp >= lo and (hi is None or stamp <= hi)):
                return True
            if hi is not None and stamp > hi:
                return False
    return False


def _inventory(bundle: Bundle, metric_hosts: set[str] | None = None,
               deadline: float | None = None) -> dict[str, Any]:
    from .extract import HostResolver

    hosts = HostResolver(bundle.workload)
    paths = [f.path for f in bundle.files if f.kind != "metrics" and _feeds(f, bundle.workload, deadline, hosts)]
    has_metrics = any(f.kind == "metrics" and f.size for f in bundle.files)
    if has_metrics and metric_hosts is None:
        metric_hosts = set()               # metrics files without a readable sample name no host
    return inventory_from_paths(bundle.workload, paths, metric_hosts if has_metrics else None,
                                kinds={f.path: f.kind for f in bundle.files})


def metrics_window(workload: WorkloadRecord) -> tuple[Any, Any]:
    """Samples that count for a workload: those within the node-scoped evidence horizon."""
    from .diagnose import EVIDENCE_HORIZON_S

    span = timedelta(seconds=EVIDENCE_HORIZON_S)
    return workload.start_time - span, (workload.end_time + span if workload.end_time else None)


def metric_events(workload: WorkloadRecord, read: MetricsRead,
                  open_file: Callable[[str], Iterable[bytes]]) -> list[Ev]:
    """Threshold crossings (one event each) and unreadable lines of the metrics files read.

    ``open_file(path)`` gives a metrics file's bytes again: only the crossing lines' text is
    kept, read in a second pass.
    """
    from .extract import HostResolver

    found = crossings(read, born_after=workload.start_time)
    texts: dict[tuple[str, int], str] = {}
    for path, lines in sorted(wanted_lines(found).items()):
        texts.update({(path, n): t for n, t in line_texts(open_file(path), lines).items()})
    return crossing_events(found, texts, HostResolver(workload).node) + unparsed_events(read)


@fewer_collections
def analyze_bundle(bundle: Bundle, catalog: Catalog | None = None, progress: Progress | None = None,
                   keep_events: bool = False, intake: Intake | None = None,
                   deadline: float | None = None, jobs: int = 1) -> Analysis:
    """``deadline`` (a ``time.monotonic()`` value) stops the work between chunks with
    AnalysisTimeout: a chunk is bounded work (linear-time matching), so the stop is prompt.
    ``jobs`` > 1 lets a big bundle's log files be read in that many forked processes
    (rules/fanout.py: the same diagnosis); only for a caller that runs no other thread."""
    catalog = catalog or load_catalog()
    extractor = Extractor(catalog, bundle.workload, year_anchors=intake.year_anchors if intake is not None else None)
    events = EventSet()
    stats = ExtractStats()
    total = bundle.total_bytes
    done = 0

    def step(n: int) -> None:
        nonlocal done
        done += n
        _check(deadline)
        if progress is not None:
            progress(done, total)

    def chunks(f: Any) -> Iterable[bytes]:
        # With a deadline, smaller pieces: the check runs once a piece (the result is split-independent).
        return f.open_chunks() if deadline is None else _pieces(f.open_chunks(), DEADLINE_PIECE)

    logs = [f for f in bundle.files if f.kind != "metrics"]
    read = None
    if fanout.worth_it(logs, jobs):
        read = fanout.read_in_parallel(catalog, bundle.workload, logs, jobs, chunks, step, deadline,
                                       year_anchors=intake.year_anchors if intake is not None else None)
        if read is None:
            done = 0                        # read again below: the bytes are counted again
    if read is not None:
        events, per_file = read[0], iter(read[1])      # each log file's counts, in bundle order
    metrics = MetricsRead()
    lo, hi = metrics_window(bundle.workload)
    for f in bundle.files:
        if f.kind == "metrics":
            # One sample a line: series -> threshold crossings, after every file is read.
            read_metrics_file(f.path, chunks(f), bundle.workload.zone, metrics, lo, hi, progress=step)
            continue
        if read is not None:
            stats.absorb(next(per_file))
            continue
        stats.absorb(extractor.scan_file(f.path, chunks(f), events, progress=step, source=f.kind))
    if metrics.lines:
        opener = {f.path: f.open_chunks for f in bundle.files if f.kind == "metrics"}
        found = metric_events(bundle.workload, metrics, lambda path: opener[path]())
        for ev in found:
            events.add(ev)
        crossed = sum(1 for ev in found if ev.kind != "unparsed")
        stats.absorb(ExtractStats(files=len(opener), lines=metrics.lines, candidates=crossed, matched=crossed,
                                  unparsed=sum(metrics.unparsed.values()),
                                  unparsed_refs=[(p, n) for p, n, _, _ in sorted(metrics.bad)[:10]]))
    _check(deadline)
    evs = events.sorted()
    if intake is not None and intake.inferred and stats.lines == 0 and not metrics.lines:
        # No scheduler record and no line: nothing to diagnose (a record alone still is evidence).
        raise BundleError("nothing could be read: every log file is empty"
                          + (f" ({'; '.join(intake.warnings)})" if intake.warnings else ""))
    inventory = _inventory(bundle, metrics.hosts if metrics.lines else None, deadline)
    if intake is not None:
        inventory.update(intake.facts())
    diagnosis = diagnose(bundle.workload, evs, catalog, inventory, owned=not keep_events)
    return Analysis(diagnosis=diagnosis, stats=stats, events=evs if keep_events else [])


DEADLINE_PIECE = 1024 * 1024     # dense candidate lines cost ~1 s a MiB: the deadline's granularity


def _pieces(chunks: Iterable[bytes], size: int) -> Iterator[bytes]:
    for chunk in chunks:
        for i in range(0, len(chunk), size):
            yield chunk[i:i + size]


def _check(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise AnalysisTimeout("the analysis passed its deadline and was stopped")


def analyze_path(path: str | Path, rules: str | Path | None = None, progress: Progress | None = None,
                 warn: Callable[[str], None] | None = None, deadline: float | None = None,
                 max_archive_bytes: int | None = None, jobs: int = 1) -> Analysis:
    """Diagnose what a user has: a bundle (directory or archive), one log file, or a folder of
    logs in any layout. Raises BundleError for an unusable input; ``warn`` hears of skipped files.
    ``max_archive_bytes`` caps an archive's expansion (default: FIRSTFAULT_MAX_ARCHIVE_BYTES, 1 GiB);
    ``jobs``: see analyze_bundle."""
    intake = open_input(path, max_archive_bytes=max_archive_bytes)
    for message in intake.warnings:
        if warn is not None:
            warn(message)
    return analyze_bundle(intake.bundle, load_catalog(rules), progress, intake=intake, deadline=deadline,
                          jobs=jobs)


def analyze_files(workload: Mapping[str, Any] | WorkloadRecord, files: Mapping[str, bytes | str],
                  rules: str | Path | None = None, catalog: Catalog | None = None,
                  deadline: float | None = None) -> Analysis:
    """Diagnose in-memory evidence: the workload record and files keyed by bundle path."""
    wl = workload if isinstance(workload, WorkloadRecord) else parse_workload(workload)
    return analyze_bundle(bundle_from_files(wl, files), catalog or load_catalog(rules), deadline=deadline)


def extract_records(extractor: Extractor, records: Iterable[RawLine], events: EventSet,
                    stats: ExtractStats | None = None, memory: LineMemory | None = None) -> ExtractStats:
    """Stream path: extract raw line records (in arrival order) into ``events``.

    ``memory`` keeps the last lines of each file across calls so an unstamped line
    inherits a stamp exactly as it does offline; pass the same one for every batch.
    """
    stats = stats or ExtractStats()
    memory = memory if memory is not None else LineMemory()
    for rec in records:
        stats.lines += 1
        source = rec.source or source_of(rec.path) or "app"
        # Only the first MAX_LINE bytes are matched (the reader flags the line as cut).
        raw = rec.text.encode("utf-8", errors="surrogateescape")[:MAX_LINE + 1]
        hits = extractor.prefilter.scan(raw)
        if hits:
            stats.candidates += 1
            file_host = extractor.hosts.file_host(rec.path, source)
            ev = extractor.read_line(rec.path, source, file_host, extractor.context(file_host, rec.path), rec.line, raw,
                                     hits[0], lambda r=rec: memory.above(r.path, r.line), stats)
            if ev is not None:
                stats.matched += 1
                events.add(ev)
        memory.add(rec.path, rec.line, rec.text)
    return stats
