"""Text for a person at a terminal: what came from logs, bundles or the broker is shown, never obeyed.

A log line or a workload id can carry terminal controls: an OSC 52 clipboard write, a
title change, a screen clear, the one-byte C1 CSI (0x9b), a bidi override that reorders
what is read. :func:`printable` writes each out (``\\x1b``, ``\\u202e``); it is applied
where human text leaves the program, never to the data (``--json`` prints it as it is).
"""
from __future__ import annotations

import re
from typing import TextIO

# Besides C0: DEL, C1, the bidi controls (marks, embeddings, overrides, isolates), the line and
# paragraph separators, and lone surrogates (undecodable bytes kept by surrogateescape).
_OTHERS = "\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE = re.compile(f"[\x00-\x1f{_OTHERS}]")
_UNSAFE_BUT_NEWLINE = re.compile(f"[\x00-\x09\x0b-\x1f{_OTHERS}]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _shown(m: re.Match[str]) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def printable(text: str, lines: bool = False) -> str:
    """``text`` with every control character written out; ``lines``: its newlines are structure, kept."""
    pattern = _UNSAFE_BUT_NEWLINE if lines else _UNSAFE
    return pattern.sub(_shown, text) if pattern.search(text) else text


class Printable:
    """A text stream that writes :func:`printable` text, newlines kept: for output built elsewhere
    (``diagnoses``' table, ``replay``'s report) that has no control character of its own to send."""

    def __init__(self, stream: TextIO) -> None:
        self.wrapped = stream

    def write(self, text: str) -> int:
        self.wrapped.write(printable(text, lines=True))      # per character: any chunking is safe
        return len(text)

    def __getattr__(self, name: str):                         # flush, isatty, fileno, encoding...
        return getattr(self.wrapped, name)
