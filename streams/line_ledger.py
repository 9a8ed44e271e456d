"""Which raw lines a workload's events already count: so a batch read twice adds nothing.

The extractor names, per event of an EventBatch, the lines it was made of (``EventBatch.lines``:
runs of consecutive line numbers per file). The correlator keeps, per file, the line numbers
it has counted as sorted disjoint runs, flat ``[first, last, first, last, ...]`` (JSON in the
changelog), and counts an event's lines only where they are new. Re-delivery of any kind then
merges to the same state: a batch re-read after a failed commit, the same raw lines extracted
again by a new owner after a rebalance (cut into other batches), a shipper that sent a line
twice. Every other part of the merge (stamps, ranks, the representative) is idempotent already.

A file's lines arrive mostly in order, so its runs stay few: they grow with the gaps between
the lines a workload's events are made of, not with the lines.
"""
from __future__ import annotations


def _first_touching(runs: list[int], first: int) -> int:
    """Index (in runs of two) of the first run that ends at or after ``first - 1``."""
    lo, hi = 0, len(runs) // 2
    while lo < hi:
        mid = (lo + hi) // 2
        if runs[2 * mid + 1] < first - 1:
            lo = mid + 1
        else:
            hi = mid
    return lo


def claim(runs: list[int], first: int, last: int) -> int:
    """Add lines ``first..last`` to ``runs`` (in place); how many of them were not there."""
    i = _first_touching(runs, first)
    new = last - first + 1
    lo, hi = first, last
    j = i
    while 2 * j < len(runs) and runs[2 * j] <= last + 1:
        a, b = runs[2 * j], runs[2 * j + 1]
        new -= max(0, min(last, b) - max(first, a) + 1)
        lo, hi = min(lo, a), max(hi, b)
        j += 1
    runs[2 * i:2 * j] = [lo, hi]
    return new


def claim_runs(ledger: dict[str, list[int]], files: list[str], runs: list[int]) -> int:
    """An event's lines as EventBatch gives them (file index, first, last)...; the new ones counted."""
    new = 0
    for k in range(0, len(runs), 3):
        new += claim(ledger.setdefault(files[runs[k]], []), runs[k + 1], runs[k + 2])
    return new
