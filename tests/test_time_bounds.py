"""An inherited time is a lower bound, on every surface (issue 25): marked ≥, never before its cause.

A line with no stamp of its own takes the time of the nearest stamped line above it: it was
written at or after it. The diagnosis says so per symptom group (``first_basis``), and the JSON
order, the text summary and the page place a group by the same rule (rules/order.py shown_at): a
time of its own stays where it is; an explained group whose bound lies before its cause sits at
the cause, after it. A line that states its own time (slurmstepd's "CANCELLED AT <time>", Slurm
src/slurmd/slurmstepd/req.c: error("*** %s ON %s CANCELLED AT %s DUE TO TIME LIMIT ***", entity,
step->node_name, time_str)) is placed by it, on the node it names, and is the stamped line the
unstamped lines below it inherit.
"""
from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import uuid

import pytest

from firstfault.rules.engine import analyze_path
from firstfault.rules.order import shown_at

from conftest import SAMPLES


def _summary(d) -> str:
    from firstfault.render import summary

    return summary(d)


def _timeline(text: str) -> list[str]:
    lines = text[text.index("Timeline"):].splitlines()[1:]
    return lines[:lines.index("")] if "" in lines else lines


def test_an_explained_bound_never_sorts_before_its_cause_and_is_marked():
    """samples/gpu-fell-off-bus-32node: "srun: error: gpu-017: tasks 128-135: Exited with exit code 1"
    (gpu-001.log:130) has no stamp; it follows a step line stamped 09:59:04.185, 56 s before the AER
    error that began it all. JSON, text: after the root, with its ≥; the stamped Xid is no bound."""
    d = analyze_path(SAMPLES / "gpu-fell-off-bus-32node").diagnosis
    by = {s.kind: s for s in d.symptoms}
    srun, xid = by["srun_task_exit"], by["xid"]
    assert (srun.first, srun.first_basis, srun.explained) == ("2026-11-02T09:59:04.185000Z", "inherited", True)
    assert xid.first_basis == "stamped" and by["watchdog_timeout"].first_basis == "stamped"
    root_at = d.root_cause.onset
    assert srun.first < root_at
    order = [s.kind for s in d.symptoms]
    assert order.index("xid") < order.index("srun_task_exit") < order.index("cuda_error")
    shown = [shown_at(s.first, s.first_basis, s.explained, root_at) for s in d.symptoms]
    assert all(t is not None and t >= root_at for t in shown) and shown == sorted(shown)
    text = _summary(d)
    tl = _timeline(text)
    assert "ROOT" in tl[0]
    [row] = [ln for ln in tl if "srun_task_exit" in ln]
    assert row.lstrip().startswith("≥2026-11-02 09:59:04.185") and tl.index(row) > 0
    assert not [ln for ln in tl if ("xid" in ln or "cuda_error" in ln) and "≥" in ln]      # points: no mark
    assert "≥2026-11-02 09:59:04.185 → " in text                      # the Symptoms table too
    doc = json.loads(d.to_json())
    assert {s["kind"]: s["first_basis"] for s in doc["symptoms"]}["srun_task_exit"] == "inherited"


def test_an_unexplained_bound_keeps_its_place_and_its_mark():
    """samples/walltime-timeout: "srun: Job step aborted: Waiting up to 32 seconds for job step to
    finish." (node-01.log:429) has no stamp and comes before the banner in its file: nothing says
    it came after the cause, so it stays at its bound, before the root, marked ≥ everywhere."""
    d = analyze_path(SAMPLES / "walltime-timeout").diagnosis
    assert d.root_cause.timestamp == "2026-11-03T14:00:07.000000Z" and d.root_cause.host == "node-01"
    aborted = {s.kind: s for s in d.symptoms}["srun_step_aborted"]
    assert (aborted.first_basis, aborted.explained) == ("inherited", False)
    tl = _timeline(_summary(d))
    assert tl[0].lstrip().startswith("≥2026-11-03 13:56:05.302") and "srun_step_aborted" in tl[0]
    assert "ROOT" in tl[1] and "≥" not in tl[1]
    assert [ln for ln in tl if "elastic_sigterm" in ln][0].lstrip().startswith("2026-")   # a point: no mark


def test_json_summary_and_page_put_the_groups_in_one_order():
    """One rule (rules/order.py shown_at) for every surface: the page's event rows and the summary's
    timeline list the symptom groups in the JSON's order, with the root where its time puts it."""
    from firstfault.connectors.api.ui_view import timeline

    for sample in sorted(p.name for p in SAMPLES.iterdir() if (p / "expected.json").is_file()):
        d = analyze_path(SAMPLES / sample).diagnosis
        rows = [r.kind for r in timeline(d)["rows"] if not r.is_root and not r.is_candidate]
        assert rows == [s.kind for s in d.symptoms], sample
        if d.root_cause is not None and d.symptoms:
            tl = _timeline(_summary(d))
            shown = [ln for ln in tl if "ROOT" not in ln]
            kinds = [s.kind for s in d.symptoms]
            assert [next(k for k in kinds if f" {k} ×" in ln) for ln in shown] == kinds[:len(shown)], sample


def test_shown_at_moves_only_an_explained_bound():
    cause = "2026-11-02T10:00:00.000000Z"
    early = "2026-11-02T09:59:04.185000Z"
    assert shown_at(early, "inherited", True, cause) == cause        # an echo: after its cause
    assert shown_at(early, "stamped", True, cause) == early          # a point is a point
    assert shown_at(early, "inherited", False, cause) == early       # nothing says it came after
    assert shown_at(None, None, True, cause) == cause                 # an untimed echo
    assert shown_at(early, "inherited", True, None) == early          # no cause to follow
    later = "2026-11-02T10:00:05.000000Z"
    assert shown_at(later, "inherited", True, cause) == later


# Real lines: the banner as req.c formats it (marbl/canu#1052 "*** JOB 3884617 ON node023 CANCELLED AT
# 2018-08-19T16:30:21 DUE TO TIME LIMIT ***"), srun's task exits (src/srun/launch.c; "srun: error: nid01934:
# tasks 2,4-5,7: Terminated" in the catalog), srun's abort wait (src/api/step_launch.c).
SLURM_OUT = """\
0: [2018-08-19 16:25:01,100] INFO step 100 loss 2.1
8: [2018-08-19 16:25:02,100] INFO step 100 loss 2.2
srun: Job step aborted: Waiting up to 32 seconds for job step to finish.
slurmstepd: error: *** STEP 3884617.0 ON node023 CANCELLED AT 2018-08-19T16:30:21 DUE TO TIME LIMIT ***
slurmstepd: error: *** STEP 3884617.0 ON node024 CANCELLED AT 2018-08-19T16:30:22 DUE TO TIME LIMIT ***
srun: error: node023: tasks 0-7: Terminated
srun: error: node024: tasks 8-15: Terminated
"""


def test_cancelled_at_is_the_line_s_time_and_on_its_host_and_a_stamp_for_the_lines_below(tmp_path):
    p = tmp_path / "slurm-3884617.out"
    p.write_text(SLURM_OUT)
    run = subprocess.run([sys.executable, "-m", "firstfault", "analyze", str(p), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    d = json.loads(run.stdout)
    rc = d["root_cause"]
    assert (d["sub_domain"], rc["host"], rc["timestamp"], rc["time_basis"]) == \
        ("walltime_exceeded", "node023", "2018-08-19T16:30:21.000000Z", "stamped")
    assert rc["message"].startswith("Slurm cancelled STEP 3884617 on node023 at 2018-08-19T16:30:21")
    by = {s["kind"]: s for s in d["symptoms"]}
    # The task exits below the banners inherit the nearer banner's own time (not the step line's).
    assert (by["srun_task_exit"]["first"], by["srun_task_exit"]["first_basis"], by["srun_task_exit"]["explained"]) \
        == ("2018-08-19T16:30:22.000000Z", "inherited", True)
    # The abort wait is above them: its bound is the step line's, and it keeps its mark.
    assert (by["srun_step_aborted"]["first"], by["srun_step_aborted"]["first_basis"]) == \
        ("2018-08-19T16:25:02.100000Z", "inherited")


def test_what_must_not_give_a_time_or_a_host(tmp_path):
    """A banner whose node is elided ("ON ...", jean-zay's posted log) names no host (never "?" nor
    "..."); an old plain banner gives its time; a date a message mentions in another shape is no stamp."""
    p = tmp_path / "slurm-494583.out"
    p.write_text("slurmstepd: error: *** STEP 494583.0 ON ... CANCELLED AT 2024-04-20T09:09:37 DUE TO TIME LIMIT ***\n"
                 "srun: error: jean-zay-a101: task 0: Terminated\n")
    d = analyze_path(p).diagnosis
    assert d.root_cause.host != "..." and "?" not in d.root_cause.message
    assert d.root_cause.timestamp == "2024-04-20T09:09:37.000000Z"
    p = tmp_path / "slurm-1479012.out"
    p.write_text("slurmstepd: *** JOB 1479012 CANCELLED AT 2015-02-04T06:33:25 *** on sh-2-3\n")
    d = analyze_path(p).diagnosis
    assert d.root_cause.timestamp == "2015-02-04T06:33:25.000000Z" and d.root_cause.time_basis == "stamped"
    p = tmp_path / "train.log"
    p.write_text("echo: job CANCELLED AT 10:00 by the owner\nsrun: error: node023: tasks 0-7: Terminated\n")
    d = analyze_path(p).diagnosis
    assert all(s.first is None and s.first_basis is None for s in d.symptoms)


# ---------------------------------------------------------------- the page, in headless Chromium

@contextlib.contextmanager
def serve_pages(tmp_path, diagnoses):
    """`firstfault serve` with ``diagnoses`` stored; yields pages(workload_id) -> (dom, html)."""
    from firstfault.connectors.sinks.redis_store import DiagnosisStore
    from served import served
    from test_service_ui import CHROMIUM, REDIS_URL, Elements, chromium

    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium is not installed")
    prefix = f"fftest:{uuid.uuid4().hex}:"
    store = DiagnosisStore(REDIS_URL, prefix=prefix)
    for d in diagnoses:
        store.save(d)

    def pages(wid: str):
        run = chromium(f"{base}/ui/diagnoses/{wid}", tmp_path, "--dump-dom")
        assert run.returncode == 0, run.stderr[-2000:]
        dom = Elements()
        dom.feed(run.stdout)
        assert dom.root_attrs.get("data-ui-ready") == "true", "the page script did not run"
        return dom, run.stdout

    with served(REDIS_URL, prefix) as (base, _):
        yield pages


def test_the_page_orders_and_marks_bounds_as_the_summary_does(tmp_path):
    """The events table: the 32-node sample's srun_task_exit row after the root, its time and delta
    marked ≥; the walltime sample's srun_step_aborted marked ≥ in the table and the symptoms list."""
    bus = analyze_path(SAMPLES / "gpu-fell-off-bus-32node").diagnosis
    wall = analyze_path(SAMPLES / "walltime-timeout").diagnosis
    with serve_pages(tmp_path, [bus, wall]) as pages:
        dom, html = pages(bus.workload_id)
        rows = [k for k in dom.by_id if k.startswith("ev-")]
        srun = next(k for k in rows if "srun_task_exit" in dom.by_id[k]["text"])
        assert rows.index("ev-root") < rows.index(srun)
        assert dom.by_id[srun]["text"].lstrip().startswith("≥") and "lower bound" in dom.by_id[srun]["text"]
        xid = next(k for k in rows if k != "ev-root" and " xid" in dom.by_id[k]["text"])
        assert "≥" not in dom.by_id[xid]["text"]
        dom, html = pages(wall.workload_id)
        rows = [k for k in dom.by_id if k.startswith("ev-")]
        aborted = next(k for k in rows if "srun_step_aborted" in dom.by_id[k]["text"])
        assert dom.by_id[aborted]["text"].lstrip().startswith("≥")
        assert re.search(r"<td>≥ [^<]*13:56:05", html), "the symptoms list marks the bound too"
