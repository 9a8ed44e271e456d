"""Registered Python rules (FINAL stage). Importing this package registers them."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PythonRule:
    id: str
    title: str
    description: str
    priority: int
    fn: Callable[[Any], None]
    examples: Mapping[str, list[Mapping[str, Any]]] = field(default_factory=dict)


FINAL_RULES: dict[str, PythonRule] = {}


def final_rule(id: str, title: str, description: str, priority: int,
               examples: Mapping[str, list[Mapping[str, Any]]] | None = None) -> Callable:
    """Register a FINAL rule. ``examples`` holds ``fires``/``quiet`` scenarios for ``rules test``."""

    def register(fn: Callable[[Any], None]) -> Callable[[Any], None]:
        if id in FINAL_RULES:
            raise ValueError(f"final rule {id!r} registered twice")
        FINAL_RULES[id] = PythonRule(id=id, title=title, description=description, priority=priority,
                                     fn=fn, examples=examples or {})
        return fn

    return register


def ordered() -> list[PythonRule]:
    return sorted(FINAL_RULES.values(), key=lambda r: (-r.priority, r.id))


from . import final_rules as _final_rules  # noqa: E402,F401  (registers the built-in rules)
from . import silent_ranks as _silent_ranks  # noqa: E402,F401  (final.silent_ranks, issue 20 item 6)
from . import desync as _desync  # noqa: E402,F401  (final.desync, issue 21 item 4)
