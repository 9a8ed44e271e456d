"""``firstfault replay`` selects workloads by when they ended, and ``--diff`` shows the changes an
operator acts on. Every sample goes through the embedded pipeline (real broker, real workers), weeks
after its workload ended; a replay of the samples' own window finds them all, agrees with what the
pipeline published, and shows the one recovery a rules overlay changes."""
from __future__ import annotations

pytest_plugins = ["conftest_kafka"]

import argparse
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conftest import sample_dirs
from firstfault.connectors.shipper import ship
from firstfault.rules.catalog import BUILTIN_CATALOG
from firstfault.rules.engine import analyze_path
from firstfault.streams import replay
from stream_pipeline import pipeline_cfg, read_finals, running_pipeline, worker_env

IDLE = 1.0
HOST_OOM_ROW = "host_oom:                {recovery: notify_owner,"
NEW_STEP = "move the job to nodes with more host memory, then rerun"


def recovery_overlay(root: Path) -> Path:
    """A rules directory whose taxonomy changes one sub_domain's recovery (host_oom: retry, another next step)."""
    text = (BUILTIN_CATALOG / "data" / "taxonomy.yaml").read_text()
    assert text.count(HOST_OOM_ROW) == 1, "the host_oom row moved: update this overlay"
    text = text.replace(HOST_OOM_ROW, "host_oom:                {recovery: retry,")
    old_step = analyze_path(Path(__file__).resolve().parents[1] / "samples" / "host-oom-killer").diagnosis.recovery.next_step
    assert text.count(old_step) == 1
    (root / "data").mkdir(parents=True)
    (root / "data" / "taxonomy.yaml").write_text(text.replace(old_step, NEW_STEP))
    return root


def run_replay(argv: list[str], capsys) -> dict:
    parser = argparse.ArgumentParser(prog="firstfault")
    replay.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["replay", "--idle", str(IDLE), "--json", *argv])
    assert args.fn(args) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def shipped(kafka_bootstrap, tmp_path_factory):
    """Every sample shipped today through a running pipeline, and its final diagnosis published."""
    tmp = tmp_path_factory.mktemp("replay-endtime")
    samples = sample_dirs()
    ids = {json.loads((s / "workload.json").read_text())["workload_id"]: s for s in samples}
    cfg = pipeline_cfg(kafka_bootstrap, f"rend-{uuid.uuid4().hex[:10]}").model_copy(update={"grace_cap_s": 4.0})
    with running_pipeline(cfg, tmp) as cfg:
        for s in samples:
            ship(s, cfg)
        finals = read_finals(cfg, lambda out: set(ids) <= set(out), timeout=240)
    assert set(ids) <= set(finals), f"no final diagnosis for {sorted(set(ids) - set(finals))}"
    return cfg, ids, tmp


@pytest.fixture
def env(shipped, monkeypatch):
    cfg = shipped[0]
    monkeypatch.setenv("FIRSTFAULT_KAFKA_BOOTSTRAP", cfg.bootstrap)
    monkeypatch.setenv("FIRSTFAULT_TOPIC_PREFIX", cfg.prefix)
    monkeypatch.setenv("FIRSTFAULT_PARTITIONS", str(cfg.partitions))
    monkeypatch.delenv("FIRSTFAULT_REDIS_URL", raising=False)
    monkeypatch.delenv("FIRSTFAULT_RULES", raising=False)
    return shipped


def test_the_samples_window_finds_every_sample_and_agrees_with_the_pipeline(env, capsys):
    cfg, ids, _ = env
    report = run_replay(["--since", "2026-11-01", "--until", "2026-11-10", "--diff"], capsys)
    assert report["by"] == "end-time"
    assert {d["workload_id"] for d in report["diagnoses"]} == set(ids)       # the warm-up (October) is not in it
    assert all("2026-11-01" <= d["ended"] < "2026-11-10" for d in report["diagnoses"])
    # Same evidence, same catalog: what the pipeline published, field for field.
    diff = report["diff"]
    assert (diff["compared"], diff["unpublished"], diff["changed"]) == (len(ids), 0, 0), diff["changes"]
    assert diff["kinds"] == dict.fromkeys(replay.DIFF_FIELDS, 0)


def test_a_narrower_window_by_end_time_and_the_publish_time_selector(env, capsys):
    cfg, ids, _ = env
    nov2 = {wid for wid, s in ids.items()
            if json.loads((s / "workload.json").read_text())["end_time"].startswith("2026-11-02")}
    assert len(nov2) == 2
    report = run_replay(["--since", "2026-11-02", "--until", "2026-11-03"], capsys)
    assert {d["workload_id"] for d in report["diagnoses"]} == nov2
    # By publish time the samples' window holds nothing: they were shipped today.
    report = run_replay(["--since", "2026-11-01", "--until", "2026-11-10", "--by", "publish-time"], capsys)
    assert report["workloads"] == 0 and report["by"] == "publish-time"
    # ... and the last hour holds them all (and the warm-up).
    report = run_replay(["--since", "1h", "--by", "publish-time"], capsys)
    assert set(ids) | {"warmup"} == {d["workload_id"] for d in report["diagnoses"]}


def test_diff_shows_the_recovery_a_rules_overlay_changes(env, capsys, tmp_path):
    cfg, ids, _ = env
    rules = recovery_overlay(tmp_path / "rules")
    report = run_replay(["--since", "2026-11-01", "--until", "2026-11-10", "--rules", str(rules), "--diff",
                         "--output-topic", f"{cfg.prefix}trial"], capsys)
    diff = report["diff"]
    assert diff["changed"] == 1 and diff["unchanged"] == len(ids) - 1
    assert diff["kinds"] == {**dict.fromkeys(replay.DIFF_FIELDS, 0), "recovery": 1}
    [change] = diff["changes"]
    assert change["workload_id"] == "slurm-4472610" and set(change["fields"]) == {"recovery"}
    before, after = change["fields"]["recovery"]["before"], change["fields"]["recovery"]["after"]
    assert (before["action"], after["action"]) == ("notify_owner", "retry")
    assert after["next_step"] == NEW_STEP and before["nodes"] == after["nodes"] == []

    # The operator's command, as typed: the text names the change and counts it by kind.
    proc = subprocess.run(
        [sys.executable, "-m", "firstfault.cli", "replay", "--since", "2026-11-01", "--until", "2026-11-10",
         "--rules", str(rules), "--diff", "--idle", str(IDLE), "--output-topic", f"{cfg.prefix}trial2"],
        env=worker_env(cfg, tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "CHANGED  slurm-4472610#0" in out
    assert "recovery.action    notify_owner  ->  retry" in out
    assert f"now  {NEW_STEP}" in out and "recovery.nodes" not in out
    assert (f"diff: 1 changed, {len(ids) - 1} unchanged, 0 never published; changes by kind: 0 status, "
            "0 sub_domain, 0 root_cause, 0 responsible_nodes, 0 suspect_nodes, 0 candidates, 1 recovery") in out
    assert (f"replayed {len(ids)} workload attempt{'' if len(ids) == 1 else 's'} ending 2026-11-01T00:00:00.000Z .. "
            "2026-11-10T00:00:00.000Z") in out
