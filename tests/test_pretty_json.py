"""schemas/pretty_json.py writes exactly what json.dumps(sort_keys=True, ensure_ascii=False, indent=2) does."""
from __future__ import annotations

import enum
import json
import random
from pathlib import Path

import pytest

from firstfault.rules.engine import analyze_path
from firstfault.schemas.pretty_json import dumps_sorted_indented

ROOT = Path(__file__).resolve().parents[1]


def reference(value):
    return json.dumps(value, sort_keys=True, ensure_ascii=False, indent=2)


class Level(enum.IntEnum):
    HIGH = 3


class Text(str):
    pass


EDGES = [
    {}, [], (), {"a": []}, [{}], {"a": {}}, None, True, False, 0, -1, 2 ** 70, "", "s",
    1.0, -0.0, 1e16, 1e-7, 0.1, float("inf"), -float("inf"),
    "quote \" backslash \\ newline \n nul \x00 line-sep \u2028 accents é emoji 😀 lone \udc80",
    {"b": 1, "a": [1, 2.5, None, True, False]}, {"k": (1, {"z": [], "y": {}})},
    {1: "int keys", 3: "sorted as numbers"}, {True: 1}, {Text("k"): Text("v")}, {"level": Level.HIGH},
]


@pytest.mark.parametrize("value", EDGES, ids=range(len(EDGES)))
def test_the_edges_are_written_as_json_writes_them(value):
    assert dumps_sorted_indented(value) == reference(value)


def test_nan_is_written_as_json_writes_it():
    assert dumps_sorted_indented([float("nan")]) == "[\n  NaN\n]" == reference([float("nan")])


def _random(rnd: random.Random, depth: int = 0):
    k = rnd.random()
    if depth > 4 or k < 0.4:
        return rnd.choice([None, True, False, rnd.randint(-10 ** 20, 10 ** 20),
                           rnd.random() * 10 ** rnd.randint(-30, 30),
                           "".join(chr(rnd.randint(0, 0x2FFF)) for _ in range(rnd.randint(0, 8)))])
    if k < 0.7:
        return [_random(rnd, depth + 1) for _ in range(rnd.randint(0, 4))]
    return {"".join(chr(rnd.randint(32, 0x500)) for _ in range(rnd.randint(0, 5))): _random(rnd, depth + 1)
            for _ in range(rnd.randint(0, 4))}


def test_random_values_are_written_as_json_writes_them():
    rnd = random.Random(24)
    for _ in range(5000):
        value = _random(rnd)
        assert dumps_sorted_indented(value) == reference(value)


def test_what_json_refuses_is_refused_with_its_error():
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        dumps_sorted_indented(loop)
    with pytest.raises(TypeError, match="not JSON serializable"):
        dumps_sorted_indented({"a": object()})
    with pytest.raises(TypeError):
        dumps_sorted_indented({"a": 1, 2: 3})          # keys of mixed types do not sort


@pytest.mark.parametrize("sample", ["gpu-fell-off-bus-32node", "worked-example", "ambiguous-two-faults"])
def test_a_diagnosis_is_the_text_it_was(sample):
    d = analyze_path(ROOT / "samples" / sample).diagnosis
    assert d.to_json() == reference(d.to_dict())
