"""The whole pipeline on a real broker: ship -> extractor -> correlator -> diagnoses topic.

Parity with `firstfault analyze --json` for every sample (stream-only fields aside),
and late evidence: inside the grace period it still counts; after the diagnosis it
produces revision 1 with the right answer.
"""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from firstfault.connectors.shipper import ship
from firstfault.rules.engine import analyze_path
from firstfault.schemas.avro import decode
from firstfault.streams import kafka
from firstfault.streams.config import StreamConfig

from conftest import sample_dirs

pytest_plugins = ["conftest_kafka"]
STREAM_ONLY = ("revision", "provisional")


def _env(cfg: StreamConfig, tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTFAULT_")}
    env.update(FIRSTFAULT_KAFKA_BOOTSTRAP=cfg.bootstrap, FIRSTFAULT_TOPIC_PREFIX=cfg.prefix,
               FIRSTFAULT_PARTITIONS=str(cfg.partitions), FIRSTFAULT_GRACE_S=str(cfg.grace_s),
               FIRSTFAULT_GRACE_CAP_S=str(cfg.grace_cap_s), FIRSTFAULT_APP_ID=cfg.app_id,
               FIRSTFAULT_EXTRACTOR_GROUP=cfg.extractor_group, FIRSTFAULT_CHANGELOG_ONE_PER_BATCH="1",
               TMPDIR=str(tmp))
    return env


@pytest.fixture
def running(kafka_bootstrap, unique_name, tmp_path):
    tag = unique_name("pipe")
    cfg = StreamConfig(bootstrap=kafka_bootstrap, prefix=f"{tag}.", partitions=2, grace_s=3600, grace_cap_s=30,
                       app_id=f"{tag}-correlator", extractor_group=f"{tag}-extractor")
    kafka.ensure_topics(cfg)
    procs = []
    for module in ("firstfault.streams.extractor", "firstfault.streams.correlator"):
        log = open(tmp_path / f"{module.rsplit('.', 1)[1]}.log", "wb")
        procs.append(subprocess.Popen([sys.executable, "-m", module], env=_env(cfg, tmp_path), cwd=tmp_path,
                                      stdout=log, stderr=subprocess.STDOUT))
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
    assert "warmup" in _finals(cfg, lambda out: "warmup" in out, timeout=90), "the pipeline never answered"
    yield cfg
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _finals(cfg, want, timeout=120.0):
    """Read the diagnoses topic until ``want(finals)``: workload_id -> [final diagnoses in order]."""
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


def _bare(d) -> dict:
    return {k: v for k, v in d.to_dict().items() if k not in STREAM_ONLY}


def test_every_sample_through_the_pipeline_matches_analyze(running):
    samples = sample_dirs()
    for s in samples:
        ship(s, running)
    expected = {json.loads((s / "workload.json").read_text())["workload_id"]: analyze_path(s).diagnosis for s in samples}
    got = _finals(running, lambda out: set(out) >= set(expected))
    assert set(got) - {"warmup"} == set(expected)
    for wid, d in expected.items():
        assert got[wid][0].revision == 0
        assert _bare(got[wid][0]) == json.loads(d.to_json()), wid


def _renamed_worked_example(tmp_path, wid) -> Path:
    src = next(p for p in sample_dirs() if p.name == "worked-example")
    dst = tmp_path / wid
    shutil.copytree(src, dst)
    wl = json.loads((dst / "workload.json").read_text())
    wl["workload_id"] = wid
    (dst / "workload.json").write_text(json.dumps(wl))
    return dst


LATE = "logs/syslog/node-02.log"


def test_late_root_cause_inside_the_grace_still_counts(running, tmp_path):
    # node-02's syslog arrives after the scheduler's end event, inside the grace period.
    bundle = _renamed_worked_example(tmp_path, "late-inside-grace")
    ship(bundle, running, only=lambda p: p != LATE)
    ship(bundle, running, only=lambda p: p == LATE, start=False, end=False)
    got = _finals(running, lambda out: "late-inside-grace" in out)["late-inside-grace"]
    assert [d.revision for d in got] == [0]
    assert (got[0].status, got[0].sub_domain, got[0].responsible_nodes) == \
        ("attributed", "nvlink_signal_integrity", ["node-02"])
    assert _bare(got[0]) == json.loads(analyze_path(bundle).diagnosis.to_json())


def test_late_root_cause_after_the_diagnosis_gives_revision_1(running, tmp_path):
    # node-02's syslog arrives after the diagnosis was published (separate workload ids and
    # topics: the two cases share hosts and times, so their node-scoped lines would mix).
    bundle = _renamed_worked_example(tmp_path, "late-after-final")
    ship(bundle, running, only=lambda p: p != LATE)
    first = _finals(running, lambda out: "late-after-final" in out)["late-after-final"]
    assert first[0].revision == 0 and first[0].responsible_nodes != ["node-02"]
    ship(bundle, running, only=lambda p: p == LATE, start=False, end=False)
    got = _finals(running, lambda out: len(out.get("late-after-final", [])) >= 2)["late-after-final"]
    assert [d.revision for d in got] == [0, 1]
    assert got[1].sub_domain == "nvlink_signal_integrity" and got[1].responsible_nodes == ["node-02"]
    assert _bare(got[1]) == json.loads(analyze_path(bundle).diagnosis.to_json())
