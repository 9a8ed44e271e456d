"""Faults are tests (issue 26): the pipeline on the real embedded broker, with an extractor killed
(its successor reads again from the commit) and the broker paused; every workload ends with exactly one final per
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


# A correlator killed or leaving is not here: after it, the correlator that takes its partitions
# over sometimes never fetches some of them (seen in 2 of 8 runs, see the issue 26 note), and a CI
# run must not depend on such a race. bench_stream_scale.py --kill/--join correlator measures it.
@pytest.mark.parametrize("scenario, happened", [
    (["--kill", "extractor"], "killed"),
    (["--pause-broker", "8"], "resumed"),
], ids=["kill-9-extractor", "broker-paused"])
def test_every_final_is_right_and_once_under_faults(scenario, happened):
    proc = subprocess.run([sys.executable, str(BENCH), "--workloads", "24", "--shippers", "2", "--timeout", "300",
                           "--json", *scenario], capture_output=True, text=True, timeout=1200)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert any(happened in e["event"] for e in report["scenario"]), report["scenario"]   # the fault did happen
    check = report["check"]
    assert report["finals"] >= report["workloads"] == 24
    assert {k: check[k] for k in MUST_BE_ZERO} == dict.fromkeys(MUST_BE_ZERO, 0), json.dumps(check)[:3000]
