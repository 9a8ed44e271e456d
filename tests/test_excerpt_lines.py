"""connectors/api/excerpts.py reads the lines of the windows as the engine numbers lines, however the
file arrives in chunks."""
from __future__ import annotations

import random

from firstfault.connectors.api.excerpts import _in_spans


def numbered(data: bytes) -> dict[int, bytes]:
    """The engine's count: every "\\n" ends a line; a last line without one counts, an empty tail does not."""
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return {n: raw for n, raw in enumerate(lines, start=1)}


def test_the_windows_lines_whatever_the_chunks():
    rnd = random.Random(24)
    for _ in range(20_000):
        data = b"\n".join(bytes([97 + rnd.randint(0, 3)]) * rnd.randint(0, 3) for _ in range(rnd.randint(0, 40)))
        if rnd.random() < 0.5:
            data += b"\n"
        cuts = sorted(rnd.sample(range(len(data) + 1), min(len(data) + 1, rnd.randint(0, 6))))
        chunks = [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]
        spans, at = [], 1
        for _ in range(rnd.randint(1, 4)):
            lo = at + rnd.randint(0, 5)
            hi = lo + rnd.randint(0, 5)
            spans.append((lo, hi))
            at = hi + 2
        lines = numbered(data)
        expected = [(n, lines[n]) for lo, hi in spans for n in range(lo, hi + 1) if n in lines]
        assert list(_in_spans(chunks, spans)) == expected, (data, chunks, spans)


def test_reading_stops_after_the_last_window():
    read = []

    def chunks():
        for k in range(100):
            read.append(k)
            yield b"line\n" * 10
    assert [n for n, _ in _in_spans(chunks(), [(3, 4), (15, 25)])] == [3, 4, *range(15, 26)]
    assert read == [0, 1, 2]
