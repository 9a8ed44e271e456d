"""Self-checks of the application and scheduler rule catalog files.

Files under test:
  rules/catalog/extract/app.yaml, rules/catalog/extract/scheduler.yaml  (extraction patterns)
  rules/catalog/early/app.yaml,   rules/catalog/early/scheduler.yaml    (EARLY rules)

The checks run on the YAML alone (a small local prefix stripper and ``re.search``), so they do
not depend on the engine: required keys, regexes compile, every ``match`` example matches with
the expected fields, every ``no_match`` does not, the pattern that lists an example is the
highest-priority pattern (among all of these files' patterns) that matches it, anchors are
present in what they must prefilter, and the EARLY rules' ``fires``/``quiet`` examples hold.
A last test runs the same examples through the real engine when it is importable.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from catalog_rx import CatalogRx

ROOT = Path(__file__).resolve().parents[1]
CATALOG = ROOT / "rules" / "catalog"
EXTRACT_FILES = [CATALOG / "extract" / "app.yaml", CATALOG / "extract" / "scheduler.yaml"]
EARLY_FILES = [CATALOG / "early" / "app.yaml", CATALOG / "early" / "scheduler.yaml"]
TAXONOMY = CATALOG / "data" / "taxonomy.yaml"

PATTERN_KEYS = ("id", "title", "status", "description", "sources", "anchors", "regex", "kind",
                "group_by", "priority", "references", "falsepositives", "examples")
RULE_KEYS = ("id", "title", "description", "priority", "status", "when", "action", "tag", "output", "examples")
ID_PREFIXES = ("torch.", "nccl.", "cuda.", "elastic.", "python.", "slurm.", "k8s.")
SOURCES = {"app", "syslog", "fabricmanager", "scheduler"}
STATUSES = {"experimental", "test", "stable"}
TYPES = {"int": int, "float": float, "str": str}
ROLES = {"root", "symptom", "context", "marker", "noise"}

# ---------------------------------------------------------------- local prefix stripper
# The prefixes the engine removes before the regexes see a line (rules/README.md): srun label,
# torchrun [defaultN]:, PyTorch [rankN]:, glog [E1102 10:13:12.044871 file.cpp:632] and
# [E file.cpp:737], Python glog E0227 17:39:41.510000 293816 file.py:732], NCCL host:pid:tid [dev],
# bracketed ISO stamps.
_PREFIXES = [
    re.compile(r"\s{0,8}\d{1,7}: "),
    re.compile(r"\[default\d+\]:"),
    re.compile(r"\[rank\d+\]:"),
    re.compile(r"\[[EWIF](?:\d{1,2}\d\d \d\d:\d\d:\d\d\.\d+)?(?: \d+)? ?[\w./-]+:\d+\] "),
    re.compile(r"[EWIF]\d{3,4} \d\d:\d\d:\d\d\.\d+\s+\d+ [\w./-]+:\d+\] "),
    re.compile(r"\[\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?\]:? "),
    re.compile(r"[A-Za-z0-9][\w.-]*:\d+:\d+ \[\d+\] "),
]


def strip_prefixes(line: str) -> str:
    text = line
    stripped_any = False
    for _ in range(12):
        candidate = text.lstrip(" ") if stripped_any else text
        for rx in _PREFIXES:
            m = rx.match(candidate)
            if m:
                text = candidate[m.end():]
                stripped_any = True
                break
        else:
            break
    return text.lstrip(" ") if stripped_any else text


# ---------------------------------------------------------------- loading
def _load(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh) or {}


@lru_cache(maxsize=1)
def patterns() -> tuple[dict[str, Any], ...]:
    out = []
    for path in EXTRACT_FILES:
        for item in _load(path).get("patterns") or []:
            out.append({**item, "_file": path.name, "_rx": CatalogRx(item)})
    return tuple(out)


@lru_cache(maxsize=1)
def rules() -> tuple[dict[str, Any], ...]:
    return tuple({**item, "_file": path.name} for path in EARLY_FILES for item in _load(path).get("rules") or [])


@lru_cache(maxsize=1)
def lists() -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for path in EARLY_FILES:
        for name, values in (_load(path).get("lists") or {}).items():
            assert name not in out, f"list {name} defined twice"
            out[name] = list(values)
    return out


def _examples(pat: dict[str, Any], key: str) -> list[dict[str, Any]]:
    raw = (pat.get("examples") or {}).get(key) or []
    return [e if isinstance(e, dict) else {"line": e} for e in raw]


def _matching(message: str, source: str | None = None) -> list[dict[str, Any]]:
    return [p for p in patterns() if (source is None or source in p["sources"]) and p["_rx"].search(message)]


def _typed_fields(pat: dict[str, Any], m: re.Match[str]) -> dict[str, Any]:
    fields: dict[str, Any] = dict(pat.get("set") or {})
    types = pat.get("types") or {}
    for name, value in m.groupdict().items():
        if value is None:
            fields.setdefault(name, None)
            continue
        fields[name] = TYPES[types.get(name, "str")](value)
    return fields


def extract(line: str, source: str) -> dict[str, Any] | None:
    """The event the highest-priority matching pattern makes of ``line`` (local model of the engine)."""
    message = strip_prefixes(line)
    cands = [p for p in _matching(message, source) if any(a in line for a in p["anchors"])]
    if not cands:
        return None
    best = max(cands, key=lambda p: (p["priority"], p["id"]))
    return {"kind": best["kind"], "pattern": best["id"], "source": source,
            "fields": _typed_fields(best, best["_rx"].search(message))}


def _members(values: Any) -> set[str]:
    items = values if isinstance(values, list) else [values]
    return {str(v) for v in items}


def when_holds(when: dict[str, Any], ev: dict[str, Any]) -> bool:
    for key, want in when.items():
        have = ev["fields"].get(key[7:]) if key.startswith("fields.") else ev.get(key)
        if isinstance(want, str) and want.startswith("@"):
            ok = have is not None and str(have) in _members(lists()[want[1:]])
        elif isinstance(want, list):
            ok = have is not None and str(have) in _members(want)
        elif isinstance(want, dict) and "regex" in want:
            ok = have is not None and re.search(want["regex"], str(have)) is not None
        elif isinstance(want, dict) and "exists" in want:
            ok = (have is not None) == bool(want["exists"])
        elif isinstance(want, dict) and "not" in want:
            inner = want["not"]
            inner = lists()[inner[1:]] if isinstance(inner, str) and inner.startswith("@") else inner
            ok = str(have) not in _members(inner)
        else:
            ok = have == want or str(have) == str(want)
        if not ok:
            return False
    return True


PATTERN_IDS = [p["id"] for p in patterns()]
RULE_IDS = [r["id"] for r in rules()]
MATCH_CASES = [(p["id"], i) for p in patterns() for i, _ in enumerate(_examples(p, "match"))]
NOMATCH_CASES = [(p["id"], i) for p in patterns() for i, _ in enumerate(_examples(p, "no_match"))]
# An example of several lines gives its last line a context (a scope above it) that this one-line
# model does not read: `firstfault rules test` runs those through the real extractor.
FIRES_CASES = [(r["id"], i) for r in rules() for i, ex in enumerate((r.get("examples") or {}).get("fires") or [])
               if "\n" not in ex["line"]]
QUIET_CASES = [(r["id"], i) for r in rules() for i, _ in enumerate((r.get("examples") or {}).get("quiet") or [])]


def _pattern(pid: str) -> dict[str, Any]:
    return next(p for p in patterns() if p["id"] == pid)


def _rule(rid: str) -> dict[str, Any]:
    return next(r for r in rules() if r["id"] == rid)


# ---------------------------------------------------------------- structure
def test_files_load_and_ids_unique():
    assert len(PATTERN_IDS) == len(set(PATTERN_IDS)), "duplicate pattern id"
    assert len(RULE_IDS) == len(set(RULE_IDS)), "duplicate rule id"
    assert not set(PATTERN_IDS) & set(RULE_IDS)
    assert len(PATTERN_IDS) > 40 and len(RULE_IDS) > 20


@pytest.mark.parametrize("pid", PATTERN_IDS)
def test_pattern_structure(pid):
    pat = _pattern(pid)
    missing = [k for k in PATTERN_KEYS if k not in pat]
    assert not missing, f"{pid}: missing {missing}"
    assert pid.startswith(ID_PREFIXES), pid
    assert re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", pid)
    assert pat["status"] in STATUSES
    assert pat["sources"] and set(pat["sources"]) <= SOURCES
    assert isinstance(pat["priority"], int)
    assert pat["title"].strip() and pat["description"].strip()
    assert pat["references"], f"{pid}: no references"
    assert isinstance(pat["falsepositives"], list)
    assert all(isinstance(a, str) and len(a) >= 3 for a in pat["anchors"])
    assert re.fullmatch(r"[a-z][a-z0-9_]*", pat["kind"])
    groups = set(pat["_rx"].groupindex)
    for name, typ in (pat.get("types") or {}).items():
        assert typ in TYPES and name in groups, f"{pid}: bad type entry {name}"
    for name in pat["group_by"]:
        assert name in groups or name in (pat.get("set") or {}), f"{pid}: group_by {name} not captured"
    for key in ("gpu", "rank", "host", "onset_ms"):
        if pat.get(key) is not None:
            assert pat[key] in groups, f"{pid}: {key} names an uncaptured field"
    assert _examples(pat, "match") and _examples(pat, "no_match")


@pytest.mark.parametrize("rid", RULE_IDS)
def test_rule_structure(rid):
    rule = _rule(rid)
    missing = [k for k in RULE_KEYS if k not in rule]
    assert not missing, f"{rid}: missing {missing}"
    assert rid.startswith("early.")
    assert rule["status"] in STATUSES and isinstance(rule["priority"], int)
    assert rule["action"] in ("tag", "drop")
    assert isinstance(rule["when"], dict) and rule["when"]
    for key, value in rule["when"].items():
        assert key in ("kind", "source", "pattern", "role", "domain", "sub_domain", "strength", "host") \
            or key.startswith("fields."), f"{rid}: unknown when key {key}"
        if isinstance(value, str) and value.startswith("@"):
            assert value[1:] in lists(), f"{rid}: unknown list {value}"
        if isinstance(value, dict) and "regex" in value:
            re.compile(value["regex"])
    tag = rule["tag"]
    assert tag["role"] in ROLES
    assert tag.get("strength", "strong") in ("strong", "weak", "echo")
    if tag["role"] == "root":
        taxonomy = _load(TAXONOMY)["domains"]
        assert tag["sub_domain"] in taxonomy.get(tag["domain"], {}), f"{rid}: {tag} not in the taxonomy"
    if rule["action"] == "drop":
        assert tag["role"] == "noise"
    assert isinstance(rule["output"], str) and rule["output"].strip()
    ex = rule["examples"]
    assert ex.get("fires") and ex.get("quiet")
    for e in ex["fires"] + ex["quiet"]:
        assert e.get("source") in SOURCES and isinstance(e.get("line"), str)


def test_rule_kinds_are_extracted():
    # a pattern's own kind, and the kind it reads a line with under a block's header (in_block)
    kinds = {p["kind"] for p in patterns()} | {p["in_block"]["kind"] for p in patterns() if p.get("in_block")}
    for rule in rules():
        want = rule["when"].get("kind")
        if want is None:
            continue
        names = lists()[want[1:]] if isinstance(want, str) and want.startswith("@") else (want if isinstance(want, list) else [want])
        assert set(names) <= kinds, f"{rule['id']}: no pattern produces {set(names) - kinds}"


# ---------------------------------------------------------------- examples
@pytest.mark.parametrize("pid,i", MATCH_CASES)
def test_match_example(pid, i):
    pat = _pattern(pid)
    ex = _examples(pat, "match")[i]
    message = strip_prefixes(ex["line"])
    m = pat["_rx"].search(message)
    assert m is not None, f"{pid}: does not match {message!r}"
    assert any(a in ex["line"] for a in pat["anchors"]), f"{pid}: no anchor in {ex['line']!r}"
    got = _typed_fields(pat, m)
    for name, want in (ex.get("fields") or {}).items():
        assert name in got, f"{pid}: field {name} missing"
        assert got[name] == want or str(got[name]) == str(want), f"{pid}: {name}={got[name]!r}, expected {want!r}"


@pytest.mark.parametrize("pid,i", NOMATCH_CASES)
def test_no_match_example(pid, i):
    pat = _pattern(pid)
    line = _examples(pat, "no_match")[i]["line"]
    assert pat["_rx"].search(strip_prefixes(line)) is None, f"{pid}: matched {line!r}"


@pytest.mark.parametrize("pid,i", MATCH_CASES)
def test_priority_consistent(pid, i):
    """The pattern that lists a match example is the unique highest-priority pattern matching it."""
    pat = _pattern(pid)
    line = _examples(pat, "match")[i]["line"]
    message = strip_prefixes(line)
    for source in pat["sources"]:
        rivals = [p for p in _matching(message, source) if p["id"] != pid]
        above = [p["id"] for p in rivals if p["priority"] >= pat["priority"]]
        assert not above, f"{pid} (priority {pat['priority']}) is outranked or tied by {above} on {line!r}"


@pytest.mark.parametrize("rid,i", FIRES_CASES)
def test_early_fires(rid, i):
    rule = _rule(rid)
    ex = rule["examples"]["fires"][i]
    ev = extract(ex["line"], ex["source"])
    assert ev is not None, f"{rid}: no event from {ex['line']!r}"
    assert when_holds(rule["when"], ev), f"{rid}: does not hold for {ev}"


@pytest.mark.parametrize("rid,i", QUIET_CASES)
def test_early_quiet(rid, i):
    rule = _rule(rid)
    ex = rule["examples"]["quiet"][i]
    ev = extract(ex["line"], ex["source"])
    assert ev is None or not when_holds(rule["when"], ev), f"{rid}: holds for {ev}"


@pytest.mark.parametrize("rid,i", FIRES_CASES)
def test_early_role_winner(rid, i):
    """For a fires example of a rule that sets a role, the first rule (by priority) that holds is a
    rule with the same role and taxonomy: the tag the example shows is the tag the event gets."""
    rule = _rule(rid)
    ex = rule["examples"]["fires"][i]
    ev = extract(ex["line"], ex["source"])
    holding = sorted((r for r in rules() if when_holds(r["when"], ev)), key=lambda r: (-r["priority"], r["id"]))
    first = holding[0]
    if first["id"] != rid:
        # a higher rule may claim the event only with the very same tag (e.g. an exception rule)
        same = {k: first["tag"].get(k) for k in ("role", "domain", "sub_domain")} == \
               {k: rule["tag"].get(k) for k in ("role", "domain", "sub_domain")}
        assert same or rule["tag"]["role"] == "symptom" and rule["priority"] <= 60, \
            f"{rid}: event taken by {first['id']} ({first['tag']})"


# ---------------------------------------------------------------- contract section 3
SYMPTOM_KINDS = ["watchdog_timeout", "watchdog_status", "heartbeat_timeout", "pg_teardown", "dump_signal",
                 "comm_aborted", "watchdog_exception", "nccl_remote_error", "child_failed",
                 "elastic_worker_failed", "elastic_sigterm", "srun_task_exit", "srun_step_aborted"]


@pytest.mark.parametrize("kind", SYMPTOM_KINDS)
def test_timeouts_and_exit_lines_are_symptoms(kind):
    """NCCL timeouts, watchdog aborts, ChildFailedError, remote-process-exited and exit-code lines
    are never tagged as a root, except srun's Out Of Memory exit (the cgroup OOM killer)."""
    for rule in rules():
        want = rule["when"].get("kind")
        names = lists()[want[1:]] if isinstance(want, str) and want.startswith("@") else (want if isinstance(want, list) else [want])
        if kind in names and rule["tag"]["role"] == "root":
            assert kind == "srun_task_exit" and rule["when"].get("fields.status") == "Out Of Memory", rule["id"]


# ---------------------------------------------------------------- the real engine
def _engine_catalog():
    from firstfault.rules import catalog as cat
    from firstfault.rules import ruletest  # noqa: F401
    files = cat.catalog_files(cat.BUILTIN_CATALOG)
    catalog, errors = cat._build(files, str(cat.BUILTIN_CATALOG), strict=False)
    mine = {p.name for p in EXTRACT_FILES} | {p.name for p in EARLY_FILES}
    own_errors = [e for e in errors if str(getattr(e, "file", "")).split("/")[-1] in mine and
                  str(getattr(e, "file", "")).split("/")[0] in ("extract", "early")]
    return catalog, own_errors


def test_engine_lint_clean():
    _, own_errors = _engine_catalog()
    assert not own_errors, [str(e) for e in own_errors]


def test_engine_runs_own_examples():
    catalog, _ = _engine_catalog()
    from firstfault.rules.ruletest import run_rule_tests
    ids = set(PATTERN_IDS) | set(RULE_IDS)
    failures = [f"{r.rule_id}: {f}" for r in run_rule_tests(catalog) if r.rule_id in ids for f in r.failures]
    assert not failures, "\n".join(failures)
