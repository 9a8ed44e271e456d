"""Registered decoders: pure functions that turn an event's captured fields into a Tag.

An EARLY rule with ``action: decode`` and ``decoder: NAME`` calls ``DECODERS[NAME]``
with the event's fields (a dict of already-typed values) and returns a :class:`Tag`,
or ``None`` when the decoder has nothing to say (the event then keeps no role and the
next rule may tag it).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

ROLES = ("root", "symptom", "context", "marker", "noise")


@dataclass(frozen=True)
class Tag:
    role: str                                   # root | symptom | context | marker | noise
    domain: str | None = None                   # taxonomy domain (roots)
    sub_domain: str | None = None               # taxonomy sub_domain (roots)
    # strong | weak: a weak root yields to any strong root before it | echo: weak, and text other
    # faults also produce, so never attributed on its own (contract section 2)
    strength: str = "strong"
    fields: Mapping[str, Any] = field(default_factory=dict)   # decoded fields to add to the event
    output: str | None = None                   # one human sentence; {host} {gpu} {rank} and field names are filled in
    next_step: str | None = None                # what to do, when more precise than the taxonomy row's (a template too)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"unknown role {self.role!r}")
        if self.role == "root" and not (self.domain and self.sub_domain):
            raise ValueError("a root tag needs a domain and a sub_domain")
        if self.strength not in ("strong", "weak", "echo"):
            raise ValueError(f"unknown strength {self.strength!r}")


Decoder = Callable[[Mapping[str, Any]], "Tag | None"]
DECODERS: dict[str, Decoder] = {}


def decoder(name: str) -> Callable[[Decoder], Decoder]:
    """Register a decoder under ``name`` (used by ``decoder:`` in EARLY rules)."""

    def register(fn: Decoder) -> Decoder:
        if name in DECODERS:
            raise ValueError(f"decoder {name!r} registered twice")
        DECODERS[name] = fn
        return fn

    return register


_LOADED = False


def load_builtin_decoders() -> None:
    """Import the decoder modules so their @decoder registrations run (once)."""
    global _LOADED
    if _LOADED:
        return
    import importlib
    import pkgutil

    for mod in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{mod.name}")
    _LOADED = True


def decoder_named(name: str) -> Decoder:
    """The decoder registered as ``name``; the built-in modules are imported at the first call, not at
    start-up (a catalog restored from the cache was checked when it was built; most inputs decode nothing)."""
    found = DECODERS.get(name)
    if found is None:
        load_builtin_decoders()
        found = DECODERS[name]
    return found
