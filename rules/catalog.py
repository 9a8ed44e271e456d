"""Load and validate the rule catalog (YAML in ``rules/catalog``), and hash it.

Errors name the file and the rule id (``CatalogError``). ``load_catalog`` fails on
the first error; ``lint_catalog`` collects them all. The catalog version is a
content hash over every catalog file and the registered Python rule sources.
"""
from __future__ import annotations

import hashlib
import pickle
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, get_args

from firstfault.schemas.diagnosis import RecoveryAction

from .decoders import DECODERS, ROLES, Tag, load_builtin_decoders
from .errors import CatalogError
from . import keys as known_keys
from . import yaml_cache
from .regex import LinearRegex, LineMatch, RegexError

PACKAGE_DIR = Path(__file__).resolve().parent
BUILTIN_CATALOG = PACKAGE_DIR / "catalog"
SOURCES = frozenset({"app", "syslog", "fabricmanager", "scheduler", "metrics"})
# A pattern's scope: host (of the lines below), object (they are about: a field of that name),
# pod (both: the object, and the pod's node from the workload's pods map as the host), teardown
# (the lines below were written while the launcher tore the step down: they carry the field as
# ``torn_down_by``, which EARLY rules read, e.g. a cancellation banner that is srun's own).
SCOPE_KEYS = frozenset({"host", "object", "pod", "teardown"})
STATUSES = frozenset({"experimental", "test", "stable"})
TYPES = {"int": int, "float": float, "str": str}
_ID = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


_APART_BLOB = "_apart"


class _ReadApart:
    """A rule whose fields that ``analyze`` never reads (``_APART``: its examples, title, description,
    references) pickle apart, as one bytes object unpickled at their first read. A restored catalog
    (rules/catalog_cache.py) is read by every ``analyze``, and the examples alone are thousands of
    objects, most of what it holds: they cost the run nothing now. ``rules test``, ``rules list``,
    lint and the tests read them as before. Fields with a default are never apart (the class
    attribute would answer for a missing one)."""

    _APART: tuple[str, ...] = ()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        fields = type(self)._APART
        if all(name in state for name in fields):
            apart = {name: state.pop(name) for name in fields}
            state[_APART_BLOB] = pickle.dumps(apart, protocol=pickle.HIGHEST_PROTOCOL)
        # else: restored and never read: the blob it came with goes on as it is
        return state

    def __getattr__(self, name: str) -> Any:
        # Only for attributes missing from the instance: a restored rule's fields apart, until read.
        if name in type(self)._APART:
            blob = self.__dict__.get(_APART_BLOB)
            if blob is not None:
                apart = pickle.loads(blob)
                self.__dict__.update(apart)         # frozen: into __dict__, as dataclass's own __init__ does
                return apart[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


@dataclass(frozen=True)
class Example:
    """A rule's example: a line (with its source) and the fields it must give."""

    line: str
    source: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class InBlock:
    """``in_block:`` of a pattern: the line ends a block (a Python traceback) whose meaning its header
    gives. Searching upward within the look-back, its prefixes read, the nearest line matching
    ``start`` begins the block; when the line just above that matches ``header``, the line is read
    with ``kind`` instead of the pattern's (an exception CPython reports as ignored ended nothing)."""

    anchor: str                 # a literal every start line holds: lines without it are not read further
    start: LinearRegex
    header: LinearRegex
    kind: str


@dataclass(frozen=True)
class Pattern(_ReadApart):
    """An extraction pattern: which lines it reads (anchors, regex) and the event it makes of them."""

    id: str
    file: str
    title: str
    description: str
    status: str
    sources: frozenset[str]
    anchors: tuple[str, ...]
    ignore_case: bool
    regex: LinearRegex
    kind: str
    types: Mapping[str, Any]
    constants: Mapping[str, Any]
    group_by: tuple[str, ...]
    gpu_field: str | None
    rank_field: str | None
    host_field: str | None
    onset_field: str | None
    aggregate_ranks: bool
    priority: int
    references: tuple[str, ...]
    match_examples: tuple[Example, ...]
    nomatch_examples: tuple[Example, ...]
    stamp_field: str | None = None          # a field holding the time the line states for itself
    unless: LinearRegex | None = None       # a line this also matches is not this pattern's (RE2 has no look-around)
    # What the line says of the lines below it in its file, until another line says otherwise (a
    # `kubectl describe`'s "Node:" is the host of the report's lines): SCOPE_KEYS -> field (None: clears).
    scope: Mapping[str, str | None] = field(default_factory=dict)
    pod_field: str | None = None            # a field naming a pod: its node (the workload's pods map) is the host
    dates_above: int | None = None          # the stated time is also that of the untimed lines up to N above (its record)
    in_block: InBlock | None = None         # read with another kind under a block header above (InBlock)

    _APART = ("title", "description", "references", "match_examples", "nomatch_examples")  # not a field

    def search(self, message: str, data: bytes | None = None) -> LineMatch | None:
        """``data``: the message's UTF-8 bytes, when the caller tries several patterns on it."""
        m = self.regex.search(message, data)
        if m is None or (self.unless is not None and self.unless.search(message, data) is not None):
            return None
        return m

    def spans(self, data: bytes) -> list[tuple[int, int]] | None:
        """``search`` on the message's UTF-8 bytes, as the regex's spans (``LinearRegex.match_of``)."""
        spans = self.regex.spans(data)
        if spans is None or (self.unless is not None and self.unless.spans(data) is not None):
            return None
        return spans

    @property
    def digit_blind(self) -> bool:
        """Lines that differ only in their ASCII digits: alike to this pattern (regex and unless)."""
        return self.regex.digit_blind and (self.unless is None or self.unless.digit_blind)


@dataclass(frozen=True)
class Condition:
    """``when:`` of an EARLY rule: every key must hold."""

    terms: tuple[tuple[str, "Matcher"], ...]


@dataclass(frozen=True)
class EarlyRule(_ReadApart):
    """An EARLY rule: what its events must hold (``when``) and what it does to them (tag, drop, decode)."""

    id: str
    file: str
    title: str
    description: str
    status: str
    priority: int
    when: Condition
    action: str                 # tag | drop | decode
    tag: Tag | None
    decoder: str | None
    output: str | None
    fires: tuple[Example, ...]
    quiet: tuple[Example, ...]

    _APART = ("title", "description", "fires", "quiet")


@dataclass(frozen=True)
class ExplainsRule(_ReadApart):
    """A FINAL demotion rule in the Alertmanager-inhibition shape: source explains target."""

    id: str
    file: str
    title: str
    description: str
    priority: int
    source: Condition
    target: Condition
    join: str                   # same_gpu | same_host | within_timeout_window | after_onset | same_workload
    window_s: float | None
    before_s: float
    scenarios: tuple[Mapping[str, Any], ...]
    equal: tuple[str, ...] = ()  # keys both events must hold with the same value (Alertmanager `equal`)
    # explains: source caused target (time decides the order). same_fault: one physical fault
    # reported by two layers (driver and CUDA); refines: a finer decode of the same family. The
    # last two are order-free (window_s either side) and fold the target into the source's candidate.
    # clears: the source, logged after the target's last report (within window_s), says its fault
    # cleared (a port back up): the target is weak evidence then (rules/clears.py).
    relation: str = "explains"
    references: tuple[str, ...] = ()

    _APART = ("title", "description", "scenarios")


for _cls in (Pattern, EarlyRule, ExplainsRule):     # a field apart must have no default (_ReadApart)
    assert not any(hasattr(_cls, name) for name in _cls._APART), _cls
del _cls


@dataclass(frozen=True, eq=False)      # identity hash: one compiled prefilter per loaded catalog
class Catalog:
    """The built rule catalog: patterns, EARLY and FINAL rules, settings, taxonomy and lists."""

    root: str
    patterns: tuple[Pattern, ...]
    early: tuple[EarlyRule, ...]
    explains: tuple[ExplainsRule, ...]
    settings: Mapping[str, Any]
    taxonomy: Mapping[str, Mapping[str, Mapping[str, Any]]]
    lists: Mapping[str, tuple[Any, ...]]
    data_dir: Path
    version: str

    @property
    def sub_domains(self) -> dict[str, str]:
        """sub_domain -> domain."""
        return {sd: dom for dom, subs in self.taxonomy.items() for sd in subs}


# ---------------------------------------------------------------- file discovery

def catalog_files(root: Path, overlay: Path | None = None) -> dict[str, Path]:
    """Relative path -> file; an overlay's file with the same relative path replaces the built-in."""
    files: dict[str, Path] = {}
    for base in (root, overlay):
        if base is None:
            continue
        if not base.is_dir():
            raise CatalogError(str(base), None, "rules directory does not exist")
        for path in sorted(base.rglob("*.yaml")):
            rel = path.relative_to(base).as_posix()
            check_rule_file(path, rel)
            files[rel] = path
    return files


MAX_RULE_FILE_BYTES = 16 * 1024 * 1024      # the biggest built-in file is ~100 KB


def check_rule_file(path: Path, rel: str) -> None:
    """A catalog file must be a regular file (a link to one is fine) of at most MAX_RULE_FILE_BYTES:
    a ``*.yaml`` that is a FIFO would block the reader, one that is /dev/zero would fill memory."""
    try:
        st = path.stat()
    except OSError as exc:
        raise CatalogError(rel, None, f"cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or
                stat.S_ISBLK(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) else "a special file")
        raise CatalogError(rel, None, f"is {kind}, not a regular file")
    if st.st_size > MAX_RULE_FILE_BYTES:
        raise CatalogError(rel, None, f"{st.st_size} bytes, more than a rules file may be ({MAX_RULE_FILE_BYTES})")


def _python_rule_sources() -> list[Path]:
    # telemetry.py holds the metrics threshold table and crossing logic the events come from
    return sorted([p for d in (PACKAGE_DIR / "decoders", PACKAGE_DIR / "python") for p in d.glob("*.py")]
                  + [PACKAGE_DIR / "telemetry.py"])


def catalog_version(files: Mapping[str, Path]) -> str:
    digest = hashlib.sha256()
    for rel in sorted(files):
        digest.update(rel.encode() + b"\0" + files[rel].read_bytes() + b"\0")
    for path in _python_rule_sources():
        digest.update(f"python/{path.name}".encode() + b"\0" + path.read_bytes() + b"\0")
    return "sha256:" + digest.hexdigest()[:16]


# ---------------------------------------------------------------- parsing helpers

class _Errors:
    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.items: list[CatalogError] = []

    def add(self, file: str, rule_id: str | None, problem: str) -> None:
        err = CatalogError(file, rule_id, problem)
        if self.strict:
            raise err
        self.items.append(err)

    def keys(self, file: str, rule_id: str | None, raw: Mapping[Any, Any], known: frozenset[str],
             where: str = "") -> None:
        """Every key of ``raw`` that is not in ``known``: YAML would let a misspelt one pass unread."""
        for problem in known_keys.unknown(raw, known):
            self.add(file, rule_id, f"{where}: {problem}" if where else problem)


def _dict(raw: Mapping[str, Any], key: str, errs: _Errors, file: str, rid: str, where: str = "") -> dict[str, Any]:
    """``raw[key]`` as a dict: a mapping of names to values, else reported and empty."""
    value = raw.get(key) or {}
    if not isinstance(value, Mapping):
        errs.add(file, rid, f"{where}{key} must be a mapping of names to values")
        return {}
    return dict(value)


def _examples_of(item: Mapping[str, Any], errs: _Errors, file: str, rid: str, lists: frozenset[str]) -> Mapping[str, Any]:
    """The rule's ``examples:`` mapping (``lists``: the example lists it may hold)."""
    ex = item.get("examples")
    if ex is None:
        return {}
    if not isinstance(ex, Mapping):
        errs.add(file, rid, f"examples must be a mapping of {' and '.join(sorted(lists))}")
        return {}
    errs.keys(file, rid, ex, lists, "examples")
    return ex


def _examples(raw: Any, errs: _Errors, file: str, rid: str, what: str,
              known: frozenset[str] = known_keys.PATTERN_EXAMPLE) -> tuple[Example, ...]:
    out = []
    if raw is not None and not isinstance(raw, list):
        errs.add(file, rid, f"examples.{what} must be a list")
        return ()
    for i, item in enumerate(raw or [], 1):
        if isinstance(item, Mapping):
            errs.keys(file, rid, item, known, f"examples.{what}[{i}]")
        if isinstance(item, str):
            out.append(Example(line=item))
        elif isinstance(item, Mapping) and isinstance(item.get("line"), str):
            src = item.get("source")
            if src is not None and src not in SOURCES:
                errs.add(file, rid, f"{what} example has unknown source {src!r}")
            out.append(Example(line=item["line"], source=src, fields=_dict(item, "fields", errs, file, rid)))
        elif (isinstance(item, Mapping) and item.get("source") == "metrics" and isinstance(item.get("lines"), list)
              and item["lines"] and all(isinstance(x, str) for x in item["lines"])):
            # metrics samples: a series of JSON lines, read as one metrics/*.jsonl file
            out.append(Example(line="\n".join(item["lines"]), source="metrics",
                               fields=_dict(item, "fields", errs, file, rid)))
        else:
            errs.add(file, rid, f"{what} example must be a line, {{line: ...}} or {{source: metrics, lines: [...]}}")
    return tuple(out)


@dataclass(frozen=True)
class Matcher:
    """One term of a condition: equality, membership, regex, existence or exclusion."""

    op: str                      # eq | in | regex | exists | not_in
    arg: Any

    def test(self, have: Any) -> bool:
        if self.op == "exists":
            return (have is not None) == self.arg
        if self.op == "regex":
            return have is not None and self.arg.search(str(have)) is not None
        inside = have in self.arg or str(have) in self.arg if self.op in ("in", "not_in") else False
        if self.op == "in":
            return inside
        if self.op == "not_in":
            return not inside
        return have == self.arg or str(have) == str(self.arg)


CONDITION_KEYS = frozenset({"kind", "source", "pattern", "role", "domain", "sub_domain", "strength", "host"})


def _members(values: Any) -> frozenset:
    items = values if isinstance(values, (list, tuple)) else [values]
    return frozenset(items) | frozenset(str(v) for v in items)


def _condition(raw: Any, lists: Mapping[str, Any], errs: _Errors, file: str, rid: str, what: str) -> Condition:
    if not isinstance(raw, Mapping) or not raw:
        errs.add(file, rid, f"{what} must be a non-empty mapping")
        return Condition(terms=())
    terms = []
    for key, value in raw.items():
        if not (key in CONDITION_KEYS or str(key).startswith("fields.")):
            errs.add(file, rid, f"{what}: {known_keys.unknown([key], CONDITION_KEYS)[0]}")
            continue
        if isinstance(value, str) and value.startswith("@"):
            if value[1:] not in lists:
                errs.add(file, rid, f"{what}: unknown list {value!r}")
                continue
            terms.append((key, Matcher("in", _members(lists[value[1:]]))))
        elif isinstance(value, list):
            terms.append((key, Matcher("in", _members(value))))
        elif isinstance(value, Mapping):
            errs.keys(file, rid, value, known_keys.MATCHER, f"{what}.{key}")
            if "regex" in value:
                try:
                    terms.append((key, Matcher("regex", LinearRegex(str(value["regex"])))))
                except RegexError as exc:
                    errs.add(file, rid, f"{what}: bad regex for {key}: {exc}")
            elif "exists" in value:
                terms.append((key, Matcher("exists", bool(value["exists"]))))
            elif "not" in value:
                inner = value["not"]
                if isinstance(inner, str) and inner.startswith("@"):
                    inner = list(lists.get(inner[1:], ()))
                terms.append((key, Matcher("not_in", _members(inner))))
            else:
                errs.add(file, rid, f"{what}: {key} takes a value, a list, @list, {{regex}}, {{exists}} or {{not}}")
        else:
            terms.append((key, Matcher("eq", value)))
    return Condition(terms=tuple(terms))


def _tag(raw: Any, taxonomy: Mapping[str, Mapping[str, Any]], errs: _Errors, file: str, rid: str) -> Tag | None:
    if not isinstance(raw, Mapping):
        errs.add(file, rid, "tag must be a mapping with a role")
        return None
    errs.keys(file, rid, raw, known_keys.TAG, "tag")
    role = raw.get("role")
    if role not in ROLES:
        errs.add(file, rid, f"tag role must be one of {', '.join(ROLES)}")
        return None
    dom, sub = raw.get("domain"), raw.get("sub_domain")
    if role == "root":
        if dom not in taxonomy or sub not in taxonomy.get(dom, {}):
            errs.add(file, rid, f"tag {dom}/{sub} is not in the taxonomy")
            return None
    try:
        step = raw.get("next_step")
        if step is not None and (role != "root" or not isinstance(step, str) or not step.strip()):
            errs.add(file, rid, "next_step is a sentence, on a root tag only")
            step = None
        return Tag(role=role, domain=dom, sub_domain=sub, strength=raw.get("strength", "strong"),
                   fields=_dict(raw, "fields", errs, file, rid, "tag."), next_step=step)
    except ValueError as exc:
        errs.add(file, rid, str(exc))
        return None


def _common(item: Mapping[str, Any], errs: _Errors, file: str, ids: set[str]) -> str | None:
    rid = item.get("id")
    if not isinstance(rid, str) or not _ID.match(rid):
        errs.add(file, str(rid) if rid else None, "every rule needs an id of lower-case letters, digits, '.', '_' or '-'")
        return None
    if rid in ids:
        errs.add(file, rid, "duplicate id")
    ids.add(rid)
    for key in ("title", "description"):
        if not isinstance(item.get(key), str) or not item[key].strip():
            errs.add(file, rid, f"missing {key}")
    status = item.get("status", "stable")
    if status not in STATUSES:
        errs.add(file, rid, f"status must be one of {', '.join(sorted(STATUSES))}")
    if not isinstance(item.get("priority", 0), int):
        errs.add(file, rid, "priority must be an integer")
    return rid


def _pattern(item: Mapping[str, Any], file: str, errs: _Errors, ids: set[str]) -> Pattern | None:
    rid = _common(item, errs, file, ids)
    if rid is None:
        return None
    errs.keys(file, rid, item, known_keys.PATTERN)
    examples = _examples_of(item, errs, file, rid, known_keys.PATTERN_EXAMPLES)
    sources = item.get("sources") or []
    if not sources or any(s not in SOURCES for s in sources):
        errs.add(file, rid, f"sources must be a non-empty subset of {sorted(SOURCES)}")
    anchors = item.get("anchors") or []
    if not anchors or any(not isinstance(a, str) or len(a) < 3 for a in anchors):
        errs.add(file, rid, "anchors must be literal strings of at least 3 characters")
    try:
        regex = LinearRegex(str(item.get("regex", "")), bool(item.get("ignore_case")))
        unless = LinearRegex(str(item["unless"]), bool(item.get("ignore_case"))) if item.get("unless") else None
    except RegexError as exc:
        errs.add(file, rid, f"regex does not compile: {exc} (RE2 has no look-around or back-references: "
                            "exclude lines with `unless`)")
        return None
    if not item.get("regex"):
        errs.add(file, rid, "missing regex")
    kind = item.get("kind")
    if not isinstance(kind, str) or not _ID.match(kind):
        errs.add(file, rid, "missing kind")
    groups = set(regex.groupindex)
    types = _dict(item, "types", errs, file, rid)
    for name, typ in types.items():
        if typ not in TYPES:
            errs.add(file, rid, f"type of {name} must be int, float or str")
        if name not in groups:
            errs.add(file, rid, f"types names {name!r}, which the regex does not capture")
    constants = _dict(item, "set", errs, file, rid)
    group_by = item.get("group_by")
    if group_by is None:
        group_by = sorted(groups)
    elif not isinstance(group_by, list):
        errs.add(file, rid, "group_by must be a list of field names")
        group_by = sorted(groups)
    for g in group_by:
        if g not in groups and g not in constants:
            errs.add(file, rid, f"group_by names {g!r}, which is neither captured nor set")
    for key in ("gpu", "rank", "host", "onset_ms", "stamp", "pod"):
        name = item.get(key)
        if name is not None and name not in groups:
            errs.add(file, rid, f"{key} names {name!r}, which the regex does not capture")
    scope = _dict(item, "scope", errs, file, rid)
    for key, name in scope.items():
        if key not in SCOPE_KEYS:
            errs.add(file, rid, f"scope: {known_keys.unknown([key], SCOPE_KEYS)[0]}")
        if name is not None and name not in groups:
            errs.add(file, rid, f"scope: {key} names {name!r}, which the regex does not capture")
    dates_above = item.get("dates_above")
    if dates_above is not None and (not isinstance(dates_above, int) or isinstance(dates_above, bool)
                                    or not 0 < dates_above <= 64 or not item.get("stamp")):
        errs.add(file, rid, "dates_above must be a number of lines from 1 to 64, with stamp naming the time")
    in_block = _in_block(item, errs, file, rid)
    match = _examples(examples.get("match"), errs, file, rid, "match")
    nomatch = _examples(examples.get("no_match"), errs, file, rid, "no_match")
    if not match:
        errs.add(file, rid, "needs at least one match example (a real line)")
    if not nomatch:
        errs.add(file, rid, "needs at least one no_match example")
    return Pattern(
        id=rid, file=file, title=item.get("title", ""), description=item.get("description", ""),
        status=item.get("status", "stable"), sources=frozenset(sources),
        anchors=tuple(a for a in anchors if isinstance(a, str)), ignore_case=bool(item.get("ignore_case")),
        regex=regex, kind=str(kind), types={k: TYPES.get(v, str) for k, v in types.items()},
        constants=constants, group_by=tuple(group_by), gpu_field=item.get("gpu"),
        rank_field=item.get("rank"), host_field=item.get("host"), onset_field=item.get("onset_ms"),
        stamp_field=item.get("stamp"), aggregate_ranks=bool(item.get("aggregate_ranks", True)), priority=int(item.get("priority", 0)),
        references=tuple(item.get("references") or ()), match_examples=match, nomatch_examples=nomatch,
        unless=unless, scope=scope, pod_field=item.get("pod"),
        dates_above=dates_above if isinstance(dates_above, int) and not isinstance(dates_above, bool) else None,
        in_block=in_block,
    )


def _in_block(item: Mapping[str, Any], errs: _Errors, file: str, rid: str) -> InBlock | None:
    spec = item.get("in_block")
    if spec is None:
        return None
    if not isinstance(spec, Mapping):
        errs.add(file, rid, "in_block must be a mapping: {anchor, start, header, kind}")
        return None
    errs.keys(file, rid, spec, known_keys.IN_BLOCK)
    if not spec.get("start") or not spec.get("header") or not isinstance(spec.get("anchor"), str) or len(spec["anchor"]) < 3:
        errs.add(file, rid, "in_block needs anchor (a literal of the block's first line, 3 characters or more), "
                            "start (that line) and header (the line above it)")
        return None
    kind = spec.get("kind")
    if not isinstance(kind, str) or not _ID.match(kind) or kind == item.get("kind"):
        errs.add(file, rid, "in_block.kind must name a kind other than the pattern's own")
        return None
    try:
        return InBlock(anchor=spec["anchor"], start=LinearRegex(str(spec["start"])), header=LinearRegex(str(spec["header"])),
                       kind=kind)
    except RegexError as exc:
        errs.add(file, rid, f"in_block regex does not compile: {exc}")
        return None


def _early(item: Mapping[str, Any], file: str, errs: _Errors, ids: set[str], lists: Mapping[str, Any],
           taxonomy: Mapping[str, Any]) -> EarlyRule | None:
    rid = _common(item, errs, file, ids)
    if rid is None:
        return None
    errs.keys(file, rid, item, known_keys.EARLY)
    action = item.get("action")
    tag = decoder = None
    if action == "tag":
        tag = _tag(item.get("tag"), taxonomy, errs, file, rid)
    elif action == "decode":
        decoder = item.get("decoder")
        if decoder not in DECODERS:
            errs.add(file, rid, f"unknown decoder {decoder!r} (registered: {', '.join(sorted(DECODERS))})")
    elif action != "drop":
        errs.add(file, rid, "action must be tag, drop or decode")
    when = _condition(item.get("when"), lists, errs, file, rid, "when")
    ex = _examples_of(item, errs, file, rid, known_keys.EARLY_EXAMPLES)
    fires = _examples(ex.get("fires"), errs, file, rid, "fires", known_keys.EARLY_EXAMPLE)
    quiet = _examples(ex.get("quiet"), errs, file, rid, "quiet", known_keys.EARLY_EXAMPLE)
    if not fires:
        errs.add(file, rid, "needs at least one 'fires' example (a real line)")
    if not quiet:
        errs.add(file, rid, "needs at least one 'quiet' example")
    return EarlyRule(
        id=rid, file=file, title=item.get("title", ""), description=item.get("description", ""),
        status=item.get("status", "stable"), priority=int(item.get("priority", 0)), when=when,
        action=str(action), tag=tag, decoder=decoder, output=item.get("output"), fires=fires, quiet=quiet,
    )


JOINS = ("same_gpu", "same_host", "within_timeout_window", "after_onset", "same_workload")
# Relations of identity (catalog keys beside `explains`): where, not when, decides them.
IDENTITY = ("same_fault", "refines")
# message_below: the target is an exception line whose message goes on below it; the source is the
# report on the line after it in the same file (rules/identity.py); content_below: the target is a
# wrapper's exception whose first line only says another error follows, and the source is the report a
# few lines below it in the same file (the wrapped error's own words)
IDENTITY_JOINS = ("same_gpu", "same_host", "message_below", "content_below")
# A fault that cleared: the report that it did must be about the same place (rules/clears.py).
CLEARS = "clears"
CLEARS_JOINS = ("same_gpu", "same_host")
EQUAL_KEYS = ("kind", "source", "host", "gpu_index", "rank", "domain", "sub_domain")


def _explains(item: Mapping[str, Any], file: str, errs: _Errors, ids: set[str], lists: Mapping[str, Any],
              relation: str = "explains") -> ExplainsRule | None:
    rid = _common(item, errs, file, ids)
    if rid is None:
        return None
    errs.keys(file, rid, item, known_keys.FINAL)
    join = item.get("join")
    allowed = IDENTITY_JOINS if relation in IDENTITY else CLEARS_JOINS if relation == CLEARS else JOINS
    if join not in allowed:
        errs.add(file, rid, f"join must be one of {', '.join(allowed)}")
    refs = item.get("references") or []
    if relation == CLEARS and item.get("before_s") is not None:
        errs.add(file, rid, "a clears relation's source comes after its target: before_s is not used")
    if relation in (*IDENTITY, CLEARS) and (not isinstance(refs, list) or not refs or not all(isinstance(r, str) for r in refs)):
        errs.add(file, rid, f"a {relation} relation names its sources: references must list them")
        refs = []
    if relation in IDENTITY and item.get("before_s") is not None:
        errs.add(file, rid, f"a {relation} relation is order-free: window_s applies either side, before_s is not used")
    equal = item.get("equal") or []
    if not isinstance(equal, list) or any(not isinstance(k, str) or not (
            k in EQUAL_KEYS or k.startswith("fields.")) for k in equal):
        errs.add(file, rid, f"equal must list keys: {', '.join(EQUAL_KEYS)} or fields.NAME")
        equal = []
    ex = _examples_of(item, errs, file, rid, known_keys.EARLY_EXAMPLES)
    fires = _scenarios(ex.get("fires"), errs, file, rid, "fires")
    quiet = _scenarios(ex.get("quiet"), errs, file, rid, "quiet")
    if not fires or not quiet:
        errs.add(file, rid, "needs 'fires' and 'quiet' example scenarios")
    return ExplainsRule(
        id=rid, file=file, title=item.get("title", ""), description=item.get("description", ""),
        priority=int(item.get("priority", 0)),
        source=_condition(item.get("source"), lists, errs, file, rid, "source"),
        target=_condition(item.get("target"), lists, errs, file, rid, "target"),
        join=str(join), window_s=item.get("window_s"), before_s=float(item.get("before_s", 0) or 0),
        scenarios=fires + quiet, equal=tuple(equal), relation=relation, references=tuple(refs),
    )


def _scenarios(raw: Any, errs: _Errors, file: str, rid: str, what: str) -> tuple[Mapping[str, Any], ...]:
    """A FINAL rule's example scenarios, each marked with what it expects (fires or quiet)."""
    if raw is not None and not isinstance(raw, list):
        errs.add(file, rid, f"examples.{what} must be a list of scenarios")
        return ()
    out = []
    for i, scenario in enumerate(raw or [], 1):
        if not isinstance(scenario, Mapping):
            errs.add(file, rid, f"examples.{what}[{i}] must be a scenario: {{files: {{path: text}}, workload: ...}}")
            continue
        errs.keys(file, rid, scenario, known_keys.SCENARIO, f"examples.{what}[{i}]")
        out.append({"expect": what, **scenario})
    return tuple(out)


def _parse_yaml(text: str) -> Any:
    import yaml         # only a build reads YAML: a catalog restored from the cache does not

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))     # libyaml: 10x faster


def _read_yaml(path: Path, rel: str, errs: _Errors) -> Any:
    import yaml

    try:
        return yaml_cache.load(path.read_bytes(), _parse_yaml) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        errs.add(rel, None, f"not valid YAML: {str(exc).splitlines()[0]}")
        return {}


def _build(files: Mapping[str, Path], root: str, strict: bool,
           version: str | None = None) -> tuple[Catalog, list[CatalogError]]:
    load_builtin_decoders()
    errs = _Errors(strict)
    taxonomy: dict[str, Any] = {}
    settings: dict[str, Any] = {}
    tax_file = files.get("data/taxonomy.yaml")
    if tax_file is None:
        errs.add("data/taxonomy.yaml", None, "the taxonomy file is missing")
    else:
        taxonomy = _taxonomy(_read_yaml(tax_file, "data/taxonomy.yaml", errs), errs)
    lists: dict[str, Any] = {}
    docs: dict[str, Any] = {}
    for rel, path in sorted(files.items()):
        doc = _read_yaml(path, rel, errs)
        docs[rel] = doc
        if isinstance(doc, Mapping):
            for name, values in _mapping(doc, "lists", rel, errs).items():
                if name in lists:
                    errs.add(rel, None, f"list {name!r} defined twice")
                if not isinstance(values, list):
                    errs.add(rel, None, f"list {name!r} must be a list of values")
                    continue
                lists[name] = tuple(values)
    ids: set[str] = set()
    patterns: list[Pattern] = []
    early: list[EarlyRule] = []
    explains: list[ExplainsRule] = []
    for rel, doc in sorted(docs.items()):
        if not isinstance(doc, Mapping):
            errs.add(rel, None, "top level must be a mapping")
            continue
        folder = next((f for f in known_keys.TOP if rel.startswith(f)), None)
        if folder is None:
            if not rel.startswith("data/"):     # decoder tables: read by their decoders
                errs.add(rel, None, "not read: rule files go under extract/, early/ or final/ "
                                    "(decoder tables under data/)")
            continue
        errs.keys(rel, None, doc, known_keys.TOP[folder])
        if folder == "extract/":
            for item in _entries(doc, "patterns", rel, errs):
                if (p := _pattern(item, rel, errs, ids)) is not None:
                    patterns.append(p)
        elif folder == "early/":
            for item in _entries(doc, "rules", rel, errs):
                if (r := _early(item, rel, errs, ids, lists, taxonomy)) is not None:
                    early.append(r)
        else:
            for relation in ("explains", *IDENTITY, CLEARS):
                for item in _entries(doc, relation, rel, errs):
                    if (r := _explains(item, rel, errs, ids, lists, relation)) is not None:
                        explains.append(r)
            given = _mapping(doc, "settings", rel, errs)
            errs.keys(rel, None, given, known_keys.settings_keys(), "settings")
            for key, value in given.items():
                if key in settings:
                    errs.add(rel, None, f"setting {key!r} defined twice")
                settings[key] = value
    catalog = Catalog(
        root=root,
        patterns=tuple(sorted(patterns, key=lambda p: (-p.priority, p.id))),
        early=tuple(sorted(early, key=lambda r: (-r.priority, r.id))),
        explains=tuple(sorted(explains, key=lambda r: (-r.priority, r.id))),
        settings=settings, taxonomy=taxonomy, lists=lists,
        data_dir=files["data/taxonomy.yaml"].parent if tax_file else BUILTIN_CATALOG / "data",
        version=version or catalog_version(files),
    )
    return catalog, errs.items


def _entries(doc: Mapping[str, Any], key: str, rel: str, errs: _Errors) -> list[Mapping[str, Any]]:
    """The rules listed under ``key``: each must be a mapping."""
    raw = doc.get(key) or []
    if not isinstance(raw, list):
        errs.add(rel, None, f"{key} must be a list of rules")
        return []
    for i, item in enumerate(raw, 1):
        if not isinstance(item, Mapping):
            errs.add(rel, None, f"{key}[{i}] must be a mapping (one rule), not {type(item).__name__}")
    return [item for item in raw if isinstance(item, Mapping)]


def _mapping(doc: Mapping[str, Any], key: str, rel: str, errs: _Errors) -> Mapping[str, Any]:
    raw = doc.get(key) or {}
    if not isinstance(raw, Mapping):
        errs.add(rel, None, f"{key} must be a mapping")
        return {}
    return raw


RECOVERY_ACTIONS = get_args(RecoveryAction)


def _taxonomy(doc: Any, errs: _Errors) -> dict[str, dict[str, Mapping[str, Any]]]:
    """domain -> sub_domain -> {recovery, summary, next_step}; malformed rows are reported and left out."""
    rel = "data/taxonomy.yaml"
    if not isinstance(doc, Mapping):
        errs.add(rel, None, "top level must be a mapping with domains")
        return {}
    errs.keys(rel, None, doc, frozenset({"domains"}))
    out: dict[str, dict[str, Mapping[str, Any]]] = {}
    for dom, subs in _mapping(doc, "domains", rel, errs).items():
        if not isinstance(subs, Mapping):
            errs.add(rel, f"taxonomy {dom}", "must map each sub_domain to {recovery, summary, next_step}")
            continue
        out[dom] = {}
        for sub, row in subs.items():
            where = f"taxonomy {dom}/{sub}"
            if not isinstance(row, Mapping):
                errs.add(rel, where, "must be a mapping: {recovery, summary, next_step}")
                continue
            errs.keys(rel, where, row, known_keys.TAXONOMY_ROW)
            if "recovery" in row and row["recovery"] not in RECOVERY_ACTIONS:
                errs.add(rel, where, f"recovery must be one of {', '.join(RECOVERY_ACTIONS)}")
            out[dom][sub] = row
    return out


@lru_cache(maxsize=8)
def _load_cached(overlay: str | None) -> Catalog:
    from . import catalog_cache         # it reads the pickled classes of this module

    files = catalog_files(BUILTIN_CATALOG, Path(overlay) if overlay else None)
    root = overlay or str(BUILTIN_CATALOG)
    version = catalog_version(files)
    return catalog_cache.load(version, root, lambda: _build(files, root, strict=True, version=version)[0])


def load_catalog(overlay: str | Path | None = None) -> Catalog:
    """The built-in catalog, with ``overlay``'s YAML files added or replacing same-named ones."""
    return _load_cached(str(Path(overlay).resolve()) if overlay else None)


def lint_catalog(overlay: str | Path | None = None) -> list[CatalogError]:
    files = catalog_files(BUILTIN_CATALOG, Path(overlay) if overlay else None)
    catalog, errors = _build(files, str(overlay or BUILTIN_CATALOG), strict=False)
    from .lint import reach_errors          # lint reads the catalog this module builds

    return errors + reach_errors(catalog) + redos_errors(catalog)


# What the engine makes without a pattern, and the fields it sets: the scheduler's end record
# (rules/diagnose.py), damaged lines kept as evidence (rules/extract.py), metric threshold
# crossings (rules/telemetry.py EVENT_KIND). tests/test_catalog_lint.py checks these stay in step.
ENGINE_FIELDS: Mapping[str, frozenset[str]] = {
    "scheduler_end": frozenset({"state", "terminal_state", "exit_code"}),
    "unparsed": frozenset({"reason"}),
    "dcgm_threshold": frozenset({"metric", "value", "threshold", "rule", "why", "delta", "previous", "xid"}),
}
ENGINE_KINDS = frozenset(ENGINE_FIELDS)
# Fields every extracted event may carry (torn_down_by: from a teardown scope above the line),
# and the names an output template always has.
LINE_FIELDS = frozenset({"uptime_s", "pid_prefix", "cuda_dev", "damaged_line", "host_basis", "torn_down_by"})
TEMPLATE_NAMES = frozenset({"host", "gpu", "rank", "kind"})


def _regexes(catalog: Catalog) -> Iterable[tuple[str, str, str, LinearRegex]]:
    """(file, rule id, what, regex) for every regex in the catalog."""
    for pat in catalog.patterns:
        yield pat.file, pat.id, "regex", pat.regex
        if pat.unless is not None:
            yield pat.file, pat.id, "unless", pat.unless
    for rule in catalog.early:
        for key, m in rule.when.terms:
            if m.op == "regex":
                yield rule.file, rule.id, f"when.{key}", m.arg
    for rule in catalog.explains:
        for what, cond in (("source", rule.source), ("target", rule.target)):
            for key, m in cond.terms:
                if m.op == "regex":
                    yield rule.file, rule.id, f"{what}.{key}", m.arg


def redos_errors(catalog: Catalog) -> list[CatalogError]:
    """Patterns that backtrack catastrophically in a backtracking engine (rules/redos.py)."""
    from .redos import BUDGET_S, find_redos      # only when a catalog is compiled or linted: not at start-up

    errors = []
    for file, rid, what, rx in _regexes(catalog):
        for f in find_redos(rx.pattern, rx.ignore_case):
            took = f"; Python's re took {f.seconds:.2f} s on it" if f.seconds else ""
            if f.seconds is not None and f.seconds >= BUDGET_S:
                took = f"; Python's re ran past {BUDGET_S:g} s on it"
            errors.append(CatalogError(file, rid, f"{what} backtracks catastrophically: {f.problem}; "
                                                  f"witness: {f.witness}{took}"))
    return errors


