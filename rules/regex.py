"""Linear-time regular expressions for the catalog (RE2).

Every catalog regex runs in RE2, whose matching time is linear in the line
whatever the pattern: a newcomer's rule cannot hang the engine on a crafted
line (issue 10: a 230-byte line took 27 s under Python's backtracking ``re``).
RE2 lacks look-around and back-references; a pattern that needs to exclude
something says so with ``unless`` (a second RE2 regex that vetoes the match).

Matching goes through the extension's ``Match`` on UTF-8 bytes and builds the
named groups itself: the package's ``str`` wrapper maps every offset back to
characters and costs about 7x more per matching line.
"""
from __future__ import annotations

from collections.abc import Mapping

import re2

_UNANCHORED = re2._Anchor.UNANCHORED


class RegexError(ValueError):
    """The pattern is not valid RE2 syntax (look-around, back-references, ...)."""


class LineMatch:
    """The named groups of one match (all a catalog pattern's user reads)."""

    __slots__ = ("_groups",)

    def __init__(self, groups: dict[str, str | None]) -> None:
        self._groups = groups

    def groupdict(self) -> dict[str, str | None]:
        return self._groups            # read-only by convention: built for this one match


class LinearRegex:
    """A compiled RE2 pattern with the ``search(text) -> match | None`` face the engine uses."""

    __slots__ = ("pattern", "ignore_case", "groupindex", "_rx", "_names")

    def __init__(self, pattern: str, ignore_case: bool = False) -> None:
        opts = re2.Options()
        opts.log_errors = False            # RE2 would print every rejected pattern on stderr
        opts.case_sensitive = not ignore_case
        try:
            compiled = re2.compile(pattern, opts)
        except re2.error as exc:
            reason = exc.args[0] if exc.args else exc
            if isinstance(reason, bytes):
                reason = reason.decode("utf-8", "replace")
            raise RegexError(f"not a linear-time (RE2) regex: {reason}") from None
        self.pattern = pattern
        self.ignore_case = ignore_case
        self.groupindex: Mapping[str, int] = dict(compiled.groupindex)
        self._rx = compiled._regexp
        self._names = tuple(sorted(self.groupindex.items(), key=lambda kv: kv[1]))

    def search(self, text: str, data: bytes | None = None) -> LineMatch | None:
        """``data``: the text's UTF-8 bytes when the caller has them (one encoding per line)."""
        if data is None:
            data = text.encode("utf-8", "surrogatepass")
        spans = self._rx.Match(_UNANCHORED, data, 0, len(data))
        if spans[0][0] < 0:
            return None
        groups: dict[str, str | None] = {}
        for name, i in self._names:
            start, end = spans[i]
            groups[name] = None if start < 0 else data[start:end].decode("utf-8", "replace")
        return LineMatch(groups)

    def __repr__(self) -> str:
        return f"LinearRegex({self.pattern!r}{', ignore_case=True' if self.ignore_case else ''})"
