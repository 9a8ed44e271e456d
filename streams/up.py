"""``firstfault up``: the whole streaming pipeline in the foreground; ``firstfault topology``.

``up`` starts the embedded Tansu broker when no FIRSTFAULT_KAFKA_BOOTSTRAP is set,
creates the topics, runs the extractor worker(s) and one correlator as child
processes configured through FIRSTFAULT_* variables, restarts a worker that dies
(with backoff) and, on Ctrl-C or SIGTERM, stops them one at a time (upstream first,
so what the extractors flushed can still be read) and then the broker.

It prints where things are and then "ready" once every worker's /readyz answers and
their consumer groups are stable. An embedded broker is announced in the run file
(runfile.py), so other commands find it with nothing set. Worker output (Faust's
banner, start and stop lines) goes to ``up.log`` beside the run file; ``-v`` puts it
on the terminal. Either way it passes through ``up``, which escapes it (term.py): a
worker's lines name workload ids, and those come from the logs.

Every child runs in its own session: a Ctrl-C at the terminal reaches only ``up``,
which then stops the group members one by one. (Tansu wedges a consumer group when
members leave together, stack.md §1, and the broker must outlive the workers.) A
child also gets SIGTERM if ``up`` itself dies, so nothing is orphaned.
"""
from __future__ import annotations

import argparse
import ctypes
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from pydantic import BaseModel

from firstfault.term import printable

from . import reach, runfile
from .broker import EmbeddedBroker, free_port
from .config import StreamConfig
from .follow import broker_is_tansu

log = logging.getLogger("firstfault.up")

# StreamConfig field -> FIRSTFAULT_ variable (the inverse of StreamConfig.from_env).
ENV_NAMES = {
    "bootstrap": "KAFKA_BOOTSTRAP", "redis_url": "REDIS_URL", "prefix": "TOPIC_PREFIX", "rules": "RULES",
    "partitions": "PARTITIONS", "grace_s": "GRACE_S", "grace_cap_s": "GRACE_CAP_S", "lateness_s": "LATENESS_S",
    "hold_s": "HOLD_S", "hold_max": "HOLD_MAX", "batch": "BATCH", "app_id": "APP_ID",
    "extractor_group": "EXTRACTOR_GROUP", "watermark_wait_s": "WATERMARK_WAIT_S",
    "watermark_margin_s": "WATERMARK_MARGIN_S", "standby_replicas": "STANDBY_REPLICAS",
}
RESTART_RESET_S = 60.0        # a worker that ran this long starts its backoff afresh
MAX_BACKOFF_S = 30.0
RELAY_LINE = 64 * 1024        # a worker's output is relayed in lines of at most this many bytes
RELAY_DRAIN_S = 5.0           # after a worker exits, how long its last lines may take to arrive


# ---------------------------------------------------------------- topology
class TopicInfo(BaseModel):
    name: str
    logical: str
    partitions: int
    key: str
    value: str
    producers: list[str]
    consumers: list[str]


class WorkerInfo(BaseModel):
    name: str
    kind: Literal["worker", "command"]
    instances: int
    command: str
    group: str | None
    inputs: list[str]
    outputs: list[str]
    stores: list[str]


class Topology(BaseModel):
    bootstrap: str
    prefix: str
    redis: str
    topics: list[TopicInfo]
    workers: list[WorkerInfo]


# logical topic -> (key, value)
_TOPIC_SHAPES = {
    "raw": ("host", "Avro RawLine, JSON (Fluent Bit / Vector / rsyslog) or plain text"),
    "scheduler": ("workload_id", "Avro SchedulerEvent (start, end) or its JSON"),
    "events": ("workload_id", "Avro EventBatch: one workload attempt's merged events"),
    "diagnoses": ("workload_id", "Avro Diagnosis (revision, provisional)"),
    "deadletter": ("the refused record's key", "JSON DeadLetter: reason, stage, step, origin, the bytes (over 64 KiB: head, size, SHA-256)"),
    "node-history": ("host", "Avro Event: a node-scoped line no workload attempt claimed, extracted on its own"),
    "diagnoses-replay": ("workload_id", "Avro Diagnosis from `firstfault replay`"),
    "progress": ("<raw topic>/<partition>", "JSON Progress: how far an extractor read a raw partition (compacted)"),
    "rules": ("version/<rules_version>, live, shadow", "JSON: published rule catalogs and the live and shadow pointers (compacted, 1 partition)"),
    "diagnoses-shadow": ("workload_id", "Avro Diagnosis from `firstfault rules shadow` (a candidate catalog)"),
    "node-health": ("host", "JSON: a node's episodes and recommendation (compacted; `firstfault nodes --rebuild`)"),
}


def describe(cfg: StreamConfig, extractors: int = 1) -> Topology:
    """The pipeline as configured (the Kafka Streams ``Topology.describe()`` idea)."""
    redis = cfg.redis_url or "none: diagnoses live only on the diagnoses topic; the service uses its in-process store"
    workers = [
        WorkerInfo(name="extractor", kind="worker", instances=extractors, command="python -m firstfault.streams.extractor",
                   group=cfg.extractor_group, inputs=["raw (group)", "scheduler (every partition, no group)",
                                                     "rules (every partition, no group)"],
                   outputs=["events", "node-history", "deadletter", "progress"],
                   stores=["allocation timeline (memory, rebuilt from the scheduler topic)",
                           f"held lines waiting for their workload (memory, <= {cfg.hold_max} for {cfg.hold_s:g}s)",
                           "last lines per file for stamp inheritance (memory)"]),
        WorkerInfo(name="correlator", kind="worker", instances=1, command="python -m firstfault.streams.correlator",
                   group=cfg.app_id, inputs=["events", "scheduler", "progress (every partition, no group)",
                                                "rules (every partition, no group)"],
                   outputs=["diagnoses", "deadletter"],
                   stores=["workload state per '<workload_id>:<attempt>' (Faust table, changelog topic)",
                           f"diagnoses store ({'Redis ' + cfg.redis_url if cfg.redis_url else 'none: topic only'})"]),
        WorkerInfo(name="node-health", kind="worker", instances=1 if cfg.redis_url else 0,
                   command="python -m firstfault.streams.node_health --follow", group=f"{cfg.app_id}-node-health",
                   inputs=["diagnoses (group)"], outputs=["node-health"],
                   stores=["fleet memory per node (Redis; needs FIRSTFAULT_REDIS_URL)"]),
        WorkerInfo(name="ship", kind="command", instances=1, command="firstfault ship PATH", group=None,
                   inputs=["a bundle"], outputs=["scheduler", "raw"], stores=[]),
        WorkerInfo(name="diagnoses", kind="command", instances=1, command="firstfault diagnoses [--follow]",
                   group=None, inputs=["diagnoses (every partition, no group)",
                                       "scheduler (the attempts with no final diagnosis yet; not with --json)"],
                   outputs=["stdout"], stores=[]),
        WorkerInfo(name="replay", kind="command", instances=1, command="firstfault replay --since T --until T",
                   group=None, inputs=["scheduler", "raw", "diagnoses (--diff)"], outputs=["diagnoses-replay"],
                   stores=[f"offset index by hour ({'Redis' if cfg.redis_url else 'none: scans from the start'})"]),
        WorkerInfo(name="rules", kind="command", instances=1, command="firstfault rules publish|promote|rollback",
                   group=None, inputs=["a rules directory", "rules"], outputs=["rules"], stores=[]),
        WorkerInfo(name="shadow", kind="command", instances=1, command="firstfault rules shadow DIR", group=None,
                   inputs=["scheduler", "raw", "rules", "diagnoses (--report)"], outputs=["diagnoses-shadow", "rules"],
                   stores=[]),
    ]
    topics = []
    for logical, name in cfg.topics.items():
        key, value = _TOPIC_SHAPES.get(logical, ("-", "-"))
        topics.append(TopicInfo(
            name=name, logical=logical, partitions=1 if logical == "rules" else cfg.partitions, key=key, value=value,
            producers=[w.name for w in workers if any(o.split(" ")[0] == logical for o in w.outputs)],
            consumers=[w.name for w in workers if any(i.split(" ")[0] == logical for i in w.inputs)]))
    return Topology(bootstrap=cfg.bootstrap or "embedded Tansu (started by `firstfault up`)", prefix=cfg.prefix,
                    redis=redis, topics=topics, workers=workers)


def render_topology(t: Topology) -> str:
    out = [f"bootstrap  {t.bootstrap}", f"redis      {t.redis}", "", "Topics"]
    for tp in t.topics:
        out.append(f"  {tp.name}  ({tp.partitions} partition{'' if tp.partitions == 1 else 's'}, key {tp.key})")
        out.append(f"      {tp.value}")
        out.append(f"      producers: {', '.join(tp.producers) or '-'}   consumers: {', '.join(tp.consumers) or '-'}")
    out += ["", "Workers and commands"]
    for w in t.workers:
        n = f" x{w.instances}" if w.kind == "worker" else ""
        out.append(f"  {w.name}{n}  [{w.command}]" + (f"  group {w.group}" if w.group else ""))
        out.append(f"      in:  {', '.join(w.inputs)}")
        out.append(f"      out: {', '.join(w.outputs)}")
        for s in w.stores:
            out.append(f"      store: {s}")
    return "\n".join(out)


def cmd_topology(args: argparse.Namespace) -> int:
    cfg = StreamConfig.from_env(bootstrap=args.bootstrap, redis_url=args.redis_url, partitions=args.partitions,
                                prefix=args.prefix)
    topo = describe(cfg, args.extractors)
    sys.stdout.write((topo.model_dump_json(indent=2) if args.json else render_topology(topo)) + "\n")
    return 0


# ---------------------------------------------------------------- children
_PR_SET_PDEATHSIG = 1
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):      # not Linux
    _prctl = None


def _child_setup() -> None:
    """In the child before exec: SIGTERM when the parent dies (Linux), so a killed `up` leaves no orphans."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def spawn_kwargs() -> dict:
    return {"start_new_session": True, "preexec_fn": _child_setup}


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _relay(pipe: IO[bytes], fd: int, notice: Callable[[str], None] | None = None) -> None:
    """A worker's output to ``fd``, line by line, control characters escaped; each line also to
    ``notice`` (what `up` says on the terminal about it)."""
    with pipe:
        for raw in iter(lambda: pipe.readline(RELAY_LINE), b""):
            text = raw.decode("utf-8", "replace")
            body = text.removesuffix("\n")
            try:
                _write_all(fd, (printable(body) + text[len(body):]).encode("utf-8"))
            except OSError:           # our stderr is gone: keep reading, a worker must never block on us
                pass
            if notice is not None:
                try:
                    notice(body)
                except Exception:     # noqa: BLE001 - a note on the terminal must never stop the relay
                    pass


class RulesNotice:
    """One line on `up`'s terminal when the workers change rule catalog (``rules publish``, ``promote``,
    ``rollback``) or refuse one: the workers say it in their output, which goes to ``up.log``.
    Said once per catalog, however many workers load it."""

    NOW = re.compile(r"rules: now (\S+), was (\S+?)(?: \((.*)\))?$")
    REFUSED = re.compile(r"rules: refused (\S+), keeping (\S+): (.*)$")

    def __init__(self, out: IO[str] | None = None) -> None:
        self.out = out
        self.said: set[tuple[str, str]] = set()
        self.lock = threading.Lock()

    def __call__(self, line: str, worker: str = "") -> None:
        if "rules: " not in line:
            return
        if m := self.NOW.search(line):
            key, text = ("now", m[1]), (f"rules: the workers now diagnose with {m[1]} (was {m[2]}"
                                        + (f"; {m[3]}" if m[3] else "") + ")")
        elif m := self.REFUSED.search(line):
            key, text = ("refused", m[1]), (f"rules: {worker or 'a worker'} refused {m[1]} and keeps {m[2]}: {m[3]} "
                                            "(firstfault rules rollback, or publish a fixed catalog)")
        else:
            return
        with self.lock:
            if key in self.said:
                return
            self.said.add(key)
            print(printable(text), file=self.out or sys.stdout, flush=True)


def worker_env(cfg: StreamConfig, base: dict[str, str] | None = None) -> dict[str, str]:
    """The parent's environment with every FIRSTFAULT_ setting made explicit from ``cfg``."""
    env = dict(os.environ if base is None else base)
    for fname, var in ENV_NAMES.items():
        value = getattr(cfg, fname)
        if value is None:
            env.pop(f"FIRSTFAULT_{var}", None)
        else:
            env[f"FIRSTFAULT_{var}"] = str(value)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class Worker:
    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    group: str | None = None           # consumer group it joins
    proc: subprocess.Popen | None = None
    started: float = 0.0
    restarts: int = 0
    failures: int = 0                  # consecutive short runs, for the backoff
    not_before: float = 0.0
    log: Path | None = None            # where its output goes (Faust's banner, start/stop lines); None: our stderr
    log_fd: int | None = None          # that file, opened once by `up` (runfile.fresh_log)
    health_port: int | None = None     # its /readyz, which `up` asks before it says "ready"
    relay: threading.Thread | None = None
    notice: Callable[[str, str], None] | None = None    # sees each output line (name, line): RulesNotice

    def start(self) -> None:
        # Never our stdout: that stays for `up`'s own report. Its lines name workload ids from
        # the logs, so they reach the terminal or the log file through `up`, escaped.
        self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **spawn_kwargs())
        sink = sys.stderr.fileno() if self.log_fd is None else self.log_fd
        notice = self.notice
        seen = (lambda line: notice(line, self.name)) if notice is not None else None
        self.relay = threading.Thread(target=_relay, args=(self.proc.stdout, sink, seen), name=f"relay-{self.name}",
                                      daemon=True)
        self.relay.start()
        self.started = time.monotonic()

    def drain(self) -> None:
        """Once it exited: its last lines written out (bounded, should something it started hold the pipe)."""
        if self.relay is not None:
            self.relay.join(RELAY_DRAIN_S)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float, hurry: Callable[[], bool] = lambda: False) -> tuple[int | None, bool]:
        """SIGTERM, wait, SIGKILL on timeout or when told to hurry; returns (exit code, killed?)."""
        if self.proc is None or self.proc.poll() is not None:
            self.drain()
            return (self.proc.returncode if self.proc else None), False
        self.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if hurry() or time.monotonic() >= deadline:
                self.proc.kill()
                rc = self.proc.wait()
                self.drain()
                return rc, True
            time.sleep(0.05)
        self.drain()
        return self.proc.returncode, False


class Supervisor:
    """Runs the workers; restarts one that exits on its own; stops them in order."""

    def __init__(self, workers: list[Worker], stop_timeout: float = 15.0, settle_s: float = 0.0) -> None:
        self.workers = workers
        self.stop_timeout = stop_timeout
        self.settle_s = settle_s           # pause between two members of one group (Tansu, stack.md §1)
        self.stopping = False
        self.hurry = False

    def start(self) -> None:
        for w in self.workers:
            w.start()
            log.info("started %s (pid %s)", w.name, w.pid)

    def check(self) -> None:
        now = time.monotonic()
        for w in self.workers:
            if self.stopping or w.proc is None:
                return
            if w.proc.poll() is None:
                continue
            if w.not_before == 0.0:            # just noticed the exit: log it and schedule the restart
                ran = now - w.started
                w.failures = 1 if ran >= RESTART_RESET_S else w.failures + 1
                delay = min(MAX_BACKOFF_S, 2.0 ** (w.failures - 1))
                w.not_before = now + delay
                log.warning("%s (pid %s) exited with code %s after %.1fs; restarting in %.0fs%s",
                            w.name, w.pid, w.proc.returncode, ran, delay, f" (its output: {w.log})" if w.log else "")
            elif now >= w.not_before:
                w.not_before = 0.0
                w.restarts += 1
                w.start()
                log.info("restarted %s (pid %s, restart %d)", w.name, w.pid, w.restarts)

    def stop(self) -> bool:
        """Stop workers one at a time, in list order; True if all exited on SIGTERM."""
        self.stopping = True
        clean = True
        last_group = None
        for w in self.workers:
            if not w.alive():
                continue
            if self.settle_s and w.group is not None and w.group == last_group:
                # Tansu wedges a group whose leader leaves mid-rebalance: let the survivors rejoin first.
                deadline = time.monotonic() + self.settle_s
                while time.monotonic() < deadline and not self.hurry:
                    time.sleep(0.1)
            last_group = w.group
            t0 = time.monotonic()
            rc, killed = w.stop(self.stop_timeout, hurry=lambda: self.hurry)
            clean &= not killed
            log.info("stopped %s (pid %s): exit %s in %.1fs%s", w.name, w.pid, rc, time.monotonic() - t0,
                     " (killed)" if killed else "")
        return clean


# ---------------------------------------------------------------- up
READY_POLL_S = 0.5
READY_WARN_S = 60.0           # not ready by then: say why on the terminal (once), keep waiting


def _try_commands(cfg: StreamConfig, embedded: bool, slurm: bool = False) -> list[str]:
    # The embedded broker is found through the run file; an external one must be named.
    env = "" if embedded else f"FIRSTFAULT_KAFKA_BOOTSTRAP={cfg.bootstrap} "
    if not embedded and cfg.prefix != StreamConfig.model_fields["prefix"].default:
        env += f"FIRSTFAULT_TOPIC_PREFIX={cfg.prefix} "
    if slurm:                       # --slurm: the jobs come from the cluster, no bundle to ship
        return ["sbatch JOB.sh", f"{env}firstfault diagnoses --follow"]
    sample = "samples/worked-example" if Path("samples/worked-example").is_dir() else "PATH/TO/BUNDLE"
    return [f"{env}firstfault ship {sample}", f"{env}firstfault diagnoses --follow"]


def banner(cfg: StreamConfig, broker: EmbeddedBroker | None, workers: list[Worker], run_file: Path | None,
           log_file: Path | None) -> str:
    """Where everything is, in a few lines: broker, store, workers, log, run file, what to try."""
    kind = (f"embedded Tansu pid {broker.proc.pid if broker.proc else '?'}, in memory: nothing survives a restart"
            if broker is not None else "external")
    lines = [f"firstfault up: broker {cfg.bootstrap} ({kind})"]
    if cfg.redis_url:
        lines.append(f"  store     {reach.redact(cfg.redis_url)} (diagnoses store, offset index)")
    else:
        lines.append("  store     memory: no FIRSTFAULT_REDIS_URL, so diagnoses live only on the diagnoses topic "
                     "and `firstfault serve` does not see them")
    for w in workers:
        lines.append(f"  worker    {w.name:<14} pid {w.pid}"
                     + (f", /metrics /healthz /readyz on :{w.health_port}" if w.health_port else ""))
    lines.append(f"  log       {log_file} (firstfault up -v: on the terminal)" if log_file else
                 "  log       workers on stderr (-v)")
    if run_file is not None:
        lines.append(f"  run file  {run_file} (ship, diagnoses, replay, serve and topology find the broker there)")
    slurm = any(w.name == "slurm" for w in workers)
    lines.append("  try:      " + "    ".join(_try_commands(cfg, broker is not None, slurm)))
    return "\n".join(lines)


def slurm_workers(env: dict[str, str], rundir: str, output: str | None = None) -> list[Worker]:
    """``--slurm``: the connector (start and end events from sacct/squeue) and the tailer of the jobs'
    output files (connectors/slurm_tail.py), both on the Slurm commands on PATH and SLURM_CONF."""
    py = sys.executable
    env = dict(env)
    # Its position lives as long as this `up` (the embedded broker keeps nothing either), so a
    # fresh start looks back only as far as the tailer can still find output (slurmctld's MinJobAge).
    env.setdefault("FIRSTFAULT_SLURM_STATE", str(Path(rundir) / "slurm-state.json"))
    env.setdefault("FIRSTFAULT_SLURM_LOOKBACK_S", "600")
    tail = [py, "-m", "firstfault.connectors.slurm_tail"] + (["--output", output] if output else [])
    return [Worker("slurm", [py, "-m", "firstfault.connectors.slurm"], env, rundir),
            Worker("slurm-tail", tail, env, rundir)]


def make_workers(cfg: StreamConfig, extractors: int, rundir: str, log: Path | None = None,
                 log_fd: int | None = None, slurm: bool = False, slurm_output: str | None = None) -> list[Worker]:
    env = worker_env(cfg)
    py = sys.executable
    # Sources first: they stop first, so what they sent is still read by the extractors.
    ws = slurm_workers(env, rundir, slurm_output) if slurm else []
    ws += [Worker(f"extractor-{i + 1}", [py, "-m", "firstfault.streams.extractor"], env, rundir, cfg.extractor_group)
           for i in range(extractors)]
    ws.append(Worker("correlator", [py, "-m", "firstfault.streams.correlator"], env, rundir, cfg.app_id))
    if cfg.redis_url:       # fleet memory lives in Redis; without it `firstfault nodes --rebuild` reads the topic
        group = f"{cfg.app_id}-node-health"
        ws.append(Worker("node-health", [py, "-m", "firstfault.streams.node_health", "--follow", "--group", group],
                         env, rundir, group))
    # Several workers on one host cannot share a health port: FIRSTFAULT_METRICS_PORT=P gives them
    # P, P+1, ... in this order (/metrics, /healthz, /readyz); 0, none serves; unset, each gets a free
    # port, so that `up` can ask their /readyz before it says "ready".
    raw = env.get("FIRSTFAULT_METRICS_PORT", "").strip()
    base = int(raw) if raw else None
    # Unauthenticated, like `serve` without tokens: loopback unless FIRSTFAULT_METRICS_HOST says (0.0.0.0).
    host = env.get("FIRSTFAULT_METRICS_HOST", "").strip() or "127.0.0.1"
    for i, w in enumerate(ws):
        w.log, w.log_fd = log, log_fd
        if w.name == "node-health":             # serves no health port: judged by its group
            continue
        port = free_port() if base is None else (base + i if base else 0)
        w.env = {**w.env, "FIRSTFAULT_METRICS_PORT": str(port), "FIRSTFAULT_METRICS_HOST": host}
        w.health_port = port or None
    return ws


class Readiness:
    """Ready when every worker's /readyz answers 200 and every consumer group they join is stable.

    The extractor is ready once the group assigned it partitions, the correlator once Faust
    started, joined and recovered its table (health.py); a stable group says, from the
    broker's side, that the join is complete. A worker started with no health port
    (FIRSTFAULT_METRICS_PORT=0) is judged by its group alone.
    """

    def __init__(self, cfg: StreamConfig, workers: list[Worker]) -> None:
        from confluent_kafka.admin import AdminClient

        from .kafka import client_conf

        self.workers = workers
        self.groups = sorted({w.group for w in workers if w.group})
        self.admin = AdminClient(client_conf(cfg.bootstrap))

    def waiting_for(self) -> str | None:
        """None when ready, else what it waits for, in a few words."""
        for w in self.workers:
            if not w.alive():
                return f"{w.name} is not running"
            if w.health_port:
                why = _probe(w.health_port)
                if why:
                    return f"{w.name}: {why}"
        from confluent_kafka import ConsumerGroupState, KafkaException

        try:
            futures = self.admin.describe_consumer_groups(self.groups, request_timeout=2)
            for group, fut in futures.items():
                state = fut.result().state
                if state != ConsumerGroupState.STABLE:
                    return f"group {group}: {state.name.lower()}"
        except KafkaException as exc:
            return f"groups not described: {exc}"
        return None


def _probe(port: int) -> str | None:
    """None if the worker's /readyz (127.0.0.1, or the one address FIRSTFAULT_METRICS_HOST names) says 200,
    else its reason."""
    import urllib.error
    import urllib.request

    host = os.environ.get("FIRSTFAULT_METRICS_HOST", "").strip()
    host = "127.0.0.1" if host in ("", "0.0.0.0", "::", "[::]") else host
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/readyz", timeout=0.5):
            return None
    except urllib.error.HTTPError as exc:
        return exc.read().decode(errors="replace").strip() or f"HTTP {exc.code}"
    except OSError:
        return "starting"


def _scrape(port: int, names: tuple[str, ...]) -> dict[str, float]:
    """Sums of some series on 127.0.0.1:port/metrics (Prometheus text); {} when it does not answer."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=0.5) as resp:
            text = resp.read().decode(errors="replace")
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            try:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return out


class InFlight:
    """What the pipeline holds that only the broker keeps: open attempts and unprocessed records,
    scraped from the workers' /metrics now and then, so a broker's death can say what it took."""

    EVERY_S = 5.0

    def __init__(self, workers: list[Worker]) -> None:
        self.workers = workers
        self.open = 0
        self.lag = 0
        self.at: float | None = None
        self._due = 0.0

    def look(self, now: float) -> None:
        if now < self._due:
            return
        self._due = now + self.EVERY_S
        from firstfault.connectors import metrics_names as M

        open_, lag, seen = 0, 0, False
        for w in self.workers:
            if w.health_port:
                got = _scrape(w.health_port, (M.WORKLOADS_OPEN, M.CONSUMER_LAG))
                seen = seen or bool(got)
                open_ += int(got.get(M.WORKLOADS_OPEN, 0))
                lag += int(got.get(M.CONSUMER_LAG, 0))
        if seen:
            self.open, self.lag, self.at = open_, lag, now

    def lost(self, now: float) -> str:
        if self.at is None:
            return "whatever it held"
        return (f"{self.open} workload attempt{'' if self.open == 1 else 's'} open in the correlator (no final "
                f"diagnosis will come for {'it' if self.open == 1 else 'them'}) and {self.lag} "
                f"record{'' if self.lag == 1 else 's'} not yet processed, as of {now - self.at:.0f} s before")


def _last_lines(path: Path, n: int = 3) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in lines[-n:])


def run_up(cfg: StreamConfig, extractors: int = 1, stop_timeout: float = 15.0, run_file: Path | None = None,
           log_file: Path | None = None, rules_version: str = "", log_fd: int | None = None, slurm: bool = False,
           slurm_output: str | None = None) -> int:
    """The pipeline until a signal. ``run_file``: where an embedded broker is announced (None: nowhere);
    ``log_file``: where worker output goes (None: our stderr), ``log_fd`` open on it; ``slurm``: with the
    Slurm connector and output tailer (``slurm_output``: the jobs' output file pattern)."""
    rundir = tempfile.mkdtemp(prefix="firstfault-up-")
    if cfg.rules:             # workers run in the run directory: a relative rules path must survive that
        cfg = cfg.model_copy(update={"rules": str(Path(cfg.rules).resolve())})
    sup: Supervisor | None = None
    signals = {"count": 0}

    def on_signal(signum, _frame) -> None:
        signals["count"] += 1
        if sup is not None:
            sup.stopping = True
            sup.hurry = signals["count"] > 1
        if signals["count"] == 1:
            log.info("%s: stopping (again to kill)", signal.Signals(signum).name)

    from . import kafka        # confluent-kafka: only when the pipeline really starts

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    broker: EmbeddedBroker | None = None
    wrote_run_file = False
    stopping_since: float | None = None
    rc = 0
    try:
        if not cfg.bootstrap:
            broker = EmbeddedBroker(log_path=Path(rundir) / "tansu.log", popen_kwargs=spawn_kwargs())
            try:
                cfg = cfg.model_copy(update={"bootstrap": broker.start()})
            except RuntimeError as exc:          # no binary, or it would not stay up: one line, not a traceback
                log.error("%s (its log: %s)", exc, Path(rundir) / "tansu.log")
                broker = None
                return 2
            log.info("embedded broker on %s (pid %s)", cfg.bootstrap, broker.proc.pid if broker.proc else "?")
        created = kafka.ensure_topics(cfg)
        log.info("topics: %d created, %d already there", len(created), len(cfg.topics) - len(created))
        if broker is not None and run_file is not None:
            try:
                runfile.write(runfile.RunInfo(
                    bootstrap=cfg.bootstrap, redis=cfg.redis_url or runfile.MEMORY, prefix=cfg.prefix,
                    pid=os.getpid(), started_at=runfile.now_iso(), rules_version=rules_version,
                    log_file=str(log_file) if log_file else None,
                    timings={k: getattr(cfg, k) for k in ("grace_cap_s", "watermark_wait_s", "lateness_s")}), run_file)
            except OSError as exc:               # e.g. someone else's file in a shared directory
                log.error("cannot write the run file %s: %s", run_file, exc.strerror or exc)
                return 2
            wrote_run_file = True
            log.info("run file %s", run_file)
        # An external Tansu keeps its groups across our restart: stop group members with a pause.
        # (The embedded broker is stopped right after, so its groups do not matter.)
        settle = 5.0 if broker is None and extractors > 1 and broker_is_tansu(cfg) else 0.0
        sup = Supervisor(make_workers(cfg, extractors, rundir, log_file, log_fd, slurm, slurm_output), stop_timeout,
                         settle)
        if log_fd is not None:            # the workers' lines go to up.log: say a catalog change here too
            notice = RulesNotice()
            for w in sup.workers:
                w.notice = notice
        ready: Readiness | None = None
        if signals["count"]:
            sup.stopping = True
        else:
            sup.start()
            print(printable(banner(cfg, broker, sup.workers, run_file if wrote_run_file else None, log_file),
                            lines=True), flush=True)
            ready = Readiness(cfg, sup.workers)
        inflight = InFlight(sup.workers)
        t0 = next_probe = time.monotonic()
        warned = False
        while not sup.stopping:
            if broker is not None and broker.proc is not None and broker.proc.poll() is not None:
                last = _last_lines(Path(rundir) / "tansu.log")
                log.error("the embedded broker exited (code %s), and it keeps nothing on disk: lost %s; stopping%s",
                          broker.proc.returncode, inflight.lost(time.monotonic()),
                          f" (its last words: {last})" if last else "")
                rc = 1
                break
            sup.check()
            now = time.monotonic()
            if ready is None:
                inflight.look(now)
            if ready is not None and now >= next_probe:
                why = ready.waiting_for()
                if why is None:
                    print("ready (Ctrl-C to stop)", flush=True)
                    log.info("ready in %.1fs", now - t0)
                    ready = None
                else:
                    next_probe = now + READY_POLL_S
                    if not warned and now - t0 >= READY_WARN_S:
                        warned = True
                        log.warning("not ready after %.0fs: %s%s", now - t0, why,
                                    f" (worker output: {log_file})" if log_file else "")
            time.sleep(0.1 if ready is not None else 0.2)
        if signals["count"] and rc == 0:
            # On the terminal, not only in up.log: what Ctrl-C does, and how long it may take.
            print(f"stopping: {len([w for w in sup.workers if w.alive()])} workers one at a time, then "
                  f"{'the broker' if broker is not None else 'nothing else'} (up to {stop_timeout:g} s a worker; "
                  "Ctrl-C again to kill them)", flush=True)
            stopping_since = time.monotonic()
        if not sup.stop():
            log.warning("some workers had to be killed")
    finally:
        if sup is not None and not sup.stopping:
            sup.stop()
        if wrote_run_file and run_file is not None:
            runfile.remove(run_file, os.getpid())      # before the broker goes: nobody is sent to a dead one
        if broker is not None:
            if broker.proc is not None and broker.proc.poll() is not None:
                log.warning("the broker had already exited (code %s) before the workers stopped",
                            broker.proc.returncode)
            broker.stop()
            log.info("broker stopped")
        for s, h in old.items():
            signal.signal(s, h)
        shutil.rmtree(rundir, ignore_errors=True)     # what a dead broker left there was said above
    if stopping_since is not None:
        print(f"stopped in {time.monotonic() - stopping_since:.1f} s", flush=True)
    return rc


class _Printable(logging.Formatter):
    """Its lines echo addresses, paths and the broker's last words: escaped (term.py), newlines kept."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record), lines=True)


def _say(message: str) -> None:
    """One line on stderr before logging is set up, what it echoes escaped."""
    print(printable(f"firstfault up: {message}"), file=sys.stderr)


def _logging(verbose: bool, log_fd: int | None) -> None:
    """`up`'s own lines: all on the terminal with -v; else to the log file, warnings on the terminal too."""
    fmt = _Printable("%(asctime)s up %(levelname)s %(message)s")
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    term = logging.StreamHandler(sys.stderr)
    term.setFormatter(fmt)
    term.setLevel(logging.INFO if verbose or log_fd is None else logging.WARNING)
    root.addHandler(term)
    if log_fd is not None:            # the descriptor fresh_log opened: the path is never opened again
        to_file = logging.StreamHandler(open(log_fd, "a", encoding="utf-8", closefd=False))
        to_file.setFormatter(fmt)
        root.addHandler(to_file)


def cmd_up(args: argparse.Namespace) -> int:
    from firstfault.rules.catalog import load_catalog
    from firstfault.rules.errors import CatalogError

    cfg = StreamConfig.from_env(bootstrap=args.bootstrap, redis_url=args.redis_url, partitions=args.partitions,
                                prefix=args.prefix)
    # Checked before anything starts, each a line and exit 2: another `up`, an external broker
    # or Redis that does not answer, a broken rules directory.
    path = runfile.run_file_path()
    if not cfg.bootstrap:
        found = runfile.lookup(path)
        other = found.info
        if other is not None and other.pid != os.getpid():
            _say(f"already running (pid {other.pid}, broker {other.bootstrap}, run file {path}): "
                 f"stop it first, or give this one its own {runfile.RUN_FILE_VARIABLE}")
            return 2
        if found.note:                # stale or forged: not obeyed, and said so
            _say(f"{found.note}; replacing it")
    args.slurm = args.slurm or bool(args.slurm_output)
    if args.slurm:
        absent = [c for c in ("sacct", "squeue") if shutil.which(c) is None]
        if absent:
            _say(f"--slurm: {' and '.join(absent)} not on PATH (run it on a Slurm login node)")
            return 2
    try:
        if cfg.bootstrap:
            reach.check_broker(cfg.bootstrap, "check FIRSTFAULT_KAFKA_BOOTSTRAP or --bootstrap "
                                              "(unset both for the embedded broker)")
        if cfg.redis_url:
            reach.check_redis(cfg.redis_url, "check FIRSTFAULT_REDIS_URL or --redis-url (unset both for no Redis)")
        version = load_catalog(cfg.rules).version
    except (reach.Unreachable, CatalogError) as exc:
        _say(str(exc))
        return 2
    log_file = log_fd = None
    if not args.verbose:
        log_file = path.with_name("up.log")
        try:
            log_fd = runfile.fresh_log(log_file)      # this run's output only; then everyone appends
        except OSError as exc:
            _say(f"cannot create its log file {log_file}: {exc.strerror or exc}")
            return 2
    _logging(args.verbose, log_fd)
    return run_up(cfg, extractors=args.extractors, stop_timeout=args.stop_timeout,
                  run_file=None if cfg.bootstrap else path, log_file=log_file, rules_version=version, log_fd=log_fd,
                  slurm=args.slurm, slurm_output=args.slurm_output)


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return n


def register(subparsers) -> None:
    p = subparsers.add_parser("up", help="run the whole streaming pipeline in the foreground")
    p.add_argument("--bootstrap", default=None,
                   help="Kafka bootstrap servers (FIRSTFAULT_KAFKA_BOOTSTRAP); none: start the embedded broker")
    p.add_argument("--redis-url", default=None, help="Redis URL (FIRSTFAULT_REDIS_URL); none: in-process store")
    p.add_argument("--extractors", type=_positive, default=1, help="extractor worker processes (default 1)")
    p.add_argument("--partitions", type=_positive, default=None,
                   help="partitions of the topics it creates (FIRSTFAULT_PARTITIONS, default 4)")
    p.add_argument("--prefix", default=None, help="topic prefix (FIRSTFAULT_TOPIC_PREFIX, default 'firstfault.')")
    p.add_argument("--stop-timeout", type=float, default=15.0, help="seconds a worker gets to stop before SIGKILL")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="worker output (Faust's start and stop lines) and up's own on the terminal, not in the log file")
    p.add_argument("--slurm", action="store_true",
                   help="also the Slurm connector and a tailer of the jobs' output files (sacct, squeue on PATH)")
    p.add_argument("--slurm-output", default=None, metavar="PATTERN",
                   help="the jobs' output files, e.g. '/scratch/%%u/%%x-%%j.out' (%%j %%x %%u %%N %%A %%a expanded "
                        "per job; implies --slurm); default: each job's StdOut")
    p.set_defaults(fn=cmd_up)

    t = subparsers.add_parser("topology", help="print the pipeline as configured: topics, workers, stores")
    t.add_argument("--json", action="store_true", help="the topics, workers and stores as one JSON object")
    t.add_argument("--bootstrap", default=None,
                   help="Kafka bootstrap servers (FIRSTFAULT_KAFKA_BOOTSTRAP); none: a running `firstfault up`'s, "
                        "else the embedded broker `up` would start")
    t.add_argument("--redis-url", default=None, help="Redis URL (FIRSTFAULT_REDIS_URL)")
    t.add_argument("--extractors", type=_positive, default=1, help="extractor worker processes (default 1)")
    t.add_argument("--partitions", type=_positive, default=None,
                   help="partitions of each topic (FIRSTFAULT_PARTITIONS, default 4)")
    t.add_argument("--prefix", default=None, help="topic prefix (FIRSTFAULT_TOPIC_PREFIX, default 'firstfault.')")
    t.set_defaults(fn=cmd_topology)


if __name__ == "__main__":        # python -m firstfault.streams.up  (same as `firstfault up`)
    _p = argparse.ArgumentParser(prog="firstfault")
    register(_p.add_subparsers(dest="command", required=True))
    _a = _p.parse_args(["up", *sys.argv[1:]])
    raise SystemExit(_a.fn(_a))
