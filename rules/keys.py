"""The keys each part of a catalog file may hold. YAML takes any key, so a misspelt one
(``outptu:``, ``nextstep:``) would be silently ignored: the catalog loader refuses it,
naming the key and the closest known one.
"""
from __future__ import annotations

from collections.abc import Collection, Iterable

DOC = ("title", "description", "status", "priority")
PATTERN = frozenset({"id", *DOC, "sources", "anchors", "regex", "unless", "ignore_case", "kind", "types", "set",
                     "group_by", "gpu", "rank", "host", "onset_ms", "stamp", "aggregate_ranks", "references",
                     "falsepositives", "examples", "scope", "pod", "dates_above", "in_block"})
IN_BLOCK = frozenset({"anchor", "start", "header", "kind"})
EARLY = frozenset({"id", *DOC, "when", "action", "tag", "decoder", "output", "examples"})
TAG = frozenset({"role", "domain", "sub_domain", "strength", "fields", "next_step"})
FINAL = frozenset({"id", *DOC, "source", "target", "join", "window_s", "before_s", "equal", "references", "examples"})
MATCHER = frozenset({"regex", "exists", "not"})
TAXONOMY_ROW = frozenset({"recovery", "summary", "next_step"})

# examples: -> the lists it holds, and the keys of one example given as a mapping
PATTERN_EXAMPLES = frozenset({"match", "no_match"})
PATTERN_EXAMPLE = frozenset({"line", "source", "fields"})
EARLY_EXAMPLES = frozenset({"fires", "quiet"})
EARLY_EXAMPLE = frozenset({"line", "source", "lines"})      # lines: a metrics series
SCENARIO = frozenset({"files", "workload"})

# The top level of a file, by the folder it sits in (lists are shared by every file).
TOP = {"extract/": frozenset({"patterns", "lists"}),
       "early/": frozenset({"rules", "lists"}),
       "final/": frozenset({"explains", "same_fault", "refines", "clears", "settings", "lists"})}


def unknown(keys: Iterable[object], known: Collection[str]) -> list[str]:
    """One problem per key not in ``known``: the closest known key, else all of them."""
    out = []
    for key in keys:
        if key in known:
            continue
        import difflib      # only for a misspelt key: not at start-up

        close = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.75)
        hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(sorted(known))}"
        out.append(f"unknown key {key!r} ({hint})")
    return out


def settings_keys() -> frozenset[str]:
    """The FINAL settings the engine reads (its defaults name them all)."""
    from .final import DEFAULT_SETTINGS       # final imports the catalog: imported when first asked

    return frozenset(DEFAULT_SETTINGS)
