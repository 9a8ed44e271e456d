"""`rules lint` catches what `rules test` would not (issue 13): a condition on a kind no
pattern produces (the rule can never fire), and an output template naming a field no
event of its kinds carries (it would print '?'). Each check: a rule that fails it, and
the built-in catalog that passes it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
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


# ---------------------------------------------------------------- issue 25: what a rule author gets wrong

def _write(root: Path, rel: str, doc: dict) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return root


def _early_rule(**over) -> dict:
    rule = {"id": "early.test.mistake", "title": "a deliberate mistake", "description": "for lint",
            "priority": 1, "status": "test", "when": {"kind": "nccl_ib_error"}, "action": "tag",
            "tag": {"role": "root", "domain": "network", "sub_domain": "ib_link_error"},
            "output": "IB completion error {status} on {host}",
            "examples": {"fires": [{"source": "app", "line": LINE}], "quiet": [{"source": "app", "line": "x"}]}}
    return {**rule, **over}


def _lint(root: Path, rule_id: str | None = "early.test.mistake") -> list[str]:
    return [str(e) for e in lint_catalog(root) if rule_id is None or rule_id in str(e)]


def test_a_root_tags_next_step_is_checked_like_output(tmp_path):
    """The trial: `{dimmm}` in a new rule's next_step printed 'on ?' and lint passed."""
    tag = {"role": "root", "domain": "network", "sub_domain": "ib_link_error",
           "next_step": "reseat the cable[[ of {hca}]] and replace the DIMM on {dimmm}"}
    root = _write(tmp_path, "early/mine.yaml", {"rules": [_early_rule(tag=tag)]})
    assert _lint(root) == ["early/mine.yaml: early.test.mistake: next_step names dimmm, which no event of kind "
                           "nccl_ib_error carries (it would print '?')"]
    tag["next_step"] = "reseat the cable[[ of {hca}]] on {host}"
    assert _lint(_write(tmp_path, "early/mine.yaml", {"rules": [_early_rule(tag=tag)]})) == []


def test_a_rule_that_names_its_pattern_not_its_kind_is_checked_too(tmp_path):
    rule = _early_rule(when={"pattern": "nccl.ib_completion_v1"}, output="IB error {statuss}")
    assert _lint(_write(tmp_path, "early/mine.yaml", {"rules": [rule]})) == [
        "early/mine.yaml: early.test.mistake: output names statuss, which no event of kind nccl_ib_error "
        "carries (it would print '?')"]


def test_a_rule_on_the_schedulers_end_record_is_checked_against_its_fields(tmp_path):
    rule = _early_rule(when={"kind": "scheduler_end"}, output="the job ended ({stat})",
                       examples={"fires": [{"source": "scheduler", "line": "x"}], "quiet": ["y"]})
    assert _lint(_write(tmp_path, "early/mine.yaml", {"rules": [rule]})) == [
        "early/mine.yaml: early.test.mistake: output names stat, which no event of kind scheduler_end "
        "carries (it would print '?')"]


def test_engine_fields_are_the_engines():
    # The fields lint knows for engine-made kinds are the ones the engine really sets.
    from firstfault.rules.catalog import ENGINE_FIELDS
    from firstfault.rules.ruletest import metrics_events
    from firstfault.schemas import WorkloadRecord

    wl = WorkloadRecord.model_validate({"workload_id": "k", "attempt": 0, "scheduler": "slurm", "nodes": ["n1"],
                                        "start_time": "2026-11-03T10:00:00Z", "end_time": "2026-11-03T10:30:00Z",
                                        "state": "FAILED", "exit_code": 1})
    assert set(diagnose.scheduler_event(wl).fields) <= ENGINE_FIELDS["scheduler_end"]
    samples = ('{"gpu": 3, "host": "node-02", "name": "DCGM_FI_DEV_XID_ERRORS", "ts": "2026-11-02T09:55:00Z", "value": 0.0}\n'
               '{"gpu": 3, "host": "node-02", "name": "DCGM_FI_DEV_XID_ERRORS", "ts": "2026-11-02T10:03:30Z", "value": 79.0}\n'
               '{"gpu": 3, "host": "node-02", "name": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ts": "2026-11-02T09:55:00Z", "value": 0.0}\n'
               '{"gpu": 3, "host": "node-02", "name": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ts": "2026-11-02T10:03:30Z", "value": 2.0}\n'
               'not json')
    made = metrics_events(samples)
    assert {e.kind for e in made} == {telemetry.EVENT_KIND, "unparsed"}
    for ev in made:
        assert set(ev.fields) <= ENGINE_FIELDS[ev.kind], ev.kind


def test_a_final_rule_condition_on_a_field_nothing_carries_is_an_error(tmp_path):
    rule = {"id": "final.test.mistake", "title": "a deliberate mistake", "description": "for lint",
            "priority": 1, "source": {"kind": "nccl_ib_error", "role": "root"},
            "target": {"kind": "watchdog_timeout", "fields.timeout_mss": {"exists": True}},
            "equal": ["fields.hcaa"], "join": "same_host", "window_s": 60,
            "examples": {"fires": [{"files": {"logs/app/node-01.log": LINE}}],
                         "quiet": [{"files": {"logs/app/node-01.log": "x"}}]}}
    root = _write(tmp_path, "final/mine.yaml", {"explains": [rule]})
    assert sorted(_lint(root, "final.test.mistake")) == [
        "final/mine.yaml: final.test.mistake: equal names fields.hcaa, which no event of kind nccl_ib_error "
        "carries (the rule can never fire)",
        "final/mine.yaml: final.test.mistake: target.fields.timeout_mss names a field no event of kind "
        "watchdog_timeout carries (the term can never hold)"]


def test_unknown_keys_are_errors_naming_file_and_key_with_a_suggestion(tmp_path):
    pattern = {"id": "test.mine", "title": "mine", "description": "mine", "status": "test", "sources": ["syslog"],
               "anchors": ["mydev"], "regex": r"mydev (?P<code>\d+) failed", "kind": "mydev_failed",
               "ignorecase": True, "priority": 1,
               "examples": {"match": [{"line": "mydev 7 failed", "feilds": {"code": 7}}], "no_match": ["mydev ok"]}}
    _write(tmp_path, "extract/mine.yaml", {"patterns": [pattern]})
    _write(tmp_path, "extract/typo.yaml", {"pattern": []})
    tag = {"role": "root", "domain": "network", "sub_domain": "ib_link_error", "nextstep": "reseat it",
           "output": "a sentence"}
    rule = _early_rule(tag=tag, when={"kind": "nccl_ib_error", "fields.status": {"regex": "1.", "flags": "i"}})
    rule["outptu"] = rule.pop("output")
    _write(tmp_path, "early/mine.yaml", {"rules": [rule]})
    final = {"id": "final.test.typo", "title": "t", "description": "d", "priority": 1,
             "source": {"kind": "nccl_ib_error"}, "target": {"kind": "watchdog_timeout"}, "join": "same_host",
             "windows_s": 60, "examples": {"fires": [{"files": {}}], "quiet": [{"files": {}, "workloads": {}}]}}
    _write(tmp_path, "final/mine.yaml", {"explains": [final]})
    _write(tmp_path, "mine.yaml", {"rules": [rule]})
    got = _lint(tmp_path, None)
    for want in [
        "extract/mine.yaml: test.mine: unknown key 'ignorecase' (did you mean 'ignore_case'?)",
        "extract/mine.yaml: test.mine: examples.match[1]: unknown key 'feilds' (did you mean 'fields'?)",
        "extract/typo.yaml: unknown key 'pattern' (did you mean 'patterns'?)",
        "early/mine.yaml: early.test.mistake: unknown key 'outptu' (did you mean 'output'?)",
        "early/mine.yaml: early.test.mistake: tag: unknown key 'nextstep' (did you mean 'next_step'?)",
        "early/mine.yaml: early.test.mistake: tag: unknown key 'output' (known: domain, fields, next_step, "
        "role, strength, sub_domain)",
        "early/mine.yaml: early.test.mistake: when.fields.status: unknown key 'flags' (known: exists, not, regex)",
        "final/mine.yaml: final.test.typo: unknown key 'windows_s' (did you mean 'window_s'?)",
        "final/mine.yaml: final.test.typo: examples.quiet[1]: unknown key 'workloads' (did you mean 'workload'?)",
        "mine.yaml: not read: rule files go under extract/, early/ or final/ (decoder tables under data/)",
    ]:
        assert want in got, (want, got)


def test_cli_lint_and_test_refuse_an_unknown_key(tmp_path):
    rule = _early_rule()
    rule["outptu"] = rule.pop("output")
    root = _write(tmp_path, "early/mine.yaml", {"rules": [rule]})
    lint = subprocess.run([sys.executable, "-m", "firstfault", "rules", "lint", "--rules", str(root)],
                          capture_output=True, text=True, timeout=120)
    assert lint.returncode == 1
    assert "early/mine.yaml: early.test.mistake: unknown key 'outptu' (did you mean 'output'?)" in lint.stdout
    test = subprocess.run([sys.executable, "-m", "firstfault", "rules", "test", "--rules", str(root)],
                          capture_output=True, text=True, timeout=300)
    assert test.returncode == 2 and "unknown key 'outptu'" in test.stderr and len(test.stderr.splitlines()) == 1


def test_a_taxonomy_sentence_is_not_a_template(tmp_path):
    from firstfault.rules.catalog import BUILTIN_CATALOG

    text = (BUILTIN_CATALOG / "data" / "taxonomy.yaml").read_text()
    sentence = "drain the node, reseat or replace the GPU"
    assert sentence in text
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "taxonomy.yaml").write_text(
        text.replace(sentence, "drain {host}, reseat or replace the GPU").replace(
            'summary: "GPU fell off the PCIe bus"', 'summary: "GPU fell off the PCIe bus", sumary: "x"'))
    got = _lint(tmp_path, "taxonomy")
    assert got == ["data/taxonomy.yaml: taxonomy gpu/gpu_fell_off_bus: unknown key 'sumary' (did you mean 'summary'?)",
                   "data/taxonomy.yaml: taxonomy gpu/gpu_fell_off_bus: next_step names {host}, but taxonomy "
                   "sentences are printed as written (a root tag's next_step is a template)"], got


def test_rules_test_shows_the_line_as_the_pattern_sees_it(tmp_path):
    # The author's regex includes "kernel: ", which the syslog prefix takes away before the pattern looks.
    pattern = {"id": "test.mine", "title": "mine", "description": "mine", "status": "test", "sources": ["syslog"],
               "anchors": ["mydev"], "regex": r"^kernel: mydev (?P<code>\d+) failed", "kind": "mydev_failed",
               "priority": 1,
               "examples": {"match": ["Nov  2 10:03:11 node-02 kernel: mydev 7 failed"],
                            "no_match": ["Nov  2 10:03:11 node-02 kernel: kernel: mydev 8 failed"]}}
    root = _write(tmp_path, "extract/mine.yaml", {"patterns": [pattern]})
    done = subprocess.run([sys.executable, "-m", "firstfault", "rules", "test", "--rules", str(root),
                           "--only", "test.mine"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    fails = [ln for ln in done.stdout.splitlines() if ln.startswith("FAIL test.mine")]
    assert fails == [
        "FAIL test.mine (extract/mine.yaml): match example 1: no event; the pattern sees 'mydev 7 failed' "
        "(prefixes removed: 'Nov  2 10:03:11 node-02 kernel: ')",
        "FAIL test.mine (extract/mine.yaml): no_match example 1: the pattern matched it; the pattern sees "
        "'kernel: mydev 8 failed' (prefixes removed: 'Nov  2 10:03:11 node-02 kernel: ')"], done.stdout


XID79 = "Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def test_rules_test_fails_a_shown_sentence_that_prints_a_question_mark(tmp_path):
    """Fields a decoder adds are not known statically (lint leaves decoded kinds alone); the
    rule's own examples show them: a next_step naming a field the event lacks prints '?'."""
    from firstfault.rules.engine import analyze_files

    tag = {"role": "root", "domain": "gpu", "sub_domain": "gpu_fell_off_bus",
           "next_step": "reseat the GPU[[ of {host}]] and replace the DIMM on {dimmm}"}
    rule = _early_rule(id="early.test.xid", when={"kind": "xid"}, tag=tag, output=None,
                       examples={"fires": [{"source": "syslog", "line": XID79}], "quiet": ["x"]})
    del rule["output"]
    root = _write(tmp_path, "early/mine.yaml", {"rules": [rule]})
    assert _lint(root, "early.test.xid") == []
    wl = {"workload_id": "w", "attempt": 0, "scheduler": "slurm", "nodes": ["node-02"], "state": "FAILED",
          "start_time": "2026-11-02T09:58:00Z", "end_time": "2026-11-02T10:21:14Z"}
    shown = analyze_files(wl, {"logs/syslog/node-02.log": XID79}, rules=root).diagnosis.recovery.next_step
    assert shown.startswith("reseat the GPU of node-02 and replace the DIMM on ?"), shown     # the trial's "on ?"
    done = subprocess.run([sys.executable, "-m", "firstfault", "rules", "test", "--rules", str(root),
                           "--only", "early.test.xid"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert ("FAIL early.test.xid (early/mine.yaml): fires example 1: next_step prints '?' for dimmm on this line "
            "(put it in a [[segment]], which is left out when a field it names is unknown)") in done.stdout, done.stdout


def _limited() -> None:            # in the child: at most 2 GiB, so the old way ends in MemoryError, not in swap
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.parametrize("make, words", [
    (lambda f: f.symlink_to("/dev/zero"), "is a device, not a regular file"),
    (lambda f: os.mkfifo(f), "is a FIFO, not a regular file"),
    (lambda f: f.write_bytes(b"") or os.truncate(f, 17 * 1024 * 1024), "more than a rules file may be"),
], ids=["dev-zero-link", "fifo", "17-MiB"])
@pytest.mark.parametrize("command", [["rules", "lint", "--rules"], ["rules", "test", "--rules"],
                                     ["rules", "publish"]], ids=["lint", "test", "publish"])
def test_an_overlay_yaml_that_is_not_a_small_regular_file_is_one_line_and_exit_2(tmp_path, make, words, command):
    """Issue 22, item 7: a `*.yaml` linked to /dev/zero took `rules lint` to 3.7 GB; a FIFO hung lint and publish."""
    overlay = tmp_path / "rules"
    overlay.mkdir()
    make(overlay / "bad.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTFAULT_")}
    env["FIRSTFAULT_KAFKA_BOOTSTRAP"] = "127.0.0.1:9"        # publish must refuse before it looks for a broker
    done = subprocess.run([sys.executable, "-m", "firstfault", *command, str(overlay)], capture_output=True, text=True,
                          timeout=120, env=env, preexec_fn=_limited)
    assert done.returncode == 2, done.stderr[-500:]
    assert done.stderr.strip() == f"firstfault: rule catalog error: bad.yaml: {words}" or (
        words in done.stderr and len(done.stderr.strip().splitlines()) == 1), done.stderr[-500:]
    assert "Traceback" not in done.stderr
