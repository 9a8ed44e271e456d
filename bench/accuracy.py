#!/usr/bin/env python3
"""How often firstfault names the right cause: on the real corpus, the samples and generated bundles.

    python bench/accuracy.py [--set corpus|samples|generated|all] [--json] [--only PREFIX]
                             [--min-accuracy X] [--max-confident-wrong Y] [--min-recovery Z] [--wrap]
                             [--shapes] [--shapes-must-agree]

A case is right when the diagnosis' ``sub_domain`` equals the expected one (for a
status other than attributed that is ``unattributed``, ``ambiguous`` or ``none``).
Confident-wrong: an ``attributed`` diagnosis whose sub_domain is not the expected one
(the harm of draining a healthy node). Recovery: the share of cases whose ``recovery.action``
equals the labelled ``recovery_action`` (corpus/label_recovery.py, the samples' expected.json). Prints per-sub_domain accuracy, the
unattributed rate, the confusion list and, with the floors given, exits 1 below them.

``--wrap`` measures the way the engine was tried before it read bare inputs: each
case's files put in a bundle with a minimal ``workload.json`` naming one node. That record
says the job FAILED, so a case labelled ``no_failure`` cannot be right there: those cases
are left out of the --wrap measure, and their number is printed.

``--shapes`` runs every corpus case three ways (bare = folder = bundle: the same lines must
give the same answer however they are handed over): ``posted`` (the case's input as it is, a
file or a folder), ``folder`` (the input's files copied into another layout: nested folders,
other file names, modification times kept) and ``bundle`` (``--wrap``'s bundle, its record
stating nothing the lines do not: state UNKNOWN, no nodes, each file under its own name in
``logs/app/``). It prints each shape's accuracy and the cases whose status, sub_domain or
nodes (responsible and suspect) differ between shapes; ``--shapes-must-agree`` exits 1 on any
difference, and the floors then hold for every shape.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "corpus" / "real"
SAMPLES = ROOT / "samples"


def corpus_cases(only: str | None) -> list[dict]:
    out = []
    for case_json in sorted(CORPUS.glob("*/case.json")):
        case = json.loads(case_json.read_text())
        if only and not case["id"].startswith(only):
            continue
        case["_input"] = case_json.parent / case["input"]
        case["_set"] = "corpus"
        out.append(case)
    return out


def sample_cases() -> list[dict]:
    out = []
    for exp in sorted(SAMPLES.glob("*/expected.json")):
        want = json.loads(exp.read_text())
        out.append({"id": f"sample:{exp.parent.name}", "_input": exp.parent, "_set": "samples",
                    "expected": {"status": want["status"], "domain": want["domain"], "sub_domain": want["sub_domain"],
                                 "responsible_nodes": want.get("responsible_nodes", []),
                                 "recovery_action": want["recovery_action"]}})
    return out


def generated_cases(tmp: Path) -> list[dict]:
    """Bundles from bench/gen_bundle.py (one Xid 79 among thousands of echoes), two sizes and seeds."""
    out = []
    for nodes, lines, seed in ((4, 20_000, 1), (16, 60_000, 2), (32, 100_000, 3)):
        dest = tmp / f"gen-{nodes}-{seed}"
        subprocess.run([sys.executable, str(ROOT / "bench" / "gen_bundle.py"), str(dest), "--nodes", str(nodes),
                        "--lines", str(lines), "--seed", str(seed)], check=True, stdout=subprocess.DEVNULL)
        want = json.loads((dest / "expected.json").read_text())
        out.append({"id": f"generated:{nodes}n-seed{seed}", "_input": dest, "_set": "generated",
                    "expected": {"status": want["status"], "domain": want["domain"], "sub_domain": want["sub_domain"],
                                 "responsible_nodes": want.get("responsible_nodes", []),
                                 "recovery_action": want["recovery_action"]}})
    return out


def wrap(case: dict, tmp: Path, neutral: bool = False) -> Path:
    """A minimal bundle around a bare input, as the engine was tried before it read them.

    ``neutral``: the bundle shape of --shapes: the record states nothing the lines do not
    (state UNKNOWN, no nodes; start_time is required, so a date before any log), and each file
    keeps its own name under logs/app/. The plain wrap says the job FAILED on node-01."""
    src = Path(case["_input"])
    if (src / "workload.json").is_file():
        return src
    dest = tmp / ("neutral" if neutral else "wrapped") / case["id"]
    (dest / "logs" / "app").mkdir(parents=True, exist_ok=True)
    files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())
    used: set[str] = set()
    for i, f in enumerate(files):
        name = f"node-01.{f.name}.log"
        if neutral:                       # its own name (a host's or a rank's name says so), unique
            name = f"{f.stem}.log" if f"{f.stem}.log" not in used else f"{i:02d}-{f.stem}.log"
        used.add(name)
        shutil.copy2(f, dest / "logs" / "app" / name)
    record = {"workload_id": case["id"], "state": "FAILED", "start_time": "2000-01-01T00:00:00Z", "nodes": ["node-01"]}
    if neutral:
        record = {"workload_id": case["id"], "state": "UNKNOWN", "start_time": "2000-01-01T00:00:00Z"}
    (dest / "workload.json").write_text(json.dumps(record))
    return dest


SHAPES = ("posted", "folder", "bundle")


def refold(case: dict, tmp: Path) -> Path:
    """The input's files in a folder of another layout, as a user might have them: each log in a
    folder of its own under another name (its stem kept: a file named after its host or rank says
    so), beside the input's workload.json if it has one. Modification times are kept (copy2)."""
    src = Path(case["_input"])
    dest = tmp / "folder" / case["id"]
    dest.mkdir(parents=True, exist_ok=True)
    files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())
    for i, f in enumerate(files):
        if src.is_dir() and f == src / "workload.json":
            shutil.copy2(f, dest / "workload.json")
            continue
        suffix = ".jsonl" if f.suffix == ".jsonl" else ".txt"
        # metrics keep their place: a DCGM sample file is read by its path, not sniffed
        # a hidden log (Nextflow's .command.log) is copied under a visible name, as a user's copy is
        rel = (f.relative_to(src) if src.is_dir() and f.relative_to(src).parts[0] == "metrics"
               else Path("collected") / f"part-{i:02d}" / ((f.stem.lstrip(".") or "log") + suffix))
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dest / rel)
    return dest


def shaped(case: dict, shape: str, tmp: Path) -> Path:
    if case["_set"] != "corpus" or shape == "posted":
        return case["_input"]
    return wrap(case, tmp, neutral=True) if shape == "bundle" else refold(case, tmp)


def _nodes(got: dict) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return tuple(sorted(got.get("responsible_nodes") or ())), tuple(sorted(got.get("suspect_nodes") or ()))


def shape_differences(by_shape: dict[str, list[dict]]) -> list[dict]:
    """Cases whose status, sub_domain or nodes differ between shapes (results in the same case order)."""
    out = []
    names = list(by_shape)
    for rows in zip(*(by_shape[n] for n in names)):
        seen = {}
        for name, r in zip(names, rows):
            g = r["got"]
            resp, susp = _nodes(g)
            seen[name] = {"status": g.get("status"), "sub_domain": g.get("sub_domain"),
                          "responsible_nodes": list(resp), "suspect_nodes": list(susp), "right": r["right"]}
        keys = ("status", "sub_domain", "responsible_nodes", "suspect_nodes")
        differ = [k for k in keys if len({json.dumps(v[k]) for v in seen.values()}) > 1]
        if differ:
            out.append({"id": rows[0]["id"], "expected": rows[0]["expected"]["sub_domain"], "differ": differ,
                        "shapes": seen})
    return out


def print_shapes(by_shape: dict[str, list[dict]], diffs: list[dict]) -> None:
    print("== shapes: the same corpus lines handed over three ways")
    for name, rs in by_shape.items():
        rs = [r for r in rs if r["set"] == "corpus"]
        n = max(1, len(rs))
        print(f"   {name:7} {len(rs)} cases  accuracy {sum(r['right'] for r in rs) / n:.3f}"
              f"  confident-wrong {sum(r['confident_wrong'] for r in rs) / n:.3f}"
              f"  unattributed {sum(r['got'].get('status') == 'unattributed' for r in rs) / n:.3f}")
    print(f"   {len(diffs)} cases differ between shapes")
    for d in diffs:
        print(f"     {d['id']}  (expected {d['expected']}; differ: {', '.join(d['differ'])})")
        for name, v in d["shapes"].items():
            nodes = ",".join(v["responsible_nodes"]) or "-"
            sus = ",".join(v["suspect_nodes"]) or "-"
            print(f"       {name:7} {v['status']:13} {v['sub_domain']:26} responsible {nodes}  suspect {sus}")


def run(cases: list[dict], tmp: Path, use_wrap: bool, progress: bool, shape: str | None = None) -> list[dict]:
    from firstfault.rules.catalog import load_catalog
    from firstfault.rules.engine import analyze_bundle
    from firstfault.rules.errors import BundleError
    import inspect

    if "intake" in inspect.signature(analyze_bundle).parameters:
        from firstfault.rules.intake import open_input
    else:                                              # an engine from before bare inputs (baseline runs)
        from firstfault.rules.bundle import open_bundle

        class _Intake:
            def __init__(self, bundle):
                self.bundle = bundle

        def open_input(path):
            return _Intake(open_bundle(path))

    catalog = load_catalog()
    results = []
    t0 = time.monotonic()
    for i, case in enumerate(cases, 1):
        if shape is not None:
            path = shaped(case, shape, tmp)
        else:
            path = wrap(case, tmp) if use_wrap and case["_set"] == "corpus" else case["_input"]
        exp = case["expected"]
        got: dict = {}
        try:
            intake = open_input(path)
            d = (analyze_bundle(intake.bundle, catalog, intake=intake) if hasattr(intake, "warnings")
                 else analyze_bundle(intake.bundle, catalog)).diagnosis
            got = {"status": d.status, "domain": d.domain, "sub_domain": d.sub_domain,
                   "responsible_nodes": d.responsible_nodes, "suspect_nodes": d.suspect_nodes,
                   "recovery_action": d.recovery.action}
        except BundleError as exc:
            got = {"status": "error", "sub_domain": "error", "error": str(exc)}
        except Exception as exc:                       # a crash is a result to report, not the end of the run
            got = {"status": "crash", "sub_domain": "crash", "error": f"{type(exc).__name__}: {exc}"}
        right = got.get("sub_domain") == exp["sub_domain"]
        confident_wrong = got.get("status") == "attributed" and not right
        want_nodes = exp.get("responsible_nodes") or []
        node_right = None
        if right and exp["status"] == "attributed" and want_nodes:
            node_right = sorted(got.get("responsible_nodes", [])) == sorted(want_nodes)
        recovery_right = (got.get("recovery_action") == exp["recovery_action"]) if "recovery_action" in exp else None
        results.append({"id": case["id"], "set": case["_set"], "expected": exp, "got": got, "right": right,
                        "recovery_right": recovery_right,
                        "confident_wrong": confident_wrong, "node_right": node_right,
                        "cascade": bool(case.get("cascade")), "shape": case.get("shape", "bundle")})
        if progress and sys.stderr.isatty():
            print(f"\r  {i}/{len(cases)} cases, {time.monotonic() - t0:.1f} s", end="", file=sys.stderr)
    if progress and sys.stderr.isatty():
        print(file=sys.stderr)
    return results


def summarize(results: list[dict]) -> dict:
    def block(rs: list[dict]) -> dict:
        n = len(rs)
        if not n:
            return {"cases": 0}
        per: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for r in rs:
            per[r["expected"]["sub_domain"]][1] += 1
            per[r["expected"]["sub_domain"]][0] += r["right"]
        nodes = [r["node_right"] for r in rs if r["node_right"] is not None]
        recov = [r["recovery_right"] for r in rs if r["recovery_right"] is not None]
        return {
            "cases": n,
            "accuracy": round(sum(r["right"] for r in rs) / n, 4),
            "confident_wrong": round(sum(r["confident_wrong"] for r in rs) / n, 4),
            "unattributed_rate": round(sum(r["got"].get("status") == "unattributed" for r in rs) / n, 4),
            "crashes": sum(r["got"].get("status") in ("crash", "error") for r in rs),
            "responsible_node_accuracy": round(sum(nodes) / len(nodes), 4) if nodes else None,
            "recovery_accuracy": round(sum(recov) / len(recov), 4) if recov else None,
            "per_sub_domain": {k: {"right": v[0], "cases": v[1], "accuracy": round(v[0] / v[1], 4)}
                               for k, v in sorted(per.items())},
            "by_shape": {s: round(sum(r["right"] for r in rs if r["shape"] == s) / c, 4)
                         for s, c in sorted(Counter(r["shape"] for r in rs).items())},
            "cascades": {"cases": sum(r["cascade"] for r in rs),
                         "accuracy": round(sum(r["right"] for r in rs if r["cascade"]) / max(1, sum(r["cascade"] for r in rs)), 4)},
            "confusion": sorted(f"{r['expected']['sub_domain']} -> {r['got'].get('sub_domain')}  {r['id']}"
                                for r in rs if not r["right"]),
        }
    return {name: block([r for r in results if r["set"] == name]) for name in ("corpus", "samples", "generated")
            if any(r["set"] == name for r in results)}


def print_human(summary: dict) -> None:
    for name, b in summary.items():
        if not b.get("cases"):
            continue
        print(f"== {name}: {b['cases']} cases")
        print(f"   sub_domain accuracy  {b['accuracy']:.3f}")
        print(f"   confident-wrong      {b['confident_wrong']:.3f}")
        print(f"   unattributed rate    {b['unattributed_rate']:.3f}")
        print(f"   crashes / errors     {b['crashes']}")
        if b["responsible_node_accuracy"] is not None:
            print(f"   responsible node     {b['responsible_node_accuracy']:.3f} (where the lines name it)")
        if b["recovery_accuracy"] is not None:
            print(f"   recovery action      {b['recovery_accuracy']:.3f} (the labelled recovery_action)")
        print(f"   cascades             {b['cascades']['accuracy']:.3f} of {b['cascades']['cases']}")
        print("   by shape             " + ", ".join(f"{k} {v:.3f}" for k, v in b["by_shape"].items()))
        print("   per sub_domain:")
        for k, v in b["per_sub_domain"].items():
            print(f"     {k:26} {v['right']:3}/{v['cases']:<3} {v['accuracy']:.2f}")
        if b["confusion"]:
            print("   wrong (expected -> got):")
            for line in b["confusion"]:
                print(f"     {line}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", choices=("corpus", "samples", "generated", "all"), default="all")
    ap.add_argument("--only", help="corpus case ids starting with this")
    ap.add_argument("--json", action="store_true", help="print the summary and every case as JSON")
    ap.add_argument("--wrap", action="store_true", help="measure as before bare inputs were read (see above)")
    ap.add_argument("--shapes", action="store_true",
                    help="also run every corpus case as posted, refolded and wrapped; list the cases that differ")
    ap.add_argument("--shapes-must-agree", action="store_true",
                    help="with --shapes (implied): exit 1 when a case's status, sub_domain or nodes differ between shapes")
    ap.add_argument("--min-accuracy", type=float, help="corpus floor: exit 1 below it")
    ap.add_argument("--max-confident-wrong", type=float, help="corpus ceiling: exit 1 above it")
    ap.add_argument("--min-recovery", type=float, help="corpus floor on the recovery action: exit 1 below it")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ff-accuracy-") as tmpdir:
        tmp = Path(tmpdir)
        cases: list[dict] = []
        if args.set in ("corpus", "all"):
            cases += corpus_cases(args.only)
        if args.set in ("samples", "all") and not args.only:
            cases += sample_cases()
        if args.set in ("generated", "all") and not args.only:
            cases += generated_cases(tmp)
        left_out = []
        if args.wrap:
            left_out = [c["id"] for c in cases if c["_set"] == "corpus" and c["expected"]["status"] == "no_failure"]
            cases = [c for c in cases if c["id"] not in set(left_out)]
            if not args.json:
                print(f"--wrap: {len(left_out)} corpus cases labelled no_failure left out (the wrap's record says the "
                      f"job FAILED)", file=sys.stderr)
        results = run(cases, tmp, args.wrap, progress=not args.json)
        shapes: dict[str, list[dict]] = {}
        if args.shapes or args.shapes_must_agree:
            corpus_only = [c for c in cases if c["_set"] == "corpus"]
            for name in SHAPES:
                if name == "posted" and not args.wrap and args.set in ("corpus", "all"):
                    shapes[name] = [r for r in results if r["set"] == "corpus"]     # already run as posted
                else:
                    shapes[name] = run(corpus_only or corpus_cases(args.only), tmp, False,
                                       progress=not args.json, shape=name)
    summary = summarize(results)
    diffs = shape_differences(shapes) if shapes else []
    if args.json:
        out = {"summary": summary, "cases": results}
        if args.wrap:
            out["wrap_left_out"] = left_out
        if shapes:
            out["shapes"] = {"summary": {name: summarize(rs).get("corpus", {}) for name, rs in shapes.items()},
                             "differences": diffs}
        json.dump(out, sys.stdout, indent=2, sort_keys=True, default=str)
        sys.stdout.write("\n")
    else:
        print_human(summary)
        if shapes:
            print_shapes(shapes, diffs)
    corpus = summary.get("corpus", {})
    failed = []
    # The floors hold for the corpus as run, and for each shape of it.
    blocks = [("corpus", corpus)] + [(f"corpus ({name})", summarize(rs).get("corpus", {})) for name, rs in shapes.items()
                                     if name != "posted" or args.wrap]
    for label, b in blocks:
        if args.min_accuracy is not None and b.get("cases") and b["accuracy"] < args.min_accuracy:
            failed.append(f"{label} accuracy {b['accuracy']:.3f} < floor {args.min_accuracy}")
        if args.max_confident_wrong is not None and b.get("cases") and b["confident_wrong"] > args.max_confident_wrong:
            failed.append(f"{label} confident-wrong {b['confident_wrong']:.3f} > ceiling {args.max_confident_wrong}")
    if args.min_recovery is not None and corpus.get("cases") and (corpus["recovery_accuracy"] or 0) < args.min_recovery:
        failed.append(f"corpus recovery-action accuracy {corpus['recovery_accuracy']:.3f} < floor {args.min_recovery}")
    if any(b.get("crashes") for b in summary.values()):
        failed.append("a case crashed or was refused")
    if any(r["got"].get("status") in ("crash", "error") for rs in shapes.values() for r in rs):
        failed.append("a case crashed or was refused in another shape")
    if args.shapes_must_agree and diffs:
        failed.append(f"{len(diffs)} corpus cases differ between shapes: {', '.join(d['id'] for d in diffs)}")
    for msg in failed:
        print(f"accuracy: FAIL {msg}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
