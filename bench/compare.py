#!/usr/bin/env python3
"""Run the benchmarks on another revision and on the working tree, in one run, and print ratios.

    python bench/compare.py REV [--only analyze cascade stream service startup] [--rounds 2] [--json]
    (bench/compare.sh REV is the same)

REV is checked out in a temporary git worktree with its own virtualenv that reuses this
tree's installed dependencies (only firstfault itself is installed there, C extensions
built). Each benchmark runs alternately on REV and on the working tree, ``--rounds`` times,
so a machine that gets busier or quieter during the run touches both alike; the figure
kept per side is the best round. Ratios are working tree / REV for times (below 1 is
faster) and for rates the other way round (above 1 is faster). The load average is printed
with the figures. Run it before closing a change to ``rules/``, ``streams/`` or
``connectors/api`` and put its output in the note.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# benchmark -> (script args, [(label, json path, kind)]); kind "time": lower is better, "rate": higher
BENCHES: dict[str, tuple[list[str], list[tuple[str, tuple[str, ...], str]]]] = {
    "analyze": (["bench/bench_analyze.py", "--json"], [
        ("analyze wall s", ("analyze", "wall_s"), "time"),
        ("analyze cpu s", ("analyze", "cpu_s"), "time"),
        ("analyze peak RSS MB", ("analyze", "peak_rss_mb"), "time"),
        ("extraction s (noise)", ("extraction_vs_grep", "firstfault_s"), "time"),
        ("grep s (yardstick)", ("extraction_vs_grep", "grep_s"), "time"),
    ]),
    # --copies given: both sides run the same correlator window (REV's script may default to fewer)
    "stream": (["bench/bench_stream.py", "--json", "--copies", "200", "--only", "consume_ceiling", "extractor_worker",
                "correlator", "latency"], [
        ("consume ceiling rec/s (yardstick)", ("consume_ceiling", "records_per_s"), "rate"),
        ("extractor records/s", ("extractor_worker", "records_per_s"), "rate"),
        ("correlator events/s", ("correlator", "events_per_s"), "rate"),
        ("correlator events per CPU s", ("correlator", "events_per_cpu_s"), "rate"),
        ("end->final p99 beyond grace s", ("latency", "p99_beyond_grace_s"), "time"),
    ]),
    "startup": (["bench/bench_startup.py", "--json"], [
        ("python -c pass s (yardstick)", ("python_bare", "wall_s_min"), "time"),
        ("analyze small file s (warm cache)", ("analyze_warm", "wall_s_min"), "time"),
        ("analyze small file s (cold cache)", ("analyze_cold", "wall_s_min"), "time"),
    ]),
    # bench_cascade's default set: 512 ranks and 20k matched lines, 2,048 and 80k (IB down), 4,096 and 200k
    "cascade": (["bench/bench_cascade.py", "--json"], [
        *((f"cascade {name} {what}", ("cases", i, key), "time")
          for i, name in enumerate(("512r/20k", "2048r/80k", "4096r/200k"))
          for what, key in (("wall s", "wall_s"), ("cpu s", "cpu_s"), ("us per matched line", "us_per_matched_line"))),
        ("cascade 4096r/200k FINAL cpu s", ("cases", 2, "stages_s", "final"), "time"),
        ("cascade 4096r/200k peak RSS MB", ("cases", 2, "peak_rss_mb"), "time"),
        ("cascade 4096r/200k grep s (yardstick)", ("cases", 2, "grep", "wall_s"), "time"),
    ]),
    "service": (["bench/bench_service.py", "--json"], [
        ("service req/s", ("requests_per_s",), "rate"),
        ("service p99 ms", ("latency_ms", "p99"), "time"),
    ]),
}


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def prepare(rev: str, tmp: Path) -> Path:
    """A worktree of ``rev`` and a python that imports firstfault from it; returns that python."""
    tree = tmp / "tree"
    sh(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev])
    # One set of generated inputs for both sides (bench/out/): the same bytes are measured.
    (ROOT / "bench" / "out").mkdir(exist_ok=True)
    if not (tree / "bench" / "out").exists():
        (tree / "bench" / "out").symlink_to(ROOT / "bench" / "out")
    venv = tmp / "venv"
    sh([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    py = venv / "bin" / "python"
    site = Path(sh([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    # This tree's dependencies on the path (a plain path entry: its .pth files, among them the editable
    # finder of this tree's firstfault, are not run), and REV's firstfault installed on its own.
    ours = Path(sysconfig.get_paths()["purelib"])
    (site / "deps.pth").write_text(str(ours) + "\n")
    sh([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
        "--target", str(site / "_ff"), str(tree)], cwd=tmp)
    (site / "zz_ff.pth").write_text(str(site / "_ff") + "\n")
    check = sh([str(py), "-c", "import firstfault, os; print(os.path.dirname(firstfault.__file__))"],
               cwd=tmp).stdout.strip()
    if str(tree) not in check and str(site / "_ff") not in check:
        raise SystemExit(f"compare: the {rev} interpreter imports firstfault from {check}")
    return py


def dig(d: dict, path: tuple[str | int, ...]):
    """The number at ``path`` (dict keys; an int indexes a list), None if absent."""
    for k in path:
        if isinstance(k, int):
            if not isinstance(d, list) or not -len(d) <= k < len(d):
                return None
        elif not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d if isinstance(d, (int, float)) and not isinstance(d, bool) else None


def run(py: Path, tree: Path, args: list[str], cwd: Path) -> dict:
    """``args[0]`` (a script path relative to the tree) run from a neutral directory: a tree's own
    ``firstfault/`` folder must not shadow the installed package. A benchmark newer than REV runs
    from the working tree's script (it measures the interpreter it is run by)."""
    script = tree / args[0] if (tree / args[0]).exists() else ROOT / args[0]
    proc = subprocess.run([str(py), str(script), *args[1:]], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["failed"]}
    try:
        return json.loads(proc.stdout[proc.stdout.index("{"):])
    except (ValueError, json.JSONDecodeError):
        return {"error": ["no JSON in the output"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rev")
    ap.add_argument("--only", nargs="*", choices=sorted(BENCHES), default=["analyze", "stream"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ff-compare-"))
    try:
        print(f"compare: preparing {args.rev} in {tmp}", file=sys.stderr, flush=True)
        theirs = prepare(args.rev, tmp)
        ours = Path(sys.executable)
        rows = []
        for name in args.only:
            script, metrics = BENCHES[name]
            best: dict[str, dict[str, float]] = {"rev": {}, "tree": {}}
            for r in range(args.rounds):
                for side, py, cwd in (("rev", theirs, tmp / "tree"), ("tree", ours, ROOT)):
                    print(f"compare: {name} round {r + 1}/{args.rounds} on {side}", file=sys.stderr, flush=True)
                    out = run(py, cwd, script, tmp)
                    for label, path, kind in metrics:
                        v = dig(out, path)
                        if v is None:
                            continue
                        have = best[side].get(label)
                        if have is None or ((v < have) if kind == "time" else (v > have)):
                            best[side][label] = v
            for label, _, kind in metrics:
                a, b = best["rev"].get(label), best["tree"].get(label)
                ratio = b / a if a and b else None
                rows.append({"bench": name, "metric": label, "rev": a, "tree": b, "ratio_tree_over_rev": ratio,
                             "better": None if ratio is None else (ratio < 1 if kind == "time" else ratio > 1)})
        load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
        report = {"rev": args.rev, "rounds": args.rounds, "loadavg": load, "rows": rows}
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            print(f"{'metric':34} {args.rev[:12]:>12} {'tree':>12} {'tree/rev':>9}")
            for row in rows:
                fmt = lambda v: "-" if v is None else (f"{v:,.3f}" if v < 1000 else f"{v:,.0f}")  # noqa: E731
                print(f"{row['metric']:34} {fmt(row['rev']):>12} {fmt(row['tree']):>12} "
                      f"{'-' if row['ratio_tree_over_rev'] is None else format(row['ratio_tree_over_rev'], '.2f'):>9}")
            print(f"load average {' '.join(load)}; best of {args.rounds} rounds per side, run alternately")
        return 0
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tmp / "tree")],
                       capture_output=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
