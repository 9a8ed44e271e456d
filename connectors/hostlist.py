"""Slurm hostlist expressions -> node names, with Slurm's own semantics.

Follows ``src/common/hostlist.c`` (``_hostlist_create_bracketed`` and
``_push_range_list``) for one-dimensional clusters:

* top-level commas separate entries; commas inside brackets separate ranges;
* a bracket holds numbers and ``lo-hi`` ranges; the width of ``lo`` as written sets
  the zero padding (``[08-10]`` -> ``08 09 10``, ``[8-10]`` -> ``8 9 10``);
* several bracket groups in one entry expand as a product, leftmost outermost
  (``r[1-2]n[1-2]`` -> ``r1n1 r1n2 r2n1 r2n2``); text after the last bracket is a suffix;
* order is kept and duplicates stay (as Slurm keeps them); negative numbers,
  ``lo > hi`` and unbalanced brackets are errors.
"""
from __future__ import annotations

import re

MAX_HOSTS = 1 << 20          # a typo such as [0-999999999] must not eat the machine

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class HostlistError(ValueError):
    """A hostlist expression Slurm itself would refuse."""


def _split_top(expr: str) -> list[str]:
    """Split on commas and whitespace outside brackets."""
    out, depth, cur = [], 0, []
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in {expr!r}")
        if depth == 0 and (ch == "," or ch.isspace()):
            if cur:
                out.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    if depth != 0:
        raise HostlistError(f"unbalanced '[' in {expr!r}")
    if cur:
        out.append("".join(cur))
    return out


def _numbers(body: str, expr: str, limit: int) -> list[str]:
    values: list[str] = []
    for part in body.split(","):
        m = _RANGE.match(part.strip())
        if not m:
            raise HostlistError(f"invalid range {part!r} in {expr!r}")
        lo_s, hi_s = m.group(1), m.group(2)
        lo, hi = int(lo_s), int(hi_s if hi_s is not None else lo_s)
        if lo > hi:
            raise HostlistError(f"invalid range {part!r} in {expr!r} (start after end)")
        if hi - lo + 1 > limit or len(values) + hi - lo + 1 > limit:
            raise HostlistError(f"{expr!r} expands to more than {limit} hosts")
        width = len(lo_s)
        values.extend(f"{n:0{width}d}" for n in range(lo, hi + 1))
    return values


def _expand_entry(entry: str, expr: str, limit: int) -> list[str]:
    pieces = re.split(r"(\[[^\[\]]*\])", entry)
    if any("[" in p or "]" in p for p in pieces if not (p.startswith("[") and p.endswith("]"))):
        raise HostlistError(f"nested or stray bracket in {expr!r}")
    names = [""]
    for piece in pieces:
        if piece.startswith("[") and piece.endswith("]"):
            nums = _numbers(piece[1:-1], expr, limit)
            if len(names) * len(nums) > limit:
                raise HostlistError(f"{expr!r} expands to more than {limit} hosts")
            names = [n + v for n in names for v in nums]
        else:
            names = [n + piece for n in names]
    return names


def expand(expr: str | None, limit: int = MAX_HOSTS) -> list[str]:
    """``"node-[01-04,07]"`` -> ``["node-01", "node-02", "node-03", "node-04", "node-07"]``.

    An empty string, ``None`` and Slurm's ``"None assigned"`` give ``[]``. More than
    ``limit`` names is a HostlistError, raised before they are built.
    """
    if expr is None:
        return []
    expr = expr.strip()
    if not expr or expr in ("None assigned", "(null)"):
        return []
    out: list[str] = []
    for entry in _split_top(expr):
        out.extend(_expand_entry(entry, expr, limit))
        if len(out) > limit:
            raise HostlistError(f"{expr!r} expands to more than {limit} hosts")
    return out
