"""EARLY rules run once per kind and the values they read (rules/early.py run_early's memo): every
event comes out as if the rules had been run on it alone."""
from pathlib import Path

import pytest

from firstfault.rules import early, engine
from firstfault.rules.catalog import load_catalog

SAMPLES = sorted(p for p in (Path(__file__).resolve().parents[1] / "samples").iterdir()
                 if (p / "workload.json").exists())


def _tagged(events):
    return [(e.signature, e.role, e.domain, e.sub_domain, e.strength, e.output, tuple(e.early_rules),
             sorted(e.fields.items(), key=repr)) for e in events]


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_remembered_outcomes_are_the_rules_own(sample):
    catalog = load_catalog()
    analysis = engine.analyze_path(sample)
    fresh = [e.copy() for e in analysis.events]
    for e in fresh:
        e.role = e.domain = e.sub_domain = e.output = None
        e.early_rules = []
    alone = [e.copy() for e in fresh]
    alone_kept = []
    for e in alone:                                   # each event through the rules, nothing remembered
        done = early._run_rules(catalog, e)
        if e.role is None:
            e.role = "context"
        if not any(a == "drop" for _, a in done) and e.role != "noise":
            alone_kept.append(e)
    early._fired(catalog).clear()
    first, trail1 = early.run_early(catalog, [e.copy() for e in fresh])
    again, trail2 = early.run_early(catalog, [e.copy() for e in fresh])      # every outcome remembered now
    assert _tagged(first) == _tagged(again) == _tagged(alone_kept)
    assert trail1.steps == trail2.steps


def test_a_field_a_rule_reads_keeps_events_apart():
    """Two events of one kind that differ in a field a rule reads do not share an outcome; a kind with a
    decoder is never remembered."""
    from firstfault.rules.model import Ev

    catalog = load_catalog()
    kinds = sorted({kind for r in catalog.early for key, m in r.when.terms if key == "kind"
                    for kind in ([m.arg] if isinstance(m.arg, str) else list(m.arg))})
    read = {k: early._read_by(catalog, k) for k in kinds}
    kind, field = next((k, key[len("fields."):]) for k, keys in read.items() if keys
                       for key in keys if key.startswith("fields."))

    def event(value):
        return Ev(kind=kind, pattern="p", source="app", path="a.log", line=1, text="x", fields={field: value})

    assert early._fired_key(catalog, event(1)) != early._fired_key(catalog, event(2))
    assert early._fired_key(catalog, event(1)) != early._fired_key(catalog, event("1"))
    assert early._fired_key(catalog, event(1)) == early._fired_key(catalog, event(1))
    decoded = next(k for k, keys in read.items() if keys is None)
    assert early._fired_key(catalog, Ev(kind=decoded, pattern="p", source="app", path="a.log", line=1, text="x")) is None
