"""Run engine work in a bounded thread pool with a per-request deadline.

A Python thread cannot be killed, so the deadline is cooperative: the request's
``time.monotonic()`` deadline goes into the work (archive expansion, line
counting, the engine between chunks), which raises AnalysisTimeout past it and
frees its thread. The caller answers 504 at the deadline either way. Slots
(threads + queue) bound how much work one process holds; past that, new
requests get 503 at once instead of piling up.

Analyses run in parallel, one per engine thread: the prefilter keeps its
Hyperscan scratch space per thread (rules/prefilter.py), and everything else an
analysis mutates is its own (tests/test_api_concurrency.py runs them side by side).
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from firstfault.rules.errors import AnalysisTimeout

from .errors import ApiError
from .settings import ServiceSettings, env_name

T = TypeVar("T")


class EngineRunner:
    def __init__(self, settings: ServiceSettings) -> None:
        self.timeout_s = settings.request_timeout_s
        self._threads = settings.engine_threads
        self._pool: ThreadPoolExecutor | None = None
        self._slots = threading.BoundedSemaphore(settings.engine_threads + settings.engine_queue)

    def _executor(self) -> ThreadPoolExecutor:
        # Created on first use (and again after close): an app may live through several
        # lifespan cycles, e.g. under test clients.
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="firstfault-engine")
        return self._pool

    def deadline(self) -> float:
        """A new request's deadline: now plus FIRSTFAULT_REQUEST_TIMEOUT_S."""
        return time.monotonic() + self.timeout_s

    def _timeout(self) -> ApiError:
        return ApiError(504, "engine_timeout",
                        f"the analysis took longer than {self.timeout_s:g} s ({env_name('request_timeout_s')})",
                        limit=env_name("request_timeout_s"))

    async def run(self, fn: Callable[[], T], deadline: float | None = None) -> T:
        """``fn`` in an engine thread; 504 at ``deadline`` (default: now + the cap), which ``fn``
        should honour too so its thread is freed."""
        deadline = self.deadline() if deadline is None else deadline
        if not self._slots.acquire(blocking=False):
            raise ApiError(503, "engine_busy", "every engine thread and queue slot is taken; retry shortly "
                           f"({env_name('engine_threads')}, {env_name('engine_queue')})",
                           limit=env_name("engine_queue"), headers={"Retry-After": "5"})

        def job() -> T:
            try:
                if time.monotonic() > deadline:        # waited in the queue past its deadline: do nothing
                    raise AnalysisTimeout("the request passed its deadline before an engine thread was free")
                return fn()
            finally:
                self._slots.release()

        try:
            fut = self._executor().submit(job)
        except BaseException:
            self._slots.release()
            raise
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), max(0.0, deadline - time.monotonic()))
        except (asyncio.TimeoutError, AnalysisTimeout):
            raise self._timeout() from None
        finally:
            # A timeout or a client disconnect cancels a run that had not started yet:
            # its job will never release the slot, so release it here.
            if fut.cancelled():
                self._slots.release()

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)       # running analyses stop at their deadlines; they hold their slots until then
