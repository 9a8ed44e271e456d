"""EARLY stage: every event, on its own, through the EARLY rules (decode, enrich, tag, drop)."""
from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping
from functools import lru_cache
from dataclasses import dataclass, field
from typing import Any

from .catalog import Catalog, Condition, EarlyRule
from .decoders import DECODERS, Tag
from .model import Ev


def value_of(ev: Ev, key: str) -> Any:
    if key.startswith("fields."):
        return ev.fields.get(key[7:])
    return getattr(ev, key, None)


def holds(cond: Condition, ev: Ev) -> bool:
    """All terms of ``cond`` hold for ``ev``."""
    return all(m.test(value_of(ev, key)) for key, m in cond.terms)


class _Blank(dict):
    def __missing__(self, key: str) -> str:
        return "?"


# "CUDA out of memory[[ on rank {rank}]][[ ({host})]]": a [[segment]] is dropped when a field it
# names is unknown, so a line without a host or rank reads "CUDA out of memory", not "on rank ? (?)".
OPTIONAL = re.compile(r"\[\[(.*?)\]\]", re.DOTALL)


def _names(segment: str) -> set[str]:
    try:
        return {name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(segment) if name}
    except ValueError:
        return {"\x00"}                  # unbalanced braces: never satisfied, the segment is dropped


def _values(ev: Ev) -> _Blank:
    """What a template may name on ``ev``: its known fields, host, gpu, rank and kind."""
    values = _Blank({k: v for k, v in ev.fields.items() if v is not None and v != ""})
    gpu = ev.pci if ev.gpu_index is None else ev.gpu_index
    values.update({k: v for k, v in (("host", ev.host), ("gpu", gpu), ("rank", ev.rank)) if v is not None})
    values["kind"] = ev.kind
    return values


def unfilled(template: str, ev: Ev) -> set[str]:
    """The names ``render`` prints as '?' on ``ev``: outside any [[segment]] and unknown on it."""
    return _names(OPTIONAL.sub("", template)) - _values(ev).keys() - {"\x00"}


def render(template: str | None, ev: Ev) -> str | None:
    if not template:
        return None
    values = _values(ev)
    text = OPTIONAL.sub(lambda m: m.group(1) if _names(m.group(1)) <= values.keys() else "", template)
    try:
        return string.Formatter().vformat(text, (), values)
    except (ValueError, IndexError, KeyError, AttributeError):
        return text


@dataclass
class EarlyTrail:
    """What each EARLY rule did: rule id -> (action, lines touched, refs)."""

    steps: dict[str, dict[str, Any]] = field(default_factory=dict)

    def note(self, rule: EarlyRule, ev: Ev, action: str) -> None:
        step = self.steps.setdefault(rule.id, {"action": action, "count": 0, "refs": set()})
        step["count"] += ev.count
        step["refs"].add((ev.path, ev.line))


def apply_tag(ev: Ev, tag: Tag, output: str | None) -> bool:
    """Add the tag's fields; set role/taxonomy only if no earlier rule did. True if it set the role."""
    for k, v in tag.fields.items():
        ev.fields.setdefault(k, v)
    if ev.role is not None:
        return False
    ev.role, ev.domain, ev.sub_domain, ev.strength = tag.role, tag.domain, tag.sub_domain, tag.strength
    if tag.role in ("root", "marker"):        # only these are ever shown as a sentence
        ev.output = render(tag.output or output, ev)
    return True


def decoder_input(ev: Ev) -> Mapping[str, Any]:
    data = dict(ev.fields)
    data.setdefault("pci", ev.pci)
    data.setdefault("host", ev.host)
    data.setdefault("rank", ev.rank)
    return data


@lru_cache(maxsize=4096)
def _rules_for(catalog: Catalog, kind: str) -> tuple[EarlyRule, ...]:
    """The EARLY rules whose ``kind`` term can hold for this kind, in priority order."""
    def applies(rule: EarlyRule) -> bool:
        return all(m.test(kind) for key, m in rule.when.terms if key == "kind")

    return tuple(r for r in catalog.early if applies(r))


@lru_cache(maxsize=4096)
def may_be_strong_root(catalog: Catalog, kind: str) -> bool:
    """Can the EARLY rules make an event of this kind a strong root? Only a tag rule that says so, or a
    decoder (its tag depends on the event), can: without one, ``run_early`` need not be asked."""
    return any(r.action == "decode" or (r.action == "tag" and r.tag is not None and r.tag.role == "root"
                                        and r.tag.strength == "strong")
               for r in _rules_for(catalog, kind))


def run_early(catalog: Catalog, events: Iterable[Ev]) -> tuple[list[Ev], EarlyTrail]:
    """Tag every event; drop noise. Returns (kept events, trail). Pure apart from mutating events."""
    trail = EarlyTrail()
    kept: list[Ev] = []
    for ev in events:
        dropped = False
        for rule in _rules_for(catalog, ev.kind):
            if not holds(rule.when, ev):
                continue
            if rule.action == "drop":
                ev.role = ev.role or "noise"
                trail.note(rule, ev, "drop")
                dropped = True
                break
            if rule.action == "tag" and rule.tag is not None:
                apply_tag(ev, rule.tag, rule.output)
                ev.early_rules.append(rule.id)
                trail.note(rule, ev, "tag")
            elif rule.action == "decode" and rule.decoder:
                tag = DECODERS[rule.decoder](decoder_input(ev))
                if tag is not None:
                    apply_tag(ev, tag, rule.output)
                ev.early_rules.append(rule.id)
                trail.note(rule, ev, "decode")
        if ev.role is None:
            ev.role = "context"         # nothing claimed it: kept for the timeline, never blamed
        if dropped or ev.role == "noise":
            continue
        kept.append(ev)
    return kept, trail
