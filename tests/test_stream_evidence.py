"""Evidence is never silently missing on the stream (issue 10, findings 1 and 8), on a real broker.

One pipeline (extractor and correlator subprocesses) for the module:

* the poison records of the issue go in on every input topic; both workers survive,
  each refused record is on the dead-letter topic with its reason (a 5 MiB one as its
  head, size and hash), and a workload shipped after them is diagnosed as ``analyze`` does;
* a bundle whose logs hold bytes that are not UTF-8 ships (``firstfault ship`` used to die
  in the Avro writer) and its final diagnosis on the topic equals ``analyze --json``.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from firstfault.connectors.shipper import ship
from firstfault.schemas import DeadLetter, RawLine
from firstfault.schemas.avro import encode
from firstfault.streams import kafka

from conftest import SAMPLES
from stream_pipeline import pipeline_cfg, read_finals, running_pipeline

pytest_plugins = ["conftest_kafka"]
STREAM_ONLY = ("revision", "provisional")


@pytest.fixture(scope="module")
def pipe(kafka_bootstrap, tmp_path_factory):
    import uuid

    tmp = tmp_path_factory.mktemp("evidence")
    procs: list = []
    cfg = pipeline_cfg(kafka_bootstrap, f"ev-{uuid.uuid4().hex[:8]}").model_copy(update={"grace_cap_s": 4.0})
    with running_pipeline(cfg, tmp, procs) as cfg:
        yield cfg, procs, tmp


def analyze_json(bundle: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "firstfault", "analyze", "--json", str(bundle)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def bare(d) -> dict:
    return {k: v for k, v in d.to_dict().items() if k not in STREAM_ONLY}


def dead_letters(cfg, want, timeout: float = 30.0) -> list[DeadLetter]:
    c = kafka.consumer(cfg, group=f"{cfg.prefix}dl-{time.monotonic_ns()}")
    c.assign([TopicPartition(cfg.topic("deadletter"), p, 0) for p in range(cfg.partitions)])
    got: list[DeadLetter] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not want(got):
            got += [DeadLetter.model_validate_json(m.value()) for m in c.consume(100, 0.5) if m.error() is None]
    finally:
        c.close()
    return got


def test_poison_on_every_topic_costs_one_dead_letter_each_and_nothing_else(pipe):
    cfg, procs, tmp = pipe
    prod = kafka.producer(cfg)
    where: dict[str, tuple[str, int, int]] = {}

    def note(name):
        return lambda err, msg: where.__setitem__(name, (msg.topic(), msg.partition(), msg.offset()))

    big = bytes(range(256)) * (5 * 4096)                        # 5 MiB, neither JSON nor Avro
    huge_attempt = json.dumps({"type": "start", "ts": "2026-11-04T14:00:00Z", "workload": {
        "workload_id": "huge-attempt", "state": "RUNNING", "start_time": "2026-11-04T14:00:00Z",
        "attempt": 2 ** 63}}).encode()
    prod.produce(cfg.topic("scheduler"), key=b"w-big", value=big, on_delivery=note("sched5m"))
    prod.produce(cfg.topic("events"), key=b"w-big", value=big, on_delivery=note("events5m"))
    prod.produce(cfg.topic("scheduler"), key=b"huge-attempt", value=huge_attempt, on_delivery=note("attempt"))
    prod.produce(cfg.topic("raw"), key=None, value=b"B" * (8 << 20), on_delivery=note("raw8m"))
    # Its own workload (never started: held, then dropped), so it cannot change the one shipped below.
    rank = RawLine(host="a100-01", path="logs/app/a100-01.poison.log", line=1, source="app",
                   workload_id="poison-rank", text="[rank99999999999999999999999]: RuntimeError: CUDA error: out of memory")
    prod.produce(cfg.topic("raw"), key=b"a100-01", value=encode(rank), on_delivery=note("rank"))
    assert prod.flush(30) == 0

    sample = SAMPLES / "cuda-oom-one-rank"                      # shipped after them: diagnosed as offline
    ship(sample, cfg)
    got = read_finals(cfg, lambda out: "slurm-4472113" in out, timeout=90)
    assert "slurm-4472113" in got, (tmp / "correlator.log").read_text(errors="replace")[-3000:]
    assert bare(got["slurm-4472113"][0]) == analyze_json(sample)

    letters = dead_letters(cfg, lambda ls: len(ls) >= 4)
    by_origin = {(d.topic, d.partition, d.offset): d for d in letters}
    for name, stage, reason in (("sched5m", "correlator", "invalid scheduler event"),
                                ("events5m", "correlator", "not Avro"),
                                ("attempt", "correlator", "field 'workload.attempt'"),
                                ("raw8m", "extractor", "no host")):
        d = by_origin.get(where[name])
        assert d is not None, (name, where[name], [(x.topic, x.offset, x.reason[:60]) for x in letters])
        assert d.stage == stage and reason in d.reason, (name, d.reason)
    for name, size in (("sched5m", len(big)), ("events5m", len(big)), ("raw8m", 8 << 20)):
        d = by_origin[where[name]]
        assert (d.value_size, d.value_truncated) == (size, True) and len(d.value_b64) < 100_000
    assert by_origin[where["sched5m"]].value_sha256 == hashlib.sha256(big).hexdigest()
    assert all(p.poll() is None for p in procs), "a worker died"


def _invalid_utf8_bundle(dst: Path) -> Path:
    """The worked example, renamed, with bytes that are not UTF-8 in the root-cause line, in a
    kernel line, in an application error and in a line of binary junk."""
    shutil.copytree(SAMPLES / "worked-example", dst)
    wl = json.loads((dst / "workload.json").read_text())
    wl["workload_id"] = "utf8-bytes"
    (dst / "workload.json").write_text(json.dumps(wl))
    syslog = dst / "logs/syslog/node-02.log"
    lines = syslog.read_bytes().split(b"\n")
    lines[8] = lines[8].replace(b"name=python3", b"name=py\xff\xfethon3")
    lines.insert(3, b"Nov  2 10:01:00 node-02 kernel: garbage \xc3\x28 \xa0\xa1 \xed\xa0\x80 end")
    syslog.write_bytes(b"\n".join(lines))
    app = dst / "logs/app/node-03.log"
    lines = app.read_bytes().split(b"\n")
    lines.insert(2, b"2: RuntimeError: CUDA error: \xff\xfe an illegal memory access was encountered")
    lines.insert(4, b"\x80\x81\x82 binary junk \xf8\x88\x80\x80\x80")
    app.write_bytes(b"\n".join(lines))
    return dst


def test_a_bundle_with_invalid_utf8_ships_and_is_diagnosed_as_analyze_does(pipe, tmp_path):
    cfg, procs, tmp = pipe
    bundle = _invalid_utf8_bundle(tmp_path / "utf8-bytes")
    expected = analyze_json(bundle)
    root = expected["root_cause"]
    assert root["fields"].get("damaged_line") is True and "\ufffd" in root["text"]   # the bytes reach the engine
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("FIRSTFAULT_")}
    env.update(FIRSTFAULT_KAFKA_BOOTSTRAP=cfg.bootstrap, FIRSTFAULT_TOPIC_PREFIX=cfg.prefix,
               FIRSTFAULT_PARTITIONS=str(cfg.partitions))
    out = subprocess.run([sys.executable, "-m", "firstfault", "ship", str(bundle)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = read_finals(cfg, lambda o: "utf8-bytes" in o, timeout=90)
    assert "utf8-bytes" in got, (tmp / "correlator.log").read_text(errors="replace")[-3000:]
    assert bare(got["utf8-bytes"][0]) == expected
    assert all(p.poll() is None for p in procs)
