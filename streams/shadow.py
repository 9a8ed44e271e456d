"""``firstfault rules shadow``: a candidate catalog beside the live one, on the live stream.

The shadow run is replay, repeated: every ``every_s`` seconds it takes the workload attempts
whose end event was published since the last round (and whose start was published after the
shadow run started: workloads shipped after it began), waits until the live pipeline's grace
has passed for them, re-diagnoses each from the raw topic with the candidate catalog (the
same extraction, EARLY and FINAL code as the workers, :func:`.replay.rediagnose`) and
publishes the result to ``diagnoses-shadow``. It never writes to ``diagnoses`` nor moves the
live pointer, so live diagnoses are untouched. Every stage of the candidate is exercised,
extraction patterns included, which a second engine fed the live extractors' events would miss.

``--report`` compares the shadow diagnoses with the live ones of the same attempts, with
replay's ``--diff`` (:func:`.replay.compare`, :func:`.replay.diff_lines`).
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import BaseModel

from .config import StreamConfig
from .follow import TopicReader, decode_diagnosis, iso_ms, revision_order, time_index_mode
from .replay import DiffReport, Key, Window, compare, published, rediagnose, select_attempts
from .rules_feed import SHADOW, Pointer, pointer, read_state

if TYPE_CHECKING:
    from firstfault.rules.catalog import Catalog
    from firstfault.schemas import Diagnosis


class ShadowReport(BaseModel):
    rules_version: str
    live_version: str | None
    since: str
    shadow_diagnoses: int
    diff: DiffReport


def _index(cfg: StreamConfig, mode: str):
    from firstfault.connectors.sinks.offset_index import OffsetIndex

    return OffsetIndex.for_config(cfg) if (cfg.redis_url and mode == "scan") else None


def run(cfg: StreamConfig, catalog: Catalog, started_ms: int, *, every_s: float = 5.0, idle_s: float = 1.0,
        settle_s: float | None = None, stop: Callable[[], bool] = lambda: False,
        emit: Callable[[Diagnosis], None] | None = None) -> int:
    """Shadow-diagnose until ``stop()``; returns how many diagnoses went to ``diagnoses-shadow``."""
    from firstfault.schemas.avro import encode

    from . import kafka

    # The live correlator finalizes an attempt this long after its end event: wait as long.
    settle_s = min(cfg.grace_s, cfg.grace_cap_s) if settle_s is None else settle_s
    out_topic = cfg.topic("diagnoses-shadow")
    kafka.ensure_topics(cfg, [out_topic])
    prod = kafka.producer(cfg)
    mode = time_index_mode(cfg)
    index = _index(cfg, mode)
    done: set[Key] = set()
    sent = 0
    while not stop():
        until_ms = int((time.time() - settle_s) * 1000)
        if until_ms > started_ms:
            counts: Counter[str] = Counter()
            chosen = select_attempts(cfg, Window(since_ms=started_ms, until_ms=until_ms), "publish-time", mode,
                                     index, idle_s, counts)
            chosen = {k: a for k, a in chosen.items() if k not in done and a.start_published_ms is not None
                      and a.start_published_ms >= started_ms}
            results = rediagnose(cfg, chosen, catalog, mode, index, idle_s, counts) if chosen else {}
            headers = [("rules-version", catalog.version.encode()), ("shadow-since", iso_ms(started_ms).encode())]
            for key in sorted(results, key=lambda k: (chosen[k].end_ms, k)):
                prod.produce(out_topic, key=key[0].encode(), value=encode(results[key]), headers=headers)
                if emit is not None:
                    emit(results[key])
            if results:
                prod.flush(30)
                sent += len(results)
            done |= set(results)
        deadline = time.monotonic() + every_s
        while not stop() and time.monotonic() < deadline:
            time.sleep(0.2)
    prod.flush(10)
    return sent


def report(cfg: StreamConfig, idle_s: float = 1.0) -> ShadowReport | None:
    """What the shadow run would have changed so far; None when no shadow run was started."""
    state = read_state(cfg, idle_s=idle_s)
    shadow: Pointer | None = pointer(state, SHADOW)
    if shadow is None or shadow.rules_version is None or shadow.started_ms is None:
        return None
    live = pointer(state, "live")
    mode = time_index_mode(cfg)
    index = _index(cfg, mode)
    candidate: dict[Key, Diagnosis] = {}
    reader = TopicReader(cfg, cfg.topic("diagnoses-shadow"), since_ms=shadow.started_ms, mode=mode, index=index,
                         idle_s=idle_s)
    for m in reader:
        d = decode_diagnosis(m.value())
        if d is None or d.rules_version != shadow.rules_version:
            continue
        key = (d.workload_id, d.attempt)
        if key not in candidate or revision_order(d) >= revision_order(candidate[key]):
            candidate[key] = d
    counts: Counter[str] = Counter()
    diff = compare(candidate, published(cfg, shadow.started_ms, set(candidate), mode, index, idle_s, counts))
    return ShadowReport(rules_version=shadow.rules_version, live_version=live.rules_version if live else None,
                        since=iso_ms(shadow.started_ms), shadow_diagnoses=len(candidate), diff=diff)
