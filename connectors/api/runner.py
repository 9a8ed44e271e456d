"""Run engine work in a bounded thread pool with a per-request time cap.

A Python thread cannot be killed, so a run that passes the cap is abandoned,
not stopped: it keeps its slot until it ends. Slots (threads + queue) bound how
much abandoned and waiting work one process can hold; past that, new requests
get 503 at once instead of piling up.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from .errors import ApiError
from .settings import ServiceSettings, env_name

T = TypeVar("T")

# The engine's compiled prefilter is shared per catalog (one per process) and its
# hyperscan scratch space serves one scan at a time: two concurrent analyses fail
# with ScratchInUseError. So analyses run one at a time per process (parsing and
# decompression still overlap); `firstfault serve --workers N` scales across cores.
ENGINE_LOCK = threading.Lock()


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

    async def run(self, fn: Callable[[], T]) -> T:
        if not self._slots.acquire(blocking=False):
            raise ApiError(503, "engine_busy", "every engine thread and queue slot is taken; retry shortly "
                           f"({env_name('engine_threads')}, {env_name('engine_queue')})",
                           limit=env_name("engine_queue"), headers={"Retry-After": "5"})

        def job() -> T:
            try:
                return fn()
            finally:
                self._slots.release()

        try:
            fut = self._executor().submit(job)
        except BaseException:
            self._slots.release()
            raise
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), self.timeout_s)
        except asyncio.TimeoutError:
            raise ApiError(504, "engine_timeout",
                           f"the analysis took longer than {self.timeout_s:g} s ({env_name('request_timeout_s')})",
                           limit=env_name("request_timeout_s")) from None
        finally:
            # A timeout or a client disconnect cancels a run that had not started yet:
            # its job will never release the slot, so release it here.
            if fut.cancelled():
                self._slots.release()

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)       # running analyses finish; they hold their slots until then
