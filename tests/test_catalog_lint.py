"""`rules lint` catches what `rules test` would not (issue 13): a condition on a kind no
pattern produces (the rule can never fire), and an output template naming a field no
event of its kinds carries (it would print '?'). Each check: a rule that fails it, and
the built-in catalog that passes it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from firstfault.rules import diagnose, telemetry
from firstfault.rules.catalog import ENGINE_KINDS, lint_catalog

LINE = "NCCL WARN NET/IB : Got completion with error 12, opcode 0, len 0, vendor err 129"


def _overlay(tmp_path: Path, when: dict, output: str) -> Path:
    root = tmp_path / "rules" / "early"
    root.mkdir(parents=True)
    rule = {"id": "early.test.mistake", "title": "a deliberate mistake", "description": "for lint",
            "priority": 1, "status": "test", "when": when, "action": "tag",
            "tag": {"role": "symptom"}, "output": output,
            "examples": {"fires": [{"source": "app", "line": LINE}], "quiet": [{"source": "app", "line": "x"}]}}
    (root / "mistakes.yaml").write_text(yaml.safe_dump({"rules": [rule]}, sort_keys=False))
    return tmp_path / "rules"


def _problems(overlay: Path) -> list[str]:
    return [str(e) for e in lint_catalog(overlay) if "early.test.mistake" in str(e)]


def test_unknown_kind_in_when_is_a_lint_error(tmp_path):
    problems = _problems(_overlay(tmp_path, {"kind": "nccl_ib_eror"}, "on {host}"))
    assert problems == ["early/mistakes.yaml: early.test.mistake: when.kind names 'nccl_ib_eror', which no "
                        "pattern produces (the rule can never fire)"]


def test_unknown_output_field_is_a_lint_error(tmp_path):
    problems = _problems(_overlay(tmp_path, {"kind": "nccl_ib_error"}, "status {status} on {host} port {prot}"))
    assert len(problems) == 1 and "output names prot" in problems[0] and "nccl_ib_error" in problems[0]


def test_known_fields_and_kinds_pass(tmp_path):
    assert _problems(_overlay(tmp_path, {"kind": "nccl_ib_error"}, "status {status} on {host} rank {rank}")) == []


def test_cli_lint_fails_naming_file_and_rule(tmp_path):
    overlay = _overlay(tmp_path, {"kind": "no_such_kind"}, "on {host}")
    done = subprocess.run([sys.executable, "-m", "firstfault", "rules", "lint", "--rules", str(overlay)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "early/mistakes.yaml: early.test.mistake: when.kind names 'no_such_kind'" in done.stdout


def test_engine_kinds_are_the_engines():
    # The kinds lint accepts without a pattern are the ones the engine really makes.
    from firstfault.rules.engine import analyze_files
    from firstfault.schemas import WorkloadRecord

    wl = WorkloadRecord.model_validate({"workload_id": "k", "attempt": 0, "scheduler": "slurm", "nodes": ["n1"],
                                        "start_time": "2026-11-03T10:00:00Z", "end_time": "2026-11-03T10:30:00Z",
                                        "state": "FAILED"})
    assert telemetry.EVENT_KIND in ENGINE_KINDS
    assert diagnose.scheduler_event(wl).kind in ENGINE_KINDS
    damaged = analyze_files(wl, {"logs/syslog/n1.log": b"NVRM: Xid (PCI:0000:1b:00): \xff 79\n"}).diagnosis
    assert any(s.rule_id == "final.unparsed" for s in damaged.evidence)     # an 'unparsed' event was made


def test_rules_test_shows_what_a_non_firing_example_produced(tmp_path):
    overlay = _overlay(tmp_path, {"kind": "nccl_ib_error", "fields.status": 99}, "on {host}")
    done = subprocess.run([sys.executable, "-m", "firstfault", "rules", "test", "--rules", str(overlay),
                           "--only", "early.test.mistake"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("FAIL early.test.mistake"))
    assert "did not fire: it produced kind=nccl_ib_error" in line and "status=12" in line, line
