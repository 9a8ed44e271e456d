"""A bundle's log files read in forked processes (rules/fanout.py) give the serial read's diagnosis."""
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from firstfault.rules import engine, fanout
from firstfault.rules.bundle import Bundle, BundleFile
from firstfault.rules.errors import AnalysisTimeout, BundleError
from firstfault.rules.intake import open_input

from conftest import sample_dirs

ROOT = Path(__file__).resolve().parents[1]


def _inputs() -> list[Path]:
    """Every sample, and every corpus input that opens as two log files or more."""
    out = list(sample_dirs())
    for case in sorted((ROOT / "corpus" / "real").glob("*/case.json")):
        path = case.parent / json.loads(case.read_text())["input"]
        if sum(f.kind != "metrics" for f in open_input(path).bundle.files) > 1:
            out.append(path)
    return out


INPUTS = _inputs()


@pytest.fixture
def every_size(monkeypatch):
    """Fan out whatever the input's size; count the reads that completed in the children."""
    monkeypatch.setattr(fanout, "MIN_BYTES", 0)
    done = []
    real = fanout.read_in_parallel

    def counted(*args, **kwargs):
        got = real(*args, **kwargs)
        done.append(got is not None)
        return got
    monkeypatch.setattr(fanout, "read_in_parallel", counted)
    return done


def test_there_are_inputs_of_several_files():
    assert len(INPUTS) >= 20


@pytest.mark.parametrize("path", INPUTS, ids=lambda p: p.parent.name if p.name == "input" else p.name)
def test_the_diagnosis_and_counts_are_the_serial_ones(path, every_size):
    serial = engine.analyze_path(path, jobs=1)
    assert every_size == []
    fanned = engine.analyze_path(path, jobs=2)
    assert every_size == [True]
    assert fanned.diagnosis.to_json() == serial.diagnosis.to_json()
    assert fanned.stats == serial.stats


def test_three_processes_over_a_big_generated_job(tmp_path, every_size):
    subprocess.run([sys.executable, str(ROOT / "bench" / "gen_bundle.py"), str(tmp_path / "job"),
                    "--nodes", "16", "--lines", "60000"], check=True, capture_output=True)
    serial = engine.analyze_path(tmp_path / "job")
    fanned = engine.analyze_path(tmp_path / "job", jobs=3)
    assert every_size == [True]
    assert fanned.diagnosis.to_json() == serial.diagnosis.to_json()
    assert fanned.stats == serial.stats and serial.stats.matched > 0


@pytest.mark.parametrize("suffix", [".tar.gz", ".zip"])
def test_an_archive_is_read_alike(tmp_path, every_size, suffix):
    """Archive members are spooled before the read: the children read the spool."""
    sample = next(p for p in sample_dirs() if p.name == "gpu-fell-off-bus-32node")
    archive = shutil.make_archive(str(tmp_path / "bundle"), "gztar" if suffix == ".tar.gz" else "zip", sample)
    serial = engine.analyze_path(archive)
    fanned = engine.analyze_path(archive, jobs=2)
    assert every_size == [True]
    assert fanned.diagnosis.to_json() == serial.diagnosis.to_json() and fanned.stats == serial.stats


def _files(sizes):
    return [BundleFile(path=f"logs/app/rank-{i}.log", size=n, open_chunks=lambda: iter(())) for i, n in enumerate(sizes)]


def test_groups_split_by_bytes_the_same_way_each_time():
    files = _files([50, 10, 40, 30, 30, 5])
    got = fanout.groups(files, 2)
    assert got == fanout.groups(files, 2)
    assert sorted(i for g in got for i in g) == list(range(6))
    loads = [sum(files[i].size for i in g) for g in got]
    assert max(loads) - min(loads) <= 10
    assert fanout.groups(files[:1], 4) == [[0]]           # no empty group


def test_small_single_or_serial_inputs_are_read_in_process():
    big = _files([fanout.MIN_BYTES, 1])
    assert fanout.worth_it(big, 2)
    assert not fanout.worth_it(big, 1)
    assert not fanout.worth_it(big[:1], 4)                 # one file: nothing to share out
    assert not fanout.worth_it(_files([10, 10]), 2)


WORKED = next(p for p in sample_dirs() if p.name == "worked-example")


def _bundle(opener):
    """The worked example's bundle with each file's reader given by ``opener(file)``."""
    real = open_input(WORKED).bundle
    files = [BundleFile(path=f.path, size=f.size, open_chunks=opener(f), source=f.source) for f in real.files]
    return Bundle(workload=real.workload, files=files)


def test_a_file_that_fails_in_a_child_fails_as_in_a_serial_read(every_size):
    last = open_input(WORKED).bundle.files[-1].path

    def opener(f):
        def broken():
            yield b"a first line\n"
            raise BundleError(f"{f.path}: the archive member is damaged")
        return broken if f.path == last else f.open_chunks
    bundle = _bundle(opener)
    with pytest.raises(BundleError) as serial:
        engine.analyze_bundle(bundle)
    with pytest.raises(BundleError) as fanned:
        engine.analyze_bundle(bundle, jobs=2)
    assert every_size == [False]                           # the children gave up; the serial read raised
    assert str(fanned.value) == str(serial.value) == f"{last}: the archive member is damaged"


def test_a_child_that_dies_leaves_the_read_to_this_process(every_size):
    parent = os.getpid()

    def opener(f):
        def dies_in_a_child():
            if os.getpid() != parent:
                os.kill(os.getpid(), signal.SIGKILL)       # as the kernel's OOM killer would
            yield from f.open_chunks()
        return dies_in_a_child
    bundle = _bundle(opener)
    seen = []
    got = engine.analyze_bundle(bundle, progress=lambda done, total: seen.append((done, total)), jobs=2)
    assert every_size == [False]
    assert got.diagnosis.to_json() == engine.analyze_path(WORKED).diagnosis.to_json()
    assert seen[-1] == (bundle.total_bytes, bundle.total_bytes)        # the bytes read again, counted once
    assert multiprocessing.active_children() == []


def test_progress_counts_every_byte_once(every_size):
    bundle = open_input(WORKED).bundle
    for jobs in (1, 2):
        seen = []
        engine.analyze_bundle(bundle, progress=lambda done, total: seen.append((done, total)), jobs=jobs)
        assert seen[-1] == (bundle.total_bytes, bundle.total_bytes)
        assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert every_size == [True]


def test_a_passed_deadline_stops_the_children(every_size):
    def opener(f):
        def stuck():
            time.sleep(600)                                # a child that would not finish in time
            yield from f.open_chunks()
        return stuck
    with pytest.raises(AnalysisTimeout):
        engine.analyze_bundle(_bundle(opener), jobs=2, deadline=time.monotonic() + 0.5)
    assert multiprocessing.active_children() == []        # stopped, not left running or waited for


def test_analyze_reads_with_every_usable_cpu_unless_told():
    from firstfault.cli import _jobs
    assert _jobs(3) == 3
    assert _jobs(None) == min(len(os.sched_getaffinity(0)), 8)
    out = subprocess.run([sys.executable, "-m", "firstfault", "analyze", str(sample_dirs()[0]), "--jobs", "0"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "--jobs" in out.stderr
