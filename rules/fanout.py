"""A big bundle's log files read in several processes: the serial read's events, sooner.

What a file yields depends on that file and the workload record alone: stamps are inherited
within a file, scopes and stated times are kept per file, the host map comes from the record,
and the extractor's memos only remember answers. Merging events is associative and
commutative (``Ev.merge``: the sample is the earliest occurrence in a total order). So the
files can be read apart and merged afterwards, giving the events a serial read gives, byte for
byte when merged in file order (tests/test_fanout.py checks every sample and every corpus
input of several files).

Processes are forked, so the loaded catalog and the bundle are shared, not pickled; only each
group's events and per-file counts come back, through a pipe. A group that fails in any way (a
file that cannot be read, a child killed) makes the caller read serially, where the same error
is raised as it would have been. Only the CLI asks for this (``firstfault analyze --jobs``):
forking a process that runs threads, as the service does, is unsafe.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from .bundle import BundleFile
from .catalog import Catalog
from .errors import AnalysisTimeout
from .extract import ExtractStats, Extractor
from .model import Ev, EventSet

MIN_BYTES = 16 * 1024 * 1024       # below this a fork and the events' trip back cost more than they save
MAX_JOBS = 8

# What the forked children read: set just before they fork, cleared after.
_SHARED: dict[str, Any] = {}


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask: one under ``taskset -c 0``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def worth_it(files: list[BundleFile], jobs: int) -> bool:
    if jobs < 2 or len(files) < 2 or sum(f.size for f in files) < MIN_BYTES:
        return False
    import multiprocessing              # not at import: a small input's analyze never needs it

    return "fork" in multiprocessing.get_all_start_methods()


def groups(files: list[BundleFile], jobs: int) -> list[list[int]]:
    """The files' indices in ``jobs`` groups of about equal bytes (largest first to the lightest
    group, ties to the lower index): the same split for the same files."""
    order = sorted(range(len(files)), key=lambda i: (-files[i].size, i))
    load = [0] * min(jobs, len(files))
    out: list[list[int]] = [[] for _ in load]
    for i in order:
        g = min(range(len(load)), key=lambda k: (load[k], k))
        out[g].append(i)
        load[g] += files[i].size
    return [sorted(g) for g in out if g]


def _read_group(indices: list[int]) -> list[tuple[int, list[tuple], ExtractStats]]:
    """In a child: read these files as the serial loop would; each file's events and counts.

    Each file's events are kept apart, to be merged in file order as the serial read merges
    them: merging is commutative but for ties (two equal instants written with two offsets,
    where the first merged is kept), so only the same order is sure to give the same bytes."""
    catalog, workload, files = _SHARED["catalog"], _SHARED["workload"], _SHARED["files"]
    chunks, done = _SHARED["chunks"], _SHARED["done"]
    extractor = Extractor(catalog, workload, year_anchors=_SHARED.get("year_anchors"))
    out: list[tuple[int, list[tuple], ExtractStats]] = []

    def step(n: int) -> None:
        with done.get_lock():
            done.value += n

    for i in indices:
        f = files[i]
        events = EventSet()
        stats = extractor.scan_file(f.path, chunks(f), events, progress=step, source=f.kind)
        out.append((i, [ev.astuple() for ev in events], stats))      # Ev(*t) in the parent
    return out


def _child(indices: list[int], conn: Any) -> None:
    """A forked child's whole life: read its group, send the result (None: it failed), exit."""
    try:
        result = _read_group(indices)
    except BaseException:                   # the serial read raises it again, with its own message
        result = None
    try:
        conn.send(result)
    finally:
        conn.close()


def read_in_parallel(catalog: Catalog, workload: Any, files: list[BundleFile], jobs: int,
                     chunks: Callable[[BundleFile], Iterable[bytes]],
                     progress: Callable[[int], None] | None = None,
                     deadline: float | None = None,
                     year_anchors: Any = None) -> tuple[EventSet, list[ExtractStats]] | None:
    """The events of ``files`` (all of them log files) and each file's counts, in file order; None
    when a child did not complete its read (it raised, or died: the caller then reads serially).
    Past ``deadline`` the children are stopped and AnalysisTimeout raised. ``year_anchors``: the
    serial read's (Extractor's ``year_anchors``), for the children's extractors."""
    import multiprocessing
    from multiprocessing.connection import wait

    ctx = multiprocessing.get_context("fork")
    done = ctx.Value("q", 0)
    _SHARED.update(catalog=catalog, workload=workload, files=files, chunks=chunks, done=done, year_anchors=year_anchors)
    children = []
    try:
        for group in groups(files, jobs):
            recv, send = ctx.Pipe(duplex=False)
            child = ctx.Process(target=_child, args=(group, send), daemon=True)
            child.start()
            send.close()                        # the child's end: EOF here once it is gone
            children.append((child, recv))
        waiting = {recv: k for k, (_, recv) in enumerate(children)}
        results: dict[int, Any] = {}
        reported = 0
        while waiting:
            # Results are received as they come: a child blocks on a full pipe until read.
            for recv in wait(list(waiting), timeout=0.1):
                k = waiting.pop(recv)
                try:
                    results[k] = recv.recv()
                except (EOFError, OSError):     # died before sending (killed, out of memory)
                    results[k] = None
                if results[k] is None:
                    return None
            if deadline is not None and time.monotonic() > deadline:
                raise AnalysisTimeout("the analysis passed its deadline and was stopped")
            # Read once: a child may add to it between two reads, and bytes counted past what was
            # reported would never be reported.
            now = done.value
            if progress is not None and now > reported:
                progress(now - reported)
                reported = now
    finally:
        for child, recv in children:
            if child.is_alive():
                child.terminate()
            child.join()
            recv.close()
        _SHARED.clear()
    read = sorted((item for group in results.values() for item in group), key=lambda item: item[0])
    events = EventSet()
    for _, evs, _ in read:                      # file order, as the serial read merges
        events.update(Ev(*t) for t in evs)
    return events, [stats for _, _, stats in read]
