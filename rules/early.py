"""EARLY stage: every event, on its own, through the EARLY rules (decode, enrich, tag, drop)."""
from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from operator import attrgetter
from dataclasses import dataclass, field
from typing import Any

from .catalog import Catalog, Condition, EarlyRule
from .decoders import Tag, decoder_named
from .model import Ev


def value_of(ev: Ev, key: str) -> Any:
    if key.startswith("fields."):
        return ev.fields.get(key[7:])
    return getattr(ev, key, None)


@lru_cache(maxsize=1024)
def reader(key: str) -> Callable[[Ev], Any]:
    """``value_of(·, key)`` as one function of the event, made once a key: the FINAL stage reads one
    key of thousands of events in a row, and a C getter skips the key's parsing on each."""
    if key.startswith("fields."):
        name = key[7:]
        return lambda ev: ev.fields.get(name)
    if key in Ev.__slots__:
        return attrgetter(key)
    return lambda ev: getattr(ev, key, None)


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
        step = self.steps.get(rule.id)
        if step is None:                # not setdefault: its new dict and set, made for every line, cost more
            step = self.steps[rule.id] = {"action": action, "count": 0, "refs": set()}
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


@lru_cache(maxsize=4096)
def _read_by(catalog: Catalog, kind: str) -> tuple[str, ...] | None:
    """What the EARLY rules of this kind read (their ``when`` keys), when that alone decides which of them
    fire: no decoder among them (a decoder's tag, and what later rules then see, depends on the whole
    event). A tag's fields are constants and its role goes only where none is: the rest follows."""
    rules = _rules_for(catalog, kind)
    if any(r.action == "decode" for r in rules):
        return None
    return tuple(dict.fromkeys(key for r in rules for key, _ in r.when.terms))


@lru_cache(maxsize=8)
def _fired(catalog: Catalog) -> dict[tuple, tuple[tuple[EarlyRule, str], ...]]:
    """(kind, role, the values its rules read) -> the rules that fired and what they did: a cascade's
    thousands of events of one kind and the same fields are run through the rules once."""
    return {}


def run_early(catalog: Catalog, events: Iterable[Ev]) -> tuple[list[Ev], EarlyTrail]:
    """Tag every event; drop noise. Returns (kept events, trail). Pure apart from mutating events."""
    trail = EarlyTrail()
    kept: list[Ev] = []
    memo = _fired(catalog)
    for ev in events:
        key = _fired_key(catalog, ev)
        done = memo.get(key) if key is not None else None
        if done is None:
            done = _run_rules(catalog, ev)
            if key is not None:
                if len(memo) >= 4096:
                    memo.clear()
                memo[key] = done
            dropped = any(action == "drop" for _, action in done)
            for rule, action in done:
                trail.note(rule, ev, action)
        else:
            dropped = False
            for rule, action in done:         # as _run_rules did it, on this event
                if action == "drop":
                    ev.role = ev.role or "noise"
                    dropped = True
                else:
                    apply_tag(ev, rule.tag, rule.output)
                    ev.early_rules.append(rule.id)
                trail.note(rule, ev, action)
        if ev.role is None:
            ev.role = "context"         # nothing claimed it: kept for the timeline, never blamed
        if dropped or ev.role == "noise":
            continue
        kept.append(ev)
    return kept, trail


def _fired_key(catalog: Catalog, ev: Ev) -> tuple | None:
    """The memo key of ``ev`` (None: not remembered): its kind and role and each value its rules read, with
    its type (the terms compare str() forms too: 1, True and "1" read apart)."""
    read = _key_reader(catalog, ev.kind)
    if read is None:
        return None
    key = read(ev)
    try:
        hash(key)
    except TypeError:                   # a list or dict field: not remembered
        return None
    return key


@lru_cache(maxsize=4096)
def _key_reader(catalog: Catalog, kind: str) -> Callable[[Ev], tuple] | None:
    """``_fired_key``'s reading of an event of this kind as one function made once a kind (None: the kind
    is not remembered): (the kind, role and values read, their types), by C getters, in a few steps
    an event. A key that names no attribute of an event reads None on every event: it tells none apart."""
    keys = _read_by(catalog, kind)
    if keys is None:
        return None
    attrs = attrgetter("kind", "role", *(k for k in keys if k in Ev.__slots__ and k not in ("kind", "role")))
    names = tuple(k[7:] for k in keys if k.startswith("fields."))

    def read(ev: Ev) -> tuple:
        values = attrs(ev) + tuple(map(ev.fields.get, names))
        return values, tuple(map(type, values))
    return read


def _run_rules(catalog: Catalog, ev: Ev) -> tuple[tuple[EarlyRule, str], ...]:
    """The EARLY rules of ``ev``'s kind, in priority order, applied to it: what fired, in order."""
    done: list[tuple[EarlyRule, str]] = []
    for rule in _rules_for(catalog, ev.kind):
        if not holds(rule.when, ev):
            continue
        if rule.action == "drop":
            ev.role = ev.role or "noise"
            done.append((rule, "drop"))
            break
        if rule.action == "tag" and rule.tag is not None:
            apply_tag(ev, rule.tag, rule.output)
            ev.early_rules.append(rule.id)
            done.append((rule, "tag"))
        elif rule.action == "decode" and rule.decoder:
            tag = decoder_named(rule.decoder)(decoder_input(ev))
            if tag is not None:
                apply_tag(ev, tag, rule.output)
            ev.early_rules.append(rule.id)
            done.append((rule, "decode"))
    return tuple(done)
