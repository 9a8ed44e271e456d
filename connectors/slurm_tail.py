"""Slurm job output tailer: each job's output file, line by line, to the raw topic as that job's lines.

Run it where the jobs' output files can be read (a login node with the shared file
system), beside the Slurm connector (``firstfault up --slurm`` starts both)::

    FIRSTFAULT_KAFKA_BOOTSTRAP=kafka:9092 python -m firstfault.connectors.slurm_tail \
        [--output '/scratch/%u/logs/%x-%j.out']

**Which jobs.** ``squeue --json`` every ``--interval``: the jobs running now and those that
ended within slurmctld's MinJobAge (300 s by default), so a job that starts and dies
between two looks is still read. A job is followed from its start until ``--linger``
seconds after it was seen ended (its last lines, a slow shared file system), then read
to the end once more and dropped. A requeued job (same id, a new start time) is
followed again; Slurm truncates its file, so its lines are numbered afresh.

**Which file.** ``--output PATTERN`` when given, else the job's own ``StdOut``: squeue's
``standard_output`` (empty for Slurm's default, ``slurm-%j.out`` or ``slurm-%A_%a.out``
in the job's working directory). Slurm 22.05 gives it unexpanded, so the file name
patterns are expanded here from squeue's record: ``%j``/``%J`` job id, ``%x`` job name,
``%u`` user, ``%A``/``%a`` array job and task, ``%N`` the batch host, ``%n``/``%t`` 0,
``%s`` ``batch``, ``%%``, with zero padding (``%4j``). A relative path is in the job's
working directory. When the expanded name does not exist, ``%N`` is tried as a wildcard
(slurmstepd writes the host name, which may differ from the node name).

**Records.** Avro ``RawLine`` keyed by the batch host: ``workload_id`` ``slurm-<job id>``
(the connector's), ``host`` the batch host, ``path`` ``logs/app/<host>.log`` and the
1-based line number, as ``firstfault analyze`` reads the same file in a bundle, so both
give the same references. Only whole lines travel (a partial last line waits for its
newline, or for the job's end). Lines are sent once; a restart sends a job's file again
from line 1, which the correlator counts once (by path and line, line_ledger.py).
"""
from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from firstfault.schemas import RawLine
from firstfault.schemas.avro import encode
from firstfault.streams.config import StreamConfig

from .publish import ConnectorMetrics
from .slurm import NOT_ENDED, base_state, slurm_parser, slurm_start

log = logging.getLogger("firstfault.connectors.slurm_tail")

READ_CHUNK = 1 << 20          # bytes read from one file per round: a huge file is sent over several rounds
MAX_LINE = 64 * 1024          # a "line" longer than this is cut (binary junk, a progress bar without newline)
_PATTERN = re.compile(r"%(\d*)([%AajJxuNnst])")


@dataclass
class Job:
    """What squeue says about a job, as far as its output file goes."""

    job_id: int
    start: int
    ended: bool
    name: str = ""
    user: str = ""
    host: str = ""
    workdir: str = ""
    stdout: str = ""
    array_job: int = 0
    array_task: int | None = None


def _int(value: Any) -> int | None:
    if isinstance(value, dict):            # newer data_parser: {"set", "infinite", "number"}
        value = value.get("number") if value.get("set", True) and not value.get("infinite") else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def jobs_from_squeue(doc: dict[str, Any]) -> list[Job]:
    """``squeue --json`` -> the jobs that have started (pending ones have no output yet)."""
    out = []
    for j in doc.get("jobs") or []:
        job_id, start = _int(j.get("job_id")), _int(j.get("start_time"))
        state = base_state(j.get("job_state") or [])
        if job_id is None or not start or state == "PENDING":
            continue
        nodes = str(j.get("nodes") or "")
        out.append(Job(job_id=job_id, start=start, ended=state not in NOT_ENDED, name=str(j.get("name") or ""),
                       user=str(j.get("user_name") or ""),
                       host=str(j.get("batch_host") or "") or nodes.split(",")[0].split("[")[0],
                       workdir=str(j.get("current_working_directory") or ""),
                       stdout=str(j.get("standard_output") or ""), array_job=_int(j.get("array_job_id")) or 0,
                       array_task=_int(j.get("array_task_id"))))
    return out


def expand(pattern: str, job: Job, host: str | None = None) -> str:
    """Slurm's file name pattern for ``job`` (``host`` in place of ``%N``: a glob ``*`` to search)."""
    array = job.array_job or job.job_id

    def one(m: re.Match) -> str:
        pad, code = m.group(1), m.group(2)
        if code == "%":
            return "%"
        value: str | int = {"A": array, "a": job.array_task if job.array_task is not None else 4294967294,
                            "j": job.job_id, "J": job.job_id, "x": job.name, "u": job.user,
                            "N": job.host if host is None else host, "n": 0, "t": 0, "s": "batch"}[code]
        return f"{value:0{pad}d}" if pad and isinstance(value, int) else str(value)
    return _PATTERN.sub(one, pattern)


def output_path(job: Job, pattern: str | None = None) -> Path | None:
    """The job's output file (``pattern``: the user's, else the job's StdOut, else Slurm's default)."""
    pat = pattern or job.stdout or ("slurm-%A_%a.out" if job.array_task is not None else "slurm-%j.out")
    path = Path(expand(pat, job))
    if not path.is_absolute():
        if not job.workdir:
            return None
        path = Path(job.workdir) / path
    if not path.exists() and "%N" in pat:
        wild = glob.escape(str(Path(job.workdir or "/") / expand(pat, job, host="\0"))).replace("\0", "*")
        found = glob.glob(wild)
        if len(found) == 1:
            return Path(found[0])
    return path


@dataclass
class Followed:
    job: Job
    path: Path | None
    offset: int = 0
    line: int = 0
    partial: bytes = b""
    ended_at: float | None = None          # monotonic time it was first seen ended
    missing_said: bool = False
    pending: tuple[int, int, bytes] | None = None   # (offset, line, partial) once this round is confirmed
    at_end: bool = False                   # the last read reached the end of the file (or there is none)


@dataclass
class OutputTailer:
    """Follows the started jobs' output files; ``publish`` sends RawLines and returns once confirmed."""

    publisher: Any
    pattern: str | None = None
    linger_s: float = 30.0
    jobs: dict[tuple[int, int], Followed] = field(default_factory=dict)   # (job id, start) -> where we are
    done: set[tuple[int, int]] = field(default_factory=set)              # read to the end and dropped

    def update(self, listed: Sequence[Job], now: float) -> None:
        """squeue's latest view: new jobs followed, ended ones marked (they linger)."""
        seen = set()
        for job in listed:
            key = (job.job_id, job.start)
            seen.add(key)
            if key in self.done:
                continue
            f = self.jobs.get(key)
            if f is None:
                f = self.jobs[key] = Followed(job, output_path(job, self.pattern))
                log.info("following job %s: %s", job.job_id, f.path)
            f.job = job
            if job.ended and f.ended_at is None:
                f.ended_at = now
        self.done &= seen                  # gone from squeue: never listed again

    def read(self, now: float) -> int:
        """One round over every followed file; the lines sent. Jobs past their linger are dropped."""
        records: list[tuple[str, RawLine]] = []
        finished = []
        for key, f in self.jobs.items():
            last = f.ended_at is not None and now - f.ended_at >= self.linger_s
            records += self._new_lines(f, last)
            if last and f.at_end:
                finished.append(key)
        if records:
            self.publisher.publish(records)      # raises unless confirmed: positions stay, the round is redone
        self._advance()
        for key in finished:
            self.jobs.pop(key)
            self.done.add(key)
        return len(records)

    def _new_lines(self, f: Followed, last: bool) -> list[tuple[str, RawLine]]:
        f.pending = None                   # a failed round's reading is not sent: start from what was
        f.at_end = True
        if f.path is None:
            return []
        if not f.path.exists() and "%N" in (self.pattern or f.job.stdout):
            f.path = output_path(f.job, self.pattern)        # %N's file may appear after the start
        try:
            with open(f.path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < f.offset:                  # truncated (a requeue rewrites it): from the top
                    f.offset, f.line, f.partial = 0, 0, b""
                fh.seek(f.offset)
                data = fh.read(READ_CHUNK)
        except OSError as exc:
            if not f.missing_said:                   # not written yet, or another user's: said once
                f.missing_said = True
                log.info("job %s: cannot read %s yet: %s", f.job.job_id, f.path, exc.strerror or exc)
            return []
        f.at_end = len(data) < READ_CHUNK
        buf = f.partial + data
        lines = buf.split(b"\n")
        rest = lines.pop()
        if last and rest and f.at_end:       # the job is over: its unterminated last line too
            lines.append(rest)
            rest = b""
        host = f.job.host or "unknown"
        out = []
        pending_line = f.line
        for raw in lines:
            pending_line += 1
            text = raw[:MAX_LINE].decode("utf-8", "surrogateescape").rstrip("\r")
            out.append((host, RawLine(host=host, path=f"logs/app/{host}.log", line=pending_line, text=text,
                                      source="app", workload_id=f"slurm-{f.job.job_id}")))
        f.pending = (f.offset + len(data), pending_line, rest[:MAX_LINE])    # a huge line: its head
        return out

    def _advance(self) -> None:
        """After the broker confirmed the round: each file's position moves past what was sent."""
        for f in self.jobs.values():
            if f.pending is not None:
                f.offset, f.line, f.partial = f.pending
                f.pending = None


class RawPublisher:
    """RawLines to the raw topic, returning only once the broker confirmed them all."""

    def __init__(self, cfg: StreamConfig, timeout_s: float = 30.0) -> None:
        from firstfault.streams import kafka

        self.topic, self.timeout_s = cfg.topic("raw"), timeout_s
        self.producer = kafka.producer(cfg)

    def publish(self, records: Sequence[tuple[str, RawLine]]) -> None:
        failures: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                failures.append(str(err))

        for key, rec in records:
            while True:
                try:
                    self.producer.produce(self.topic, key=key.encode(), value=encode(rec), on_delivery=delivered)
                    break
                except BufferError:
                    self.producer.poll(0.1)
        left = self.producer.flush(self.timeout_s)
        if left or failures:
            raise RuntimeError(f"{left} line(s) unconfirmed, {len(failures)} failed: {failures[:3]}")


def squeue_jobs(squeue: str = "squeue", extra: Sequence[str] = (), timeout_s: float = 60.0) -> list[Job]:
    out = subprocess.run([squeue, "--json", *extra], capture_output=True, timeout=timeout_s, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"squeue exited {out.returncode}: {out.stderr.decode(errors='replace')[:300]}")
    return jobs_from_squeue(json.loads(out.stdout))


def run(tailer: OutputTailer, interval_s: float, read_every_s: float = 0.5, metrics: ConnectorMetrics | None = None,
        extra: Sequence[str] = ()) -> None:
    """Ask squeue every ``interval_s``, read the files every ``read_every_s``, until killed."""
    next_look = 0.0
    while True:
        now = time.monotonic()
        try:
            if now >= next_look:
                next_look = now + interval_s
                tailer.update(squeue_jobs(extra=extra), now)
            sent = tailer.read(now)
            if sent:
                log.debug("sent %d line(s)", sent)
            if metrics is not None:
                metrics.ok()
        except Exception as exc:       # squeue or the broker down: keep the positions, try again
            if metrics is not None:
                metrics.failed(str(exc))
            log.warning("slurm output tail failed, will retry: %s", exc)
            next_look = min(next_look, now + interval_s)
        time.sleep(read_every_s)


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = slurm_parser("firstfault.connectors.slurm_tail", __doc__.split("\n")[0], "squeue")
    p.add_argument("--output", default=env("FIRSTFAULT_SLURM_OUTPUT") or None,
                   help="the jobs' output file pattern, e.g. '/scratch/%%u/%%x-%%j.out' (FIRSTFAULT_SLURM_OUTPUT); "
                        "default: each job's StdOut")
    p.add_argument("--interval", type=float, default=float(env("FIRSTFAULT_SLURM_TAIL_INTERVAL_S", "5")),
                   help="seconds between two squeue calls (FIRSTFAULT_SLURM_TAIL_INTERVAL_S)")
    p.add_argument("--linger", type=float, default=float(env("FIRSTFAULT_SLURM_TAIL_LINGER_S", "30")),
                   help="seconds a file is still read after its job ended (FIRSTFAULT_SLURM_TAIL_LINGER_S)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    started = slurm_start(build_parser(), argv, "slurm-tail", "squeue")
    if started is None:
        return 2
    args, extra = started
    cfg = StreamConfig.from_env(bootstrap=args.kafka_bootstrap)
    if not cfg.bootstrap:
        print("firstfault slurm-tail: set FIRSTFAULT_KAFKA_BOOTSTRAP or --kafka-bootstrap", file=sys.stderr)
        return 2
    metrics = ConnectorMetrics("slurm-tail", stale_after_s=args.interval + 600.0)
    metrics.serve(args.metrics_port)
    try:
        run(OutputTailer(RawPublisher(cfg), args.output, args.linger), args.interval, metrics=metrics, extra=extra)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
