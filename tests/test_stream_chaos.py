"""Faults are tests (issue 26): the pipeline on the real embedded broker with the broker paused
(sessions time out, members rejoin, batches are read again); every workload ends with exactly one final per
revision, equal to what ``analyze`` says of the same bundle, and no final drains or excludes a
node the reference does not.

Each run is ``bench/bench_stream_scale.py`` on a few dozen isolated workloads (copies of the
samples with their own hosts), so the scenario is the one the benchmark measures at scale.
Nothing here depends on how fast the machine is: the scenarios fire on the share of lines
shipped, and the runs wait for the finals (up to a generous bound), they do not time them.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_stream_scale.py"
MUST_BE_ZERO = ("missing", "duplicated", "duplicate_records", "conflicting", "wrong", "harmful",
                "first_wrong_verdict")


# Not here yet, because a CI run must not depend on a race (issue 26 note, bench_stream_scale.py
# reproduces both): a correlator killed or leaving (its successor sometimes never fetches some of
# the partitions it takes over), and an extractor killed (its successor re-reads from the commit
# without the lines above, and a line's event can then take another signature: 1 symptom in 1 run).
@pytest.mark.parametrize("scenario, happened", [
    (["--pause-broker", "8"], "resumed"),
], ids=["broker-paused"])
def test_every_final_is_right_and_once_under_faults(scenario, happened):
    proc = subprocess.run([sys.executable, str(BENCH), "--workloads", "24", "--shippers", "2", "--timeout", "300",
                           "--json", *scenario], capture_output=True, text=True, timeout=1200)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert any(happened in e["event"] for e in report["scenario"]), report["scenario"]   # the fault did happen
    check = report["check"]
    assert report["finals"] >= report["workloads"] == 24
    assert {k: check[k] for k in MUST_BE_ZERO} == dict.fromkeys(MUST_BE_ZERO, 0), json.dumps(check)[:3000]
