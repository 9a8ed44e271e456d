"""Fewer garbage-collector passes while an analysis runs.

An analysis allocates a few objects a matched line and keeps tens of thousands of events alive;
CPython's default cyclic collector (a pass every 700 net allocations, each pass walking the young
objects and, every so often, all of them) then costs about a fifth of the run. What an analysis
allocates is acyclic, so it is freed by reference counting alone: passes are made rarer while one
runs, not stopped, and the thresholds are restored when the last concurrent analysis ends.
"""
from __future__ import annotations

import functools
import gc
import threading
from collections.abc import Callable
from typing import Any, TypeVar

GEN0 = 50_000                      # net allocations between young-generation passes (default 700)

_lock = threading.Lock()
_running = 0
_saved: tuple[int, ...] = ()

F = TypeVar("F", bound=Callable[..., Any])


def fewer_collections(fn: F) -> F:
    """Run ``fn`` with the young-generation threshold raised to GEN0 (never lowered)."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        global _running, _saved
        with _lock:
            if _running == 0:
                _saved = gc.get_threshold()
                gc.set_threshold(max(_saved[0], GEN0), *_saved[1:])
            _running += 1
        try:
            return fn(*args, **kwargs)
        finally:
            with _lock:
                _running -= 1
                if _running == 0:
                    gc.set_threshold(*_saved)
    return run  # type: ignore[return-value]
