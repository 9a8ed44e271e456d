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

import re
from collections.abc import Mapping

import re2

_UNANCHORED = re2._Anchor.UNANCHORED


class RegexError(ValueError):
    """The pattern is not valid RE2 syntax (look-around, back-references, ...)."""


def _compile(pattern: str, ignore_case: bool) -> re2._Regexp:
    opts = re2.Options()
    opts.log_errors = False            # RE2 would print every rejected pattern on stderr
    opts.case_sensitive = not ignore_case
    try:
        return re2.compile(pattern, opts)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise RegexError(f"not a linear-time (RE2) regex: {reason}") from None


class _Pending:
    """A restored regex's RE2 object until its first use, which compiles it and puts it in place
    (the match path then calls RE2 directly, as for a regex compiled at once)."""

    __slots__ = ("owner",)

    def __init__(self, owner: "LinearRegex") -> None:
        self.owner = owner

    def Match(self, *args: object) -> list[tuple[int, int]]:          # noqa: N802 - RE2's own name
        rx = _compile(self.owner.pattern, self.owner.ignore_case)._regexp
        self.owner._rx = rx
        return rx.Match(*args)


class LineMatch:
    """The named groups of one match (all a catalog pattern's user reads)."""

    __slots__ = ("_groups",)

    def __init__(self, groups: dict[str, str | None]) -> None:
        self._groups = groups

    def groupdict(self) -> dict[str, str | None]:
        return self._groups            # read-only by convention: built for this one match


class LinearRegex:
    """A compiled RE2 pattern with the ``search(text) -> match | None`` face the engine uses."""

    __slots__ = ("pattern", "ignore_case", "groupindex", "digit_blind", "_rx", "_names")

    def __init__(self, pattern: str, ignore_case: bool = False) -> None:
        compiled = _compile(pattern, ignore_case)
        self.pattern = pattern
        self.ignore_case = ignore_case
        self.groupindex: Mapping[str, int] = dict(compiled.groupindex)
        self._rx = compiled._regexp
        self._names = tuple(sorted(self.groupindex.items(), key=lambda kv: kv[1]))
        self.digit_blind = digit_blind(pattern)

    # Pickled (the on-disk catalog cache, rules/catalog_cache.py) without the compiled RE2 object:
    # restored, the pattern compiles at its first match, so a run compiles only the patterns it uses.
    def __getstate__(self) -> tuple:
        return self.pattern, self.ignore_case, self.groupindex, self._names, self.digit_blind

    def __setstate__(self, state: tuple) -> None:
        self.pattern, self.ignore_case, self.groupindex, self._names, self.digit_blind = state
        self._rx = _Pending(self)

    def search(self, text: str, data: bytes | None = None) -> LineMatch | None:
        """``data``: the text's UTF-8 bytes when the caller has them (one encoding per line)."""
        if data is None:
            data = text.encode("utf-8", "surrogatepass")
        spans = self.spans(data)
        return None if spans is None else self.match_of(text, data, spans)

    def spans(self, data: bytes) -> list[tuple[int, int]] | None:
        """Byte spans of the whole match and of every group ((-1, -1): unset), or None."""
        spans = self._rx.Match(_UNANCHORED, data, 0, len(data))
        return None if spans[0][0] < 0 else spans

    @property
    def names(self) -> tuple[tuple[str, int], ...]:
        """The named groups and their indices, in group order."""
        return self._names

    def match_of(self, text: str, data: bytes, spans: list[tuple[int, int]]) -> LineMatch:
        """The named groups that ``spans`` (of this regex, on ``data``, the UTF-8 of ``text``) mark."""
        groups: dict[str, str | None] = {}
        if len(data) == len(text):         # ASCII: byte offsets are character offsets, no decoding
            for name, i in self._names:
                start, end = spans[i]
                groups[name] = None if start < 0 else text[start:end]
        else:
            for name, i in self._names:
                start, end = spans[i]
                groups[name] = None if start < 0 else data[start:end].decode("utf-8", "replace")
        return LineMatch(groups)

    def __repr__(self) -> str:
        return f"LinearRegex({self.pattern!r}{', ignore_case=True' if self.ignore_case else ''})"


_GROUP_NAME = re.compile(r"\(\?P?<\w+>")
_COUNTS = re.compile(r"\{\d+(?:,\d*)?\}")


def digit_blind(pattern: str) -> bool:
    """Does the regex read every ASCII digit alike (lines that differ only in digits match alike,
    at the same offsets)? Judged on its text, conservatively: a digit may appear only in a group's
    name, a repeat count and a class's whole ``0-9``; \\d, \\w and the like hold all ten. A literal
    digit, a partial range or a numeric escape (``\\x31``, a back-reference) says no."""
    rest, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        skip = None
        if c == "\\":
            # An escape, whole (\\x{31}, \\p{Nd} with their braces): its digits (\\1, \\x31) stay to be seen.
            braced = pattern[i + 1:i + 2] in ("x", "p", "P") and pattern.startswith("{", i + 2)
            end = pattern.find("}", i) + 1 if braced else i + 2
            rest.append(pattern[i:end or len(pattern)])
            i = end or len(pattern)
            continue
        if in_class:
            if pattern.startswith("0-9", i) and pattern[i - 1] != "-":      # not the end of a range x-0
                skip = 3
            elif pattern.startswith("[:", i):
                end = pattern.find(":]", i + 2)
                if end < 0:
                    return False
                skip = end + 2 - i                  # [:digit:] and its kind hold all ten or none
            elif c == "]":
                in_class = False
        elif c == "[":
            in_class = True
            lead = 3 if pattern.startswith("[^]", i) else 2 if pattern.startswith("[]", i) else 0
            if lead:                                # a ] first in a class is a member
                rest.append(pattern[i:i + lead])
                i += lead
                continue
        else:
            counts = c == "{" and i > 0 and (pattern[i - 1].isalnum() or pattern[i - 1] in ")].}_")    # after an atom
            m = _COUNTS.match(pattern, i) if counts else _GROUP_NAME.match(pattern, i) if c == "(" else None
            if m is not None:
                skip = m.end() - i
        if skip:
            i += skip
            continue
        rest.append(c)
        i += 1
    return not in_class and not any(ch.isdigit() and ch.isascii() for ch in "".join(rest))
