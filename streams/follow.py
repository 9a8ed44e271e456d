"""Reading a topic as a tool, not as a group member; and ``firstfault diagnoses``.

``TopicReader`` assigns every partition (no consumer group, nothing committed),
seeks to a time when asked, filters on record timestamps and decides when it is
done. Where the broker's offsets are right (Apache Kafka) it seeks with
``offsets_for_times`` and stops at partition EOF. On Tansu both are wrong
(stack.md §1): it starts from the Redis offset index (or the beginning) and stops
after an idle timeout. ``FIRSTFAULT_TIME_INDEX=offsets|scan`` overrides the guess.

    firstfault diagnoses [--all] [--follow] [--json] [--since ISO|30m|2d]

By default ``diagnoses`` shows the latest diagnosis of each workload attempt (its
highest revision), newest publication first, one line each with the cause and the
recovery action; ``--all`` and ``--follow`` list every publication as it was
published, ``--json`` every publication as its diagnosis object.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Literal

from firstfault.rules.summary import node_blame

from .config import StreamConfig

# Kafka, Redis and Avro load on first use: `register` runs for every CLI command,
# and `firstfault analyze` should not pay for the streaming stack.
if TYPE_CHECKING:
    from confluent_kafka import Consumer, Message

    from firstfault.connectors.sinks.offset_index import OffsetIndex
    from firstfault.schemas import Diagnosis

Mode = Literal["offsets", "scan"]
TANSU_CLUSTER_ID = "tansu_cluster"
SKEW_MS = 60_000          # records up to this far past `until` do not end a partition (producer clocks, batching)
_REL = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


# ---------------------------------------------------------------- time
def parse_time(text: str, now: datetime | None = None) -> int:
    """ISO-8601 (zone-less = UTC), ``now``, or an age such as ``90m`` / ``30d`` -> epoch ms."""
    now = now or datetime.now(timezone.utc)
    s = text.strip()
    if s == "now":
        return int(now.timestamp() * 1000)
    if m := _REL.match(s):
        return int((now - timedelta(seconds=float(m[1]) * _UNIT_S[m[2]])).timestamp() * 1000)
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a time: {text!r} (ISO-8601, 'now', or an age like 30m, 2d)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


def iso_ms(ms: int | None) -> str:
    if ms is None or ms <= 0:
        return "-"
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# ---------------------------------------------------------------- broker kind
def broker_is_tansu(cfg: StreamConfig, consumer: Consumer | None = None) -> bool:
    """Tansu names its cluster ``tansu_cluster`` in metadata (stack.md §1)."""
    from . import kafka

    c = consumer or kafka.consumer(cfg, group=f"{cfg.prefix}probe-{uuid.uuid4().hex[:8]}")
    try:
        return c.list_topics(timeout=10).cluster_id == TANSU_CLUSTER_ID
    finally:
        if consumer is None:
            c.close()


def time_index_mode(cfg: StreamConfig, env: Mapping[str, str] | None = None, consumer: Consumer | None = None) -> Mode:
    """'offsets' when the broker's time index and end offsets can be trusted, else 'scan'."""
    env = os.environ if env is None else env
    override = env.get("FIRSTFAULT_TIME_INDEX", "").strip().lower()
    if override in ("offsets", "scan"):
        return override  # type: ignore[return-value]
    return "scan" if broker_is_tansu(cfg, consumer) else "offsets"


# ---------------------------------------------------------------- reader
class TopicReader:
    """Every partition of one topic, from a time or the beginning, until done (or forever)."""

    def __init__(self, cfg: StreamConfig, topic: str, *, since_ms: int | None = None, until_ms: int | None = None,
                 follow: bool = False, idle_s: float = 2.0, mode: Mode | None = None,
                 index: OffsetIndex | None = None, on_record: Callable[[int], None] | None = None,
                 also: Sequence[str] = (), on_quiet: Callable[[float], None] | None = None) -> None:
        """``also``: more topics read beside ``topic`` by the same consumer, from the same time (a missing
        one is skipped); ``on_quiet``: called, in follow mode, with the seconds since the last record
        whenever a poll brought nothing (the reader has caught up for now)."""
        self.cfg, self.topic = cfg, topic
        self.since_ms, self.until_ms = since_ms, until_ms
        self.follow, self.idle_s = follow, idle_s
        self.index = index
        self.on_record = on_record
        self.also = tuple(also)
        self.on_quiet = on_quiet
        self.read = 0            # messages fetched, before any filtering
        self._stop = False
        from . import kafka

        # EOF events are only believed in 'offsets' mode (Tansu's end offsets are wrong).
        self.consumer = kafka.consumer(cfg, group=f"{cfg.prefix}reader-{uuid.uuid4().hex[:8]}",
                                       **{"fetch.wait.max.ms": 100, "enable.partition.eof": True})
        self.mode: Mode = mode or time_index_mode(cfg, consumer=self.consumer)

    def stop(self) -> None:
        self._stop = True

    def partitions(self, wait: bool = False, topic: str | None = None) -> list[int]:
        topic = topic or self.topic
        while True:
            meta = self.consumer.list_topics(topic, timeout=10).topics.get(topic)
            if meta is not None and meta.error is None and meta.partitions:
                return sorted(meta.partitions)
            if not wait or self._stop:
                return []
            time.sleep(1.0)

    def start_offsets(self, parts: list[int], topic: str | None = None) -> dict[int, int]:
        from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, TopicPartition

        topic = topic or self.topic
        if self.since_ms is None:
            return {p: OFFSET_BEGINNING for p in parts}
        if self.mode == "offsets":
            found = self.consumer.offsets_for_times([TopicPartition(topic, p, self.since_ms) for p in parts],
                                                    timeout=10)
            # -1: nothing stamped at or after `since` in that partition yet.
            return {tp.partition: (tp.offset if tp.offset >= 0 else OFFSET_END) for tp in found}
        noted = self.index.start_offsets(topic, self.since_ms) if self.index else {}
        return {p: noted.get(p, 0) for p in parts}

    def __iter__(self) -> Iterator[Message]:
        from confluent_kafka import KafkaError, TopicPartition

        parts = self.partitions(wait=self.follow)
        if not parts:
            return
        every = [(self.topic, p) for p in parts]
        assign = [TopicPartition(self.topic, p, o) for p, o in self.start_offsets(parts).items()]
        missing = []
        for other in self.also:
            more = self.partitions(topic=other)
            missing += [] if more else [other]
            every += [(other, p) for p in more]
            assign += [TopicPartition(other, p, o) for p, o in self.start_offsets(more, other).items()]
        self.consumer.assign(assign)
        look_again = time.monotonic() + 2.0
        eof: set[tuple[str, int]] = set()      # at the end (offsets mode only)
        past: set[tuple[str, int]] = set()     # past `until`: paused for good
        stop_after = self.until_ms + SKEW_MS if self.until_ms is not None else None
        # Kafka mode ends on EOF; the idle limit there only guards against a partition that never answers.
        idle = self.idle_s if self.mode == "scan" else max(10.0, 5 * self.idle_s)
        last = time.monotonic()
        try:
            while not self._stop:
                msgs = self.consumer.consume(num_messages=1000, timeout=0.2)
                now = time.monotonic()
                if not msgs and self.follow and self.on_quiet is not None:
                    self.on_quiet(now - last)
                if missing and self.follow and now >= look_again:
                    # Followed, a topic created after we started (the pipeline came up later) is read too.
                    look_again = now + 2.0
                    for other in list(missing):
                        if more := self.partitions(topic=other):
                            missing.remove(other)
                            self.consumer.incremental_assign([TopicPartition(other, p, o) for p, o in
                                                              self.start_offsets(more, other).items()])
                for m in msgs:
                    err = m.error()
                    where = (m.topic(), m.partition())
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            if self.mode == "offsets":
                                eof.add(where)
                        else:
                            print(f"firstfault: {m.topic() or self.topic}: {err}", file=sys.stderr)
                        continue
                    last = now
                    self.read += 1
                    ts_type, ts = m.timestamp()
                    ts = ts if ts_type else None
                    if self.on_record is not None and ts is not None:
                        self.on_record(ts)
                    if ts is not None and self.since_ms is not None and ts < self.since_ms:
                        continue
                    if ts is not None and self.until_ms is not None and ts >= self.until_ms:
                        if not self.follow and stop_after is not None and ts > stop_after:
                            past.add(where)
                            self.consumer.pause([TopicPartition(*where)])
                        continue
                    eof.discard(where)
                    yield m
                if self.follow:
                    continue
                if len(eof | past) >= len(every) or now - last >= idle:
                    return
        finally:
            self.consumer.close()


# ---------------------------------------------------------------- diagnoses
def decode_diagnosis(value: bytes | None) -> Diagnosis | None:
    """Avro Diagnosis, else None (tombstones and foreign records are skipped, not fatal)."""
    from firstfault.schemas import Diagnosis
    from firstfault.schemas.avro import decode

    if not value:
        return None
    try:
        rec = decode(value)
    except ValueError:
        return None
    return rec if isinstance(rec, Diagnosis) else None


def summary_line(d: Diagnosis, published_ms: int | None = None, width: int | None = None) -> str:
    """One readable line: when, which attempt, which revision, the verdict, whom it blames, the
    recovery action and the one-line cause; cut to ``width`` (with an ellipsis) when given."""
    rev = "-" if d.revision is None else str(d.revision)
    phase = "provisional" if d.provisional else ("final" if d.revision is not None else "offline")  # replay, analyze
    where = f"{d.domain}/{d.sub_domain}"
    blame = node_blame(d.domain, d.responsible_nodes)
    if d.suspect_nodes:
        blame += f"  suspect {','.join(d.suspect_nodes)}"
    recovery = d.recovery.action + (f" {','.join(d.recovery.nodes)}" if d.recovery.nodes else "")
    stamp = f"{iso_ms(published_ms)}  " if published_ms else ""
    line = (f"{stamp}{d.workload_id}#{d.attempt}  rev {rev} {phase:<11}  {d.status.upper():<12}  "
            f"{where:<40}  {blame}  recovery {recovery}  {cause_text(d)}")
    return cut(line, width)


def cut(line: str, width: int | None) -> str:
    """``line`` in at most ``width`` columns, an ellipsis where it was cut (None: whole)."""
    if width is not None and len(line) > width:
        return line[:max(width - 1, 0)] + "\u2026"
    return line


def revision_order(d: Diagnosis) -> int:
    """Revisions in order; a diagnosis without one (replayed, offline) sorts first."""
    return -1 if d.revision is None else d.revision


def latest_per_attempt(items: list[tuple[Diagnosis, int | None]]) -> list[tuple[Diagnosis, int | None]]:
    """Each attempt's latest diagnosis (highest revision; the later publication on a tie), newest first."""
    latest: dict[tuple[str, int], tuple[Diagnosis, int | None]] = {}
    for d, ts in items:
        key = (d.workload_id, d.attempt)
        have = latest.get(key)
        if have is None or revision_order(d) >= revision_order(have[0]):
            latest[key] = (d, ts)
    return sorted(latest.values(), key=lambda it: (-(it[1] or 0), it[0].workload_id, it[0].attempt))


def _nodes(d: Diagnosis) -> str:
    """Whom it blames: responsible nodes, else suspects, else the candidates' nodes."""
    def short(hosts: list[str]) -> str:
        return ",".join(hosts) if len(hosts) <= 3 else f"{','.join(hosts[:2])} +{len(hosts) - 2}"

    if d.responsible_nodes:
        return short(d.responsible_nodes)
    if d.suspect_nodes:
        return "suspect " + short(d.suspect_nodes)
    if hosts := sorted({h for c in d.candidates for h in c.nodes}):
        return "one of " + short(hosts)
    return "-"


def cause_text(d: Diagnosis) -> str:
    """The one-line cause: the root cause's sentence when there is one, else the summary."""
    text = d.root_cause.message if d.root_cause is not None and d.root_cause.message else d.summary
    return " ".join(text.split()) or "-"


def _width(stream) -> int | None:
    """Columns to cut lines to: $COLUMNS, else the terminal's; None (no cut) when not a terminal."""
    if (cols := os.environ.get("COLUMNS", "")).isdigit() and int(cols) > 0:
        return int(cols)
    if hasattr(stream, "isatty") and stream.isatty():
        return shutil.get_terminal_size((100, 24)).columns
    return None


def latest_table(items: list[tuple[Diagnosis, int | None]], width: int | None = None) -> list[str]:
    """The operator's view: a header and one line per attempt, the cause last and cut to ``width``."""
    header = ("WORKLOAD", "ATTEMPT", "STATUS", "SUB_DOMAIN", "NODES", "RECOVERY")
    rows = [(d.workload_id, str(d.attempt), d.status + ("*" if d.provisional else ""), d.sub_domain, _nodes(d),
             d.recovery.action, cause_text(d)) for d, _ in items]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [cut("  ".join(v.ljust(w) for v, w in zip(row, widths)) + "  " + row[-1], width)
            for row in [(*header, "CAUSE"), *rows]]


# ---------------------------------------------------------------- attempts still open
@dataclass
class Attempt:
    """A workload attempt the scheduler topic announced, and what the diagnoses topic said of it."""

    workload_id: str
    attempt: int
    nodes: int = 0
    started_ms: int | None = None      # the start record's timestamp
    ended_ms: int | None = None        # the end record's timestamp: the correlator's grace runs from about then
    final: bool = False                # a final (not provisional) diagnosis was read
    provisional: bool = False

    @property
    def name(self) -> str:
        return f"{self.workload_id}#{self.attempt}"


@dataclass(frozen=True)
class Timings:
    """How long the correlator waits (StreamConfig), as the running pipeline has them where known."""

    grace_cap_s: float
    watermark_wait_s: float
    lateness_s: float


def timings(cfg: StreamConfig, run: tuple | None = None) -> Timings:
    """The running `up`'s waits (its run file), else this environment's."""
    got = {"grace_cap_s": cfg.grace_cap_s, "watermark_wait_s": cfg.watermark_wait_s, "lateness_s": cfg.lateness_s}
    if run is not None:
        from . import runfile

        info = runfile.lookup(run[0]).info
        if info is not None:
            got.update({k: v for k, v in info.timings.items() if k in got})
    return Timings(**got)


def _age(ms: float) -> str:
    s = max(ms, 0) / 1000
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    if s < 172800:
        return f"{s / 3600:.0f} h"
    return f"{s / 86400:.0f} d"


class OpenAttempts:
    """Which attempts have no final diagnosis yet, and why, from the scheduler and diagnoses topics:
    what ``diagnoses`` says while the correlator waits (its grace, the extractors) instead of nothing."""

    SHOWN = 10

    def __init__(self, timings: Timings) -> None:
        self.timings = timings
        self.by_key: dict[tuple[str, int], Attempt] = {}
        self.fresh: set[tuple[str, int]] = set()      # changed since the last look (follow mode)

    def _get(self, wid: str, attempt: int) -> Attempt:
        return self.by_key.setdefault((wid, attempt), Attempt(wid, attempt))

    def scheduler(self, value: bytes | None, ts_ms: int | None) -> None:
        from firstfault.rules.errors import RecordError

        from .codecs import decode_scheduler

        try:
            ev = decode_scheduler(value)
        except RecordError:          # not a scheduler event: nothing to say about it here
            return
        wl = ev.workload
        a = self._get(wl.workload_id, wl.attempt)
        a.nodes = len(wl.nodes) or a.nodes
        if ev.type == "start":
            a.started_ms = ts_ms if ts_ms is not None else int(ev.ts.timestamp() * 1000)
        else:
            a.ended_ms = ts_ms if ts_ms is not None else int(ev.ts.timestamp() * 1000)
        self.fresh.add((wl.workload_id, wl.attempt))

    def diagnosis(self, d: Diagnosis) -> None:
        a = self._get(d.workload_id, d.attempt)
        if d.provisional:
            a.provisional = True
        else:
            a.final = True

    def open(self, keys: set[tuple[str, int]] | None = None) -> list[Attempt]:
        """Announced, not finally diagnosed: ended ones first, then running ones, newest first."""
        found = [a for k, a in self.by_key.items() if not a.final and (a.started_ms or a.ended_ms)
                 and (keys is None or k in keys)]
        return sorted(found, key=lambda a: (a.ended_ms is None, -(a.ended_ms or a.started_ms or 0), a.name))

    def describe(self, a: Attempt, now_ms: int) -> str:
        t = self.timings
        if a.ended_ms is not None:
            ago = now_ms - a.ended_ms
            left = a.ended_ms + t.grace_cap_s * 1000 - now_ms
            if left > 0:
                why = (f"final diagnosis in about {_age(left)} (the correlator's grace period for late lines, "
                       f"FIRSTFAULT_GRACE_CAP_S={t.grace_cap_s:g})")
            elif ago < (t.grace_cap_s + t.watermark_wait_s) * 1000:
                why = "final diagnosis due: the correlator waits for the extractors to read every line shipped before its end"
            elif ago < t.lateness_s * 1000:
                why = ("no final diagnosis yet: the extractors are behind (a provisional diagnosis names the "
                       f"partitions); the final comes within {_age(t.lateness_s * 1000)} of the end")
            else:
                why = "no final diagnosis was published for it (was the pipeline down?)"
            return f"waiting  {a.name}  ended {_age(ago)} ago; {why}"
        nodes = f" on {a.nodes} node{'s' if a.nodes != 1 else ''}" if a.nodes else ""
        shown = "; a provisional diagnosis is listed" if a.provisional else ""
        return (f"running  {a.name}  started {_age(now_ms - (a.started_ms or now_ms))} ago{nodes}, no end event yet: "
                f"diagnosed once it ends (at once, provisionally, if a root cause shows){shown}")

    def lines(self, now_ms: int, keys: set[tuple[str, int]] | None = None) -> list[str]:
        found = self.open(keys)
        out = [self.describe(a, now_ms) for a in found[:self.SHOWN]]
        if len(found) > self.SHOWN:
            out.append(f"... and {len(found) - self.SHOWN} more attempts without a final diagnosis")
        return out


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


class _Notes:
    """Lines about attempts with no final diagnosis yet, on stderr (escaped: the ids come from the data).
    In follow mode: once the reader first caught up, every open attempt; then each attempt whose start
    or end event just arrived, so a shipped job is never silent while the correlator waits."""

    def __init__(self, attempts: OpenAttempts, catch_up_s: float) -> None:
        self.attempts, self.catch_up_s = attempts, catch_up_s
        self.caught_up = False

    def say(self, lines: list[str]) -> None:
        from firstfault.term import printable

        for line in lines:
            print(printable(line), file=sys.stderr, flush=True)

    def quiet(self, quiet_s: float) -> None:
        now_ms = int(time.time() * 1000)
        if not self.caught_up:
            if quiet_s < self.catch_up_s:
                return
            self.caught_up = True
            self.say(self.attempts.lines(now_ms))
        elif self.attempts.fresh:
            self.say(self.attempts.lines(now_ms, self.attempts.fresh))
        self.attempts.fresh.clear()


def cmd_diagnoses(args: argparse.Namespace) -> int:
    cfg = StreamConfig.from_env(bootstrap=args.bootstrap, redis_url=args.redis_url, prefix=args.prefix)
    if not cfg.bootstrap:
        print("firstfault: no broker: set FIRSTFAULT_KAFKA_BOOTSTRAP or --bootstrap "
              "(`firstfault up` prints it)", file=sys.stderr)
        return 2
    from firstfault.connectors.sinks.offset_index import OffsetIndex

    topic = cfg.topics.get(args.topic, args.topic)
    # For a person (not --json) reading the live diagnoses: the scheduler topic too, to say which
    # attempts have no final diagnosis yet and why (the grace period, the extractors), not nothing.
    scheduler = cfg.topic("scheduler") if not args.json and topic == cfg.topic("diagnoses") else None
    attempts = OpenAttempts(timings(cfg, getattr(args, "up_run", None)))
    notes = _Notes(attempts, catch_up_s=min(args.idle, 1.0))
    index = OffsetIndex.for_config(cfg) if cfg.redis_url else None
    reader = TopicReader(cfg, topic, since_ms=args.since, follow=args.follow, idle_s=args.idle, index=index,
                         also=(scheduler,) if scheduler else (), on_quiet=notes.quiet if scheduler else None)
    if not reader.partitions():
        if reader.follow:              # it waits for the topic: say so, not nothing
            print(f"firstfault: topic {topic} does not exist yet: waiting for it (is the pipeline up?)",
                  file=sys.stderr, flush=True)
        else:
            reader.consumer.close()
            print(f"firstfault: topic {topic} does not exist (is the pipeline up?)", file=sys.stderr)
            return 0
    every = args.all or args.follow or args.json        # else: the latest per attempt, once the topic is read
    width = None if args.json else _width(sys.stdout)
    kept: list[tuple[Diagnosis, int | None]] = []
    skipped = 0
    try:
        for m in reader:
            ts_type, ts = m.timestamp()
            ts = ts if ts_type else None
            if scheduler is not None and m.topic() == scheduler:
                attempts.scheduler(m.value(), ts)
                continue
            d = decode_diagnosis(m.value())
            if d is None:
                skipped += 1
                continue
            attempts.diagnosis(d)
            if not every:
                kept.append((d, ts))
                continue
            if args.json:
                line = json.dumps(d.to_dict(), sort_keys=True, ensure_ascii=False)
            else:
                line = summary_line(d, ts, width)
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
    except KeyboardInterrupt:
        reader.stop()          # Ctrl-C is how --follow ends: not an error
    if not every:
        latest = latest_per_attempt(kept)
        if latest:
            sys.stdout.write("\n".join(latest_table(latest, width)) + "\n")
            sys.stdout.flush()          # the table before the note on stderr, on one terminal
            note = f"{_n(len(latest), 'workload attempt')}, {_n(len(kept), 'publication')}; --all lists every publication"
            if any(d.provisional for d, _ in latest):
                note += "; * provisional: published before the workload's end event"
            print(note, file=sys.stderr)
        else:
            print(f"firstfault: no diagnoses on {topic} yet", file=sys.stderr)
    if not args.follow:
        notes.say(attempts.lines(int(time.time() * 1000)))
    if skipped:
        print(f"firstfault: skipped {_n(skipped, 'record')} on {topic} that are not Avro diagnoses", file=sys.stderr)
    return 0


def add_connection_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", default=None, help="Kafka bootstrap servers (FIRSTFAULT_KAFKA_BOOTSTRAP)")
    p.add_argument("--redis-url", default=None, help="Redis URL (FIRSTFAULT_REDIS_URL)")
    p.add_argument("--prefix", default=None, help="topic prefix (FIRSTFAULT_TOPIC_PREFIX, default 'firstfault.')")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "diagnoses", help="read the diagnoses topic: the latest diagnosis of each workload attempt, newest first",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  firstfault diagnoses                      latest per workload attempt, with cause and recovery\n"
               "  firstfault diagnoses --all --since 2h     every publication (provisional and final) of the last 2 h\n"
               "  firstfault diagnoses --follow             each new publication as it arrives, until Ctrl-C\n"
               "  firstfault diagnoses --json | jq .summary one diagnosis object per publication")
    p.add_argument("--all", action="store_true", help="every publication, in topic order, not only the latest")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new publications until Ctrl-C")
    p.add_argument("--json", action="store_true", help="one diagnosis object per publication, per line")
    p.add_argument("--since", type=parse_time, default=None,
                   help="only those published at or after this time (ISO-8601, or an age: 30m, 2d)")
    p.add_argument("--idle", type=float, default=2.0,
                   help="without --follow: stop after this many seconds with nothing new (default 2)")
    p.add_argument("--topic", default="diagnoses",
                   help="a logical topic (diagnoses, diagnoses-replay) or a full name; default diagnoses")
    add_connection_flags(p)
    p.set_defaults(fn=cmd_diagnoses)


def main(argv: list[str] | None = None, command: str = "diagnoses") -> int:
    """``python -m firstfault.streams.follow ...`` = ``firstfault diagnoses ...`` (before and besides the CLI)."""
    parser = argparse.ArgumentParser(prog="firstfault")
    subs = parser.add_subparsers(dest="command", required=True)
    register(subs)
    args = parser.parse_args([command, *(sys.argv[1:] if argv is None else argv)])
    return args.fn(args)


if __name__ == "__main__":
    raise SystemExit(main())
