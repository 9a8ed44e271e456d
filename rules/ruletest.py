"""``firstfault rules test``: every rule's own examples, run through the real engine.

Extraction patterns: each ``match`` line must yield an event from that pattern with
the expected fields; each ``no_match`` line must not. EARLY rules: each ``fires``
line must be touched by the rule, each ``quiet`` line not (a line may be several: the event is the
last one's, the others its context; an example with ``source: metrics``
gives ``lines:``, a series of metrics samples read as one ``metrics/dcgm.jsonl``). FINAL rules (YAML and
Python): each ``fires`` scenario must leave the rule's step in the evidence trail,
each ``quiet`` scenario must not.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from firstfault.schemas import WorkloadRecord

from .catalog import Catalog, EarlyRule, Example, Pattern
from .diagnose import scheduler_event
from .early import render, run_early, unfilled
from .engine import analyze_files
from .extract import Extractor
from .model import Ev, EventSet
from .prefixes import read_head
from .python import ordered as python_rules

_WL = {"workload_id": "rules-test", "attempt": 0, "scheduler": "slurm", "state": "FAILED",
       "start_time": "2026-11-02T09:58:00Z", "end_time": "2026-11-02T10:21:14Z",
       "nodes": ["node-01", "node-02", "node-03", "node-04"], "gpus_per_node": 8}


@dataclass
class Result:
    rule_id: str
    file: str
    passed: int = 0
    failures: list[str] = field(default_factory=list)


def _path_for(source: str) -> str:
    return {"app": "logs/app/node-01.log", "syslog": "logs/syslog/node-02.log",
            "fabricmanager": "logs/fabricmanager/node-02.log",
            "scheduler": "logs/scheduler/slurmctld.log"}.get(source, "logs/app/node-01.log")


def extract_one(catalog: Catalog, line: str, source: str, workload: WorkloadRecord | None = None):
    """The event (or None) that the real extractor makes of one line from ``source``. An example of
    several lines is read as one file: the lines above give the last one its context (a scope, an
    inherited stamp), and the event is the last line's."""
    wl = workload or WorkloadRecord.model_validate(_WL)
    ex = Extractor(catalog, wl)
    events = EventSet()
    path = _path_for(source)
    ex.scan_file(path, [line.encode("utf-8", errors="surrogateescape") + b"\n"], events)
    evs = events.sorted()
    if "\n" in line:
        last = line.count("\n") + 1
        evs = [e for e in evs if e.line == last]
    return evs[0] if evs else None


def seen_as(line: str, workload: WorkloadRecord | None = None) -> str:
    """What a pattern is searched on: the example's message once its prefixes (stamp, host, rank,
    ...) are removed, as the extractor removes them (rules/prefixes.py); said when an example fails."""
    wl = workload or WorkloadRecord.model_validate(_WL)
    message = read_head(line, Extractor.context_for(wl, None)).message
    prefix = line[:len(line) - len(message)]           # read_head only ever takes from the front
    return f"the pattern sees {message!r}" + (f" (prefixes removed: {prefix!r})" if prefix else "")


def _fields_ok(expected: Mapping[str, Any], got: Mapping[str, Any]) -> str | None:
    for k, v in expected.items():
        if k not in got:
            return f"field {k!r} missing"
        if got[k] != v and str(got[k]) != str(v):
            return f"field {k!r} is {got[k]!r}, expected {v!r}"
    return None


def _test_pattern(catalog: Catalog, pat: Pattern) -> Result:
    res = Result(pat.id, pat.file)
    for i, ex in enumerate(pat.match_examples, 1):
        src = ex.source or sorted(pat.sources)[0]
        ev = extract_one(catalog, ex.line, src)
        if ev is None or ev.pattern != pat.id:
            problem = "no event" if ev is None else f"taken by {ev.pattern}"
            res.failures.append(f"match example {i}: {problem}; {seen_as(ex.line)}")
            continue
        problem = _fields_ok(ex.fields, ev.fields)
        if problem:
            res.failures.append(f"match example {i}: {problem}; {seen_as(ex.line)}")
        else:
            res.passed += 1
    for i, ex in enumerate(pat.nomatch_examples, 1):
        for src in ([ex.source] if ex.source else sorted(pat.sources)):
            ev = extract_one(catalog, ex.line, src)
            if ev is not None and ev.pattern == pat.id:
                res.failures.append(f"no_match example {i}: the pattern matched it; {seen_as(ex.line)}")
                break
        else:
            res.passed += 1
    return res


def metrics_events(lines: str, workload: WorkloadRecord | None = None) -> list:
    """The events the engine makes of these metrics sample lines (one ``metrics/dcgm.jsonl``)."""
    from .engine import metric_events, metrics_window
    from .telemetry import MetricsRead, read_metrics_file

    wl = workload or WorkloadRecord.model_validate(_WL)
    read = MetricsRead()
    lo, hi = metrics_window(wl)
    data = lines.encode("utf-8", errors="surrogateescape")
    read_metrics_file("metrics/dcgm.jsonl", [data], wl.zone, read, lo, hi)
    return metric_events(wl, read, lambda _path: [data])


def _early_events(catalog: Catalog, ex: Example) -> list:
    src = ex.source or "app"
    if src == "scheduler" and ex.line.lstrip().startswith("{") and '"workload_id"' in ex.line:
        wl = WorkloadRecord.model_validate(json.loads(ex.line))
        evs = [scheduler_event(wl)]
    elif src == "metrics":
        evs = metrics_events(ex.line)
    else:
        ev = extract_one(catalog, ex.line, src)
        evs = [ev] if ev is not None else []
    return evs


def _early_touched(catalog: Catalog, rule_id: str, ex: Example) -> bool:
    return _early_run(catalog, rule_id, ex)[0]


def _early_run(catalog: Catalog, rule_id: str, ex: Example) -> tuple[bool, list[Ev]]:
    """Did the rule touch the example's events, and which ones (as the EARLY stage left them)."""
    evs = _early_events(catalog, ex)
    _, trail = run_early(catalog, evs)
    return rule_id in trail.steps, [ev for ev in evs if rule_id in ev.early_rules]


def _unfilled(rule: EarlyRule, ev: Ev) -> list[str]:
    """The rule's sentences that print '?' on this event: the shown ``output`` (when this rule's
    is the one shown) and a root tag's ``next_step``. Lint cannot see a decoder's fields; this can."""
    shown = []
    if rule.output and ev.output is not None and ev.output == render(rule.output, ev):
        shown.append(("output", rule.output))
    if rule.tag and rule.tag.next_step and ev.role == "root":
        shown.append(("next_step", rule.tag.next_step))
    problems = []
    for what, template in shown:
        missing = sorted(unfilled(template, ev))
        if missing:
            problems.append(f"{what} prints '?' for {', '.join(missing)} on this line (put it in a "
                            "[[segment]], which is left out when a field it names is unknown)")
    return problems


def _what_it_made(catalog: Catalog, ex: Example) -> str:
    """The events an example line produced, so a rule that did not fire says why."""
    evs = _early_events(catalog, ex)
    if not evs:
        seen = f"; {seen_as(ex.line)}" if ex.source != "metrics" else ""
        return f"the line produced no event (no pattern matched it){seen}"
    shown = []
    for ev in evs:
        fields = ", ".join(f"{k}={v!r}" for k, v in sorted(ev.fields.items()) if v is not None)
        shown.append(f"kind={ev.kind} (pattern {ev.pattern}; {fields})")
    return "it produced " + "; ".join(shown)


def _scenario(catalog: Catalog, scenario: Mapping[str, Any]):
    wl = {**_WL, **(scenario.get("workload") or {})}
    files = {p: (t.encode("utf-8", errors="surrogateescape") if isinstance(t, str) else t)
             for p, t in (scenario.get("files") or {}).items()}
    return analyze_files(wl, files, catalog=catalog).diagnosis


def run_rule_tests(catalog: Catalog, only: str | None = None) -> list[Result]:
    results: list[Result] = []
    for pat in catalog.patterns:
        if not only or pat.id.startswith(only):
            results.append(_test_pattern(catalog, pat))
    for rule in catalog.early:
        if only and not rule.id.startswith(only):
            continue
        res = Result(rule.id, rule.file)
        for i, ex in enumerate(rule.fires, 1):
            fired, touched = _early_run(catalog, rule.id, ex)
            problems = [p for ev in touched for p in _unfilled(rule, ev)]
            if not fired:
                res.failures.append(f"fires example {i}: the rule did not fire: {_what_it_made(catalog, ex)}")
            elif problems:
                res.failures.append(f"fires example {i}: {problems[0]}")
            else:
                res.passed += 1
        for i, ex in enumerate(rule.quiet, 1):
            if _early_touched(catalog, rule.id, ex):
                res.failures.append(f"quiet example {i}: the rule fired")
            else:
                res.passed += 1
        results.append(res)
    finals = [(r.id, "final/" + r.file if not r.file.startswith("final/") else r.file, r.scenarios) for r in catalog.explains]
    finals += [(r.id, f"python:{r.fn.__module__}", [{"expect": k, **s} for k in ("fires", "quiet")
                                                    for s in r.examples.get(k, [])]) for r in python_rules()]
    for rid, file, scenarios in finals:
        if only and not rid.startswith(only):
            continue
        res = Result(rid, file)
        if not any(s["expect"] == "fires" for s in scenarios) or not any(s["expect"] == "quiet" for s in scenarios):
            res.failures.append("needs at least one 'fires' and one 'quiet' scenario")
        for i, sc in enumerate(scenarios, 1):
            try:
                diag = _scenario(catalog, sc)
            except Exception as exc:  # a broken scenario is a failing test, not a crash
                res.failures.append(f"{sc['expect']} scenario {i}: {type(exc).__name__}: {exc}")
                continue
            fired = any(step.rule_id == rid and step.stage == "final" for step in diag.evidence)
            if fired == (sc["expect"] == "fires"):
                res.passed += 1
            else:
                res.failures.append(f"{sc['expect']} scenario {i}: the rule {'did not fire' if not fired else 'fired'}")
        results.append(res)
    return results


