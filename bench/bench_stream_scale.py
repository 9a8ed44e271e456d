#!/usr/bin/env python3
"""Benchmark the streaming pipeline at scale: many isolated workloads, several workers, faults on the way.

    python bench/bench_stream_scale.py [--workloads 200] [--shippers 4] [--extractors 1|2] [--correlators 1|2]
        [--join extractor|correlator] [--kill extractor|correlator] [--pause-broker S] [--big B]
        [--bootstrap HOST:PORT] [--timeout 300] [--json]

The workloads are copies of the samples (round robin; ``--big B`` adds B generated 16-node jobs of
bench/gen_bundle.py), each isolated: its id and every host name (workload.json, file names, lines) get a
``c017-`` prefix, so node-scoped lines of one copy never reach another. A copy must analyze to its
original's status and sub_domain; its own ``analyze`` diagnosis is its reference. On fresh topics
(4 partitions, grace 2 s) of the embedded Tansu broker (or ``--bootstrap``) the extractor(s) and
correlator(s) run as subprocesses until a warm-up workload has its final; then ``--shippers`` processes
ship their share: every start, then per workload its lines, a flush and its end event. One run prints:

* lines/s shipped (read, encoded and confirmed by the broker), all shippers together;
* last end event confirmed -> last final received; per workload, its end event -> its first final (p50/p99);
* peak RSS (VmHWM) of every worker process and of the embedded broker;
* the correlator's ``<app_id>-workloads-changelog``: records and key + value bytes;
* the check: missing (no final), duplicated (two finals of one revision; ``conflicting``: they differ),
  wrong (the last final, stream-only fields aside, not byte-equal to analyze's JSON; ``minor``: only
  evidence, missing_evidence or counts differ, ``verdict``: status, sub_domain or the recovery's action
  or nodes do), harmful (finals, any revision, that drain or exclude nodes where the reference does
  otherwise), ``revised`` (more than one revision) and ``first_wrong`` / ``first_wrong_verdict``
  (as wrong, for revision 0: what consumers saw first).

Scenarios, placed by the fraction of lines shipped: ``--join K`` starts one more K at 20 % and stops it
(SIGTERM) at 70 %, once it has had partitions for 5 s; ``--kill K`` kill -9s one K at 40 % and starts
another 1 s later; ``--pause-broker S`` SIGSTOPs the embedded broker at 40 % for S seconds. Progress goes
to stderr; worker logs stay in bench/out/bench-stream-scale-*/. Exit status 1 when a workload is missing,
wrong or harmful, 2 when the run failed. The broker, workers and shippers share the cores: rates are floors.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition

from firstfault.rules.bundle import read_workload
from firstfault.rules.engine import analyze_path
from firstfault.schemas import Diagnosis
from firstfault.schemas.avro import decode
from firstfault.streams import kafka
from firstfault.streams.broker import EmbeddedBroker
from firstfault.streams.config import StreamConfig

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
GRACE_S, PARTITIONS, SETTLE_S, BIG_LINES = 2.0, 4, 5.0, 50_000
HARMFUL = ("drain_nodes", "retry_excluding_nodes")
_HOST = rb"(?<![A-Za-z0-9_.-])%s(?![A-Za-z0-9_-])"       # as tests/test_pipeline_parity.py's isolated()


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- workloads
def isolated(src: Path, dst: Path, tag: str) -> Path:
    """``src`` copied to ``dst`` with hosts ``<tag>-<host>`` (file names, lines, record) and id ``<tag>-<id>``."""
    wl = json.loads((src / "workload.json").read_text())
    hosts = set(wl.get("nodes") or []) | {v for v in (wl.get("pods") or {}).values() if isinstance(v, str)}
    hosts |= {p.stem for sub in ("syslog", "fabricmanager") for p in (src / "logs" / sub).glob("*") if p.is_file()}
    alts = [_HOST % re.escape(h.encode()) for h in sorted(filter(None, hosts), key=len, reverse=True)]
    pattern = re.compile(b"|".join(alts)) if alts else None

    def swap(data: bytes) -> bytes:
        return pattern.sub(lambda m: tag.encode() + b"-" + m.group(0), data) if pattern else data

    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        if (rel := f.relative_to(src).as_posix()) == "workload.json" or rel.startswith(("logs/", "metrics/")):
            (out := dst / swap(rel.encode()).decode()).parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(swap(f.read_bytes()))
    wl = json.loads((dst / "workload.json").read_text())
    (dst / "workload.json").write_text(json.dumps({**wl, "workload_id": f"{tag}-{wl['workload_id']}"}))
    return dst


@dataclass
class Job:
    wid: str
    path: Path
    origin: str
    reference: dict[str, Any]
    lines: int


def make_jobs(n: int, big: int, root: Path) -> list[Job]:
    sources = sorted(p for p in (HERE.parent / "samples").iterdir() if (p / "workload.json").is_file())
    plan = [(sources[i % len(sources)], f"c{i:03d}") for i in range(n)]
    if big and not ((gen := OUT / f"job-16n-{BIG_LINES}") / "workload.json").exists():   # bench_stream.py's cache
        subprocess.run([sys.executable, str(HERE / "gen_bundle.py"), str(gen), "--nodes", "16", "--lines",
                        str(BIG_LINES)], check=True, stdout=subprocess.DEVNULL)
    plan += [(OUT / f"job-16n-{BIG_LINES}", f"g{j:02d}") for j in range(big)]
    originals: dict[Path, tuple[str, str]] = {}
    jobs, bad, last = [], [], time.monotonic()
    for i, (src, tag) in enumerate(plan, 1):
        if src not in originals:
            d0 = analyze_path(src).diagnosis
            originals[src] = (d0.status, d0.sub_domain)
        d = analyze_path(dst := isolated(src, root / tag, tag)).diagnosis
        if (d.status, d.sub_domain) != originals[src]:
            bad.append(f"{tag} ({src.name}): {d.status}/{d.sub_domain}, the original {originals[src]}")
        lines = sum(f.read_bytes().count(b"\n") for f in dst.rglob("*") if f.is_file() and f.name != "workload.json")
        jobs.append(Job(d.workload_id, dst, src.name, json.loads(d.to_json()), lines))
        if time.monotonic() - last > 5:
            last = time.monotonic()
            say(f"prepare: {i}/{len(plan)} copies written and analyzed")
    if bad:
        raise RuntimeError("a copy does not analyze like its original: " + "; ".join(bad[:5]))
    return jobs


def canon(d: dict[str, Any]) -> str:
    return json.dumps(d, sort_keys=True, ensure_ascii=False, indent=2)       # Diagnosis.to_json's form


def bare(d: Diagnosis) -> dict[str, Any]:
    return {k: v for k, v in d.to_dict().items() if k not in ("revision", "provisional")}


def action(d: dict[str, Any]) -> tuple[str | None, list[str]]:
    return (d.get("recovery") or {}).get("action"), sorted((d.get("recovery") or {}).get("nodes") or [])


def verdict_diff(got: dict[str, Any], ref: dict[str, Any]) -> list[str]:
    """status, sub_domain, recovery (its action and nodes: its text follows the evidence) where they differ."""
    differ = [k for k in ("status", "sub_domain") if got.get(k) != ref.get(k)]
    return differ + ["recovery"] * (action(got) != action(ref))


# ---------------------------------------------------------------- shippers (spawned processes)
def ship_share(idx: int, cfg_json: str, paths: list[str], counter: Any, go: Any, out: Any) -> None:
    """Every start of this share, then per workload: its lines, a flush, its end event."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)               # the parent stops us
    try:
        from firstfault.connectors.shipper import bundle_records, scheduler_message
        from firstfault.schemas.avro import encode

        cfg = StreamConfig.model_validate_json(cfg_json)
        prod, ends, n, nbytes, pending = kafka.producer(cfg), {}, 0, 0, 0

        def send(topic: str, key: str, value: bytes, cb: Any = None) -> None:
            while True:
                try:
                    return prod.produce(cfg.topic(topic), key=key.encode(), value=value, on_delivery=cb)
                except BufferError:
                    prod.poll(0.05)

        def ended(wid: str) -> Any:
            return lambda err, _msg: ends.__setitem__(wid, time.time()) if err is None else None

        wls = [read_workload(Path(p) / "workload.json") for p in paths]
        out.put(("ready", idx, None))
        go.wait()
        t0 = time.time()
        for wl in wls:
            send("scheduler", wl.workload_id, scheduler_message("start", wl))
        prod.flush(30)
        for p in paths:
            wl, records = bundle_records(p)
            for key, rec in records:
                send("raw", key, value := encode(rec))
                n, nbytes, pending = n + 1, nbytes + len(value), pending + 1
                if pending >= 2000:
                    with counter.get_lock():
                        counter.value += pending
                    pending = 0
            if prod.flush(60):
                raise RuntimeError(f"lines of {wl.workload_id} not confirmed within 60 s")
            send("scheduler", wl.workload_id, scheduler_message("end", wl), ended(wl.workload_id))
            prod.poll(0)
        left = prod.flush(60)
        with counter.get_lock():
            counter.value += pending
        out.put(("done", idx, {"lines": n, "bytes": nbytes, "t1": time.time(), "ends": ends, "unconfirmed": left,
                               "t0": t0}))
    except BaseException:
        out.put(("error", idx, traceback.format_exc()))


# ---------------------------------------------------------------- the pipeline
@dataclass
class Worker:
    name: str
    kind: str
    proc: subprocess.Popen
    log: Path | None = None
    peak_kb: int = 0
    how: str = "running"

    def sample(self) -> None:
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                self.peak_kb = max(self.peak_kb, next((int(x.split()[1]) for x in f if x.startswith("VmHWM:")), 0))
        except (OSError, ValueError):
            pass

    def assigned(self) -> bool:
        """Has it taken a share of the load (its log says so)?"""
        text = self.log.read_text(errors="replace") if self.log else ""
        return "Worker ready" in text or re.search(r"assigned [1-9]\d* partition", text) is not None


class Pipeline:
    """Broker, workers (own sessions: a Ctrl-C reaches only us), diagnoses reader and shippers; ``close`` stops all."""

    def __init__(self, run: Path) -> None:
        self.run, self.workers, self.counts, self.shippers = run, [], Counter(), []
        self.broker: EmbeddedBroker | None = None
        self.broker_w: Worker | None = None
        self.finals: dict[str, list[tuple[float, Diagnosis]]] = {}      # workload -> [(received, final)]
        self.provisionals, self.halt = 0, threading.Event()
        self.reader = threading.Thread(target=self.read, daemon=True)

    def configure(self, cfg: StreamConfig) -> None:
        self.cfg, self.env = cfg, {k: v for k, v in os.environ.items() if not k.startswith("FIRSTFAULT_")}
        self.env.update(FIRSTFAULT_KAFKA_BOOTSTRAP=cfg.bootstrap or "", FIRSTFAULT_TOPIC_PREFIX=cfg.prefix,
                        FIRSTFAULT_PARTITIONS=str(cfg.partitions), FIRSTFAULT_GRACE_S=str(cfg.grace_s),
                        FIRSTFAULT_GRACE_CAP_S=str(cfg.grace_cap_s), FIRSTFAULT_APP_ID=cfg.app_id,
                        FIRSTFAULT_EXTRACTOR_GROUP=cfg.extractor_group, FIRSTFAULT_CHANGELOG_ONE_PER_BATCH="1",
                        FIRSTFAULT_METRICS_PORT="0", PYTHONUNBUFFERED="1", TMPDIR=str(self.run))

    def read(self) -> None:
        """The diagnoses topic from offset 0, in a thread."""
        c = kafka.consumer(self.cfg, group=f"{self.cfg.prefix}bench-reader")
        c.assign([TopicPartition(self.cfg.topic("diagnoses"), p, 0) for p in range(self.cfg.partitions)])
        try:
            while not self.halt.is_set():
                for m in c.consume(num_messages=500, timeout=0.2):
                    try:
                        now, d = time.time(), decode(m.value()) if m.error() is None and m.value() else None
                    except ValueError:
                        d = None
                    if d is None:
                        continue
                    if d.provisional:
                        self.provisionals += 1
                    else:
                        self.finals.setdefault(d.workload_id, []).append((now, d))
        finally:
            c.close()

    def start(self, kind: str) -> Worker:
        self.counts[kind] += 1
        name = f"{kind}-{self.counts[kind]}"
        with open(log := self.run / f"{name}.log", "ab") as f:
            proc = subprocess.Popen([sys.executable, "-m", f"firstfault.streams.{kind}"], env=self.env, cwd=self.run,
                                    stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        self.workers.append(Worker(name, kind, proc, log))
        return self.workers[-1]

    def live(self, kind: str) -> list[Worker]:
        return [w for w in self.workers if w.kind == kind and w.proc.poll() is None]

    def stop(self, w: Worker, kill: bool = False, wait_s: float = 20.0) -> None:
        w.sample()
        if w.proc.poll() is None:
            w.how = "killed" if kill else "stopped"
            w.proc.kill() if kill else w.proc.terminate()
            try:
                w.proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
                w.how += f" (SIGKILL after {wait_s:.0f} s)"

    def sample(self) -> list[Worker]:
        """Peak RSS of the live processes; returns the ones that died on their own since the last call."""
        died = []
        for w in self.workers + ([self.broker_w] if self.broker_w else []):
            if w.proc.poll() is None:
                w.sample()
            elif w.how == "running":
                w.how = f"exited {w.proc.returncode}"
                died.append(w)
        return died

    def close(self) -> None:
        for p in self.shippers:
            if p.is_alive():
                p.terminate()
                p.join(5)
        self.halt.set()
        if self.reader.is_alive():
            self.reader.join(5)
        if self.broker and self.broker.proc and self.broker.proc.poll() is None:
            os.kill(self.broker.proc.pid, signal.SIGCONT)         # a paused broker would hold every stop
        for w in self.live("extractor") + self.live("correlator"):   # one at a time, upstream first
            self.stop(w)
        if self.broker:
            self.broker.stop()


def warm_up(pipe: Pipeline, timeout: float = 180.0) -> float:
    """A workload of its own host and day (as tests/stream_pipeline.py's): the pipeline answers before the load."""
    from firstfault.connectors.shipper import ship

    (warm := pipe.run / "warmup" / "logs" / "app").mkdir(parents=True)
    (warm / "warm-01.log").write_text("0: [2026-10-01 00:05:00,000] INFO step 1 loss 2.0\n")
    (pipe.run / "warmup" / "workload.json").write_text(json.dumps({
        "workload_id": "warmup", "state": "COMPLETED", "start_time": "2026-10-01T00:00:00Z",
        "end_time": "2026-10-01T00:10:00Z", "nodes": ["warm-01"], "gpus_per_node": 1}))
    t0 = time.monotonic()
    ship(pipe.run / "warmup", pipe.cfg)
    while "warmup" not in pipe.finals:
        if died := pipe.sample():
            raise RuntimeError(f"{died[0].name} exited with {died[0].proc.returncode}; see {died[0].log}")
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"no final for the warm-up workload in {timeout:.0f} s; see the logs in {pipe.run}")
        time.sleep(0.5)
    return time.monotonic() - t0


def changelog(cfg: StreamConfig, timeout: float = 30.0) -> dict[str, Any]:
    """Records and key + value bytes of the correlator's table changelog, read up to the high watermarks."""
    topic, c = f"{cfg.app_id}-workloads-changelog", kafka.consumer(cfg, group=f"{cfg.prefix}bench-changelog")
    try:
        if (md := c.list_topics(topic, timeout=10).topics.get(topic)) is None or md.error is not None:
            return {"topic": topic, "error": "no such topic"}
        highs = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in md.partitions}
        pos, records, size, deadline = dict.fromkeys(highs, 0), 0, 0, time.monotonic() + timeout
        c.assign([TopicPartition(topic, p, 0) for p, h in highs.items() if h > 0])
        while any(pos[p] < h for p, h in highs.items()) and time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=0.5):
                if m.error() is None and m.offset() < highs[m.partition()]:
                    pos[m.partition()], records = m.offset() + 1, records + 1
                    size += len(m.key() or b"") + len(m.value() or b"")
        return {"topic": topic, "records": records, "mb": round(size / 1e6, 2),
                "complete": all(pos[p] >= h for p, h in highs.items())}
    finally:
        c.close()


class Scenario:
    """Mid-load events by the fraction of lines shipped: a member joins and leaves, one dies, the broker stops."""

    def __init__(self, args: argparse.Namespace, pipe: Pipeline, t0: float) -> None:
        self.args, self.pipe, self.t0, self.events, self.pause_t = args, pipe, t0, [], 0.0
        self.joiner: Worker | None = None
        self.in_since: float | None = None
        self.left = self.killed = self.paused = self.resumed = False

    def note(self, what: str) -> None:
        self.events.append({"t_s": round(time.time() - self.t0, 1), "event": what})
        say(f"scenario: {what}")

    def step(self, frac: float, done: bool) -> None:
        a, now, broker = self.args, time.monotonic(), self.pipe.broker
        if a.join and self.joiner is None and frac >= 0.2:
            self.joiner = self.pipe.start(a.join)
            self.note(f"{self.joiner.name} joins at {frac:.0%} of the lines shipped")
        elif self.joiner and not self.left:
            if self.in_since is None and self.joiner.assigned():
                self.in_since = now
                self.note(f"{self.joiner.name} has partitions")
            if done or (frac >= 0.7 and self.in_since is not None and now - self.in_since >= 5):
                self.pipe.stop(self.joiner)
                self.left = True
                self.note(f"{self.joiner.name} leaves at {frac:.0%} of the lines shipped"
                          f"{' (after the last final)' if done else ''}: {self.joiner.how}")
        if a.kill and not self.killed and frac >= 0.4 and (victims := self.pipe.live(a.kill)):
            self.pipe.stop(victims[0], kill=True)
            self.killed = True
            self.note(f"{victims[0].name} killed (SIGKILL) at {frac:.0%} of the lines shipped")
            time.sleep(1)
            self.note(f"{self.pipe.start(a.kill).name} started in its place")
        if a.pause_broker and broker and broker.proc:
            if not self.paused and frac >= 0.4:
                os.kill(broker.proc.pid, signal.SIGSTOP)
                self.paused, self.pause_t = True, now
                self.note(f"broker paused (SIGSTOP) at {frac:.0%} of the lines shipped")
            elif self.paused and not self.resumed and (done or now - self.pause_t >= a.pause_broker):
                os.kill(broker.proc.pid, signal.SIGCONT)
                self.resumed = True
                self.note(f"broker resumed (SIGCONT) after {now - self.pause_t:.1f} s")


# ---------------------------------------------------------------- the run
def check(jobs: list[Job], finals: dict[str, list[tuple[float, Diagnosis]]]) -> dict[str, Any]:
    c, keys, ex = Counter(), Counter(), {k: [] for k in ("missing", "duplicated", "wrong", "first_wrong_verdict",
                                                         "harmful")}

    def pair(got: dict[str, Any], ref: dict[str, Any], names: list[str]) -> dict[str, Any]:
        return {**{f"got_{k}": got.get(k) for k in names}, **{f"ref_{k}": ref.get(k) for k in names}}

    for j in jobs:
        if not (got := [d for _, d in finals.get(j.wid, [])]):
            c["missing"] += 1
            ex["missing"].append(f"{j.wid} ({j.origin})")
            continue
        by_rev: dict[Any, list[str]] = {}
        for d in got:
            by_rev.setdefault(d.revision, []).append(canon(bare(d)))
        if dups := [v for v in by_rev.values() if len(v) > 1]:
            conflicting = any(len(set(v)) > 1 for v in dups)
            c.update(duplicated=1, duplicate_records=sum(len(v) - 1 for v in dups), conflicting=int(conflicting))
            ex["duplicated"].append({"workload": j.wid, "revisions": [d.revision for d in got],
                                     "conflicting": conflicting})
        c["revised"] += len(by_rev) > 1
        if canon(first := bare(got[0])) != canon(ref := j.reference):        # a later revision may right it
            c["first_wrong"] += 1
            if verdict := verdict_diff(first, ref):
                c["first_wrong_verdict"] += 1
                ex["first_wrong_verdict"].append({"workload": j.wid, "origin": j.origin, "revisions": list(by_rev),
                                                  **pair(first, ref, verdict)})
        if canon(last := bare(got[-1])) != canon(ref):
            differ = sorted(k for k in set(last) | set(ref) if last.get(k) != ref.get(k) and k != "diagnosis_id")
            kind = "verdict" if verdict_diff(last, ref) else "minor"
            keys.update(differ)
            c.update({"wrong": 1, f"wrong_{kind}": 1})
            shown = [k for k in differ if k in ("status", "sub_domain", "recovery", "missing_evidence")]
            ex["wrong"].append({"workload": j.wid, "origin": j.origin, "kind": kind, "differ": differ,
                                "revisions": [d.revision for d in got], **pair(last, ref, shown)})
        want = action(ref)
        for d in got:
            if d.recovery and d.recovery.action in HARMFUL and (d.recovery.action, sorted(d.recovery.nodes)) != want:
                c["harmful"] += 1
                ex["harmful"].append({"workload": j.wid, "revision": d.revision, "action": d.recovery.action,
                                      "nodes": d.recovery.nodes, "reference": want})
    names = ("missing duplicated duplicate_records conflicting wrong wrong_minor wrong_verdict harmful revised "
             "first_wrong first_wrong_verdict").split()
    return {**{k: c[k] for k in names}, "wrong_keys": dict(keys.most_common()),
            "examples": {k: v[:3] for k, v in ex.items() if v}}


def bench(args: argparse.Namespace, pipe: Pipeline, res: dict[str, Any]) -> None:
    t0 = time.perf_counter()
    jobs = make_jobs(args.workloads, args.big, pipe.run / "bundles")
    res.update(prepare_s=round(time.perf_counter() - t0, 1), workloads=len(jobs),
               by_sample=Counter(j.origin for j in jobs))
    if not args.bootstrap:
        pipe.broker = EmbeddedBroker(log_path=pipe.run / "tansu.log")
        args.bootstrap = pipe.broker.start()
        pipe.broker_w = Worker("broker", "broker", pipe.broker.proc)
    tag = f"s{uuid.uuid4().hex[:8]}"
    pipe.configure(cfg := StreamConfig(bootstrap=args.bootstrap, prefix=f"{tag}.", partitions=PARTITIONS,
                                       grace_s=GRACE_S, grace_cap_s=GRACE_S, app_id=f"{tag}-correlator",
                                       extractor_group=f"{tag}-extractor"))
    kafka.ensure_topics(cfg)
    for kind in ["extractor"] * args.extractors + ["correlator"] * args.correlators:
        pipe.start(kind)
    pipe.reader.start()
    say(f"workers started on {cfg.bootstrap} (prefix {cfg.prefix}); waiting for the warm-up final")
    res["warmup_s"] = round(warm_up(pipe), 1)
    for _ in range(120):                           # every member has its share (a second one may still be joining)
        if all(w.assigned() for w in pipe.workers):
            break
        time.sleep(0.5)

    ctx = mp.get_context("spawn")
    counter, go, out, done = ctx.Value("q", 0), ctx.Event(), ctx.Queue(), {}
    shares = [s for i in range(args.shippers) if (s := [str(j.path) for j in jobs[i::args.shippers]])]
    pipe.shippers = [ctx.Process(target=ship_share, args=(i, cfg.model_dump_json(), s, counter, go, out), daemon=True)
                     for i, s in enumerate(shares)]
    for p in pipe.shippers:
        p.start()

    def take(kind: str, idx: int, body: Any) -> int:
        if kind == "error":
            raise RuntimeError(f"shipper {idx}: {body}")
        done.update({idx: body} if kind == "done" else {})
        return kind == "ready"

    ready, total, deadline = 0, sum(j.lines for j in jobs), None
    while ready < len(shares):
        ready += take(*out.get(timeout=120))
    go.set()
    say(f"shipping {len(jobs)} workloads (~{total:,} lines) with {len(shares)} shippers")
    t_ship, next_say = time.time(), time.monotonic() + 5
    scen = Scenario(args, pipe, t_ship)
    while True:
        try:
            while True:
                take(*out.get_nowait())
        except queue.Empty:
            pass
        for w in pipe.sample():
            scen.note(f"{w.name} exited on its own with {w.proc.returncode} (see {w.log})")
        got = sum(1 for j in jobs if j.wid in pipe.finals)
        scen.step(counter.value / total, got == len(jobs))
        if deadline is None and len(done) == len(shares):
            deadline = time.monotonic() + args.timeout
            say(f"shipped in {time.time() - t_ship:.1f} s; waiting up to {args.timeout:.0f} s for the finals")
        if len(done) < len(shares) and any(p.exitcode not in (None, 0) for p in pipe.shippers):
            raise RuntimeError("a shipper died without a result")
        if time.monotonic() >= next_say:
            next_say = time.monotonic() + 5
            say(f"t={time.time() - t_ship:4.0f}s  shipped {counter.value:,}/~{total:,} lines  finals {got}/{len(jobs)}"
                f"  provisionals {pipe.provisionals}  load {os.getloadavg()[0]:.1f}")
        if deadline and (got == len(jobs) or time.monotonic() > deadline):
            break
        time.sleep(0.5)
    if got < len(jobs):
        say(f"timeout: {len(jobs) - got} workloads have no final")
    scen.step(1.0, True)                          # a joiner still there leaves, a paused broker resumes
    for _ in range(int(SETTLE_S * 2)):             # late duplicates and revisions
        pipe.sample()
        time.sleep(0.5)
    pipe.halt.set()
    pipe.reader.join(5)

    ends = {w: t for r in done.values() for w, t in r["ends"].items()}
    lines, secs = sum(r["lines"] for r in done.values()), max(r["t1"] for r in done.values()) - t_ship
    lat = sorted(pipe.finals[j.wid][0][0] - ends[j.wid] for j in jobs if j.wid in pipe.finals and j.wid in ends)
    last_final = max((t for j in jobs for t, _ in pipe.finals.get(j.wid, [])), default=None)
    pct = lambda p: round(lat[min(len(lat) - 1, int(round(p * (len(lat) - 1))))], 3) if lat else None  # noqa: E731
    res.update(lines=lines, mb=round(sum(r["bytes"] for r in done.values()) / 1e6, 1), ship_s=round(secs, 2),
               lines_per_s=round(lines / secs), unconfirmed=sum(r["unconfirmed"] for r in done.values()),
               last_end_to_last_final_s=round(last_final - max(ends.values()), 2) if last_final and ends else None,
               latency={"n": len(lat), "p50_s": pct(0.5), "p99_s": pct(0.99), "max_s": pct(1.0)},
               finals=sum(len(pipe.finals.get(j.wid, [])) for j in jobs), provisionals=pipe.provisionals,
               scenario=scen.events, changelog=changelog(cfg), check=check(jobs, pipe.finals))


def summary(r: dict[str, Any]) -> str:
    """One line per figure, as bench_stream.py prints them; the check's examples one per line."""
    ex = (r.get("check") or {}).pop("examples", {})
    lines = [f"{k:26} {json.dumps(v)}" for k, v in r.items()]
    return "\n".join(lines + [f"{'example ' + k:26} {json.dumps(v)[:800]}" for k, vs in ex.items() for v in vs[:2]])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", type=int, default=200, help="isolated copies of the samples")
    ap.add_argument("--shippers", type=int, default=4, help="shipper processes")
    ap.add_argument("--extractors", type=int, choices=(1, 2), default=1)
    ap.add_argument("--correlators", type=int, choices=(1, 2), default=1)
    ap.add_argument("--join", choices=("extractor", "correlator"), help="one more joins mid-load and leaves later")
    ap.add_argument("--kill", choices=("extractor", "correlator"), help="kill -9 one mid-load; another is started")
    ap.add_argument("--pause-broker", type=float, metavar="S", help="SIGSTOP the embedded broker for S s mid-load")
    ap.add_argument("--big", type=int, default=0, help=f"generated 16-node jobs of {BIG_LINES} lines added")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds after the last ship to wait for finals")
    ap.add_argument("--bootstrap", default=os.environ.get("FIRSTFAULT_KAFKA_BOOTSTRAP"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.pause_broker and args.bootstrap:
        ap.error("--pause-broker needs the embedded broker (no --bootstrap)")

    def on_term(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_term)
    OUT.mkdir(parents=True, exist_ok=True)
    pipe, rc = Pipeline(Path(tempfile.mkdtemp(prefix="bench-stream-scale-", dir=OUT))), 2
    res: dict[str, Any] = {"broker": args.bootstrap or "embedded Tansu", "cores": os.cpu_count(),
                           "loadavg": Path("/proc/loadavg").read_text().split()[:3], "shippers": args.shippers,
                           "extractors": args.extractors, "correlators": args.correlators, "partitions": PARTITIONS,
                           "grace_s": GRACE_S, "run_dir": str(pipe.run)}
    try:
        bench(args, pipe, res)
        rc = 1 if any(res["check"][k] for k in ("missing", "wrong", "harmful")) else 0
    except KeyboardInterrupt as exc:
        res["error"] = f"interrupted ({str(exc) or 'SIGINT'})"
    except Exception as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    finally:
        say("stopping the shippers, the workers and the broker")
        pipe.sample()
        pipe.close()
        shutil.rmtree(pipe.run / "bundles", ignore_errors=True)
        shutil.rmtree(pipe.run / "warmup", ignore_errors=True)
    res.update(peak_rss_mb={w.name: round(w.peak_kb / 1024, 1) for w in pipe.workers + [pipe.broker_w] if w},
               workers={w.name: w.how for w in pipe.workers}, loadavg_end=Path("/proc/loadavg").read_text().split()[:3])
    print(json.dumps(res, indent=2) if args.json else summary(res), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
