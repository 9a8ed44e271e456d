"""Rules as data on the stream (issue 12.1), on the real embedded broker and one running pipeline.

One extractor and one correlator run for the whole module. Catalogs are overlays in the test's
tmp dir (the taxonomy's recovery row for cuda_oom changed), never rules/catalog/. Checked:
publish -> the next workload is diagnosed with the new rules_version and verdict with the
workers' processes unchanged; a catalog failing `rules test` is refused by publish and, forced
onto the topic, by the workers (counted on /metrics); rollback and promote move the live
pointer and the workers follow; `rules shadow` shows the changed verdict on diagnoses-shadow
and in its report, and the live diagnosis stays the live catalog's.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from firstfault.cli import main as cli
from firstfault.rules.catalog import BUILTIN_CATALOG, load_catalog
from firstfault.streams import rules_feed as feed
from firstfault.streams.broker import free_port

from stream_pipeline import pipeline_cfg, read_finals, running_pipeline, worker_env

pytest_plugins = ["conftest_kafka"]

OOM_ROW = "cuda_oom:                {recovery: notify_owner"
WORKERS = ("extractor", "correlator")


def _taxonomy_overlay(root: Path, action: str) -> Path:
    text = (BUILTIN_CATALOG / "data" / "taxonomy.yaml").read_text()
    assert text.count(OOM_ROW) == 1
    (root / "data").mkdir(parents=True)
    (root / "data" / "taxonomy.yaml").write_text(text.replace(OOM_ROW, f"cuda_oom:                {{recovery: {action}"))
    return root


def _failing_overlay(root: Path) -> Path:
    """Lint passes; `rules test` fails: the pattern's own match example does not match it."""
    (root / "extract").mkdir(parents=True)
    (root / "extract" / "zz_bad.yaml").write_text(
        "patterns:\n"
        "  - id: test.bad_example\n"
        "    title: A pattern whose own example does not match\n"
        "    description: Fails rules test on purpose.\n"
        "    sources: [app]\n"
        "    anchors: [\"zzqx-marker\"]\n"
        "    regex: 'zzqx-marker (?P<n>\\d+)'\n"
        "    kind: zzqx_marker\n"
        "    types: {n: int}\n"
        "    examples:\n"
        "      match: ['zzqx-marker none here']\n"
        "      no_match: ['nothing to see']\n")
    return root


def _oom_bundle(root: Path, wid: str, host: str, day: int) -> Path:
    """A workload whose rank ran out of GPU memory: attributed application/cuda_oom."""
    (root / "logs" / "app").mkdir(parents=True)
    (root / "workload.json").write_text(json.dumps({
        "workload_id": wid, "state": "FAILED", "exit_code": 1, "nodes": [host], "gpus_per_node": 1,
        "start_time": f"2026-10-{day:02d}T00:00:00Z", "end_time": f"2026-10-{day:02d}T00:10:00Z"}))
    (root / "logs" / "app" / f"{host}.log").write_text(
        f"0: [2026-10-{day:02d} 00:05:00,000] INFO step 1 loss 2.0\n"
        "0: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB. GPU 0 has a total "
        "capacity of 31.47 GiB of which 12.73 GiB is free.\n")
    return root


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def _sample(text: str, name: str, **labels: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and labels.items() <= s.labels.items():
                return s.value
    return None


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def live(kafka_bootstrap, tmp_path_factory):
    import uuid

    tmp = tmp_path_factory.mktemp("rules-live")
    cfg = pipeline_cfg(kafka_bootstrap, f"rl-{uuid.uuid4().hex[:8]}").model_copy(update={"grace_cap_s": 3.0})
    ports = {w: free_port() for w in WORKERS}
    procs: list = []
    env = {w: {"FIRSTFAULT_METRICS_PORT": str(ports[w])} for w in WORKERS}
    with running_pipeline(cfg, tmp, procs, env=env):
        yield cfg, tmp, ports, procs


def _ship(cfg, bundle: Path):
    from firstfault.connectors.shipper import ship

    ship(bundle, cfg)
    wid = json.loads((bundle / "workload.json").read_text())["workload_id"]
    return read_finals(cfg, lambda out: wid in out, timeout=60)[wid][-1]


def _cli(cfg, capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli(["rules", *argv, "--bootstrap", cfg.bootstrap, "--prefix", cfg.prefix])
    out, err = capsys.readouterr()
    return code, out, err


def _all_on(ports, version: str) -> bool:
    return all(_sample(_metrics(ports[w]), "firstfault_rules_version_info", worker=w, rules_version=version) == 1
               for w in WORKERS)


def test_publish_refuse_rollback_promote_and_shadow(live, capsys):
    cfg, tmp, ports, procs = live
    pids = [p.pid for p in procs]
    base = load_catalog().version
    assert _all_on(ports, base)

    # Before: the built-in catalog's verdict.
    before = _ship(cfg, _oom_bundle(tmp / "wl-before", "wl-before", "oom-01", 2))
    assert (before.sub_domain, before.recovery.action, before.rules_version) == ("cuda_oom", "notify_owner", base)

    # Publish a catalog that changes the verdict: the workers load it between batches.
    new_dir = _taxonomy_overlay(tmp / "retry", "retry")
    code, out, err = _cli(cfg, capsys, "publish", str(new_dir), "--author", "test", "-m", "oom: retry", "--json")
    assert code == 0, err
    new = json.loads(out)["rules_version"]
    assert new == load_catalog(new_dir).version != base
    _wait(lambda: _all_on(ports, new), 30, f"both workers on {new}")
    after = _ship(cfg, _oom_bundle(tmp / "wl-after", "wl-after", "oom-02", 3))
    assert (after.recovery.action, after.rules_version) == ("retry", new)
    assert [p.pid for p in procs] == pids and all(p.poll() is None for p in procs), "a worker restarted"

    # A catalog that fails `rules test`: publish refuses it with one line ...
    bad_dir = _failing_overlay(tmp / "bad")
    code, out, err = _cli(cfg, capsys, "publish", str(bad_dir))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "refused" in err and "test.bad_example" in err, err
    # ... and forced onto the topic past the gate, the workers refuse it and keep the one they have.
    bad = feed.bundle_of(bad_dir, "test", "forced past the gate")
    feed.publish_record(cfg, feed.version_key(bad.rules_version), bad)
    feed.move_live(cfg, feed.read_state(cfg), bad.rules_version, "test", "forced")
    _wait(lambda: all(_sample(_metrics(ports[w]), "firstfault_rules_load_failures_total", worker=w) == 1
                      for w in WORKERS), 30, "both workers to refuse the failing catalog")
    assert _all_on(ports, new)
    log = (tmp / "correlator.log").read_text()
    assert f"rules: refused {bad.rules_version}, keeping {new}" in log

    # Rollback moves the live pointer back (to `new`, which they run), then to the configured catalog.
    assert _cli(cfg, capsys, "rollback")[0] == 0
    assert feed.pointer(feed.read_state(cfg), feed.LIVE).rules_version == new
    code, out, _ = _cli(cfg, capsys, "rollback", "--json")
    assert code == 0 and json.loads(out)["rules_version"] is None
    _wait(lambda: _all_on(ports, base), 30, "both workers back on the configured catalog")
    # Promote moves it forward again; an unknown version is refused in one line.
    assert _cli(cfg, capsys, "promote", new)[0] == 0
    _wait(lambda: _all_on(ports, new), 30, f"both workers on {new} again")
    code, _, err = _cli(cfg, capsys, "promote", "sha256:0000000000000000")
    assert code == 2 and "no published catalog" in err
    assert [p.pid for p in procs] == pids and all(p.poll() is None for p in procs), "a worker restarted"

    # Shadow: a candidate beside the live catalog, on what is shipped after it started.
    cand_dir = _taxonomy_overlay(tmp / "drain", "drain_nodes")
    cand = load_catalog(cand_dir).version
    shadow_log = open(tmp / "shadow.log", "w+")
    shadow = subprocess.Popen([sys.executable, "-m", "firstfault", "rules", "shadow", str(cand_dir), "--every", "1"],
                              env=worker_env(cfg, tmp), cwd=tmp, stdout=shadow_log, stderr=subprocess.STDOUT)
    try:
        _wait(lambda: "on the live stream since" in (tmp / "shadow.log").read_text() or shadow.poll() is not None,
              30, "the shadow run to start")
        assert shadow.poll() is None, (tmp / "shadow.log").read_text()
        live_d = _ship(cfg, _oom_bundle(tmp / "wl-shadow", "wl-shadow", "oom-03", 4))
        assert (live_d.recovery.action, live_d.rules_version) == ("retry", new)     # live is untouched

        def reported():
            code, out, _ = _cli(cfg, capsys, "shadow", "--report", "--json")
            assert code == 0
            rep = json.loads(out)
            return rep if rep["diff"]["changed"] else None
        _wait(reported, 40, "the shadow report to show the change")
        rep = reported()
    finally:
        shadow.terminate()
        shadow.wait(20)
    assert rep["rules_version"] == cand and rep["live_version"] == new
    [change] = rep["diff"]["changes"]
    assert change["workload_id"] == "wl-shadow"                     # wl-before/-after were shipped earlier
    assert change["fields"]["recovery"]["before"]["action"] == "retry"
    assert change["fields"]["recovery"]["after"]["action"] == "drain_nodes"
    code, out, _ = _cli(cfg, capsys, "shadow", "--report")
    assert "CHANGED  wl-shadow#0" in out and "retry  ->  drain_nodes" in out, out
    # The live topic holds only live-catalog diagnoses for it.
    finals = read_finals(cfg, lambda out: "wl-shadow" in out, timeout=10)["wl-shadow"]
    assert {d.rules_version for d in finals} == {new}
