"""Guards rules/catalog/extract/kernel.yaml and rules/catalog/early/kernel.yaml.

Self-contained on purpose (yaml + re only): every pattern and EARLY rule has the keys
the catalog format asks for, every regex compiles, every ``match`` example matches its
pattern (after a local prefix stripper) with the expected fields, every ``no_match``
example matches none of the kernel patterns, and every EARLY rule fires on its
``fires`` lines and stays quiet on its ``quiet`` lines, evaluated on the event that the
highest-priority kernel pattern extracts from the line.
"""
from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Any

import pytest
import yaml

from catalog_rx import CatalogRx

ROOT = Path(__file__).resolve().parents[1]
EXTRACT = ROOT / "rules" / "catalog" / "extract" / "kernel.yaml"
EARLY = ROOT / "rules" / "catalog" / "early" / "kernel.yaml"
TAXONOMY = ROOT / "rules" / "catalog" / "data" / "taxonomy.yaml"

PATTERN_KEYS = ("id", "title", "status", "description", "sources", "anchors", "regex", "kind",
                "types", "group_by", "priority", "references", "falsepositives", "examples")
RULE_KEYS = ("id", "title", "description", "priority", "status", "when", "action", "tag",
             "output", "examples")
ID_PREFIXES = ("kernel.", "pcie.", "ib.", "storage.")
STATUSES = {"experimental", "test", "stable"}
ROLES = {"root", "symptom", "context", "marker", "noise"}
TYPES = {"int": int, "float": float, "str": str}
WHEN_KEYS = {"kind", "source", "pattern", "role", "domain", "sub_domain", "strength", "host"}

# --- a small prefix stripper: RFC 3164, ISO journal / dmesg --time-format iso, dmesg stamps
_RFC3164 = re.compile(
    r"^(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)? "
    r"(?:[\w.:-]+ )?(?:[\w./@-]+(?:\[\d+\])?: )?")
_ISO = re.compile(
    r"^\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
    r"(?: [\w.-]+ [\w./@-]+(?:\[\d+\])?:)? ")
_DMESG = re.compile(
    r"^\[(?:\s*\+?\s*\d+\.\d+|(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4})\] ?")


def strip_prefix(line: str) -> str:
    text = line
    for _ in range(4):
        for rx in (_RFC3164, _ISO, _DMESG):
            m = rx.match(text)
            if m and m.end() > 0:
                text = text[m.end():]
                break
        else:
            break
    return text


# --- loading

def _load(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    assert isinstance(doc, dict), f"{path} must hold a mapping"
    return doc


EXTRACT_DOC = _load(EXTRACT)
EARLY_DOC = _load(EARLY)
PATTERNS: list[dict[str, Any]] = EXTRACT_DOC.get("patterns") or []
RULES: list[dict[str, Any]] = EARLY_DOC.get("rules") or []
TAXO = (_load(TAXONOMY).get("domains") or {})
LISTS = EARLY_DOC.get("lists") or {}

COMPILED = {p["id"]: CatalogRx(p) for p in PATTERNS}
BY_PRIORITY = sorted(PATTERNS, key=lambda p: (-int(p.get("priority", 0)), p["id"]))


def _typed(pattern: dict[str, Any], m: re.Match[str]) -> dict[str, Any]:
    types = pattern.get("types") or {}
    fields: dict[str, Any] = {}
    for name, value in m.groupdict().items():
        if value is None:
            continue
        fields[name] = TYPES[types.get(name, "str")](value)
    for name, value in (pattern.get("set") or {}).items():
        fields.setdefault(name, value)
    return fields


def extract(line: str) -> dict[str, Any] | None:
    """The event the highest-priority kernel pattern makes of ``line`` (syslog source)."""
    msg = strip_prefix(line)
    for p in BY_PRIORITY:
        if "syslog" not in p["sources"]:
            continue
        if not any(a in msg for a in p["anchors"]):
            continue
        m = COMPILED[p["id"]].search(msg)
        if m:
            return {"kind": p["kind"], "pattern": p["id"], "source": "syslog", "fields": _typed(p, m)}
    return None


# --- a local evaluator of `when:` (value, list, @list, {regex}, {exists}, {not})

def _holds(term: Any, value: Any) -> bool:
    if isinstance(term, str) and term.startswith("@"):
        return value in LISTS[term[1:]]
    if isinstance(term, list):
        return value in term
    if isinstance(term, dict):
        if "regex" in term:
            return value is not None and re.search(str(term["regex"]), str(value)) is not None
        if "exists" in term:
            return (value is not None) == bool(term["exists"])
        if "not" in term:
            inner = term["not"] if isinstance(term["not"], list) else [term["not"]]
            return value not in inner
        raise AssertionError(f"unknown condition {term!r}")
    return value == term


def when_holds(when: dict[str, Any], event: dict[str, Any]) -> bool:
    for key, term in when.items():
        value = event["fields"].get(key[len("fields."):]) if key.startswith("fields.") else event.get(key)
        if not _holds(term, value):
            return False
    return True


def winning_rule(event: dict[str, Any]) -> str | None:
    for rule in sorted(RULES, key=lambda r: (-int(r.get("priority", 0)), r["id"])):
        if when_holds(rule["when"], event):
            return rule["id"]
    return None


# ----------------------------------------------------------------- extraction patterns

def test_files_are_not_empty():
    assert PATTERNS, "no patterns in extract/kernel.yaml"
    assert RULES, "no rules in early/kernel.yaml"


def test_ids_are_unique():
    ids = [p["id"] for p in PATTERNS] + [r["id"] for r in RULES]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: p.get("id", "?"))
def test_pattern_shape(pattern):
    missing = [k for k in PATTERN_KEYS if k not in pattern]
    assert not missing, f"missing keys {missing}"
    assert pattern["id"].startswith(ID_PREFIXES), pattern["id"]
    assert re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", pattern["id"])
    assert re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", pattern["kind"])
    assert pattern["status"] in STATUSES
    assert pattern["sources"] == ["syslog"]
    assert isinstance(pattern["priority"], int)
    assert pattern["title"].strip() and pattern["description"].strip()
    assert pattern["references"], "every pattern names its sources"
    assert isinstance(pattern["falsepositives"], list)
    anchors = pattern["anchors"]
    assert anchors and all(isinstance(a, str) and len(a) >= 6 for a in anchors), anchors
    regex = COMPILED[pattern["id"]]
    groups = set(regex.groupindex)
    assert groups or pattern.get("set"), "a pattern captures or sets at least one field"
    for name, typ in (pattern.get("types") or {}).items():
        assert typ in TYPES and name in groups, (name, typ)
    for name in pattern["group_by"]:
        assert name in groups or name in (pattern.get("set") or {}), name
    for key in ("gpu", "rank", "host", "onset_ms"):
        if pattern.get(key) is not None:
            assert pattern[key] in groups, key
    ex = pattern["examples"]
    assert ex.get("match"), "needs at least one match example"
    assert ex.get("no_match"), "needs at least one no_match example"


@pytest.mark.parametrize(
    "pattern,example",
    [(p, e) for p in PATTERNS for e in p["examples"]["match"]],
    ids=lambda x: x["id"] if isinstance(x, dict) and "id" in x else "")
def test_match_examples(pattern, example):
    line = example["line"] if isinstance(example, dict) else example
    msg = strip_prefix(line)
    assert any(a in msg for a in pattern["anchors"]), f"no anchor in {msg!r}"
    m = COMPILED[pattern["id"]].search(msg)
    assert m, f"{pattern['id']} does not match {msg!r}"
    fields = _typed(pattern, m)
    for name, want in (example.get("fields") or {}).items() if isinstance(example, dict) else ():
        assert fields.get(name) == want, f"{name}: got {fields.get(name)!r}, want {want!r} in {msg!r}"
    # the pattern that wins the line is of the same kind (priorities are consistent)
    event = extract(line)
    assert event is not None and event["kind"] == pattern["kind"], event


@pytest.mark.parametrize(
    "pattern,line",
    [(p, e if isinstance(e, str) else e["line"]) for p in PATTERNS for e in p["examples"]["no_match"]],
    ids=lambda x: x["id"] if isinstance(x, dict) and "id" in x else "")
def test_no_match_examples(pattern, line):
    # A look-alike must not match the pattern that lists it, nor any pattern of the same kind.
    msg = strip_prefix(line)
    hits = [p["id"] for p in PATTERNS if p["kind"] == pattern["kind"] and COMPILED[p["id"]].search(msg)]
    assert not hits, f"{line!r} matched {hits}"


def test_stripper_on_known_prefixes():
    assert strip_prefix("Nov  2 10:03:11 node-02 kernel: [  219.470994] X") == "X"
    assert strip_prefix("2024-04-29T14:55:41,679700+02:00 X") == "X"
    assert strip_prefix("2026-11-02T10:03:11.5+00:00 node-02 kernel: X") == "X"
    assert strip_prefix("[Tue Feb 14 18:48:25 2023] X") == "X"
    assert strip_prefix("[  +0.000004] X") == "X"


# ----------------------------------------------------------------- EARLY rules

@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.get("id", "?"))
def test_rule_shape(rule):
    missing = [k for k in RULE_KEYS if k not in rule]
    assert not missing, f"missing keys {missing}"
    assert rule["id"].startswith("early."), rule["id"]
    assert re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", rule["id"])
    assert rule["status"] in STATUSES
    assert isinstance(rule["priority"], int)
    assert rule["action"] in ("tag", "drop")
    assert rule["title"].strip() and rule["description"].strip()
    when = rule["when"]
    assert isinstance(when, dict) and when
    for key in when:
        assert key in WHEN_KEYS or key.startswith("fields."), key
    kinds = {p["kind"] for p in PATTERNS}
    wanted = when.get("kind")
    for kind in (wanted if isinstance(wanted, list) else [wanted] if wanted else []):
        assert kind in kinds, f"when.kind {kind!r} is made by no kernel pattern"
    if "pattern" in when:
        assert when["pattern"] in COMPILED
    tag = rule["tag"]
    assert tag["role"] in ROLES
    assert tag.get("strength", "strong") in ("strong", "weak", "echo")
    if tag["role"] == "root":
        assert tag["sub_domain"] in (TAXO.get(tag["domain"]) or {}), (tag["domain"], tag["sub_domain"])
    assert isinstance(rule["output"], str) and rule["output"].strip()
    ex = rule["examples"]
    assert ex.get("fires") and ex.get("quiet")
    for item in ex["fires"] + ex["quiet"]:
        assert isinstance(item, dict) and item.get("source") == "syslog" and isinstance(item.get("line"), str)


@pytest.mark.parametrize(
    "rule,line",
    [(r, e["line"]) for r in RULES for e in r["examples"]["fires"]],
    ids=lambda x: x["id"] if isinstance(x, dict) and "id" in x else "")
def test_rule_fires(rule, line):
    event = extract(line)
    assert event is not None, f"no kernel pattern extracts {line!r}"
    assert when_holds(rule["when"], event), f"{rule['id']} does not fire on {event}"
    assert winning_rule(event) == rule["id"], f"{winning_rule(event)} wins over {rule['id']} on {event}"
    # A name inside an optional [[...]] segment may be absent (the renderer drops the segment); one
    # outside must be on the event; every name must be one the pattern can give.
    required = re.sub(r"\[\[.*?\]\]", "", rule["output"])
    names = {f for _, f, _, _ in string.Formatter().parse(required) if f}
    unknown = names - {"host", "gpu", "rank"} - set(event["fields"])
    assert not unknown, f"output names {unknown}, which the event lacks"
    pat = next(p for p in PATTERNS if p["id"] == event["pattern"])
    possible = set(re.compile(pat["regex"]).groupindex) | set(pat.get("set") or {})
    optional = {f for seg in re.findall(r"\[\[(.*?)\]\]", rule["output"])
                for _, f, _, _ in string.Formatter().parse(seg) if f}
    assert not optional - {"host", "gpu", "rank"} - possible, f"output names {optional - possible}, which no match gives"


@pytest.mark.parametrize(
    "rule,line",
    [(r, e["line"]) for r in RULES for e in r["examples"]["quiet"]],
    ids=lambda x: x["id"] if isinstance(x, dict) and "id" in x else "")
def test_rule_quiet(rule, line):
    event = extract(line)
    assert event is None or not when_holds(rule["when"], event), f"{rule['id']} fires on {event}"


def test_a_memcg_oom_report_cut_before_its_kill_line_is_weak_host_oom(tmp_path):
    # The start of a memory cgroup's OOM report as dmesg prints it (mm/oom_kill.c dump_header,
    # mm/memcontrol.c mem_cgroup_print_oom_meminfo), without the kill line: weak evidence, no drain.
    from firstfault.rules.engine import analyze_path

    (tmp_path / "dmesg.txt").write_text(
        "[1043957.201542] python invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=968\n"
        "[1043957.201601] memory: usage 33554432kB, limit 33554432kB, failcnt 2513\n"
        "[1043957.201606] Memory cgroup stats for /kubepods/burstable/pod4c1a0b7e-7f83-4a3f-9d1e-1f0d3a6c2b11:\n")
    d = analyze_path(tmp_path / "dmesg.txt").diagnosis
    assert (d.status, d.sub_domain) == ("attributed", "host_oom")
    assert d.recovery.action != "drain_nodes"
