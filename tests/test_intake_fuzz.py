"""Property tests of the bundle opener and the workload parser (issue 10): whatever the input,
the answer is a bundle (or a record) or a BundleError, never another exception.

Time-bounded and reproducible: derandomized, a fixed number of small examples each.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from firstfault.rules.bundle import Bundle, open_archive, parse_workload
from firstfault.rules.errors import BundleError
from firstfault.rules.intake import Intake, open_input
from firstfault.rules.jsonsafe import load_json
from firstfault.schemas import WorkloadRecord

from conftest import BASE_WORKLOAD
from archives import archive as _archive

FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Arbitrary JSON, big integers and odd floats included.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10 ** 30), max_value=10 ** 30)
    | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)
FIELDS = ("workload_id", "attempt", "scheduler", "state", "exit_code", "start_time", "end_time", "nodes",
          "gpus_per_node", "ranks", "time_limit_s", "pods", "timezone", "boot_times")
# A valid record with some fields replaced by arbitrary JSON: the validators' edges, not just "not an object".
mutated_workloads = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=4).map(
    lambda changes: {**BASE_WORKLOAD, **changes})
stamps = st.sampled_from(["2026-11-02T10:00:00Z", "9999-12-31T23:59:59-05:00", "0001-01-01T00:00:00+05:00",
                          "[99999999999999999.000000]", "Nov  2 10:03:11", "[ 12.5]", ""])
log_lines = st.builds(lambda s, h, m: f"{s} {h} {m}", stamps,
                      st.sampled_from(["node-01", "node-02 kernel:", "[rank99999999999999999999]:", ""]),
                      st.sampled_from(["NVRM: Xid (PCI:0000:1b:00): 79, pid=1, GPU has fallen off the bus.",
                                       "RuntimeError: CUDA error: an illegal memory access was encountered",
                                       "hello", "ran for 100000000000000 milliseconds"]))
text_logs = st.lists(log_lines, max_size=5).map(lambda ls: "\n".join(ls).encode())
# gzipped logs, whole or cut anywhere (a rotated log copied while it was written)
gzipped_logs = st.builds(lambda data, cut: gzip.compress(data)[:cut], text_logs, st.integers(0, 400))
contents = st.one_of(st.binary(max_size=300), text_logs, gzipped_logs)
rel_paths = st.lists(st.sampled_from(["logs", "app", "syslog", "metrics", "a", ".h", "x.log", "y.jsonl",
                                      "workload.json", "z.gz", "kern.log.2.gz"]), min_size=1, max_size=4).map("/".join)


def _ok_or_bundle_error(fn, *args):
    try:
        return fn(*args)
    except BundleError:
        return None


@FUZZ
@given(workload=st.one_of(json_values, mutated_workloads))
def test_parse_workload_gives_a_record_or_a_bundle_error(workload):
    for data in (json.dumps(workload), workload if isinstance(workload, dict) else None):
        if data is None:
            continue
        got = _ok_or_bundle_error(parse_workload, data)
        assert got is None or isinstance(got, WorkloadRecord)


@FUZZ
@given(text=st.text(alphabet='[]{}",:0123456789-e. \\ax', max_size=200) | st.binary(max_size=100))
def test_load_json_gives_a_value_or_a_bundle_error(text):
    _ok_or_bundle_error(load_json, text, "input")


def _write_tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        p = root / rel
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        except (IsADirectoryError, FileExistsError, NotADirectoryError):
            pass                        # a name used both as a folder and a file: keep the first


@FUZZ
@given(files=st.dictionaries(rel_paths, contents, max_size=6),
       workload=st.none() | st.one_of(json_values, mutated_workloads).map(json.dumps))
def test_open_input_on_any_small_folder_gives_an_intake_or_a_bundle_error(tmp_path_factory, files, workload):
    root = tmp_path_factory.mktemp("tree")
    if workload is not None:
        (root / "workload.json").write_text(workload)
    _write_tree(root, files)
    got = _ok_or_bundle_error(open_input, root)
    assert got is None or (isinstance(got, Intake) and isinstance(got.bundle, Bundle))





@FUZZ
@given(kind=st.sampled_from(["tar", "zip"]), members=st.dictionaries(rel_paths, contents, max_size=5),
       workload=st.one_of(json_values, mutated_workloads).map(lambda w: json.dumps(w).encode()),
       flips=st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), max_size=4),
       cut=st.none() | st.integers(min_value=0))
def test_open_archive_on_any_small_or_damaged_archive_gives_a_bundle_or_a_bundle_error(kind, members, workload,
                                                                                        flips, cut):
    data = bytearray(_archive(kind, {"workload.json": workload, **members}))
    for pos, byte in flips:                           # damage: flipped bytes, a truncated end
        data[pos % len(data)] = byte
    if cut is not None:
        data = data[:cut % (len(data) + 1)]
    got = _ok_or_bundle_error(open_archive, bytes(data), kind, "fuzz", 1 << 20, 1 << 20, 50)
    assert got is None or isinstance(got, Bundle)


@FUZZ
@given(kind=st.sampled_from(["tar", "zip"]), data=st.binary(max_size=400))
def test_open_archive_on_random_bytes_is_a_bundle_error(kind, data):
    with pytest.raises(BundleError):
        open_archive(data, kind, "fuzz")
