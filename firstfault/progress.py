"""A progress bar on stderr for long work; silent when stderr is not a terminal."""
from __future__ import annotations

import sys
import time


class Bar:
    def __init__(self, label: str, min_total: int = 64 * 1024 * 1024, stream=None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.min_total = min_total
        self.enabled = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._last = 0.0
        self._shown = False

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total < self.min_total:
            return
        now = time.monotonic()
        if now - self._last < 0.1 and done < total:
            return
        self._last = now
        frac = min(done / total, 1.0) if total else 1.0
        width = 30
        fill = int(frac * width)
        self.stream.write(f"\r{self.label} [{'#' * fill}{'.' * (width - fill)}] {frac:5.1%} "
                          f"{done / 1e6:,.0f}/{total / 1e6:,.0f} MB")
        self.stream.flush()
        self._shown = True

    def close(self) -> None:
        if self._shown:
            self.stream.write("\r" + " " * 78 + "\r")
            self.stream.flush()


class Steps:
    """One line on stderr per step of a long command, with the seconds since it began: a person sees
    what it is doing and why it waits. Off (``enabled=False``) under ``--json``, for a program."""

    def __init__(self, label: str, enabled: bool = True, stream=None, clock=time.monotonic) -> None:
        self.label = label
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self._clock = clock
        self._t0 = clock()

    def __call__(self, message: str) -> None:
        if not self.enabled:
            return
        from .term import printable

        self.stream.write(printable(f"{self.label}: {message} [{self._clock() - self._t0:.1f} s]") + "\n")
        self.stream.flush()
