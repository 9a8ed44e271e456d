"""Property-based fuzzing of the line reader and the extractor core (issue 10).

Inputs are real catalog example lines, cut, mixed with noise and invalid UTF-8,
and split into chunks at random. Properties: nothing raises; the events do not
depend on how the bytes were chunked; every line is counted; a stamp that cannot
be represented is no stamp rather than a crash. Bounded and derandomized for CI (2 cores,
no flaky runs); `HYPOTHESIS_MORE=1` explores further with fresh inputs.
"""
from __future__ import annotations

import os
from datetime import datetime, timezone

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from firstfault.rules.catalog import load_catalog
from firstfault.rules.extract import Extractor
from firstfault.rules.model import EventSet
from firstfault.rules.prefixes import StampContext, read_head
from firstfault.schemas import WorkloadRecord

CATALOG = load_catalog()
EXAMPLES = sorted({ex.line for p in CATALOG.patterns for ex in p.match_examples})
WORKLOAD = WorkloadRecord.model_validate({
    "workload_id": "fuzz", "attempt": 0, "scheduler": "slurm", "nodes": ["gpu01", "gpu02"],
    "start_time": "2026-11-03T10:00:00Z", "end_time": "2026-11-03T10:30:00Z", "state": "FAILED"})
CTX = StampContext(zone=timezone.utc, anchor=datetime(2026, 11, 3, 10, tzinfo=timezone.utc))
MORE = bool(os.environ.get("HYPOTHESIS_MORE"))
FUZZ = settings(max_examples=3000 if MORE else 150, deadline=None, derandomize=not MORE,
                suppress_health_check=[HealthCheck.too_slow])

# Pieces that make prefixes and stamps ambiguous or overflow.
NOISE = ["[rank99999999999999999999999]:", "99999-12-31T23:59:59Z ", "Jan 99 99:99:99 ", "[ 9e99.0] ",
         "[" + "9" * 40 + ".5] ", "0: " * 5, "> > **", "\x00", "\ufffd", " ran for 100000000000000 milliseconds",
         ", a=[]" * 30, "Error: " * 50, "gpu01:1234:1234 [0] ", "<6>[    2.000000] ", "\t"]


def _line():
    example = st.sampled_from(EXAMPLES)
    cut = st.tuples(example, st.integers(0, 200)).map(lambda t: t[0][:t[1]] if t[1] else t[0])
    glued = st.lists(st.one_of(example, cut, st.sampled_from(NOISE), st.text(max_size=40)), min_size=1, max_size=4)
    return glued.map("".join)


def _bytes_lines():
    bad = st.sampled_from([b"\xff", b"\xc3(", b"\xed\xa0\x80", b"\r", b""])
    one = st.tuples(_line(), bad).map(lambda t: t[0].encode("utf-8", "surrogatepass") + t[1])
    return st.lists(one, min_size=1, max_size=12).map(lambda ls: b"\n".join(ls) + b"\n")


@FUZZ
@given(_line())
def test_read_head_never_raises(line):
    head = read_head(line, CTX)
    assert isinstance(head.message, str)
    assert head.rank is None or 0 <= head.rank < 10_000_000


def _extract(data: bytes, cuts: list[int]):
    events = EventSet()
    pieces, last = [], 0
    for c in sorted(set(min(c, len(data)) for c in cuts)):
        pieces.append(data[last:c])
        last = c
    pieces.append(data[last:])
    stats = Extractor(CATALOG, WORKLOAD).scan_file("logs/app/train.log", pieces, events)
    return stats, [(e.kind, e.pattern, e.line, e.host, e.rank, e.stamp, e.onset, sorted(e.fields.items(), key=str))
                   for e in events.sorted()]


@FUZZ
@given(_bytes_lines(), st.lists(st.integers(0, 4000), max_size=6))
def test_extraction_is_total_and_independent_of_chunking(data, cuts):
    whole_stats, whole = _extract(data, [])
    split_stats, split = _extract(data, cuts)
    assert whole == split
    assert whole_stats.lines == split_stats.lines == data.count(b"\n")
    for _, _, line, _, rank, _, _, _ in whole:
        assert 1 <= line <= whole_stats.lines
        assert rank is None or 0 <= rank < 10_000_000
