"""What `rules test` would not catch, read off the loaded catalog (``rules lint``).

A rule can load, pass its own examples and still be wrong where its examples do not look:
a condition on a kind nothing produces or a field no event of its kinds carries (the rule
never fires), a template naming a field its events do not carry (the sentence prints "?"
or drops a [[segment]] for ever), a placeholder in a taxonomy sentence (printed as written).
Templates are checked wherever they are rendered: an EARLY rule's ``output`` and its root
tag's ``next_step`` (both rendered on the tagged event, rules/early.py ``render``). Fields a
decoder adds are not known statically: templates and conditions on decoded kinds (xid, sxid,
dcgm_threshold) are left to their examples.
"""
from __future__ import annotations

import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .catalog import ENGINE_FIELDS, LINE_FIELDS, TEMPLATE_NAMES, Catalog, Condition, Matcher
from .early import OPTIONAL
from .errors import CatalogError

# Fields the FINAL Python rules add before the explains rules look (rules/python/).
FINAL_FIELDS = frozenset({"excluded", "referred_xid", "desync_with"})
TAXONOMY_FILE = "data/taxonomy.yaml"


@dataclass(frozen=True)
class Fields:
    """What an event of each kind may carry when a rule looks at it."""

    produced: Mapping[str, frozenset[str]]      # kind -> fields its patterns (or the engine) set
    by_pattern: Mapping[str, str]               # pattern id -> its kind
    decoded: frozenset[str] | None              # kinds a decoder adds fields to (None: any kind)
    tagged: frozenset[str]                      # fields EARLY tags add

    @classmethod
    def of(cls, catalog: Catalog) -> "Fields":
        produced: dict[str, set[str]] = {k: set(v) for k, v in ENGINE_FIELDS.items()}
        for pat in catalog.patterns:
            produced.setdefault(pat.kind, set()).update(pat.regex.groupindex, pat.constants)
            if pat.in_block is not None:         # the same line, read with its block's kind
                produced.setdefault(pat.in_block.kind, set()).update(pat.regex.groupindex, pat.constants)
        by_pattern = {pat.id: pat.kind for pat in catalog.patterns}
        decoders = [r for r in catalog.early if r.action == "decode"]
        kinds = [kinds_of(r.when, by_pattern) for r in decoders]
        decoded = None if any(k is None for k in kinds) else frozenset().union(*kinds)
        tagged = frozenset(k for r in catalog.early if r.tag for k in r.tag.fields)
        return cls({k: frozenset(v) for k, v in produced.items()}, by_pattern, decoded, tagged)

    def carried(self, kinds: set[str] | None) -> frozenset[str] | None:
        """The fields an event of one of ``kinds`` may carry; None when not known statically
        (any kind, a kind nothing produces, or one a decoder adds its own fields to)."""
        if not kinds or self.decoded is None or kinds & self.decoded or not kinds <= self.produced.keys():
            return None
        return frozenset().union(*(self.produced[k] for k in kinds)) | LINE_FIELDS | self.tagged


def kinds_of(cond: Condition, by_pattern: Mapping[str, str]) -> set[str] | None:
    """The kinds a condition admits, from its ``kind`` or ``pattern`` term (None: any)."""
    for key, m in cond.terms:
        if key == "kind" and m.op in ("eq", "in"):
            return {m.arg} if m.op == "eq" else {v for v in m.arg if isinstance(v, str)}
    for key, m in cond.terms:
        if key == "pattern" and m.op in ("eq", "in"):
            ids = {m.arg} if m.op == "eq" else m.arg
            return {by_pattern[i] for i in ids if i in by_pattern}
    return None


def _names(template: str) -> set[str] | None:
    """The field names a template fills in (None: unbalanced braces)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError:
        return None
    return {name.split(".")[0].split("[")[0] for _, name, _, _ in parsed if name}


def _conditions(catalog: Catalog) -> Iterable[tuple[str, str, str, Condition, bool]]:
    """(file, rule id, what, condition, at FINAL) for every condition in the catalog."""
    for r in catalog.early:
        yield r.file, r.id, "when", r.when, False
    for r in catalog.explains:
        yield r.file, r.id, "source", r.source, True
        yield r.file, r.id, "target", r.target, True


def reach_errors(catalog: Catalog) -> list[CatalogError]:
    fields = Fields.of(catalog)
    return (condition_errors(catalog, fields) + equal_errors(catalog, fields) + template_errors(catalog, fields)
            + taxonomy_errors(catalog))


def condition_errors(catalog: Catalog, fields: Fields) -> list[CatalogError]:
    """A kind, pattern or field no event has: the term never holds, so the rule never fires."""
    errors = []
    for file, rid, what, cond, final in _conditions(catalog):
        kinds = kinds_of(cond, fields.by_pattern)
        for key, m in cond.terms:
            if key == "kind":
                for kind in sorted(kinds or ()):
                    if kind not in fields.produced:
                        errors.append(CatalogError(file, rid, f"{what}.kind names {kind!r}, which no pattern "
                                                              "produces (the rule can never fire)"))
            elif key == "pattern" and m.op in ("eq", "in"):
                for pid in sorted(map(str, {m.arg} if m.op == "eq" else m.arg)):
                    if pid not in fields.by_pattern:
                        errors.append(CatalogError(file, rid, f"{what}.pattern names {pid!r}, which is no "
                                                              "pattern's id (the rule can never fire)"))
        have = fields.carried(kinds)
        if have is None:
            continue
        have |= FINAL_FIELDS if final else frozenset()
        for key, m in cond.terms:
            if key.startswith("fields.") and key[7:] not in have:
                errors.append(CatalogError(file, rid, f"{what}.{key} names a field no event of kind "
                                                      f"{', '.join(sorted(kinds or ()))} carries ({_outcome(m)})"))
    return errors


def _outcome(m: Matcher) -> str:
    absent_holds = m.op == "not_in" or (m.op == "exists" and not m.arg)
    return "the term always holds" if absent_holds else "the term can never hold"


def equal_errors(catalog: Catalog, fields: Fields) -> list[CatalogError]:
    """``equal: [fields.x]`` needs both sides to carry x."""
    errors = []
    for rule in catalog.explains:
        for key in rule.equal:
            if not key.startswith("fields."):
                continue
            for cond in (rule.source, rule.target):
                kinds = kinds_of(cond, fields.by_pattern)
                have = fields.carried(kinds)
                if have is not None and key[7:] not in have | FINAL_FIELDS:
                    errors.append(CatalogError(rule.file, rule.id, f"equal names {key}, which no event of kind "
                                                                   f"{', '.join(sorted(kinds or ()))} carries "
                                                                   "(the rule can never fire)"))
                    break
    return errors


def template_errors(catalog: Catalog, fields: Fields) -> list[CatalogError]:
    """An EARLY rule's ``output`` and its root tag's ``next_step``, against its events' fields."""
    errors = []
    for rule in catalog.early:
        kinds = kinds_of(rule.when, fields.by_pattern)
        have = fields.carried(kinds)
        for what, template in (("output", rule.output), ("next_step", rule.tag.next_step if rule.tag else None)):
            if not template:
                continue
            names = _names(template)
            if names is None:
                errors.append(CatalogError(rule.file, rule.id, f"{what} has an unbalanced brace "
                                                               "(write {{ or }} for a literal one)"))
                continue
            missing = sorted(names - have - TEMPLATE_NAMES) if have is not None else []
            if missing:
                shown = _names(OPTIONAL.sub("", template)) or set()
                effect = "it would print '?'" if shown & set(missing) else "its [[segment]] would never show"
                errors.append(CatalogError(rule.file, rule.id, f"{what} names {', '.join(missing)}, which no "
                                                               f"event of kind {', '.join(sorted(kinds or ()))} "
                                                               f"carries ({effect})"))
    return errors


def taxonomy_errors(catalog: Catalog) -> list[CatalogError]:
    """The taxonomy's sentences are shown as written: a placeholder in them is printed as is."""
    errors = []
    for dom, subs in catalog.taxonomy.items():
        for sub, row in subs.items():
            for key in ("summary", "next_step"):
                text = row.get(key)
                names = _names(text) if isinstance(text, str) else set()
                if names is None or names:
                    shown = ", ".join(f"{{{n}}}" for n in sorted(names or ())) or "a brace"
                    errors.append(CatalogError(TAXONOMY_FILE, f"taxonomy {dom}/{sub}",
                                               f"{key} names {shown}, but taxonomy sentences are printed as "
                                               "written (a root tag's next_step is a template)"))
    return errors
