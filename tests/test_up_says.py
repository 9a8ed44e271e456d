"""What `firstfault up` and the commands beside it say on the terminal while the stream works (issue 25):
a shipped job is never silent while the correlator waits for it, a replay says what it is reading,
a rule reload and Ctrl-C each get one line on `up`'s terminal (their details stay in up.log).

Everything is real: `up` starts the embedded broker and its workers; the other commands run as a user
runs them, as subprocesses that find `up` through its run file."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from firstfault.rules.catalog import BUILTIN_CATALOG
from firstfault.rules.engine import analyze_path
from stream_pipeline import start_up

ROOT = Path(__file__).resolve().parents[1]
OOM = ROOT / "samples" / "host-oom-killer"
OOM_ROW = "cuda_oom:                {recovery: notify_owner"


def cli(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "firstfault", *argv], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=180)


def wait_for(lines: list[str], pattern: str, proc: subprocess.Popen, within_s: float = 120) -> re.Match:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        for line in list(lines):
            if m := re.search(pattern, line):
                return m
        assert proc.poll() is None, "".join(lines)
        time.sleep(0.2)
    raise AssertionError(f"no line matching {pattern!r} in {''.join(lines)}")


def test_up_and_its_neighbours_say_what_they_are_waiting_for(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTFAULT_")}
    env["FIRSTFAULT_RUN_FILE"] = str(tmp_path / "run" / "up.json")
    tag = f"s{uuid.uuid4().hex[:8]}"
    # Only `up` has the long grace: `diagnoses` must learn it from the run file, not from its own variables.
    up_env = {**env, "FIRSTFAULT_TOPIC_PREFIX": f"{tag}.", "FIRSTFAULT_APP_ID": f"{tag}-correlator",
              "FIRSTFAULT_EXTRACTOR_GROUP": f"{tag}-extractor", "FIRSTFAULT_GRACE_S": "900",
              "FIRSTFAULT_GRACE_CAP_S": "900"}
    proc, text, err_lines = start_up(up_env, ROOT)
    out_lines = text.splitlines(keepends=True)
    threading.Thread(target=lambda: out_lines.extend(proc.stdout), daemon=True).start()
    try:
        assert text.splitlines()[-1:] and text.splitlines()[-1].startswith("ready"), text + "".join(err_lines)

        # Right after `ship`: no diagnosis yet, and `diagnoses` says why and for how long.
        shipped = cli(["ship", str(OOM)], env, tmp_path)
        assert shipped.returncode == 0, shipped.stderr
        assert "its final diagnosis comes about 900 s after the end (the grace period): firstfault diagnoses" \
            in shipped.stdout, shipped.stdout
        wid = analyze_path(OOM).diagnosis.workload_id
        listed = cli(["diagnoses", "--idle", "1"], env, tmp_path)
        assert listed.returncode == 0 and listed.stdout == "", listed.stderr
        assert f"no diagnoses on {tag}.diagnoses yet" in listed.stderr
        assert re.search(rf"^waiting  {wid}#0  ended \d+ s ago; final diagnosis in about 1[45] min \(the "
                         r"correlator's grace period for late lines, FIRSTFAULT_GRACE_CAP_S=900\)$",
                         listed.stderr, re.M), listed.stderr

        # A replay says on stderr what it reads and why it waits; --json keeps stderr for errors only.
        window = ["--since", "2026-10-01", "--until", "2026-12-31", "--idle", "1"]
        replayed = cli(["replay", *window], env, tmp_path)
        assert replayed.returncode == 0, replayed.stderr
        steps = replayed.stderr.splitlines()
        assert steps and steps[0].startswith(f"replay: reading {tag}.scheduler for the workload attempts that ended "), steps
        assert "nothing new came for 1 s, --idle" in steps[0]
        assert any(re.match(rf"replay: 1 workload attempt to diagnose again: reading their lines on {tag}\.raw", s)
                   for s in steps), steps
        assert any(re.match(r"replay: [\d,]+ raw records read; 1 diagnosed with rules sha256:", s) for s in steps)
        assert all(re.search(r"\[\d+\.\d s\]$", s) for s in steps), steps
        assert "replayed 1 workload attempt ending" in replayed.stdout
        as_json = cli(["replay", *window, "--json"], env, tmp_path)
        assert as_json.returncode == 0 and as_json.stderr == "", as_json.stderr
        assert json.loads(as_json.stdout)["workloads"] == 1

        # A new catalog goes live: one line on up's terminal, however many workers load it.
        overlay = tmp_path / "rules"
        (overlay / "data").mkdir(parents=True)
        taxonomy = (BUILTIN_CATALOG / "data" / "taxonomy.yaml").read_text()
        (overlay / "data" / "taxonomy.yaml").write_text(
            taxonomy.replace(OOM_ROW, "cuda_oom:                {recovery: retry"))
        published = cli(["rules", "publish", str(overlay), "--author", "test", "-m", "oom: retry", "--json"],
                        env, tmp_path)
        assert published.returncode == 0, published.stderr
        new = json.loads(published.stdout)["rules_version"]
        m = wait_for(out_lines, rf"^rules: the workers now diagnose with {re.escape(new)} \(was (sha256:\S+); "
                                r"test: oom: retry\)$", proc)
        assert m[1] != new
        time.sleep(3)                                # every worker has had the time to say it too
        assert len([line for line in out_lines if line.startswith("rules: ")]) == 1, "".join(out_lines)

        # Ctrl-C: what it does, on the terminal, and when it is done.
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    time.sleep(0.5)                                  # the reader thread takes the last lines
    said = "".join(out_lines)
    assert re.search(r"^stopping: \d+ workers one at a time, then the broker \(up to 10 s a worker; Ctrl-C again "
                     r"to kill them\)$", said, re.M), said
    assert re.search(r"^stopped in \d+\.\d s$", said, re.M), said
