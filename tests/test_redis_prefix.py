"""Every Redis key firstfault writes lives under FIRSTFAULT_REDIS_PREFIX, so two deployments can share a Redis.

A full run under a fresh key prefix: the embedded pipeline with the Redis diagnoses store and the
offset index (extractor and shipper), a bundle shipped through it, ``diagnoses`` and ``replay`` reading
with the index. Then every key of the Redis database is listed and compared with the list from
before the run. Real broker, real Redis; nothing faked."""
from __future__ import annotations

pytest_plugins = ["conftest_kafka"]

import argparse
import json
import os
import shutil
import time
import uuid
from pathlib import Path

import redis

from firstfault.connectors.shipper import ship
from firstfault.connectors.sinks.offset_index import OffsetIndex
from firstfault.connectors.sinks.redis_store import DiagnosisStore
from firstfault.streams import follow, replay
from stream_pipeline import pipeline_cfg, read_finals, running_pipeline

SAMPLE = Path(__file__).resolve().parents[1] / "samples" / "host-oom-killer"


def all_keys(r: redis.Redis) -> set[str]:
    return {k.decode("utf-8", "replace") for k in r.scan_iter(count=1000)}


def test_a_full_run_writes_keys_only_under_the_redis_prefix(kafka_bootstrap, redis_url, tmp_path, monkeypatch, capsys):
    tag = f"keys{uuid.uuid4().hex[:10]}"
    prefix = f"{tag}-store:"        # unlike the topic prefix ("<tag>."), so a key under the wrong one shows
    cfg = pipeline_cfg(kafka_bootstrap, tag).model_copy(update={"redis_url": redis_url, "redis_prefix": prefix,
                                                        "grace_cap_s": 4.0})
    # The bundle's workload carries the tag too: any key this run writes names the tag or starts with the prefix.
    bundle = tmp_path / "bundle"
    shutil.copytree(SAMPLE, bundle)
    workload = json.loads((bundle / "workload.json").read_text())
    workload["workload_id"] = wid = f"{tag}-job"
    (bundle / "workload.json").write_text(json.dumps(workload))

    r = redis.Redis.from_url(redis_url)
    before = all_keys(r)
    try:
        with running_pipeline(cfg, tmp_path) as cfg:
            ship(bundle, cfg)
            assert wid in read_finals(cfg, lambda out: wid in out, timeout=120)
            store = DiagnosisStore(redis_url, prefix)
            deadline = time.monotonic() + 30
            while store.latest(wid) is None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert store.latest(wid) is not None, "the correlator never stored the diagnosis in Redis"
            time.sleep(1.5)         # the extractor flushes its offset-index notes once a second

        # The readers, with the index: diagnoses --since, and a replay that diffs.
        monkeypatch.setenv("FIRSTFAULT_KAFKA_BOOTSTRAP", cfg.bootstrap)
        monkeypatch.setenv("FIRSTFAULT_TOPIC_PREFIX", cfg.prefix)
        monkeypatch.setenv("FIRSTFAULT_REDIS_URL", redis_url)
        monkeypatch.setenv("FIRSTFAULT_REDIS_PREFIX", prefix)
        monkeypatch.setenv("FIRSTFAULT_TIME_INDEX", "scan")
        parser = argparse.ArgumentParser(prog="firstfault")
        subs = parser.add_subparsers(dest="command", required=True)
        follow.register(subs)
        replay.register(subs)
        args = parser.parse_args(["diagnoses", "--since", "1h", "--idle", "1"])
        assert args.fn(args) == 0
        assert wid in capsys.readouterr().out
        args = parser.parse_args(["replay", "--since", "2026-11-06", "--until", "2026-11-07", "--diff", "--json",
                                  "--idle", "1"])
        assert args.fn(args) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["time_index"] == "scan" and report["diff"]["unchanged"] >= 1
        assert wid in {d["workload_id"] for d in report["diagnoses"]}

        new = all_keys(r) - before
        # What the run wrote: the store's documents and indexes, the offset index of both raw topics' writers.
        assert any(k.startswith(f"{prefix}doc:") for k in new) and any(k.startswith(f"{prefix}latest:") for k in new)
        assert f"{prefix}offset-index:{cfg.topic('raw')}" in new
        assert f"{prefix}offset-index:{cfg.topic('scheduler')}" in new
        index = OffsetIndex.for_config(cfg)
        assert index.entries(cfg.topic("raw")) and index.start_offsets(cfg.topic("raw"), 0)
        outside = sorted(k for k in new if not k.startswith(prefix))
        assert not [k for k in outside if tag in k], outside
        if not os.environ.get("REDIS_URL") and not redis_url.endswith(":6379/0"):
            assert not outside, outside          # a Redis of this session's own: nothing else writes to it
    finally:
        mine = [k for k in all_keys(r) if k.startswith(prefix) or tag in k]
        if mine:
            r.delete(*mine)
        r.close()
