"""Every sample bundle gives its documented result, deterministically."""
import json
import random
import subprocess
import sys

import pytest

from firstfault.rules.catalog import load_catalog
from firstfault.rules.diagnose import diagnose
from firstfault.rules.engine import analyze_path, extract_records
from firstfault.rules.extract import Extractor, LineMemory, source_of
from firstfault.rules.model import Ev, EventSet
from firstfault.rules.bundle import open_bundle
from firstfault.schemas import RawLine

from conftest import sample_dirs

KEYS = ("status", "terminal_state", "domain", "sub_domain", "responsible_nodes", "suspect_nodes")


@pytest.mark.parametrize("sample", sample_dirs(), ids=lambda p: p.name)
def test_sample_gives_its_documented_result(sample):
    expected = json.loads((sample / "expected.json").read_text())
    got = analyze_path(sample).diagnosis.to_dict()
    assert {k: got[k] for k in KEYS} == {k: expected[k] for k in KEYS}
    assert got["recovery"]["action"] == expected["recovery_action"], got["recovery"]
    # Only node actions name nodes, and then the responsible ones.
    want_nodes = expected["responsible_nodes"] if expected["recovery_action"] in ("drain_nodes", "retry_excluding_nodes") else []
    assert got["recovery"]["nodes"] == want_nodes


def test_worked_example_keeps_the_nccl_reports_as_symptoms():
    d = analyze_path(next(p for p in sample_dirs() if p.name == "worked-example")).diagnosis
    assert d.root_cause is not None and d.root_cause.host == "node-02" and d.root_cause.fields["xid"] == 149
    kinds = {s.kind for s in d.symptoms}
    assert {"watchdog_timeout", "nccl_remote_error"} <= kinds
    assert any(s.kind == "nccl_ib_error" for s in d.symptoms)           # demoted weak root, kept as evidence
    assert d.symptom_coverage >= 0.9
    assert {e.join for e in d.explains} >= {"within_timeout_window", "after_onset"}


def _records(sample):
    bundle = open_bundle(sample)
    out = []
    for f in bundle.files:
        data = b"".join(f.open_chunks())
        for i, raw in enumerate(data.split(b"\n"), 1):
            if raw or i <= data.count(b"\n"):
                out.append(RawLine(path=f.path, line=i, text=raw.decode("utf-8", "surrogateescape"),
                                   source=source_of(f.path)))
    return bundle, out


@pytest.mark.parametrize("sample", sample_dirs(), ids=lambda p: p.name)
def test_same_bundle_twice_is_byte_identical(sample):
    assert analyze_path(sample).diagnosis.to_json() == analyze_path(sample).diagnosis.to_json()


def test_interleaving_across_hosts_does_not_change_a_byte():
    """Lines fed in any interleaving across hosts, in any batch sizes, give the same JSON."""
    sample = next(p for p in sample_dirs() if p.name == "gpu-fell-off-bus-32node")
    offline = analyze_path(sample).diagnosis.to_json()
    bundle, records = _records(sample)
    catalog = load_catalog()
    for seed in (1, 2, 3):
        rng = random.Random(seed)
        by_file = {}
        for r in records:
            by_file.setdefault(r.path, []).append(r)
        queues = [list(v) for v in by_file.values()]
        mixed = []
        while queues:                      # per-host order kept, hosts interleaved at random
            q = rng.choice(queues)
            mixed.append(q.pop(0))
            if not q:
                queues.remove(q)
        events = EventSet()
        ex = Extractor(catalog, bundle.workload)
        memory = LineMemory()
        size = rng.randint(50, 5000)
        for i in range(0, len(mixed), size):
            batch = EventSet()
            extract_records(ex, mixed[i:i + size], batch, memory=memory)
            events.update(batch.sorted())
        from firstfault.rules.engine import _inventory
        inv = _inventory(bundle)
        assert diagnose(bundle.workload, events.sorted(), catalog, inv).to_json() == offline


def test_diagnose_leaves_the_callers_events_as_they_were():
    """diagnose works on copies (the stream keeps its events in state): every field of every
    event the caller passed is the same afterwards, containers included."""
    sample = next(p for p in sample_dirs() if p.name == "worked-example")
    bundle, records = _records(sample)
    catalog = load_catalog()
    events = EventSet()
    extract_records(Extractor(catalog, bundle.workload), records, events, memory=LineMemory())
    evs = events.sorted()
    before = [tuple(repr(getattr(e, name)) for name in Ev.__slots__) for e in evs]
    from firstfault.rules.engine import _inventory
    d = diagnose(bundle.workload, evs, catalog, _inventory(bundle))
    assert d.status == "attributed" and d.symptoms        # the rules did run: roles, edges, symptoms
    assert [tuple(repr(getattr(e, name)) for name in Ev.__slots__) for e in evs] == before
    assert all(e.role is None for e in evs)


def test_an_event_copy_has_every_field_and_its_own_containers():
    ev = Ev(kind="xid", pattern="p", source="kernel", path="logs/syslog/n1.log", line=3, text="t", host="n1",
            gpu_index=2, fields={"xid": 79}, ranks={1, 2}, signature="s", role="root", early_rules=["r"])
    other = ev.copy()
    assert [getattr(other, n) for n in Ev.__slots__] == [getattr(ev, n) for n in Ev.__slots__]
    other.fields["xid"] = 48
    other.ranks.add(3)
    other.early_rules.append("q")
    assert ev.fields == {"xid": 79} and ev.ranks == {1, 2} and ev.early_rules == ["r"]


def test_cli_json_is_the_diagnosis(tmp_path):
    sample = next(p for p in sample_dirs() if p.name == "worked-example")
    out = subprocess.run([sys.executable, "-m", "firstfault", "analyze", str(sample), "--json"],
                         capture_output=True, text=True, check=True)
    assert out.stdout == analyze_path(sample).diagnosis.to_json() + "\n"
