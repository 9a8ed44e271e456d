"""Find catalog regexes that backtrack catastrophically, with a witness line.

The engine runs every pattern in RE2 (linear time), so such a pattern cannot
hang firstfault; ``rules lint`` still rejects it because the catalog is also
read by backtracking engines (the catalog tests, users' own tools, ports of a
rule elsewhere), where the same pattern hangs on a 230-byte line.

Two static checks, each confirmed by timing Python's ``re`` on a generated
witness (interrupted by a timer, so a check never hangs lint):

* an alternation inside a repeat whose alternatives match a common string:
  ``(?:, \\w+=(?:\\[[^\\]]*\\]|[^,()]*))*`` reads ``, a=[a]`` two ways, so n
  items have 2**n parses when the line then fails to match;
* nested or adjacent quantifiers over overlapping characters, found by
  ``regexploit`` (``(\\w+\\s?)*$``, ``(a+)+$``).
"""
from __future__ import annotations

import re
import signal
import threading
import time
import warnings
from dataclasses import dataclass
from re import _compiler as sre_compile        # type: ignore[attr-defined]
from re import _constants as C                 # type: ignore[attr-defined]
from re import _parser as sre_parse            # type: ignore[attr-defined]

PUMP_SMALL, PUMP_LARGE = 12, 22
BUDGET_S = 1.0                 # a witness search that runs this long is confirmed catastrophic
_KILLERS = ("", "!", "\x00", ")", "\n")
_POOL = "a0 _-=.:,;/!x[](){}'\"\t"


@dataclass(frozen=True)
class Finding:
    problem: str               # what is wrong, in words
    witness: str               # a Python expression for the input, e.g. "'x' + ', a=[a]' * 22 + '!'"
    seconds: float | None      # Python re's time on the witness (None: not measured), >= BUDGET_S if cut


# ---------------------------------------------------------------- samples
def _in_set(ch: str, items: list) -> bool:
    code = ord(ch)
    hit = False
    negate = False
    for op, av in items:
        if op is C.NEGATE:
            negate = True
        elif op is C.LITERAL:
            hit |= code == av
        elif op is C.RANGE:
            hit |= av[0] <= code <= av[1]
        elif op is C.CATEGORY:
            hit |= _category(ch, av)
        elif op in (C.RANGE_UNI_IGNORE,):
            hit |= av[0] <= code <= av[1]
    return hit != negate


def _category(ch: str, cat) -> bool:
    table = {
        C.CATEGORY_DIGIT: ch.isdigit(), C.CATEGORY_NOT_DIGIT: not ch.isdigit(),
        C.CATEGORY_SPACE: ch.isspace(), C.CATEGORY_NOT_SPACE: not ch.isspace(),
        C.CATEGORY_WORD: ch.isalnum() or ch == "_", C.CATEGORY_NOT_WORD: not (ch.isalnum() or ch == "_"),
    }
    return table.get(cat, False)


class _Sampler:
    """One string a (sub)pattern matches; chosen alternatives and repeat counts by node id."""

    def __init__(self, choose: dict[int, int] | None = None, marks: set[int] | None = None) -> None:
        self.choose = choose or {}
        self.marks = marks or set()
        self.ends: dict[int, int] = {}
        self.out: list[str] = []

    def text(self) -> str:
        return "".join(self.out)

    def seq(self, sp) -> None:
        for op, av in sp.data if hasattr(sp, "data") else sp:
            self.node(op, av)

    def node(self, op, av) -> None:
        if op is C.LITERAL:
            self.out.append(chr(av))
        elif op is C.NOT_LITERAL:
            self.out.append("a" if av != ord("a") else "b")
        elif op is C.ANY:
            self.out.append("a")
        elif op is C.IN:
            self.out.append(next((c for c in _POOL if _in_set(c, av)), "a"))
        elif op in (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT):
            lo, hi, body = av
            n = self.choose.get(id(av), max(lo, 1))
            n = min(n, hi) if hi is not C.MAXREPEAT else n
            for _ in range(n):
                self.seq(body)
            if id(av) in self.marks:
                self.ends[id(av)] = len(self.text())
        elif op is C.SUBPATTERN:
            self.seq(av[-1])
        elif op is C.ATOMIC_GROUP:
            self.seq(av)
        elif op is C.BRANCH:
            alts = av[1]
            self.seq(alts[self.choose.get(id(av), 0) % len(alts)])
        # AT, ASSERT, ASSERT_NOT, GROUPREF...: contribute nothing


def _sample(sp) -> str:
    s = _Sampler()
    s.seq(sp)
    return s.text()


# ---------------------------------------------------------------- ambiguity under a repeat
def _walk(sp, inside: tuple = ()):
    """Yield (op, av, enclosing repeats) for every node."""
    for op, av in sp.data if hasattr(sp, "data") else sp:
        yield op, av, inside
        if op in (C.MAX_REPEAT, C.MIN_REPEAT):
            lo, hi, body = av
            deeper = inside + ((av,) if hi is C.MAXREPEAT or hi > 1 else ())
            yield from _walk(body, deeper)
        elif op is C.SUBPATTERN:
            yield from _walk(av[-1], inside)
        elif op is C.BRANCH:
            for alt in av[1]:
                yield from _walk(alt, inside)
        # atomic groups and possessive repeats never backtrack into themselves: not entered


def _ambiguous_branches(parsed) -> list[tuple[tuple, tuple, int]]:
    """(repeat, branch, alternative) where the alternative's sample is matched whole by another."""
    found = []
    for op, av, repeats in _walk(parsed):
        if op is not C.BRANCH or not repeats:
            continue
        alts = av[1]
        compiled = [sre_compile.compile(sre_parse.SubPattern(parsed.state, list(a.data)), parsed.state.flags)
                    for a in alts]
        for i, alt in enumerate(alts):
            sample = _sample(alt)
            if any(j != i and compiled[j].fullmatch(sample) for j in range(len(alts))):
                found.append((repeats[-1], av, i))
                break
    return found


# ---------------------------------------------------------------- timing
class _Cut(Exception):
    pass


def _timed(regex: re.Pattern[str], text: str) -> float:
    """Seconds ``regex.search(text)`` takes, at most BUDGET_S (a timer interrupts it)."""
    if threading.current_thread() is not threading.main_thread():
        return 0.0                       # signals reach the main thread only: do not risk a hang

    def cut(*_):
        raise _Cut()

    old = signal.signal(signal.SIGALRM, cut)
    signal.setitimer(signal.ITIMER_REAL, BUDGET_S)
    start = time.perf_counter()
    try:
        regex.search(text)
    except _Cut:
        return BUDGET_S
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return time.perf_counter() - start


def _confirm(regex: re.Pattern[str], build) -> tuple[str, float] | None:
    """The first killer (in a fixed order, so the witness is stable) with which the time
    grows fast with the pump: cut at the budget, or 8x from the small pump to the large."""
    for killer in _KILLERS:
        small = _timed(regex, build(PUMP_SMALL, killer))
        large = _timed(regex, build(PUMP_LARGE, killer))
        if large >= BUDGET_S or (large > 0.05 and large > 8 * max(small, 1e-6)):
            return killer, large
    return None


def _expr(prefix: str, pump: str, n: int, killer: str) -> str:
    parts = ([repr(prefix)] if prefix else []) + [f"{pump!r} * {n}"] + ([repr(killer)] if killer else [])
    return " + ".join(parts)


def find_redos(pattern: str, ignore_case: bool = False) -> list[Finding]:
    """Catastrophic-backtracking findings for one pattern (empty: none found)."""
    flags = re.IGNORECASE if ignore_case else 0
    try:
        parsed = sre_parse.parse(pattern, flags)
        regex = re.compile(pattern, flags)
    except re.error:
        return []                        # not Python syntax: the RE2 compile reports what is wrong
    findings: list[Finding] = []
    for rep, branch, alt in _ambiguous_branches(parsed):
        def build(n: int, killer: str, rep=rep, branch=branch, alt=alt) -> str:
            s = _Sampler(choose={id(rep): n, id(branch): alt}, marks={id(rep)})
            s.seq(parsed)
            return s.text()[:s.ends.get(id(rep), len(s.text()))] + killer

        def pieces(rep=rep, branch=branch, alt=alt) -> tuple[str, str]:
            one, two = (_Sampler(choose={id(rep): k, id(branch): alt}, marks={id(rep)}) for k in (1, 2))
            one.seq(parsed)
            two.seq(parsed)
            end1, end2 = one.ends[id(rep)], two.ends[id(rep)]
            return one.text()[:end1 - (end2 - end1)], one.text()[end1 - (end2 - end1):end1]

        prefix, pump = pieces()
        hit = _confirm(regex, build)
        killer, secs = hit if hit else ("!", None)
        findings.append(Finding(
            problem="alternatives inside a repeat match the same text, so a line that almost matches "
                    "is tried in 2**n ways",
            witness=_expr(prefix, pump, PUMP_LARGE, killer), seconds=secs))
    findings.extend(_regexploit(pattern, flags, regex))
    return findings


def _regexploit(pattern: str, flags: int, regex: re.Pattern[str]) -> list[Finding]:
    try:
        with warnings.catch_warnings():          # it imports the deprecated sre_* modules
            warnings.simplefilter("ignore", DeprecationWarning)
            from regexploit.ast.sre import SreOpParser
            from regexploit.redos import find
    except ImportError:                  # optional: the ambiguity check above still runs
        return []
    try:
        found = find(SreOpParser().parse_sre(pattern, flags))
    except Exception:                    # its parser does not know every construct
        return []
    out = []
    for r in found:
        if r.starriness <= 2:
            continue
        prefix = r.example_prefix
        rep = r.repeated_character.example()
        killer = r.killer.example() if r.killer else ""
        secs = _timed(regex, prefix + rep * 3000 + killer)
        out.append(Finding(problem=f"nested quantifiers over overlapping characters (regexploit starriness "
                                   f"{r.starriness})",
                           witness=_expr(prefix, rep, 3000, killer), seconds=secs or None))
    return out
