"""Find the lines worth reading: a multi-literal scan over whole chunks.

Hyperscan (the ``hyperscan`` binding) scans a chunk for every anchor at once at
memory speed; without it, one compiled alternation of the escaped anchors (or a
``bytes.find`` per anchor for tiny sets) does the same job more slowly.
Both are linear in the chunk, however many anchors hit one line. Either
way the result is, per candidate line, its start offset and the set of anchor
ids that hit it.
"""
from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import re2

if TYPE_CHECKING:
    from .catalog import Catalog, Pattern

try:  # pragma: no cover - exercised when the binding is installed
    import hyperscan as _hs
except ImportError:  # pragma: no cover
    _hs = None


def _alternation(literals: list[bytes], case_sensitive: bool):
    opts = re2.Options()
    opts.case_sensitive = case_sensitive
    opts.log_errors = False
    return re2.compile(b"|".join(literals), opts)


class TooManyHits(Exception):
    """More anchor hits in one chunk than its lines can account for."""


class Prefilter:
    """Compiled once per catalog; ``scan(chunk)`` -> {line_start: {anchor ids}}."""

    def __init__(self, anchors: Sequence[tuple[str, bool]], force_fallback: bool = False,
                 _database: bytes | None = None) -> None:
        self.anchors = list(anchors)
        self.engine = "hyperscan" if (_hs is not None and not force_fallback and self.anchors) else "re"
        if self.engine == "hyperscan":
            db = None
            if _database is not None:
                try:                            # a database serialized on another CPU may not load here
                    db = _hs.loadb(_database, _hs.HS_MODE_BLOCK)
                except _hs.error:
                    db = None
            if db is None:
                db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
                exprs = [re.escape(a).encode() for a, _ in self.anchors]
                flags = [_hs.HS_FLAG_CASELESS if ci else 0 for _, ci in self.anchors]
                db.compile(expressions=exprs, ids=list(range(len(exprs))), elements=len(exprs), flags=flags)
            self._db = db
            self._local = threading.local()      # Hyperscan scratch space is per thread
        else:
            sens = [re.escape(a.encode()) for a, ci in self.anchors if not ci]
            insens = [re.escape(a.encode()) for a, ci in self.anchors if ci]
            self._lookup = {a.encode(): i for i, (a, ci) in enumerate(self.anchors) if not ci}
            self._lookup_ci = {a.lower().encode(): i for i, (a, ci) in enumerate(self.anchors) if ci}
            # RE2 (linear in the chunk); Python's re would try every alternative at every byte.
            self._re = _alternation(sens, True) if sens else None
            self._re_ci = _alternation(insens, False) if insens else None

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (rules/catalog_cache.py) as its anchors and, for Hyperscan, the compiled database.
        database = bytes(_hs.dumpb(self._db)) if self.engine == "hyperscan" else None
        return Prefilter, (self.anchors, self.engine == "re", database)

    def scan(self, chunk: bytes, window: int | None = None, max_hits: int | None = None) -> dict[int, set[int]]:
        """``window``: only a line's first ``window`` bytes are read later, so the overlap
        check of the fallback engine looks no further (it is per line and per anchor).
        ``max_hits``: raise TooManyHits past it (a line made of anchors: the caller cuts
        long lines to their window and scans again, instead of one callback per hit)."""
        hits: dict[int, set[int]] = {}
        if self.engine == "hyperscan":
            found: list[tuple[int, int]] = []
            add = found.append

            if max_hits is None:
                def on_match(anchor_id: int, _start: int, end: int, _flags: int, _ctx: object) -> None:
                    add((end, anchor_id))                  # None: go on
            else:
                def on_match(anchor_id: int, _start: int, end: int, _flags: int, _ctx: object) -> bool:
                    add((end, anchor_id))
                    return len(found) > max_hits           # True halts the scan

            scratch = getattr(self._local, "scratch", None)
            if scratch is None:
                scratch = self._local.scratch = _hs.Scratch(self._db)
            try:
                self._db.scan(chunk, match_event_handler=on_match, scratch=scratch)
            except _hs.ScanTerminated:          # our handler halted it: too many hits
                raise TooManyHits(len(found)) from None
            # Line starts in one forward pass: each byte is searched for a newline at most once
            # (a look-back per hit was quadratic on a long line of hits).
            # Sorted by end, the hits' line starts never decrease: each line's set is made at its first hit.
            found.sort()
            rfind = chunk.rfind
            start = lo = 0
            ids = None
            for end, anchor_id in found:
                if end != lo:                   # (a hit ending where the last did is on its line)
                    nl = rfind(b"\n", lo, end)
                    lo = end
                    if nl >= 0:
                        start = nl + 1
                        ids = None
                if ids is None:
                    ids = hits[start] = {anchor_id}
                else:
                    ids.add(anchor_id)
            return hits
        seen = 0
        for regex, table, fold in ((self._re, self._lookup, False), (self._re_ci, self._lookup_ci, True)):
            if regex is None:
                continue
            start = lo = 0
            for m in regex.finditer(chunk):
                seen += 1
                if max_hits is not None and seen > max_hits:
                    raise TooManyHits(seen)
                key = m.group(0).lower() if fold else m.group(0)
                nl = chunk.rfind(b"\n", lo, m.start())
                if nl >= 0:
                    start = nl + 1
                lo = max(lo, m.start())
                hits.setdefault(start, set()).add(table[key])
        # An alternation reports one anchor per position; add anchors that overlap it.
        if len(self.anchors) > 1:
            for start in list(hits):
                end = chunk.find(b"\n", start)
                end = len(chunk) if end < 0 else end
                line = chunk[start:min(end, start + window) if window else end]
                low = None
                for i, (a, ci) in enumerate(self.anchors):
                    if i in hits[start]:
                        continue
                    if ci:
                        low = low if low is not None else line.lower()
                        if a.lower().encode() in low:
                            hits[start].add(i)
                    elif a.encode() in line:
                        hits[start].add(i)
        return hits


AnchorIndex = tuple[Prefilter, list[list["Pattern"]]]
_INDEXES: "weakref.WeakKeyDictionary[Catalog, AnchorIndex]" = weakref.WeakKeyDictionary()


def build_anchor_index(catalog: "Catalog") -> AnchorIndex:
    """One prefilter over every pattern's anchors; anchor id -> patterns that list it (priority order)."""
    index: dict[tuple[str, bool], int] = {}
    by_anchor: list[list[Pattern]] = []
    for pat in catalog.patterns:            # already in priority order
        for anchor in pat.anchors:
            key = (anchor, pat.ignore_case)
            if key not in index:
                index[key] = len(by_anchor)
                by_anchor.append([])
            by_anchor[index[key]].append(pat)
    return Prefilter(list(index)), by_anchor


def anchor_index(catalog: "Catalog") -> AnchorIndex:
    """The catalog's anchor index, built once per loaded catalog (or restored with it from the cache)."""
    got = _INDEXES.get(catalog)
    if got is None:
        got = _INDEXES[catalog] = build_anchor_index(catalog)
    return got


def keep_anchor_index(catalog: "Catalog", index: AnchorIndex) -> None:
    """Use ``index`` (restored from the on-disk cache with ``catalog``) instead of building one."""
    _INDEXES[catalog] = index
