#!/usr/bin/env python3
"""Benchmark: a 512-node job (4,096 ranks, ~1M lines, one Xid 79) through `firstfault analyze`,
and extraction speed against GNU `grep -E` with the catalog's literal anchors.

    python bench/bench_analyze.py [--lines 1000000] [--nodes 512] [--json]

Prints wall time, lines/s and peak RSS of `firstfault analyze --json` run in a child
process pinned to one core (taskset), whether the diagnosis is right, and for a
noise-only file the time of firstfault's extraction vs `grep -E -c` in the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"


def _pin() -> list[str]:
    return ["taskset", "-c", "0"] if shutil.which("taskset") else []


def generate(nodes: int, lines: int, noise_only: bool = False) -> Path:
    name = f"{'noise' if noise_only else 'job'}-{nodes}n-{lines}"
    target = OUT / name
    if not (target / "workload.json").exists() and not (target / "noise.log").exists():
        cmd = [sys.executable, str(HERE / "gen_bundle.py"), str(target), "--nodes", str(nodes), "--lines", str(lines)]
        if noise_only:
            cmd.append("--noise-only")
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return target


def run_analyze(bundle: Path, pin: bool = True) -> dict:
    """``pin``: on one core; else on every core this bench may use (analyze's default --jobs)."""
    cmd = (_pin() if pin else []) + [sys.executable, "-m", "firstfault", "analyze", str(bundle), "--json"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    diag = json.loads(proc.stdout)
    return {"wall_s": wall, "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "peak_rss_mb": after.ru_maxrss / 1024, "diagnosis": diag}


def count_lines(root: Path) -> tuple[int, int]:
    n = size = 0
    for p in root.rglob("*.log"):
        data = p.read_bytes()
        n += data.count(b"\n")
        size += len(data)
    return n, size


def extraction_vs_grep(path: Path, repeats: int = 3) -> dict:
    """firstfault's prefilter + extraction over one file vs grep -E with the same anchors."""
    from firstfault.rules.catalog import load_catalog
    from firstfault.rules.extract import Extractor, ExtractStats
    from firstfault.rules.model import EventSet
    from firstfault.schemas import WorkloadRecord

    catalog = load_catalog()
    anchors = sorted({a for p in catalog.patterns for a in p.anchors})
    expr = "|".join(re.escape(a).replace("\\ ", " ") for a in anchors)
    wl = WorkloadRecord.model_validate({"workload_id": "bench", "state": "FAILED", "start_time": "2026-11-02T09:00:00Z",
                                        "nodes": ["gpu-0001"]})
    ex = Extractor(catalog, wl)
    data_size = path.stat().st_size

    def ff_once() -> tuple[float, ExtractStats]:
        t0 = time.perf_counter()
        with path.open("rb") as fh:
            stats = ex.scan_file("logs/app/gpu-0001.log", iter(lambda: fh.read(8 << 20), b""), EventSet())
        return time.perf_counter() - t0, stats

    def grep_once() -> float:
        t0 = time.perf_counter()
        subprocess.run(["grep", "-E", "-c", "-e", expr, str(path)], stdout=subprocess.DEVNULL, check=False,
                       env={**os.environ, "LC_ALL": "C"})
        return time.perf_counter() - t0

    ff_times, grep_times, stats = [], [], None
    for _ in range(repeats):
        t, stats = ff_once()
        ff_times.append(t)
        grep_times.append(grep_once())
    ff, gr = min(ff_times), min(grep_times)
    return {"file_mb": data_size / 1e6, "lines": stats.lines, "anchors": len(anchors), "engine": ex.prefilter.engine,
            "firstfault_s": ff, "grep_s": gr, "firstfault_mb_s": data_size / 1e6 / ff, "grep_mb_s": data_size / 1e6 / gr,
            "ratio_grep_over_firstfault": gr / ff}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=512)
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    bundle = generate(args.nodes, args.lines)
    lines, size = count_lines(bundle)
    res = run_analyze(bundle)
    d = res["diagnosis"]
    culprit = json.loads((bundle / "culprit.json").read_text())["host"] if (bundle / "culprit.json").exists() else None
    correct = d["status"] == "attributed" and d["sub_domain"] == "gpu_fell_off_bus" and (
        culprit is None or d["responsible_nodes"] == [culprit])
    cores = len(os.sched_getaffinity(0))
    spread = run_analyze(bundle, pin=False) if cores > 1 else None
    noise = generate(args.nodes, args.lines, noise_only=True)
    noise_file = next(iter(sorted(noise.rglob("*.log"))))
    grep = extraction_vs_grep(noise_file)
    report = {
        "bundle": {"nodes": args.nodes, "lines": lines, "mb": round(size / 1e6, 1)},
        "analyze": {"wall_s": round(res["wall_s"], 3), "cpu_s": round(res["cpu_s"], 3),
                    "lines_per_s": round(lines / res["wall_s"]), "peak_rss_mb": round(res["peak_rss_mb"], 1),
                    "correct": correct, "status": d["status"], "sub_domain": d["sub_domain"],
                    "responsible_nodes": d["responsible_nodes"], "one_core": bool(_pin())},
        # the same command on every core this bench may use (the files read in that many processes)
        "analyze_all_cores": None if spread is None else {
            "cores": cores, "wall_s": round(spread["wall_s"], 3), "cpu_s": round(spread["cpu_s"], 3),
            "same_diagnosis": spread["diagnosis"] == d},
        "extraction_vs_grep": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in grep.items()},
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    a, g = report["analyze"], report["extraction_vs_grep"]
    print(f"bundle      {report['bundle']['nodes']} nodes, {lines:,} lines, {report['bundle']['mb']} MB")
    print(f"analyze     {a['wall_s']:.2f} s wall ({a['cpu_s']:.2f} s CPU{', one core' if a['one_core'] else ''}), "
          f"{a['lines_per_s']:,} lines/s, peak RSS {a['peak_rss_mb']:.0f} MB")
    spread_ok = spread is None or report["analyze_all_cores"]["same_diagnosis"]
    if spread is not None:
        s_ = report["analyze_all_cores"]
        print(f"            every core ({s_['cores']}): {s_['wall_s']:.2f} s wall ({s_['cpu_s']:.2f} s CPU), "
              f"same diagnosis: {'yes' if s_['same_diagnosis'] else 'NO'}")
    print(f"diagnosis   {a['status']} {a['sub_domain']} {a['responsible_nodes']}  -> {'CORRECT' if correct else 'WRONG'}")
    print(f"targets     < 5 s: {'yes' if a['wall_s'] < 5 else 'NO'}; < 500 MB: {'yes' if a['peak_rss_mb'] < 500 else 'NO'}")
    print(f"extraction  {g['file_mb']:.0f} MB noise file, {g['anchors']} anchors, prefilter {g['engine']}")
    print(f"            firstfault {g['firstfault_s']:.3f} s ({g['firstfault_mb_s']:.0f} MB/s)   "
          f"grep -E {g['grep_s']:.3f} s ({g['grep_mb_s']:.0f} MB/s)")
    print(f"ratio       grep time / firstfault time = {g['ratio_grep_over_firstfault']:.2f} "
          f"(>= 1.0: firstfault at least as fast as grep)")
    return 0 if correct and spread_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
