"""Shared fixtures. Paths and small helpers only; no fakes of the broker or Redis."""
from __future__ import annotations

import contextlib
import functools
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from firstfault.rules.catalog import load_catalog
from firstfault.rules.engine import analyze_files
from firstfault.rules.ruletest import extract_one

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"


@pytest.fixture(autouse=True)
def _no_terminal_size(monkeypatch):
    """Tests see the output a program writes to a pipe, whoever runs them: a terminal's $COLUMNS (or the
    COLUMNS=80 that pytest-xdist sets in its workers) would cut the operator's tables to its width."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


def sample_dirs() -> list[Path]:
    return sorted(p for p in SAMPLES.iterdir() if (p / "workload.json").is_file())


@pytest.fixture
def make_bundle(tmp_path):
    """Write a bundle directory from a workload dict and {path: text|bytes}."""

    def make(workload: dict, files: dict[str, str | bytes], name: str = "bundle") -> Path:
        root = tmp_path / name
        root.mkdir()
        (root / "workload.json").write_text(json.dumps(workload))
        for rel, content in files.items():
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(content if isinstance(content, bytes) else content.encode())
        return root

    return make


BASE_WORKLOAD = {
    "workload_id": "slurm-100", "attempt": 0, "scheduler": "slurm", "state": "FAILED", "exit_code": "1:0",
    "start_time": "2026-11-02T09:58:00Z", "end_time": "2026-11-02T10:21:14Z",
    "nodes": ["node-01", "node-02", "node-03", "node-04"], "gpus_per_node": 8,
}


def diag(files: dict[str, str], **wl):
    """The diagnosis of ``files`` (bundle path -> text) under BASE_WORKLOAD with ``wl``'s fields changed."""
    return analyze_files({**BASE_WORKLOAD, **wl}, files).diagnosis


@functools.lru_cache(maxsize=1)
def catalog():
    """The shipped catalog, loaded once for the modules that extract single lines."""
    return load_catalog()


def pattern_of(line: str, source: str = "app") -> str | None:
    """The id of the catalog pattern that reads ``line`` (None: no pattern does)."""
    ev = extract_one(catalog(), line, source)
    return ev.pattern if ev is not None else None


@contextlib.contextmanager
def redis_key_prefix(url: str, label: str) -> Iterator[str]:
    """A key prefix of this test's own on the real Redis at ``url``; its keys are deleted afterwards."""
    import redis

    p = f"fftest-{label}-{uuid.uuid4().hex[:12]}:"
    try:
        yield p
    finally:
        r = redis.Redis.from_url(url)
        keys = list(r.scan_iter(match=f"{p}*", count=1000))
        if keys:
            r.delete(*keys)
        r.close()
