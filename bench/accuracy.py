#!/usr/bin/env python3
"""How often firstfault names the right cause: on the real corpus, the samples and generated bundles.

    python bench/accuracy.py [--set corpus|samples|generated|all] [--json] [--only PREFIX]
                             [--min-accuracy X] [--max-confident-wrong Y] [--min-recovery Z] [--wrap]

A case is right when the diagnosis' ``sub_domain`` equals the expected one (for a
status other than attributed that is ``unattributed``, ``ambiguous`` or ``none``).
Confident-wrong: an ``attributed`` diagnosis whose sub_domain is not the expected one
(the harm of draining a healthy node). Recovery: the share of cases whose ``recovery.action``
equals the labelled ``recovery_action`` (corpus/label_recovery.py, the samples' expected.json). Prints per-sub_domain accuracy, the
unattributed rate, the confusion list and, with the floors given, exits 1 below them.

``--wrap`` measures the way the engine was tried before it read bare inputs: each
case's files put in a bundle with a minimal ``workload.json`` naming one node.
"""
from __future__ import annotations

import argparse
import json
import os
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


def wrap(case: dict, tmp: Path) -> Path:
    """A minimal bundle around a bare input, as the engine was tried before it read them."""
    src = Path(case["_input"])
    if (src / "workload.json").is_file():
        return src
    dest = tmp / "wrapped" / case["id"]
    (dest / "logs" / "app").mkdir(parents=True, exist_ok=True)
    files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())
    for f in files:
        (dest / "logs" / "app" / f"node-01.{f.name}.log").write_bytes(f.read_bytes())
    (dest / "workload.json").write_text(json.dumps({
        "workload_id": case["id"], "state": "FAILED", "start_time": "2000-01-01T00:00:00Z",
        "nodes": ["node-01"]}))
    return dest


def run(cases: list[dict], tmp: Path, use_wrap: bool, progress: bool) -> list[dict]:
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
        results = run(cases, tmp, args.wrap, progress=not args.json)
    summary = summarize(results)
    if args.json:
        json.dump({"summary": summary, "cases": results}, sys.stdout, indent=2, sort_keys=True, default=str)
        sys.stdout.write("\n")
    else:
        print_human(summary)
    corpus = summary.get("corpus", {})
    failed = []
    if args.min_accuracy is not None and corpus.get("cases") and corpus["accuracy"] < args.min_accuracy:
        failed.append(f"corpus accuracy {corpus['accuracy']:.3f} < floor {args.min_accuracy}")
    if args.max_confident_wrong is not None and corpus.get("cases") and corpus["confident_wrong"] > args.max_confident_wrong:
        failed.append(f"corpus confident-wrong {corpus['confident_wrong']:.3f} > ceiling {args.max_confident_wrong}")
    if args.min_recovery is not None and corpus.get("cases") and (corpus["recovery_accuracy"] or 0) < args.min_recovery:
        failed.append(f"corpus recovery-action accuracy {corpus['recovery_accuracy']:.3f} < floor {args.min_recovery}")
    if any(b.get("crashes") for b in summary.values()):
        failed.append("a case crashed or was refused")
    for msg in failed:
        print(f"accuracy: FAIL {msg}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
