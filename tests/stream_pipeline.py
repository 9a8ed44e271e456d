"""The whole pipeline for a test: an extractor and a correlator as subprocesses, and a reader of its diagnoses.

Not a plugin (import what you use); the broker and Redis fixtures are in conftest_kafka.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path


def worker_env(cfg, tmp: Path, **extra: str) -> dict:
    """The environment a worker or connector subprocess gets: only this test's FIRSTFAULT_* values."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTFAULT_")}
    env.update(FIRSTFAULT_KAFKA_BOOTSTRAP=cfg.bootstrap, FIRSTFAULT_TOPIC_PREFIX=cfg.prefix,
               FIRSTFAULT_PARTITIONS=str(cfg.partitions), FIRSTFAULT_GRACE_S=str(cfg.grace_s),
               FIRSTFAULT_GRACE_CAP_S=str(cfg.grace_cap_s), FIRSTFAULT_APP_ID=cfg.app_id,
               FIRSTFAULT_EXTRACTOR_GROUP=cfg.extractor_group, FIRSTFAULT_CHANGELOG_ONE_PER_BATCH="1",
               FIRSTFAULT_WATERMARK_WAIT_S=str(cfg.watermark_wait_s),
               FIRSTFAULT_WATERMARK_MARGIN_S=str(cfg.watermark_margin_s),
               TMPDIR=str(tmp), **extra)
    if cfg.redis_url:            # the diagnoses store and the offset index, under the test's own key prefix
        env.update(FIRSTFAULT_REDIS_URL=cfg.redis_url, FIRSTFAULT_REDIS_PREFIX=cfg.redis_prefix)
    return env


def pipeline_cfg(bootstrap: str, tag: str):
    from firstfault.streams.config import StreamConfig

    return StreamConfig(bootstrap=bootstrap, prefix=f"{tag}.", partitions=2, grace_s=3600, grace_cap_s=30,
                        app_id=f"{tag}-correlator", extractor_group=f"{tag}-extractor")


def start_worker(cfg, tmp_path: Path, module: str, log_name: str | None = None, **extra: str) -> subprocess.Popen:
    """``python -m firstfault.streams.<module>`` on ``cfg``'s topics, its output in ``<log_name>.log``;
    ``extra``: more environment (e.g. FIRSTFAULT_METRICS_PORT)."""
    log = open(tmp_path / f"{log_name or module}.log", "ab")
    return subprocess.Popen([sys.executable, "-m", f"firstfault.streams.{module}"], env=worker_env(cfg, tmp_path, **extra),
                            cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)


@contextlib.contextmanager
def running_pipeline(cfg, tmp_path: Path, procs: list | None = None, env: dict | None = None):
    """An extractor and a correlator as subprocesses on ``cfg``'s topics, answering before this yields.

    ``procs``: a list the two processes are put in (extractor first), for a test that stops one;
    ``env``: module -> extra environment for that worker."""
    from firstfault.connectors.shipper import ship
    from firstfault.streams import kafka

    kafka.ensure_topics(cfg)
    procs = [] if procs is None else procs
    try:
        for module in ("extractor", "correlator"):
            procs.append(start_worker(cfg, tmp_path, module, **(env or {}).get(module, {})))
        # Production workers run long before a job ends; wait until both answer, with a
        # warm-up workload, so the grace period measures the pipeline, not process start-up.
        # (Its own host and day: node-scoped lines are shared by every workload on a node at a time.)
        warm = tmp_path / "warmup"
        (warm / "logs" / "app").mkdir(parents=True)
        (warm / "workload.json").write_text(json.dumps({
            "workload_id": "warmup", "state": "COMPLETED", "start_time": "2026-10-01T00:00:00Z",
            "end_time": "2026-10-01T00:10:00Z", "nodes": ["warm-01"], "gpus_per_node": 1}))
        (warm / "logs" / "app" / "warm-01.log").write_text("0: [2026-10-01 00:05:00,000] INFO step 1 loss 2.0\n")
        ship(warm, cfg)
        assert "warmup" in read_finals(cfg, lambda out: "warmup" in out, timeout=90), "the pipeline never answered"
        yield cfg
    finally:
        stop_all(procs, 15)


def stop_all(procs, wait_s: float = 20.0) -> None:
    """SIGTERM every process still running, then wait for each (SIGKILL past ``wait_s``)."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        p.terminate()
    for p in live:
        try:
            p.wait(wait_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def read_finals(cfg, want, timeout: float = 120.0) -> dict:
    """Read the diagnoses topic until ``want(finals)``: {(workload_id): [final diagnoses in order]}."""
    from confluent_kafka import TopicPartition

    from firstfault.schemas.avro import decode
    from firstfault.streams import kafka

    c = kafka.consumer(cfg, group=f"{cfg.prefix}reader-{time.monotonic_ns()}")
    c.assign([TopicPartition(cfg.topic("diagnoses"), p, 0) for p in range(cfg.partitions)])
    out: dict[str, list] = {}
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not want(out):
            for m in c.consume(num_messages=100, timeout=0.5):
                if m.error() is None:
                    d = decode(m.value())
                    if not d.provisional:
                        out.setdefault(d.workload_id, []).append(d)
    finally:
        c.close()
    return out


def drain(cfg, topic: str, want, timeout: float = 40.0) -> list:
    """Every record of ``topic`` (all partitions, from the start) until ``want(records)`` or the timeout."""
    from confluent_kafka import TopicPartition

    from firstfault.streams import kafka

    c = kafka.consumer(cfg, group=f"{cfg.prefix}reader-{time.monotonic_ns()}")
    c.assign([TopicPartition(topic, p, 0) for p in range(cfg.partitions)])
    got, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not want(got):
            got.extend(m for m in c.consume(num_messages=500, timeout=0.5) if m.error() is None)
    finally:
        c.close()
    return got


def start_up(env: dict, cwd, *extra: str, timeout: float = 60.0):
    """`firstfault up` in its own process group, read until it prints `ready`:
    (process, what it printed on stdout, the list its stderr lines keep arriving in)."""
    proc = subprocess.Popen([sys.executable, "-m", "firstfault.streams.up", "--partitions", "1", "--stop-timeout", "10",
                             *extra], env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    err_lines: list[str] = []
    threading.Thread(target=lambda: err_lines.extend(proc.stderr), daemon=True).start()
    out: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        out.append(line)
        if line.startswith("ready"):
            break
    return proc, "".join(out), err_lines
