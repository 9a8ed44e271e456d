#!/usr/bin/env python3
"""Benchmark: start-up, the whole process of `firstfault analyze` on a 3-line file.

    python bench/bench_startup.py [--runs 15] [--json]

Each run is a fresh process pinned to one core; the figure kept is the fastest run and the
median, wall and CPU. Measured three ways in one run: the bare interpreter (`python -c pass`,
the yardstick), `analyze` with a warm cache (the built catalog kept on disk from an earlier
run, rules/catalog_cache.py) and with a cold one (an empty cache directory every run).
Bytecode is written as a user's interpreter writes it (PYTHONDONTWRITEBYTECODE is cleared
for the children, and one warm-up run comes first).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LINES = ("2024-05-01T10:00:00 rank 0: step 1 loss 2.31\n"
         "2024-05-01T10:00:05 rank 0: step 2 loss 2.29\n"
         "2024-05-01T10:00:09 rank 0: done\n")


def _pin() -> list[str]:
    return ["taskset", "-c", "0"] if shutil.which("taskset") else []


def once(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(_pin() + cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"bench_startup: {' '.join(cmd)} failed: {proc.stderr.strip()[-400:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(cmd: list[str], env: dict[str, str], runs: int, fresh_cache: bool = False) -> dict:
    walls, cpus = [], []
    for _ in range(runs):
        if fresh_cache:
            with tempfile.TemporaryDirectory() as cache:
                wall, cpu = once(cmd, {**env, "FIRSTFAULT_CACHE_DIR": cache})
        else:
            wall, cpu = once(cmd, env)
        walls.append(wall)
        cpus.append(cpu)
    return {"wall_s_min": min(walls), "wall_s_median": statistics.median(walls),
            "cpu_s_min": min(cpus), "cpu_s_median": statistics.median(cpus), "runs": runs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "job.log"
        log.write_text(LINES)
        cache = Path(tmp) / "cache"
        env = {**env, "FIRSTFAULT_CACHE_DIR": str(cache), "NO_COLOR": "1"}
        analyze = [sys.executable, "-m", "firstfault", "analyze", str(log)]
        once(analyze, env)                                  # bytecode written, cache filled
        out = {
            "python_bare": measure([sys.executable, "-c", "pass"], env, args.runs),
            "analyze_warm": measure(analyze, env, args.runs),
            "analyze_cold": measure(analyze, env, max(3, args.runs // 3), fresh_cache=True),
            "load_avg": os.getloadavg(),
        }
    out["warm_over_bare"] = out["analyze_warm"]["wall_s_min"] / out["python_bare"]["wall_s_min"]
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    print(f"load average {' '.join(f'{x:.2f}' for x in out['load_avg'])}")
    for name in ("python_bare", "analyze_warm", "analyze_cold"):
        r = out[name]
        print(f"{name:14} wall min {r['wall_s_min'] * 1000:6.0f} ms  median {r['wall_s_median'] * 1000:6.0f} ms   "
              f"cpu min {r['cpu_s_min'] * 1000:6.0f} ms  median {r['cpu_s_median'] * 1000:6.0f} ms  ({r['runs']} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
