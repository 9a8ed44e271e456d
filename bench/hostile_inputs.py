"""Hostile inputs for bench/hostile.py, generated into a scratch directory (issue 10).

Every builder writes a bundle (or a body) under ``root`` and returns its path, so the
inputs never live in the repository and a run is reproducible from this file alone.
"""
from __future__ import annotations

import gzip
import io
import json
import re
import tarfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

MiB = 1024 * 1024

WORKLOAD = {
    "attempt": 0, "workload_id": "probe-1", "scheduler": "slurm", "state": "FAILED", "exit_code": "1:0",
    "start_time": "2026-11-02T09:58:00Z", "end_time": "2026-11-02T10:13:19Z", "time_limit_s": 14400,
    "gpus_per_node": 8, "nodes": ["node-01"], "ranks": {"0": "node-01"},
}

# The real PyTorch ProcessGroupNCCL watchdog message, as the catalog's examples quote it
# (rules/catalog/extract/app.yaml, torch.watchdog_timeout), with a stamp inside WORKLOAD's window.
WATCHDOG = ("[rank2]:[E1102 10:10:45.510486595 ProcessGroupNCCL.cpp:632] [Rank 2] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=45390, OpType=ALLREDUCE, NumelIn=544997376, NumelOut=544997376, "
            "Timeout(ms)=600000) ran for {ran_for} milliseconds before timing out.")
# A fault the engine attributes (cuda_oom), put in most bundles: a probe that survives but
# loses evidence shows it as a status other than "attributed cuda_oom".
FAULT = ("0: [rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total "
         "capacity of 79.14 GiB of which 1.87 GiB is free.\n"
         "0: W1102 10:10:41.634976 33467 torch/distributed/elastic/multiprocessing/api.py:897] Sending process "
         "33532 closing signal SIGTERM")
XID = "NVRM: Xid (PCI:0000:9b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."

# The exponential part of torch.watchdog_timeout / torch.blocking_wait_timeout:
# `(?:, \w+=(?:\[[^\]]*\]|[^,()]*))*` matches ", a=[]" two ways (bracket or plain class),
# and with no closing `, Timeout(ms)=` every split is tried: 2**items.
REDOS_ITEM = ", a=[]"
REDOS_HEADS = {
    "torch.watchdog_timeout": "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(OpType=A",
    "torch.blocking_wait_timeout": "[Rank 1] Work WorkNCCL(OpType=A",
}
# After the items: ')' ends every split; the blocking-wait rule's anchor text must be on the
# line too, or the prefilter never runs its regex.
REDOS_TAILS = {"torch.watchdog_timeout": ")", "torch.blocking_wait_timeout": ") timed out in blocking wait."}


def redos_line(rule: str, items: int, length: int | None = None) -> str:
    """The rule's prefix, ``items`` repetitions and no closing match; padded with '.' to ``length``."""
    line = REDOS_HEADS[rule] + REDOS_ITEM * items + REDOS_TAILS[rule]
    if length is not None:
        if len(line) > length:
            raise ValueError(f"{items} items do not fit in {length} bytes")
        line += "." * (length - len(line))     # '.' after ')' cannot extend the repetition
    return line


def witness_check(rule_regex: str, rule: str) -> dict[str, object]:
    """Time Python's ``re`` on the catalog regex itself at 12/14/16 items: the growth per item."""
    rx = re.compile(rule_regex)
    times = {}
    for n in (12, 14, 16):
        line = redos_line(rule, n)
        t = time.perf_counter()
        hit = rx.search(line)
        times[n] = time.perf_counter() - t
        if hit:
            return {"matched": True}
    growth = (times[16] / max(times[12], 1e-9)) ** 0.25
    return {"matched": False, "s_at_16": round(times[16], 4), "growth_per_item": round(growth, 2)}


# ------------------------------------------------------------------ bundles

def bundle(root: Path, name: str, app: bytes | None = None, workload: bytes | dict | None = None,
           extra: dict[str, bytes] | None = None) -> Path:
    """A bundle directory: workload.json, logs/app/node-01.log = ``app``, and ``extra`` files."""
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    wl = WORKLOAD if workload is None else workload
    (d / "workload.json").write_bytes(wl if isinstance(wl, bytes) else json.dumps(wl).encode())
    files = dict(extra or {})
    if app is not None:
        files["logs/app/node-01.log"] = app
    for rel, data in files.items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return d


def lines(*text: str) -> bytes:
    return "".join(t + "\n" for t in text).encode()


def repeated_line(root: Path, name: str, unit: bytes, size: int, head: bytes = b"", tail: bytes = b"") -> Path:
    """A bundle whose app log is one line: ``head``, ``unit`` repeated to ``size`` bytes, ``tail``; streamed."""
    d = bundle(root, name)
    p = d / "logs/app/node-01.log"
    p.parent.mkdir(parents=True, exist_ok=True)
    block = unit * max(1, MiB // len(unit))
    with p.open("wb") as f:
        f.write(head)
        left = size - len(head)
        while left > 0:
            f.write(block[:left])
            left -= len(block)
        f.write(tail + b"\n")
    return d


def deep_folder(root: Path, depth: int) -> Path:
    d = bundle(root, f"deep-folder-{depth}")
    p = d / "logs" / "app"
    p.mkdir(parents=True)
    for _ in range(depth):                     # one level at a time: mkdir(parents=True) recurses
        p = p / "d"
        p.mkdir()
    (p / "node-01.log").write_bytes(lines(FAULT))
    return d


def big_int_workload(digits: int) -> bytes:
    text = json.dumps(WORKLOAD)
    return text.replace('"attempt": 0', '"attempt": ' + "9" * digits).encode()


def deep_json_workload(depth: int) -> bytes:
    text = json.dumps(WORKLOAD)
    return (text[:-1] + ', "labels": {"x": ' + "[" * depth + "]" * depth + "}}").encode()


# ------------------------------------------------------------------ archive bombs

def _zeros(total: int) -> Iterator[bytes]:
    block = bytes(MiB)
    while total > 0:
        yield block[:total]
        total -= len(block)


class _ZeroReader(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:                  # type: ignore[no-untyped-def]
        n = min(len(b), self.left)
        b[:n] = bytes(n)
        self.left -= n
        return n


def tar_bomb(root: Path, expanded: int) -> Path:
    """A .tar.gz bundle: workload.json and one app log of ``expanded`` zero bytes (one endless line)."""
    out = root / "bomb.tar.gz"
    wl = json.dumps(WORKLOAD).encode()
    with gzip.open(out, "wb", compresslevel=9) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        info = tarfile.TarInfo("workload.json")
        info.size = len(wl)
        tar.addfile(info, io.BytesIO(wl))
        info = tarfile.TarInfo("logs/app/node-01.log")
        info.size = expanded
        tar.addfile(info, io.BufferedReader(_ZeroReader(expanded), MiB))
    return out


def zip_bomb(root: Path, expanded: int) -> Path:
    out = root / "bomb.zip"
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        z.writestr("workload.json", json.dumps(WORKLOAD))
        with z.open("logs/app/node-01.log", "w", force_zip64=expanded > 2**31 - 1) as f:
            for block in _zeros(expanded):
                f.write(block)
    return out


# ------------------------------------------------------------------ service bodies

def analyze_json(app: bytes) -> bytes:
    """The JSON form of POST /v1/analyze for WORKLOAD and one app log."""
    return json.dumps({"workload": WORKLOAD,
                       "files": {"logs/app/node-01.log": app.decode("utf-8", "surrogateescape")}}).encode()


def heavy_app(lines_count: int) -> bytes:
    """Legitimate but long work: many real watchdog lines (about 6 s per 100k on the 'before' engine)."""
    return lines(WATCHDOG.format(ran_for=600061)) * lines_count
