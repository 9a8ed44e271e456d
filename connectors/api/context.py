"""What the routes share: settings, store, engine runner, metrics, auth and the injected hooks."""
from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool

from firstfault.connectors.sinks.fleet_memory import FleetMemory
from firstfault.connectors.sinks.node_health import NodeHealthStore
from firstfault.connectors.sinks.redis_store import DiagnosisStore
from firstfault.rules.catalog import Catalog
from firstfault.schemas import Diagnosis

from .auth import Auth
from .metrics import Metrics
from .runner import EngineRunner
from .settings import ServiceSettings

# A publisher sends one diagnosis to the diagnoses topic; sync or async. Built by
# the streaming side (Kafka producer) and injected, so the service has no broker code.
Publisher = Callable[[Diagnosis], Any]
# Kafka readiness: True when the broker is reachable; sync or async.
ReadyCheck = Callable[[], bool | Awaitable[bool]]
T = TypeVar("T")

HOOK_TIMEOUT_S = 5.0


async def call_hook(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a sync or async hook without blocking the event loop."""
    if inspect.iscoroutinefunction(fn):
        result = await fn(*args)
    else:
        result = await run_in_threadpool(fn, *args)
    if inspect.isawaitable(result):
        result = await result
    return result


@dataclass
class ServiceContext:
    settings: ServiceSettings
    store: DiagnosisStore
    catalog: Catalog
    runner: EngineRunner
    metrics: Metrics
    auth: Auth
    publisher: Publisher | None = None
    kafka_ready: ReadyCheck | None = None
    nodes: NodeHealthStore | None = None        # the fleet memory's record (same Redis and prefix as the store)
    clock: Callable[[], float] = time.time      # when the fleet memory is judged: now, unless a test says
    fleet: FleetMemory = field(init=False)      # the fleet state, kept current from the record

    def __post_init__(self) -> None:
        self.fleet = FleetMemory(self.nodes or NodeHealthStore(None), clock=self.clock)

    async def in_thread(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Store calls are blocking (redis-py sync client): keep them off the event loop."""
        return await run_in_threadpool(fn, *args, **kwargs)

    async def kafka_reachable(self) -> bool:
        if self.kafka_ready is None:
            return True
        try:
            return bool(await asyncio.wait_for(call_hook(self.kafka_ready), HOOK_TIMEOUT_S))
        except Exception:           # a failing or slow check means "not ready", never a 500
            return False
