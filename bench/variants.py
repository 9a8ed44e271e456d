#!/usr/bin/env python3
"""The same incident told differently: every corpus case rewritten in ways that change no fact.

    python bench/variants.py [--only PREFIX] [--variant NAME ...] [--json]

Each real case (corpus/real) is diagnosed as posted and again after a rewrite of its log
files that changes no fact: terminal colours around every line (with and without their ESC),
a byte-order mark, CRLF line ends, trailing spaces, an unstamped progress-bar line after every
line, 2,000 such lines before or after the log, every log gzipped. A case whose status,
sub_domain or responsible nodes differ is listed. The metamorphic tests
(tests/test_metamorphic.py) keep a few of these on the samples and on posted logs; this runs
them all on every case (a few minutes a variant on one core), to find what a new reader or
pattern breaks before a user does. Progress goes to stderr; --json prints the result.
Exit 1 when any case differs.
"""
from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from accuracy import corpus_cases  # noqa: E402  (bench/accuracy.py: the corpus and its layout)

BAR = "Epoch 3:  41%|####      | 410/1000 [01:02<01:30,  6.54it/s, loss=2.31]"     # no stamp, no anchor


def _lines(fn: Callable[[str], str]) -> Callable[[bytes], bytes]:
    """``fn`` applied to every line's text (latin-1, so any byte survives); line ends kept."""
    def rewrite(data: bytes) -> bytes:
        text = data.decode("latin-1")
        out = "".join(fn(line[:-1]) + "\n" if line.endswith("\n") else fn(line)
                      for line in text.splitlines(keepends=True))
        return out.encode("latin-1")
    return rewrite


# name -> rewrite of one log file's bytes
VARIANTS: dict[str, Callable[[bytes], bytes]] = {
    "colours": _lines(lambda l: f"\x1b[36m{l}\x1b[0m" if l else l),
    "colours_without_esc": _lines(lambda l: f"[36m{l}[0m" if l else l),
    "byte_order_mark": lambda b: b"\xef\xbb\xbf" + b,
    "crlf": lambda b: b.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"),
    "trailing_spaces": lambda b: b.replace(b"\n", b"  \n"),
    "progress_line_after_each": _lines(lambda l: l + "\n" + BAR),
    "noise_before": lambda b: (BAR + "\n").encode() * 2000 + b,
    "noise_after": lambda b: b + (b"" if b.endswith(b"\n") else b"\n") + (BAR + "\n").encode() * 2000,
    "gzipped": gzip.compress,                   # the file also gets ".gz" (see _rewrite)
}
_SKIP = (".json", ".jsonl", ".gz", ".tgz", ".tar", ".zip")       # records, metrics and archives stay as they are


def _rewrite(src: Path, dst: Path, variant: str) -> None:
    """Copy ``src`` (a file or a folder) to ``dst`` with every log file rewritten."""
    fn = VARIANTS[variant]
    files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())
    for p in files:
        rel = p.name if src.is_file() else p.relative_to(src).as_posix()
        out = dst / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if p.name.endswith(_SKIP):
            shutil.copy(p, out)
        elif variant == "gzipped":
            out.with_name(out.name + ".gz").write_bytes(fn(p.read_bytes()))
        else:
            out.write_bytes(fn(p.read_bytes()))


def _key(d) -> dict:
    return {"status": d.status, "sub_domain": d.sub_domain, "responsible_nodes": list(d.responsible_nodes)}


def run(cases: list[dict], variants: list[str]) -> dict:
    from firstfault.rules.engine import analyze_path

    result: dict = {"cases": len(cases), "variants": {}}
    base: dict[str, dict] = {}
    for case in cases:
        base[case["id"]] = _key(analyze_path(case["_input"]).diagnosis)
    for variant in variants:
        t0 = time.perf_counter()
        diffs = []
        for i, case in enumerate(cases, 1):
            src = Path(case["_input"])
            with tempfile.TemporaryDirectory() as tmp:
                dst = Path(tmp) / "case"
                if src.is_file():
                    dst.mkdir()
                _rewrite(src, dst, variant)
                target = dst if src.is_dir() else next(dst.iterdir())
                try:
                    got = _key(analyze_path(target).diagnosis)
                except Exception as exc:            # a crash is a difference too
                    got = {"error": f"{type(exc).__name__}: {exc}"[:200]}
            if got != base[case["id"]]:
                diffs.append({"case": case["id"], "posted": base[case["id"]], "rewritten": got})
            if i % 50 == 0 or i == len(cases):
                print(f"  {variant}: {i}/{len(cases)} cases, {len(diffs)} differ", file=sys.stderr)
        result["variants"][variant] = {"differ": diffs, "seconds": round(time.perf_counter() - t0, 1)}
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="corpus case ids starting with this")
    ap.add_argument("--variant", action="append", choices=sorted(VARIANTS), help="only this rewrite (repeatable)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()
    cases = corpus_cases(args.only)            # each with "_input": the case's input as posted
    result = run(cases, args.variant or sorted(VARIANTS))
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        for name, v in result["variants"].items():
            print(f"{name:26} {len(v['differ']):>3} of {result['cases']} differ  ({v['seconds']} s)")
            for d in v["differ"]:
                print(f"    {d['case']}: {d['posted']} -> {d['rewritten']}")
    return 1 if any(v["differ"] for v in result["variants"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
