"""The whole pipeline on a real broker: ship -> extractor -> correlator -> diagnoses topic.

Parity with `firstfault analyze --json` for every sample (stream-only fields aside),
and late evidence: inside the grace period it still counts; after the diagnosis it
produces revision 1 with the right answer.
"""
import json
import shutil
from pathlib import Path

import pytest

from firstfault.connectors.shipper import ship
from firstfault.rules.engine import analyze_path

from conftest import sample_dirs
from stream_pipeline import pipeline_cfg, read_finals, running_pipeline

pytest_plugins = ["conftest_kafka"]
STREAM_ONLY = ("revision", "provisional")


@pytest.fixture
def running(kafka_bootstrap, unique_name, tmp_path):
    with running_pipeline(pipeline_cfg(kafka_bootstrap, unique_name("pipe")), tmp_path) as cfg:
        yield cfg


def _bare(d) -> dict:
    return {k: v for k, v in d.to_dict().items() if k not in STREAM_ONLY}


METRICS = "\n".join([
    '{"ts": "2026-11-02T09:55:00Z", "host": "node-02", "gpu": 3, "name": "DCGM_FI_DEV_XID_ERRORS", "value": 0}',
    '{"ts": "2026-11-02T10:03:30Z", "host": "node-02", "gpu": 3, "name": "DCGM_FI_DEV_XID_ERRORS", "value": 149}',
    '{"ts": "2026-11-02T09:55:00Z", "host": "node-04", "gpu": 1, "name": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "value": 0}',
    '{"ts": "2026-11-02T10:02:00Z", "host": "node-04", "gpu": 1, "name": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "value": 500}',
    "not a sample",
    '{"ts": "2026-11-02T10:00:00Z", "host": "node-01", "gpu": 0, "name": "DCGM_FI_DEV_GPU_TEMP", "value": 61}',
    "",
    '{"ts": "2026-11-02T10:10:00Z", "host": "node-01", "gpu": 0, "name": "DCGM_FI_DEV_GPU_TEMP", "value": "hot"}',
]) + "\n"


def _with_metrics(tmp_path: Path) -> Path:
    """The worked example with DCGM samples: a crossing the kernel line explains, a weak
    NVLink counter, unreadable lines and a host (node-03) with no samples."""
    dst = tmp_path / "worked-example-metrics"
    shutil.copytree(next(p for p in sample_dirs() if p.name == "worked-example"), dst)
    (dst / "metrics").mkdir()
    (dst / "metrics" / "dcgm.jsonl").write_text(METRICS)
    return dst


def test_every_sample_through_the_pipeline_matches_analyze(running, tmp_path):
    # The worked example goes with metrics samples (its hosts and times are its own: a second
    # copy would share node-scoped lines with it).
    samples = [_with_metrics(tmp_path) if p.name == "worked-example" else p for p in sample_dirs()]
    for s in samples:
        ship(s, running)
    expected = {json.loads((s / "workload.json").read_text())["workload_id"]: analyze_path(s).diagnosis for s in samples}
    got = read_finals(running, lambda out: set(out) >= set(expected))
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
    got = read_finals(running, lambda out: "late-inside-grace" in out)["late-inside-grace"]
    assert [d.revision for d in got] == [0]
    assert (got[0].status, got[0].sub_domain, got[0].responsible_nodes) == \
        ("attributed", "nvlink_signal_integrity", ["node-02"])
    assert _bare(got[0]) == json.loads(analyze_path(bundle).diagnosis.to_json())


def test_late_root_cause_after_the_diagnosis_gives_revision_1(running, tmp_path):
    # node-02's syslog arrives after the diagnosis was published (separate workload ids and
    # topics: the two cases share hosts and times, so their node-scoped lines would mix).
    bundle = _renamed_worked_example(tmp_path, "late-after-final")
    ship(bundle, running, only=lambda p: p != LATE)
    first = read_finals(running, lambda out: "late-after-final" in out)["late-after-final"]
    assert first[0].revision == 0 and first[0].responsible_nodes != ["node-02"]
    ship(bundle, running, only=lambda p: p == LATE, start=False, end=False)
    got = read_finals(running, lambda out: len(out.get("late-after-final", [])) >= 2)["late-after-final"]
    assert [d.revision for d in got] == [0, 1]
    assert got[1].sub_domain == "nvlink_signal_integrity" and got[1].responsible_nodes == ["node-02"]
    assert _bare(got[1]) == json.loads(analyze_path(bundle).diagnosis.to_json())
