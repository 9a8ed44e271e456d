"""The `curl` examples of the README and docs/commands.md, run as written against a real
`firstfault serve` (issue 25: the REST API did not take what the upload form takes)."""
from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest
from served import served

from conftest import SAMPLES

ROOT = Path(__file__).resolve().parents[1]
REDIS_URL = "redis://127.0.0.1:6379/0"
DOC_BASE = "http://127.0.0.1:8080"          # the address the examples name: serve's default
LOG = (b"step 100 loss 2.1\n"
       b"slurmstepd: error: *** JOB 3884617 ON node023 CANCELLED AT 2018-08-19T16:30:21 DUE TO TIME LIMIT ***\n")


def curl_examples(doc: Path) -> list[str]:
    """Every `curl` command in the fenced blocks of ``doc``, continuation lines joined."""
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", doc.read_text(encoding="utf-8"), re.S | re.M)
    commands = []
    for block in blocks:
        for cmd in re.sub(r"\\\n\s*", " ", block).splitlines():
            if cmd.lstrip().startswith("curl "):
                commands.append(cmd.strip())
    return commands


@pytest.fixture
def serve():
    prefix = f"fftest:{uuid.uuid4().hex}:"
    with served(REDIS_URL, prefix) as (base, _):
        yield base


def _inputs(where: Path, commands: list[str]) -> None:
    """The files the examples name (`@file`): a log for a log's name, the worked example for a bundle."""
    for name in {m for cmd in commands for m in re.findall(r"@([\w./-]+)", cmd)}:
        if name.endswith((".tar.gz", ".tgz")):
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w:gz") as tf:
                tf.add(SAMPLES / "worked-example", arcname="worked-example")
            (where / name).write_bytes(buf.getvalue())
        else:
            (where / name).write_bytes(LOG)


def test_the_documented_curl_examples_return_the_diagnosis(serve, tmp_path):
    readme, commands_doc = curl_examples(ROOT / "README.md"), curl_examples(ROOT / "docs" / "commands.md")
    # One for a bare log, one for a bundle, and the form's way, in both places the API is described.
    for examples in (readme, commands_doc):
        assert any("text/plain" in c for c in examples), examples
        assert any("application/gzip" in c for c in examples), examples
        assert any(" -F " in c for c in examples), examples
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    _inputs(tmp_path, readme + commands_doc)
    for cmd in readme + commands_doc:
        assert DOC_BASE in cmd, cmd
        argv = shlex.split(cmd.replace(DOC_BASE, serve))
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, timeout=120)
        assert done.returncode == 0, (cmd, done.stderr)
        d = json.loads(done.stdout)
        assert d["status"] == "attributed", (cmd, d)
        want = ("slurm-4471823", "nvlink_signal_integrity") if "gzip" in cmd else (None, "walltime_exceeded")
        assert d["sub_domain"] == want[1] and (want[0] is None or d["workload_id"] == want[0]), (cmd, d)
