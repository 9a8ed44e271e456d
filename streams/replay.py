"""``firstfault replay``: re-diagnose a past time window with a (new) rule catalog.

Every workload attempt whose scheduler end event was published in ``[since, until)``
is diagnosed again, in this process, from the raw topic: the stream extractor's own
``ExtractorCore`` routes lines to attempts by an allocation timeline built from those
end events (a node-scoped line goes to whichever attempt held the node at the line's
time) and extracts with line memory for stamp inheritance, so a replay gives what the
pipeline would have published, and the same bytes as ``firstfault analyze`` of a
complete bundle. Results go to ``diagnoses-replay`` (never to ``diagnoses``, which
the service and recovery automation act on); ``--diff`` compares them with what the
pipeline published.

Times are the pipeline's clock (Kafka record timestamps): for a bundle shipped after
the fact, the window is when it was shipped. Seeking: see ``follow.TopicReader``.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, model_validator

from firstfault.rules.errors import RecordError

from .config import StreamConfig
from .follow import Mode, TopicReader, add_connection_flags, decode_diagnosis, iso_ms, parse_time, summary_line, \
    time_index_mode

# The engine, Kafka and Redis load when a replay runs, not when the CLI registers its commands.
if TYPE_CHECKING:
    from firstfault.connectors.sinks.offset_index import OffsetIndex
    from firstfault.rules.catalog import Catalog
    from firstfault.schemas import Diagnosis, RawLine, SchedulerEvent

Key = tuple[str, int]
DIFF_FIELDS = ("status", "domain", "sub_domain", "root_cause", "responsible_nodes", "suspect_nodes")


class Window(BaseModel):
    since_ms: int
    until_ms: int

    @model_validator(mode="after")
    def _ordered(self) -> "Window":
        if self.until_ms <= self.since_ms:
            raise ValueError("--until must be after --since")
        return self


class Change(BaseModel):
    workload_id: str
    attempt: int
    fields: dict[str, dict[str, Any]] = Field(description="field -> {before, after}")


class DiffReport(BaseModel):
    compared: int = 0
    changed: int = 0
    unchanged: int = 0
    unpublished: int = 0
    changes: list[Change] = Field(default_factory=list)
    unpublished_ids: list[str] = Field(default_factory=list)


class ReplayReport(BaseModel):
    since: str
    until: str
    rules: str | None
    rules_version: str
    output_topic: str
    time_index: Mode
    records: dict[str, int]
    workloads: int
    diagnoses: list[dict[str, Any]]
    diff: DiffReport | None = None
    seconds: float


# ---------------------------------------------------------------- progress
class TimeBar:
    """Where the reader is in the window, by record time (end offsets are not trusted)."""

    def __init__(self, label: str, start_ms: int, end_ms: int, stream=None) -> None:
        self.label, self.start_ms, self.end_ms = label, start_ms, max(end_ms, start_ms + 1)
        self.stream = stream or sys.stderr
        self.enabled = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.count = 0
        self._last = 0.0
        self._shown = False

    def __call__(self, ts_ms: int) -> None:
        self.count += 1
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < 0.2:
            return
        self._last = now
        frac = min(max((ts_ms - self.start_ms) / (self.end_ms - self.start_ms), 0.0), 1.0)
        fill = int(frac * 24)
        self.stream.write(f"\r{self.label:<10} [{'#' * fill}{'.' * (24 - fill)}] {iso_ms(ts_ms)[:19]} "
                          f"{self.count:,} records")
        self.stream.flush()
        self._shown = True

    def close(self) -> None:
        if self._shown:
            self.stream.write("\r" + " " * 79 + "\r")
            self.stream.flush()


# ---------------------------------------------------------------- the three reads
def select_attempts(cfg: StreamConfig, window: Window, mode: Mode, index: OffsetIndex | None, idle_s: float,
                    counts: dict[str, int]) -> dict[Key, SchedulerEvent]:
    """Attempts whose end event was published in the window (the last such event wins)."""
    from .codecs import decode_scheduler

    chosen: dict[Key, SchedulerEvent] = {}
    bar = TimeBar("scheduler", window.since_ms, window.until_ms)
    reader = TopicReader(cfg, cfg.topic("scheduler"), since_ms=window.since_ms, until_ms=window.until_ms,
                         mode=mode, index=index, idle_s=idle_s, on_record=bar)
    try:
        for m in reader:
            try:
                ev = decode_scheduler(m.value())
            except RecordError:
                counts["scheduler_unreadable"] += 1
                continue
            counts["scheduler"] += 1
            if ev.type == "end":
                chosen[(ev.workload.workload_id, ev.workload.attempt)] = ev
    finally:
        bar.close()
    return chosen


def rediagnose(cfg: StreamConfig, chosen: dict[Key, SchedulerEvent], window: Window, catalog: Catalog, mode: Mode,
               index: OffsetIndex | None, idle_s: float, counts: dict[str, int]) -> dict[Key, Diagnosis]:
    from firstfault.rules.diagnose import diagnose
    from firstfault.rules.engine import stream_inventory
    from firstfault.rules.model import Ev, EventSet

    from .codecs import decode_raw
    from .extractor import ExtractorCore
    from .timeline import AllocationTimeline

    if not chosen:
        return {}
    # hold_max=0: every end event is known up front, so a line that routes nowhere now never will.
    core = ExtractorCore(cfg.model_copy(update={"hold_max": 0}), catalog)
    for ev in chosen.values():
        core.timeline.apply(ev)
    slack_ms = int(AllocationTimeline().slack.total_seconds() * 1000)
    starts = [int(ev.workload.start_time.timestamp() * 1000) for ev in chosen.values()]
    raw_from = min([window.since_ms, *starts]) - slack_ms
    # Lines that arrive after the end event still revise the stream's diagnosis within the lateness.
    raw_until = window.until_ms + int(cfg.lateness_s * 1000)
    events: dict[Key, EventSet] = {k: EventSet() for k in chosen}
    paths: dict[Key, set[str]] = {k: set() for k in chosen}
    metric_hosts: dict[Key, set[str]] = {k: set() for k in chosen}

    def run(batch: list[tuple[RawLine, int]]) -> None:
        batches = core.handle(batch)
        counts["raw_unreadable"] += len(core.take_failures())     # lines the engine raised on: left out
        for key, out in batches.items():
            if key in events:
                events[key].update(Ev.from_schema(e) for e in out.events)
                paths[key].update(out.paths)
                metric_hosts[key].update(out.metric_hosts)

    bar = TimeBar("raw", raw_from, min(raw_until, int(time.time() * 1000)))
    reader = TopicReader(cfg, cfg.topic("raw"), since_ms=raw_from, until_ms=raw_until, mode=mode, index=index,
                         idle_s=idle_s, on_record=bar)
    batch: list[tuple[RawLine, int]] = []
    try:
        for m in reader:
            try:
                batch.append((decode_raw(m.value(), m.key(), m.headers(), m.offset()), m.timestamp()[1]))
            except (RecordError, ValueError):
                counts["raw_unreadable"] += 1
                continue
            if len(batch) >= cfg.batch:
                run(batch)
                batch = []
        if batch:
            run(batch)
    finally:
        bar.close()
    counts["raw"] = core.counters.records
    return {k: diagnose(ev.workload, events[k].sorted(), catalog,
                        stream_inventory(ev.workload, paths[k], metric_hosts[k]))
            for k, ev in chosen.items()}


def _rev(d: Diagnosis) -> int:
    return -1 if d.revision is None else d.revision


def published(cfg: StreamConfig, window: Window, keys: set[Key], mode: Mode, index: OffsetIndex | None,
              idle_s: float, counts: dict[str, int]) -> dict[Key, Diagnosis]:
    """The latest published revision of each attempt (published at or after ``since``)."""
    latest: dict[Key, Diagnosis] = {}
    reader = TopicReader(cfg, cfg.topic("diagnoses"), since_ms=window.since_ms, mode=mode, index=index, idle_s=idle_s)
    for m in reader:
        d = decode_diagnosis(m.value())
        if d is None:
            continue
        counts["diagnoses"] += 1
        key = (d.workload_id, d.attempt)
        if key not in keys:
            continue
        have = latest.get(key)
        if have is None or _rev(d) >= _rev(have):
            latest[key] = d
    return latest


# ---------------------------------------------------------------- diff
def _comparable(d: Diagnosis, name: str) -> Any:
    if name == "root_cause":
        rc = d.root_cause
        if rc is None:
            return None
        return {"kind": rc.kind, "host": rc.host, "gpu": rc.gpu, "ref": f"{rc.ref.path}:{rc.ref.line}"}
    return getattr(d, name)


def diff(before: Diagnosis, after: Diagnosis) -> dict[str, dict[str, Any]]:
    out = {}
    for name in DIFF_FIELDS:
        b, a = _comparable(before, name), _comparable(after, name)
        if b != a:
            out[name] = {"before": b, "after": a}
    return out


def compare(new: dict[Key, Diagnosis], old: dict[Key, Diagnosis]) -> DiffReport:
    report = DiffReport()
    for key in sorted(new):
        if key not in old:
            report.unpublished += 1
            report.unpublished_ids.append(f"{key[0]}#{key[1]}")
            continue
        report.compared += 1
        fields = diff(old[key], new[key])
        if fields:
            report.changed += 1
            report.changes.append(Change(workload_id=key[0], attempt=key[1], fields=fields))
        else:
            report.unchanged += 1
    return report


# ---------------------------------------------------------------- the whole run
def replay(cfg: StreamConfig, window: Window, rules: str | None = None, output_topic: str | None = None,
           with_diff: bool = False, idle_s: float = 2.0, mode: Mode | None = None,
           emit: Callable[[Diagnosis], None] | None = None) -> ReplayReport:
    from firstfault.connectors.sinks.offset_index import OffsetIndex
    from firstfault.rules.catalog import load_catalog
    from firstfault.schemas.avro import encode

    from . import kafka

    t0 = time.monotonic()
    catalog = load_catalog(rules)
    mode = mode or time_index_mode(cfg)
    index = OffsetIndex(cfg.redis_url, cfg.prefix) if (cfg.redis_url and mode == "scan") else None
    counts = {"scheduler": 0, "scheduler_unreadable": 0, "raw": 0, "raw_unreadable": 0, "diagnoses": 0}
    chosen = select_attempts(cfg, window, mode, index, idle_s, counts)
    results = rediagnose(cfg, chosen, window, catalog, mode, index, idle_s, counts)
    order = sorted(results, key=lambda k: (chosen[k].ts, k))
    out_topic = output_topic or cfg.topic("diagnoses-replay")
    if results:
        kafka.ensure_topics(cfg, [out_topic])
        prod = kafka.producer(cfg)
        headers = [("replay-since", iso_ms(window.since_ms).encode()), ("replay-until", iso_ms(window.until_ms).encode()),
                   ("rules-version", catalog.version.encode())]
        for key in order:
            prod.produce(out_topic, key=key[0].encode(), value=encode(results[key]), headers=headers)
            if emit:
                emit(results[key])
        prod.flush(30)
    report = None
    if with_diff:
        report = compare(results, published(cfg, window, set(results), mode, index, idle_s, counts))
    return ReplayReport(
        since=iso_ms(window.since_ms), until=iso_ms(window.until_ms), rules=rules, rules_version=catalog.version,
        output_topic=out_topic, time_index=mode, records=counts, workloads=len(results),
        diagnoses=[{"workload_id": k[0], "attempt": k[1], "status": results[k].status, "domain": results[k].domain,
                    "sub_domain": results[k].sub_domain, "diagnosis_id": results[k].diagnosis_id} for k in order],
        diff=report, seconds=round(time.monotonic() - t0, 3))


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(map(str, value)) or "-"
    if isinstance(value, dict):
        return " ".join(str(v) for v in value.values() if v is not None)
    return str(value)


def render_text(report: ReplayReport) -> str:
    lines = []
    if report.diff is not None:
        for ch in report.diff.changes:
            lines.append(f"CHANGED  {ch.workload_id}#{ch.attempt}")
            for name, v in ch.fields.items():
                lines.append(f"    {name:<18} {_fmt(v['before'])}  ->  {_fmt(v['after'])}")
        for wid in report.diff.unpublished_ids:
            lines.append(f"NEW      {wid}  (nothing published for it on the diagnoses topic)")
        d = report.diff
        lines.append(f"diff: {d.changed} changed, {d.unchanged} unchanged, {d.unpublished} never published")
    r = report.records
    lines.append(f"replayed {report.workloads} workload attempt(s) ending {report.since} .. {report.until} "
                 f"from {r['raw']:,} raw and {r['scheduler']:,} scheduler records in {report.seconds:.1f}s "
                 f"(rules {report.rules_version}{', overlay ' + report.rules if report.rules else ''}; "
                 f"seek: {report.time_index}) -> {report.output_topic}")
    return "\n".join(lines)


def cmd_replay(args: argparse.Namespace) -> int:
    cfg = StreamConfig.from_env(bootstrap=args.bootstrap, redis_url=args.redis_url, rules=args.rules,
                                prefix=args.prefix)
    if not cfg.bootstrap:
        print("firstfault: no broker: set FIRSTFAULT_KAFKA_BOOTSTRAP or --bootstrap", file=sys.stderr)
        return 2
    try:
        window = Window(since_ms=args.since, until_ms=args.until if args.until is not None else parse_time("now"))
    except ValueError as exc:
        print(f"firstfault: {exc.errors()[0]['msg'] if hasattr(exc, 'errors') else exc}", file=sys.stderr)
        return 2

    def emit(d: Diagnosis) -> None:
        if not args.json and not args.diff:
            print(summary_line(d), flush=True)

    report = replay(cfg, window, rules=cfg.rules, output_topic=args.output_topic, with_diff=args.diff,
                    idle_s=args.idle, emit=emit)
    if args.json:
        sys.stdout.write(report.model_dump_json(indent=2) + "\n")
    else:
        sys.stdout.write(render_text(report) + "\n")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("replay", help="re-diagnose a past time window with a rule catalog")
    p.add_argument("--since", type=parse_time, required=True, help="window start (ISO-8601, or an age: 30d)")
    p.add_argument("--until", type=parse_time, default=None, help="window end (default now)")
    p.add_argument("--rules", default=None, help="a rules directory laid over the built-in catalog (FIRSTFAULT_RULES)")
    p.add_argument("--diff", action="store_true", help="show what changed against the published diagnoses")
    p.add_argument("--json", action="store_true", help="print a machine summary")
    p.add_argument("--output-topic", default=None, help="where replayed diagnoses go (default <prefix>diagnoses-replay)")
    p.add_argument("--idle", type=float, default=2.0, help="Tansu: a topic is read once nothing new came for this long")
    add_connection_flags(p)
    p.set_defaults(fn=cmd_replay)


if __name__ == "__main__":        # python -m firstfault.streams.replay ... = firstfault replay ...
    _p = argparse.ArgumentParser(prog="firstfault")
    register(_p.add_subparsers(dest="command", required=True))
    _a = _p.parse_args(["replay", *sys.argv[1:]])
    raise SystemExit(_a.fn(_a))
