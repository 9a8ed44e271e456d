"""Find the lines worth reading: a multi-literal scan over whole chunks.

Hyperscan (the ``hyperscan`` binding) scans a chunk for every anchor at once at
memory speed; without it, one compiled alternation of the escaped anchors (or a
``bytes.find`` per anchor for tiny sets) does the same job more slowly. Either
way the result is, per candidate line, its start offset and the set of anchor
ids that hit it.
"""
from __future__ import annotations

import re
import threading
from collections.abc import Sequence

try:  # pragma: no cover - exercised when the binding is installed
    import hyperscan as _hs
except ImportError:  # pragma: no cover
    _hs = None


class Prefilter:
    """Compiled once per catalog; ``scan(chunk)`` -> {line_start: {anchor ids}}."""

    def __init__(self, anchors: Sequence[tuple[str, bool]], force_fallback: bool = False) -> None:
        self.anchors = list(anchors)
        self.engine = "hyperscan" if (_hs is not None and not force_fallback and self.anchors) else "re"
        if self.engine == "hyperscan":
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
            self._re = re.compile(b"|".join(sens)) if sens else None
            self._re_ci = re.compile(b"|".join(insens), re.IGNORECASE) if insens else None

    def scan(self, chunk: bytes) -> dict[int, set[int]]:
        hits: dict[int, set[int]] = {}
        if self.engine == "hyperscan":
            found: list[tuple[int, int]] = []

            def on_match(anchor_id: int, _start: int, end: int, _flags: int, _ctx: object) -> None:
                found.append((end, anchor_id))

            scratch = getattr(self._local, "scratch", None)
            if scratch is None:
                scratch = self._local.scratch = _hs.Scratch(self._db)
            self._db.scan(chunk, match_event_handler=on_match, scratch=scratch)
            for end, anchor_id in found:
                start = chunk.rfind(b"\n", 0, end) + 1
                hits.setdefault(start, set()).add(anchor_id)
            return hits
        for regex, table, fold in ((self._re, self._lookup, False), (self._re_ci, self._lookup_ci, True)):
            if regex is None:
                continue
            for m in regex.finditer(chunk):
                key = m.group(0).lower() if fold else m.group(0)
                start = chunk.rfind(b"\n", 0, m.start()) + 1
                hits.setdefault(start, set()).add(table[key])
        # An alternation reports one anchor per position; add anchors that overlap it.
        if len(self.anchors) > 1:
            for start in list(hits):
                end = chunk.find(b"\n", start)
                line = chunk[start:end if end >= 0 else len(chunk)]
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
