"""An exception CPython reports as ignored ended nothing (Pattern.in_block, early.python.ignored_exception).

Real lines: deepspeedai/DeepSpeed#4060 (an atexit hook's FileNotFoundError at the end of a run, the
whole post) and NVIDIA/Megatron-LM#878 (a DataLoader worker's bus error, then an atexit callback's
traceback). The offline reader, the stream's reader and any chunking read them alike.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from firstfault.rules.catalog import load_catalog
from firstfault.rules.engine import analyze_files, analyze_path, extract_records
from firstfault.rules.extract import Extractor, LineMemory
from firstfault.rules.model import EventSet
from firstfault.schemas import RawLine, WorkloadRecord

ROOT = Path(__file__).resolve().parents[1]
ATEXIT = ROOT / "corpus/real/ho85-deepspeed-triton-autotune-cache-atexit-filenotfound/input/train.log"
MEGATRON = ROOT / "corpus/real/ho-shm-dataloader-buserror-megatron-878/input/train.log"
WORKLOAD = {"workload_id": "w", "attempt": 0, "scheduler": "slurm", "nodes": ["node-01"], "gpus_per_node": 8,
            "start_time": "2023-08-01T00:00:00Z", "end_time": "2023-08-01T01:00:00Z", "state": "FAILED"}
LAST = "FileNotFoundError: [Errno 2] No such file or directory: '/.triton/autotune/Fp16Matmul_4d_kernel.pickle'"


def _kinds(events: EventSet) -> list[tuple[int, str]]:
    return sorted((e.line, e.kind) for e in events.sorted())


def _offline(text: bytes, cut: int | None = None) -> EventSet:
    wl = WorkloadRecord.model_validate(WORKLOAD)
    events = EventSet()
    chunks = [text] if cut is None else [text[:cut], text[cut:]]
    Extractor(load_catalog(), wl).scan_file("logs/app/node-01.log", chunks, events)
    return events


def test_an_atexit_callbacks_exception_is_not_a_cause():
    d = analyze_path(ATEXIT).diagnosis
    assert d.status == "unattributed" and d.root_cause is None and not d.candidates


def test_the_line_alone_is_still_the_programs():
    d = analyze_files(WORKLOAD, {"logs/app/node-01.log": LAST + "\n"}).diagnosis
    assert d.status == "attributed" and d.root_cause.sub_domain == "user_code_exception"


def test_the_line_is_read_with_its_blocks_kind():
    events = _offline(ATEXIT.read_bytes())
    last = len(ATEXIT.read_text().splitlines())
    assert (last, "python_exception_ignored") in _kinds(events)
    assert all(kind != "python_exception" for _, kind in _kinds(events))


@pytest.mark.parametrize("cut", [1, 20, 33, 40, 200])
def test_any_chunking_reads_it_alike(cut):
    text = ATEXIT.read_bytes()
    assert _kinds(_offline(text, cut)) == _kinds(_offline(text))


def test_the_stream_reads_it_as_offline():
    wl = WorkloadRecord.model_validate(WORKLOAD)
    lines = ATEXIT.read_text().splitlines()
    records = [RawLine(path="logs/app/node-01.log", line=i, text=t) for i, t in enumerate(lines, start=1)]
    events, memory, ex = EventSet(), LineMemory(), Extractor(load_catalog(), wl)
    for i in range(0, len(records), 5):               # in batches, the memory carried across them
        extract_records(ex, records[i:i + 5], events, memory=memory)
    assert _kinds(events) == _kinds(_offline(ATEXIT.read_bytes()))


def test_a_traceback_under_another_line_is_the_programs():
    lines = ATEXIT.read_text().splitlines()
    text = "\n".join(["During handling of the above exception, another exception occurred:", *lines[1:]]) + "\n"
    d = analyze_files(WORKLOAD, {"logs/app/node-01.log": text}).diagnosis
    assert d.status == "attributed" and d.root_cause.sub_domain == "user_code_exception"


def test_a_fault_before_an_ignored_block_stays_the_cause():
    d = analyze_path(MEGATRON).diagnosis
    assert d.status == "attributed" and d.root_cause.sub_domain == "shm_exhausted"


def test_a_progress_bar_between_the_header_and_its_traceback_changes_nothing():
    # another writer's tqdm redraw interleaved on the same stream (bench/variants.py's progress_line_after_each)
    bar = "Epoch 3:  41%|####      | 410/1000 [01:02<01:30,  6.54it/s, loss=2.31]"
    lines = ATEXIT.read_text().splitlines()
    text = "".join(f"{line}\n{bar}\n" for line in lines)
    d = analyze_files(WORKLOAD, {"logs/app/node-01.log": text}).diagnosis
    assert d.status == "unattributed" and d.root_cause is None
