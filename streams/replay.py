"""``firstfault replay``: re-diagnose past workloads with a (new) rule catalog.

Which workloads: by default every attempt whose workload ENDED in ``[since, until)``
(the end time on its scheduler end event), whenever that event was published, so a
window means what an operator means by it, also for bundles shipped after the fact.
``--by publish-time`` selects by when the end event was published instead (the
pipeline's clock: Kafka record timestamps).

Each chosen attempt is diagnosed again, in this process, from the raw topic: the stream
extractor's own ``ExtractorCore`` routes lines to attempts by an allocation timeline built
from those end events (a node-scoped line goes to whichever attempt held the node at the
line's time) and extracts with line memory for stamp inheritance, so a replay gives what
the pipeline would have published, and the same bytes as ``firstfault analyze`` of a
complete bundle. Results go to ``diagnoses-replay`` (never to ``diagnoses``, which the
service and recovery automation act on); ``--diff`` compares them with what the pipeline
published: status, sub_domain, root cause, nodes, candidates and recovery, with a count
per kind of change.

Reading by end time: an end event is published no earlier than the workload ended (less
clock skew), so the scheduler topic is read from ``since`` minus ``END_SKEW_MS`` to its
end. The raw lines of an attempt are read by publish time: from its start (less the
allocation slack) for a live attempt, or from its start event's publication for one
shipped after it ended, to its end event's publication plus the lateness. Seeking:
see ``follow.TopicReader``.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, model_validator

from firstfault.rules.errors import RecordError

from .config import StreamConfig
from .follow import SKEW_MS, Mode, TopicReader, add_connection_flags, decode_diagnosis, iso_ms, parse_time, \
    revision_order, summary_line, time_index_mode

# The engine, Kafka and Redis load when a replay runs, not when the CLI registers its commands.
if TYPE_CHECKING:
    from firstfault.connectors.sinks.offset_index import OffsetIndex
    from firstfault.rules.catalog import Catalog
    from firstfault.schemas import Diagnosis, RawLine, SchedulerEvent

Key = tuple[str, int]
Selector = Literal["end-time", "publish-time"]
# What --diff compares, in the order it reports (domain follows sub_domain, so it is not its own kind).
DIFF_FIELDS = ("status", "sub_domain", "root_cause", "responsible_nodes", "suspect_nodes", "candidates", "recovery")
END_SKEW_MS = 3_600_000      # an end event stamped up to this far before its publication (scheduler vs broker clock)


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
    kinds: dict[str, int] = Field(default_factory=lambda: dict.fromkeys(DIFF_FIELDS, 0),
                                  description="kind of change -> how many attempts it changed in")
    changes: list[Change] = Field(default_factory=list)
    unpublished_ids: list[str] = Field(default_factory=list)


class ReplayReport(BaseModel):
    by: Selector = "end-time"
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
@dataclass(frozen=True)
class Chosen:
    """One attempt to replay: its end event and when (pipeline clock) its events were published."""

    event: SchedulerEvent
    published_ms: int | None            # the end event's record timestamp
    start_published_ms: int | None      # its last start event before that, if read

    @property
    def end_ms(self) -> int:
        return _ms(self.event.workload.end_time or self.event.ts)


def _ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def select_attempts(cfg: StreamConfig, window: Window, by: Selector, mode: Mode, index: OffsetIndex | None,
                    idle_s: float, counts: dict[str, int]) -> dict[Key, Chosen]:
    """Attempts that ended (``by="end-time"``) or whose end event was published in the window;
    the last such end event of an attempt wins."""
    from .codecs import decode_scheduler

    chosen: dict[Key, Chosen] = {}
    started: dict[Key, int | None] = {}
    if by == "end-time":
        # Published at or after the end, whenever: read from the window's start to the topic's end.
        since_ms, until_ms, bar_end = window.since_ms - END_SKEW_MS, None, int(time.time() * 1000)
    else:
        since_ms, until_ms, bar_end = window.since_ms, window.until_ms, window.until_ms
    bar = TimeBar("scheduler", since_ms, bar_end)
    reader = TopicReader(cfg, cfg.topic("scheduler"), since_ms=since_ms, until_ms=until_ms,
                         mode=mode, index=index, idle_s=idle_s, on_record=bar)
    try:
        for m in reader:
            try:
                ev = decode_scheduler(m.value())
            except RecordError:
                counts["scheduler_unreadable"] += 1
                continue
            counts["scheduler"] += 1
            ts_type, ts = m.timestamp()
            published = ts if ts_type else None
            key = (ev.workload.workload_id, ev.workload.attempt)
            if ev.type == "start":
                started[key] = published
                continue
            attempt = Chosen(ev, published, started.get(key))
            if by == "publish-time" or window.since_ms <= attempt.end_ms < window.until_ms:
                chosen[key] = attempt
    finally:
        bar.close()
    return chosen


def raw_bounds(cfg: StreamConfig, chosen: dict[Key, Chosen]) -> tuple[int, int]:
    """The publish-time range holding every raw line of the chosen attempts."""
    from .timeline import AllocationTimeline

    slack_ms = int(AllocationTimeline().slack.total_seconds() * 1000)
    lateness_ms = int(cfg.lateness_s * 1000)
    lows, highs = [], []
    for a in chosen.values():
        start_ms = _ms(a.event.workload.start_time)
        if a.start_published_ms is not None and a.start_published_ms >= a.end_ms:
            # Shipped after it ended: start event, lines, end event, in that order (connectors.shipper).
            low = a.start_published_ms - SKEW_MS
        else:
            # Live: lines are published as they are written, from the allocation's slack before the start.
            low = start_ms - slack_ms
        published = a.published_ms if a.published_ms is not None else a.end_ms
        lows.append(min(low, published - SKEW_MS))
        # Lines that arrive after the end event still revise the stream's diagnosis within the lateness.
        highs.append(max(published, a.end_ms) + lateness_ms)
    return min(lows), max(highs)


def rediagnose(cfg: StreamConfig, chosen: dict[Key, Chosen], catalog: Catalog, mode: Mode,
               index: OffsetIndex | None, idle_s: float, counts: dict[str, int]) -> dict[Key, Diagnosis]:
    from firstfault.rules.diagnose import diagnose
    from firstfault.rules.engine import stream_inventory
    from firstfault.rules.model import Ev
    from firstfault.schemas import Event

    from .codecs import decode_raw
    from .extractor import ExtractorCore
    from .workload_state import merge_events

    if not chosen:
        return {}
    # hold_max=0: every end event is known up front, so a line that routes nowhere now never will.
    core = ExtractorCore(cfg.model_copy(update={"hold_max": 0}), catalog)
    for a in chosen.values():
        core.timeline.apply(a.event)
    raw_from, raw_until = raw_bounds(cfg, chosen)
    # Merged as the correlator merges (a metrics crossing a later batch replaced: the last version).
    events: dict[Key, dict[str, Event]] = {k: {} for k in chosen}
    versions: dict[Key, dict[str, int]] = {k: {} for k in chosen}
    paths: dict[Key, set[str]] = {k: set() for k in chosen}
    metric_hosts: dict[Key, set[str]] = {k: set() for k in chosen}
    counted: dict[Key, dict[str, list[int]]] = {k: {} for k in chosen}     # lines counted: line_ledger

    def run(batch: list[tuple[RawLine, int]]) -> None:
        batches = core.handle(batch)
        core.outputs_delivered()                                  # merged here at once: nothing to make again
        counts["raw_unreadable"] += len(core.take_failures())     # lines the engine raised on: left out
        for key, out in batches.items():
            if key in events:
                merge_events(events[key], versions[key], out.events, counted[key], out.line_files, out.lines)
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
    return {k: diagnose(a.event.workload, [Ev.from_schema(e) for e in events[k].values()], catalog,
                        stream_inventory(a.event.workload, paths[k], metric_hosts[k]), owned=True)
            for k, a in chosen.items()}


def published(cfg: StreamConfig, since_ms: int, keys: set[Key], mode: Mode, index: OffsetIndex | None,
              idle_s: float, counts: dict[str, int]) -> dict[Key, Diagnosis]:
    """The latest published revision of each attempt (published at or after ``since_ms``)."""
    latest: dict[Key, Diagnosis] = {}
    reader = TopicReader(cfg, cfg.topic("diagnoses"), since_ms=since_ms, mode=mode, index=index, idle_s=idle_s)
    for m in reader:
        d = decode_diagnosis(m.value())
        if d is None:
            continue
        counts["diagnoses"] += 1
        key = (d.workload_id, d.attempt)
        if key not in keys:
            continue
        have = latest.get(key)
        if have is None or revision_order(d) >= revision_order(have):
            latest[key] = d
    return latest


# ---------------------------------------------------------------- diff
def _comparable(d: Diagnosis, name: str) -> Any:
    """The part of a field an operator acts on: where the root line is, who is blamed, what recovery does."""
    if name == "root_cause":
        rc = d.root_cause
        if rc is None:
            return None
        return {"kind": rc.kind, "host": rc.host, "gpu": rc.gpu, "ref": f"{rc.ref.path}:{rc.ref.line}"}
    if name == "candidates":
        return sorted(({"sub_domain": c.sub_domain, "nodes": sorted(c.nodes)} for c in d.candidates),
                      key=lambda c: (c["sub_domain"], c["nodes"]))
    if name == "recovery":
        r = d.recovery
        return {"action": r.action, "nodes": list(r.nodes), "next_step": r.next_step}
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
            for name in fields:
                report.kinds[name] += 1
        else:
            report.unchanged += 1
    return report


# ---------------------------------------------------------------- the whole run
def replay(cfg: StreamConfig, window: Window, rules: str | None = None, output_topic: str | None = None,
           with_diff: bool = False, idle_s: float = 2.0, mode: Mode | None = None,
           emit: Callable[[Diagnosis], None] | None = None, by: Selector = "end-time",
           say: Callable[[str], None] | None = None) -> ReplayReport:
    """``say``: one line per step, for a person (firstfault.progress.Steps)."""
    from firstfault.connectors.sinks.offset_index import OffsetIndex
    from firstfault.rules.catalog import load_catalog
    from firstfault.schemas.avro import encode

    from . import kafka

    say = say or (lambda _message: None)
    t0 = time.monotonic()
    catalog = load_catalog(rules)
    mode = mode or time_index_mode(cfg)
    index = OffsetIndex.for_config(cfg) if (cfg.redis_url and mode == "scan") else None
    counts = {"scheduler": 0, "scheduler_unreadable": 0, "raw": 0, "raw_unreadable": 0, "diagnoses": 0}
    which = "ended" if by == "end-time" else "had their end event published"
    say(f"reading {cfg.topic('scheduler')} for the workload attempts that {which} "
        f"{iso_ms(window.since_ms)} .. {iso_ms(window.until_ms)}"
        + (f" (this broker does not say where a topic ends: each read stops once nothing new came for "
           f"{idle_s:g} s, --idle)" if mode == "scan" else ""))
    chosen = select_attempts(cfg, window, by, mode, index, idle_s, counts)
    if chosen:
        low, high = raw_bounds(cfg, chosen)
        say(f"{len(chosen)} workload attempt{'s' if len(chosen) != 1 else ''} to diagnose again: reading their lines "
            f"on {cfg.topic('raw')} published {iso_ms(low)} .. {iso_ms(min(high, int(time.time() * 1000)))}")
    else:
        say(f"no workload attempt {which} in the window ({counts['scheduler']:,} scheduler records read)")
    results = rediagnose(cfg, chosen, catalog, mode, index, idle_s, counts)
    if chosen:
        say(f"{counts['raw']:,} raw records read; {len(results)} diagnosed with rules {catalog.version}")
    order = sorted(results, key=lambda k: (chosen[k].end_ms, k))
    out_topic = output_topic or cfg.topic("diagnoses-replay")
    if results:
        kafka.ensure_topics(cfg, [out_topic])
        prod = kafka.producer(cfg)
        headers = [("replay-since", iso_ms(window.since_ms).encode()), ("replay-until", iso_ms(window.until_ms).encode()),
                   ("replay-by", by.encode()), ("rules-version", catalog.version.encode())]
        for key in order:
            prod.produce(out_topic, key=key[0].encode(), value=encode(results[key]), headers=headers)
            if emit:
                emit(results[key])
        prod.flush(30)
    report = None
    if with_diff:
        # A diagnosis is published after the lines it was made from: none before the first raw line.
        since_ms = raw_bounds(cfg, chosen)[0] if chosen else window.since_ms
        say(f"reading {cfg.topic('diagnoses')} to compare with what the pipeline published")
        report = compare(results, published(cfg, since_ms, set(results), mode, index, idle_s, counts))
    return ReplayReport(
        by=by, since=iso_ms(window.since_ms), until=iso_ms(window.until_ms), rules=rules,
        rules_version=catalog.version, output_topic=out_topic, time_index=mode, records=counts, workloads=len(results),
        diagnoses=[{"workload_id": k[0], "attempt": k[1], "ended": iso_ms(chosen[k].end_ms),
                    "status": results[k].status, "domain": results[k].domain, "sub_domain": results[k].sub_domain,
                    "diagnosis_id": results[k].diagnosis_id} for k in order],
        diff=report, seconds=round(time.monotonic() - t0, 3))


# ---------------------------------------------------------------- text
def _fmt(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, list):
        return "; ".join(map(_fmt, value)) if value and isinstance(value[0], dict) else (",".join(map(str, value)) or "-")
    if isinstance(value, dict):
        if set(value) == {"sub_domain", "nodes"}:                  # a candidate
            return f"{value['sub_domain']} on {_fmt(value['nodes'])}"
        return " ".join(str(v) for v in value.values() if v is not None)
    return str(value)


def _change_lines(name: str, before: Any, after: Any) -> list[str]:
    """One line per changed field (a long value: before and after on lines of their own)."""
    if name == "recovery" and isinstance(before, dict) and isinstance(after, dict):
        return [line for sub in ("action", "nodes", "next_step") if before.get(sub) != after.get(sub)
                for line in _change_lines(f"recovery.{sub}", before.get(sub), after.get(sub))]
    b, a = _fmt(before), _fmt(after)
    if len(b) + len(a) > 72:
        return [f"    {name}", f"        was  {b}", f"        now  {a}"]
    return [f"    {name:<18} {b}  ->  {a}"]


def diff_lines(d: DiffReport) -> list[str]:
    """The --diff text: each changed attempt with its fields, then the counts (also `rules shadow --report`)."""
    lines = []
    for ch in d.changes:
        lines.append(f"CHANGED  {ch.workload_id}#{ch.attempt}")
        for name, v in ch.fields.items():
            lines.extend(_change_lines(name, v["before"], v["after"]))
    for wid in d.unpublished_ids:
        lines.append(f"NEW      {wid}  (nothing published for it on the diagnoses topic)")
    lines.append(f"diff: {d.changed} changed, {d.unchanged} unchanged, {d.unpublished} never published; "
                 f"changes by kind: " + ", ".join(f"{n} {k}" for k, n in d.kinds.items()))
    return lines


def render_text(report: ReplayReport) -> str:
    lines = diff_lines(report.diff) if report.diff is not None else []
    r = report.records
    which = "ending" if report.by == "end-time" else "with an end event published"
    lines.append(f"replayed {report.workloads} workload attempt{'' if report.workloads == 1 else 's'} {which} "
                 f"{report.since} .. {report.until} "
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

    from firstfault.progress import Steps

    def emit(d: Diagnosis) -> None:
        if not args.json and not args.diff:
            print(summary_line(d), flush=True)

    # What it is doing, on stderr, for a person; --json is for a program and says nothing there.
    report = replay(cfg, window, rules=cfg.rules, output_topic=args.output_topic, with_diff=args.diff,
                    idle_s=args.idle, emit=emit, by=args.by, say=Steps("replay", enabled=not args.json))
    if args.json:
        sys.stdout.write(report.model_dump_json(indent=2) + "\n")
    else:
        sys.stdout.write(render_text(report) + "\n")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "replay", help="re-diagnose the workloads that ended in a time window, with a rule catalog",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  firstfault replay --since 2026-11-01 --until 2026-11-10 --rules my-rules/ --diff\n"
               "  firstfault replay --since 2d --json                    the last two days, a machine summary\n"
               "  firstfault replay --since 1h --by publish-time         what the pipeline received in the last hour")
    p.add_argument("--since", type=parse_time, required=True, help="window start (ISO-8601, or an age: 30d)")
    p.add_argument("--until", type=parse_time, default=None, help="window end (default now)")
    p.add_argument("--by", choices=("end-time", "publish-time"), default="end-time",
                   help="select workloads by when they ended (default), or by when their end event was published")
    p.add_argument("--rules", default=None, help="a rules directory laid over the built-in catalog (FIRSTFAULT_RULES)")
    p.add_argument("--diff", action="store_true",
                   help="show what changed against the published diagnoses: status, sub_domain, root cause, nodes, "
                        "candidates, recovery; with a count per kind")
    p.add_argument("--json", action="store_true",
                   help="the report as one JSON object (window, records read, each diagnosis' id and verdict, the "
                        "diff), and no progress lines on stderr")
    p.add_argument("--output-topic", default=None, help="where replayed diagnoses go (default <prefix>diagnoses-replay)")
    p.add_argument("--idle", type=float, default=2.0, metavar="SECONDS",
                   help="on a broker that does not say where a topic ends (the embedded one), a topic counts as read "
                        "once nothing new came for this long (default 2)")
    add_connection_flags(p)
    p.set_defaults(fn=cmd_replay)


if __name__ == "__main__":        # python -m firstfault.streams.replay ... = firstfault replay ...
    _p = argparse.ArgumentParser(prog="firstfault")
    register(_p.add_subparsers(dest="command", required=True))
    _a = _p.parse_args(["replay", *sys.argv[1:]])
    raise SystemExit(_a.fn(_a))
