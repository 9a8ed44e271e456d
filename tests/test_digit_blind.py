"""Lines alike but for their digits: the extractor remembers how such a line matched (which pattern,
the groups' offsets) and reads the next one's groups off its own text. Sound only for patterns that
read the ten ASCII digits alike (regex.digit_blind); these check that judgement and the result."""
import random

import pytest

from firstfault.rules.catalog import load_catalog
from firstfault.rules.extract import Extractor
from firstfault.rules.model import EventSet
from firstfault.rules.regex import LinearRegex, digit_blind
from firstfault.schemas import WorkloadRecord

CATALOG = load_catalog()
WORKLOAD = WorkloadRecord.model_validate({"workload_id": "digits", "state": "FAILED", "start_time": "2026-11-02T08:00:00Z",
                                          "nodes": ["node-01", "node-02"], "gpus_per_node": 8})


@pytest.mark.parametrize("pattern, blind", [
    (r"\[Rank (?P<rank>\d+)\] Watchdog", True),            # \d, a group's name with a digit
    (r"opId=(?P<op>0x[0-9a-f]+)", False),                  # a literal 0
    (r"busId (?P<bus>[0-9a-f]+)", True),                    # a class's whole 0-9
    (r"Xid \(PCI:[^)]*\): 79", False),
    (r"[0-5]", False), (r"[--0-9]", False), (r"\x31", False), (r"\x{31}", False), (r"(a)\1", False),
    (r"\s{0,8}\d{1,7}: ", True), (r"x{,3}", False), (r"\{2\}", False), (r"[{1}]", False),
    (r"[[:digit:]]+", True), (r"[[:alpha:]1]", False), (r"\p{Nd}", True),
])
def test_digit_blind_judges_the_regex_text(pattern, blind):
    assert digit_blind(pattern) is blind


def _variant(rng: random.Random, line: str) -> str:
    return "".join(rng.choice("0123456789") if c in "0123456789" and rng.random() < 0.5 else c for c in line)


def test_blind_patterns_match_digit_variants_at_the_same_offsets():
    rng = random.Random(24)
    for pat in CATALOG.patterns:
        if not pat.digit_blind:
            continue
        for ex in pat.match_examples + pat.nomatch_examples:
            for line in ex.line.split("\n"):
                for _ in range(3):
                    other = _variant(rng, line)
                    a, b = line.encode(), other.encode()
                    sa, sb = pat.spans(a), pat.spans(b)
                    assert (sa is None) == (sb is None) and (sa is None or list(sa) == list(sb)), (pat.id, line, other)


def _events(lines: list[str], one_extractor: bool) -> list:
    """Each line's event, read by one extractor (its memory of earlier lines in use) or a fresh one each."""
    ex = Extractor(CATALOG, WORKLOAD)
    out = []
    for i, line in enumerate(lines):
        ex = ex if one_extractor else Extractor(CATALOG, WORKLOAD)
        events = EventSet()
        data = (line + "\n").encode()
        ex.scan_file(f"logs/app/node-0{1 + i % 2}.log", [data], events)
        out.append([e.canonical() for e in events.sorted()])
    return out


def test_lines_alike_but_for_digits_extract_as_if_alone():
    rng = random.Random(7)
    lines = []
    for pat in CATALOG.patterns:
        for ex in pat.match_examples:
            if ex.source not in (None, "app"):
                continue
            first = ex.line.split("\n")[0]
            lines += [first, _variant(rng, first), _variant(rng, first)]
    assert _events(lines, one_extractor=True) == _events(lines, one_extractor=False)


def test_a_regex_that_tells_digits_apart_is_not_remembered():
    # "exit code 1" and "exit code 2" differ in a literal digit of the regex: never taken for one another
    rx = LinearRegex(r"exit code 1\b")
    assert not rx.digit_blind
    assert rx.spans(b"exit code 1") is not None and rx.spans(b"exit code 2") is None
