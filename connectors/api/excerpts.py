"""The lines around each raw-line reference of a diagnosis, kept so a page can show them later.

A diagnosis refers to lines by bundle path and 1-based line number; the bundle itself is
not kept. When the service stores a diagnosis it also keeps, for each reference, the
line with ``RADIUS`` lines either side (windows on one file merged), so every log
reference on the page can open its context. Line numbers count ``\\n`` exactly as the
engine does, so a reference and its excerpt always agree.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from firstfault.rules.bundle import Bundle
from firstfault.schemas import Diagnosis, Ref

RADIUS = 20
MAX_REFS = 200                  # references kept per diagnosis (the root and candidates first)
MAX_LINE_CHARS = 2000           # a kept line is cut here, with an ellipsis
MAX_KEPT_CHARS = 1 << 20        # per diagnosis: past it, later windows are not kept (the page says so)


def references(d: Diagnosis) -> list[Ref]:
    """Every raw-line reference the diagnosis shows, most important first, without repeats."""
    refs: list[Ref] = []
    if d.root_cause is not None:
        refs.append(d.root_cause.ref)
    for c in d.candidates:
        refs.extend(c.evidence)
    refs.extend(s.sample for s in d.symptoms)
    refs.extend(e.source for e in d.explains)
    for step in d.evidence:
        refs.extend(step.events)
    seen: set[tuple[str, int]] = set()
    out: list[Ref] = []
    for r in refs:
        if (r.path, r.line) not in seen:
            seen.add((r.path, r.line))
            out.append(r)
    return out[:MAX_REFS]


def _windows(refs: list[Ref]) -> dict[str, list[tuple[int, int]]]:
    by_path: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for r in refs:
        by_path[r.path].append((max(1, r.line - RADIUS), r.line + RADIUS))
    merged: dict[str, list[tuple[int, int]]] = {}
    for path, spans in by_path.items():
        spans.sort()
        out = [spans[0]]
        for lo, hi in spans[1:]:
            if lo <= out[-1][1] + 1:
                out[-1] = (out[-1][0], max(out[-1][1], hi))
            else:
                out.append((lo, hi))
        merged[path] = out
    return merged


def _text(raw: bytes) -> str:
    text = raw.rstrip(b"\r").decode("utf-8", "replace")
    return text if len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS] + " …"


def _in_spans(chunks, spans: list[tuple[int, int]]) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, bytes) of the lines inside ``spans`` (sorted, disjoint, inclusive), as the
    engine counts lines (a final line without a newline counts). Each chunk is split once and only
    the wanted lines are looked at; reading stops past the last span."""
    n, rest, i = 0, b"", 0              # n: lines before this chunk's; i: the first span not yet done
    for chunk in chunks:
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        top = n + len(lines)
        while i < len(spans):
            lo, hi = spans[i]
            for k in range(max(lo, n + 1), min(hi, top) + 1):
                yield k, lines[k - n - 1]
            if hi > top:
                break                   # the span goes on in the next chunk
            i += 1
        if i == len(spans):
            return
        n = top
    if rest and spans[i][0] <= n + 1 <= spans[i][1]:
        yield n + 1, rest


def excerpts(bundle: Bundle, d: Diagnosis) -> dict[str, dict[str, str]]:
    """{path: {line number: text}} for the windows around the diagnosis' references."""
    wanted = _windows(references(d))
    out: dict[str, dict[str, str]] = {}
    budget = MAX_KEPT_CHARS
    for f in bundle.files:
        spans = wanted.get(f.path)
        if not spans or budget <= 0:
            continue
        kept: dict[str, str] = {}
        for n, raw in _in_spans(f.open_chunks(), spans):
            if budget <= 0:
                break
            kept[str(n)] = text = _text(raw)
            budget -= len(text)
        if kept:
            out[f.path] = kept
    return out


def window(kept: dict[str, str], line: int) -> list[tuple[int, str]]:
    """The kept lines within RADIUS of ``line``, in order."""
    return [(n, kept[str(n)]) for n in range(max(1, line - RADIUS), line + RADIUS + 1) if str(n) in kept]


def context(d: Diagnosis, kept: dict[str, dict[str, str]] | None, path: str, line: int) -> dict:
    """What the line page shows for one reference: the kept lines around it, or, when the
    diagnosis came without its bundle (the stream keeps no bundle), the line itself if known."""
    body = {"workload_id": d.workload_id, "attempt": d.attempt, "path": path, "line": line}
    if kept is not None and path in kept and str(line) in kept[path]:
        return {**body, "source": "bundle", "lines": [{"line": n, "text": t} for n, t in window(kept[path], line)]}
    known = d.root_cause.text if d.root_cause is not None and (d.root_cause.ref.path, d.root_cause.ref.line) == (path, line) else None
    note = ("the lines around it were not kept: only diagnoses posted to /v1/analyze keep them "
            "(the stream stores the diagnosis, not the logs)" if kept is None else
            "the lines around it were not kept: a diagnosis keeps the context of its first "
            f"{MAX_REFS} references, up to {MAX_KEPT_CHARS >> 20} MiB")
    return {**body, "source": "diagnosis" if known is not None else "none", "note": note,
            "lines": [{"line": line, "text": known}] if known is not None else []}
