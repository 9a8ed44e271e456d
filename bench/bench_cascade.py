#!/usr/bin/env python3
"""Benchmark: the failure cascade is the workload (issue 24).

    python bench/bench_cascade.py [--ranks N] [--matched M] [--noise L] [--fault xid79|ib_down] [--json]

A large job's failure prints tens of thousands of lines the catalog fires on (the
PyTorch NCCL watchdog timeouts of every rank, their status and teardown lines, NCCL
WARN lines from the proxies, torchrun's ChildFailedError blocks, srun's exits) among
about a million noise lines, all caused by one initiating fault: an Xid 79 in one
host's syslog (bench/gen_bundle.py's job) or a ConnectX port going down. Those
*matched* lines, not the noise, set the time.

Each case's bundle is generated into bench/out/ (reused when present), then
``firstfault analyze --json`` runs in a child pinned to one core (taskset) and the
diagnosis must name the initiating fault; as in bench_startup.py, the children write bytecode
as a user's interpreter does (PYTHONDONTWRITEBYTECODE cleared, one warm-up run first). Printed per case: matched and total lines,
wall and CPU s, matched lines/s, us per matched line, peak RSS, the per-stage split of
an in-process run in CPU seconds (read, prefix, match, event, merge, FINAL: see
``stage_split``) and ``grep -E -c`` with the catalog's literal anchors over the same
files, as a ratio (grep time / analyze time, wall and CPU). On a shared machine the CPU
figures are the ones to compare.

Without size flags a default set of three cases runs (512 to 4,096 ranks, 20k to 200k
matched lines, 1M noise lines each); any of ``--ranks``/``--matched``/``--noise`` runs
one case. Message formats are bench/gen_bundle.py's and samples/make_samples.py's
(real lines from public reports).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
sys.path.insert(0, str(HERE))

import gen_bundle  # noqa: E402  (bench/gen_bundle.py: the job, its noise and its line formats)

GPUS = 8
STAGES = ("read", "prefix", "match", "event", "merge", "final")
EXPECTED = {"xid79": ("gpu", "gpu_fell_off_bus"), "ib_down": ("network", "ib_link_error")}


@dataclass(frozen=True)
class Case:
    ranks: int
    matched: int             # the target; the count measured is what the engine matched
    noise: int
    fault: str

    @property
    def name(self) -> str:
        return f"cascade-{self.fault}-{self.ranks}r-{self.matched}m-{self.noise}n"


DEFAULT_SET = (Case(512, 20_000, 1_000_000, "xid79"), Case(2048, 80_000, 1_000_000, "ib_down"),
               Case(4096, 200_000, 1_000_000, "xid79"))


# ---------------------------------------------------------------- generation

class CascadeGen(gen_bundle.Gen):
    """gen_bundle's job with a denser cascade: NCCL WARN lines from every surviving rank's
    proxy (per channel, as NCCL prints them) and, for ``ib_down``, a port-down root instead
    of the Xid 79."""

    def __init__(self, args: argparse.Namespace, fault: str, warn_per_rank: int) -> None:
        super().__init__(args)
        self.fault_kind, self.warn_per_rank = fault, warn_per_rank

    def ip(self, i: int) -> str:
        return f"10.{i // 250}.{i % 250}.{1 + (i // 62500)}"      # gen_bundle's ib0 address of node i

    def signal(self) -> dict[str, list]:
        files = self.ib_signal() if self.fault_kind == "ib_down" else super().signal()
        self.proxy_warnings(files)
        for v in files.values():
            v.sort()
        return files

    # -- line shapes (gen_bundle's and make_samples.py's)
    def _app(self, files: dict, rank: int, us: int, text: str) -> None:
        files.setdefault(f"logs/app/{self.nodes[rank // self.G]}.log", []).append((us, self._next(), f"{rank}: {text}"))

    def _next(self) -> int:
        self._seq = getattr(self, "_seq", 1 << 40) + 1       # after gen_bundle's own sequence numbers
        return self._seq

    def _warn(self, files: dict, rank: int, us: int, where: str, msg: str) -> None:
        host, pid = self.nodes[rank // self.G], self.pid(rank)
        self._app(files, rank, us, f"{host}:{pid}:{pid + 311} [{rank % self.G}] {where} NCCL WARN {msg}")

    def _c10(self, files: dict, rank: int, us: int, line: int, msg: str) -> None:
        h = self.nodes[rank // self.G]
        self._app(files, rank, us, f"[rank{rank}]:[{self.st.c10(us + self.skew[h])} ProcessGroupNCCL.cpp:{line}] {msg}")

    def proxy_warnings(self, files: dict) -> None:
        """Every rank off the culprit node: its proxy's failed sends to the culprit, a few per channel."""
        r, G, ci = self.r, self.G, self.culprit_i
        shapes = ("ib", "closed", "recv")
        for rank in range(self.R):
            if rank // G == ci:
                continue
            t = self.fault + r.randint(1_000_000, 3_000_000)
            for k in range(self.warn_per_rank):
                t += r.randint(200, 5000)
                shape = shapes[k % 3] if self.fault_kind == "xid79" else "ib"
                if shape == "ib":
                    self._warn(files, rank, t, "transport/net_ib.cc:1696",
                               f"NET/IB : Got completion from peer {self.ip(ci)}<{r.randint(32768, 60999)}> "
                               "with error 12, opcode 0, len 0, vendor err 129 (Send)")
                elif shape == "closed":
                    self._warn(files, rank, t, "misc/socket.cc:49", "socketProgress: Connection closed by remote "
                                                                     f"peer {self.culprit}<{r.randint(32768, 60999)}>")
                else:
                    self._warn(files, rank, t, "proxy.cc:1143", "Socket recv failed while polling for "
                                                                 f"opId=0x{r.randint(0x7f0000000000, 0x7fffffffffff) >> 5 << 5:x}")

    def ib_signal(self) -> dict[str, list]:
        """The culprit's ConnectX port goes down (samples' ambiguous-two-faults line): its ranks' NCCL
        sees the port error, and every rank's collective times out one PG timeout later."""
        r, st, G, ci, h = self.r, self.st, self.G, self.culprit_i, self.culprit
        files: dict[str, list] = {}
        f = self.fault
        up = f - self.boot[ci]
        files.setdefault(f"logs/syslog/{h}.log", []).append(
            (f, self._next(), f"{st.rfc3164(f + self.skew[h])} {h} kernel: [{up // 1_000_000:5d}.{up % 1_000_000:06d}] "
                              "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link DOWN"))
        for rank in range(ci * G, ci * G + G):
            self._warn(files, rank, f + r.randint(50_000, 200_000), "transport/net_ib.cc:133",
                       "NET/IB : Got async event : port error")
        seqnum, numel, timeout_ms = 40000 + r.randint(0, 50000), 1073741824, gen_bundle.TIMEOUT_MS
        aborts = {}
        for rank in range(self.R):
            aborts[rank] = self._watchdog(files, rank, f + r.randint(100_000, 1_100_000), seqnum, numel, timeout_ms)
        end = 0
        for i in range(len(self.nodes)):
            ranks = sorted(range(i * G, i * G + G), key=aborts.get)
            end = max(end, self._agent_block(files, i, aborts[ranks[-1]] + 300_000, ranks[0], aborts[ranks[0]]))
        t = end + 500_000
        order = list(range(len(self.nodes)))
        r.shuffle(order)
        for i in order:
            files.setdefault(f"logs/app/{self.nodes[0]}.log", []).append(
                (t, self._next(), f"srun: error: {self.nodes[i]}: "
                                  f"{gen_bundle.task_list(range(i * G, i * G + G))}: Exited with exit code 1"))
            t += r.randint(20_000, 200_000)
        self.end = t + 1_500_000
        return files

    def _watchdog(self, files: dict, rank: int, onset: int, seqnum: int, numel: int, timeout_ms: int) -> int:
        """gen_bundle's six watchdog lines of one rank; returns its abort time."""
        r = self.r
        ran = timeout_ms + r.randint(11, 1400)
        t = onset + ran * 1000
        work = (f"WorkNCCL(SeqNum={seqnum}, OpType=ALLREDUCE, NumelIn={numel}, NumelOut={numel}, "
                f"Timeout(ms)={timeout_ms}) ran for {ran} milliseconds before timing out.")
        pg = f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}]"
        lines = ((632, f"[Rank {rank}] Watchdog caught collective operation timeout: {work}"),
                 (2268, f"{pg}  failure detected by watchdog at work sequence id: {seqnum} PG status: "
                        f"last enqueued work: {seqnum + r.randint(6, 13)}, last completed work: {seqnum - 1}"),
                 (670, "Stack trace of the failed collective not found, potentially because FlightRecorder is "
                       "disabled. You can enable it by setting TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero value."),
                 (684, f"[Rank {rank}] Some NCCL operations have failed or timed out. Due to the asynchronous "
                       "nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data."),
                 (690, f"[Rank {rank}] To avoid data inconsistency, we are taking the entire process down."),
                 (1414, f"{pg} Process group watchdog thread terminated with exception: "
                        f"[Rank {rank}] Watchdog caught collective operation timeout: {work}"))
        for line, msg in lines:
            self._c10(files, rank, t, line, msg)
            t += r.randint(20, 900)
        return t + r.randint(50_000, 300_000)

    def _agent_block(self, files: dict, node_i: int, us: int, root_rank: int, when: int) -> int:
        """gen_bundle's torchrun failure report (exitcode -6) of one node."""
        r, st, G, h = self.r, self.st, self.G, self.nodes[node_i]
        lab, ap, pid = node_i * G, self.agent_pid(node_i), self.pid(root_rank)
        us += r.randint(300_000, 1_200_000)
        self._app(files, lab, us, f"{st.elastic(us + self.skew[h], 'E')} {ap} torch/distributed/elastic/multiprocessing/"
                                  f"api.py:869] failed (exitcode: -6) local_rank: {root_rank % G} "
                                  f"(pid: {pid}) of binary: /usr/bin/python3")
        us += r.randint(2000, 9000)
        for line in gen_bundle.AGENT_TB + [
            "[0]:", f"  time      : {st.elastic_time(when + self.skew[h])}", f"  host      : {h}",
            f"  rank      : {root_rank} (local_rank: {root_rank % G})", f"  exitcode  : -6 (pid: {pid})",
            "  error_file: <N/A>", f"  traceback : Signal 6 (SIGABRT) received by PID {pid}", "=" * 60,
        ]:
            self._app(files, lab, us, line)
        return us


def base_signal(case: Case) -> int:
    """About how many lines the cascade prints before the proxies' warnings: 6 watchdog lines a
    rank and a ~30-line agent block a node (calibrates --matched)."""
    return case.ranks * 6 + case.ranks // GPUS * 30


def generate(case: Case) -> Path:
    target = OUT / case.name
    if (target / "expected.json").exists():
        return target
    nodes = max(2, case.ranks // GPUS)
    warn = max(0, (case.matched - base_signal(case)) // (case.ranks - GPUS))      # the culprit node's ranks print none
    args = argparse.Namespace(nodes=nodes, gpus_per_node=GPUS, seed=24, lines=0, noise_only=False)
    gen = CascadeGen(args, case.fault, warn)
    n_sig = sum(len(v) for v in gen.signal().values())
    gen = CascadeGen(args, case.fault, warn)        # a fresh generator: the same random draws again
    args.lines = case.noise + n_sig
    tmp = Path(tempfile.mkdtemp(dir=OUT, prefix=".gen-"))
    gen.write_bundle(str(tmp))
    domain, sub = EXPECTED[case.fault]
    expected = json.loads((tmp / "expected.json").read_text())
    expected.update(domain=domain, sub_domain=sub, responsible_nodes=[gen.culprit])
    (tmp / "expected.json").write_text(json.dumps(expected, indent=2, sort_keys=True) + "\n")
    tmp.rename(target)                               # whole or absent: an interrupted run leaves no half bundle
    return target


# ---------------------------------------------------------------- measuring

def _pin() -> list[str]:
    return ["taskset", "-c", "0"] if shutil.which("taskset") else []


def run_child(cmd: list[str], env: dict | None = None) -> tuple[float, Any, bytes, int]:
    """Wall s, rusage of this child alone (os.wait4: not the max over every child so far), stdout, rc."""
    with tempfile.TemporaryFile() as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        return wall, usage, out.read(), proc.returncode


# As bench_startup.py runs it: bytecode written as a user's interpreter writes it (a shell that sets
# PYTHONDONTWRITEBYTECODE compiles every module of firstfault from source at each start, ~70 ms a run).
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
_warmed = False


def _warm_up() -> None:
    """One unmeasured analyze of a one-line file first, so the measured runs find the bytecode written."""
    global _warmed
    if not _warmed:
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "warm-up.log"
            log.write_text("2024-05-01T10:00:00 rank 0: step 1 loss 2.31\n")
            run_child([sys.executable, "-m", "firstfault", "analyze", str(log), "--json"], env=CHILD_ENV)
        _warmed = True


def analyze_child(bundle: Path, pin: bool = True) -> dict:
    """``pin``: on one core (analyze then reads in one process); else on every core this bench may use
    (analyze's default --jobs: the files read in that many processes, rules/fanout.py)."""
    _warm_up()
    wall, usage, out, rc = run_child((_pin() if pin else []) + [sys.executable, "-m", "firstfault", "analyze",
                                                                str(bundle), "--json"], env=CHILD_ENV)
    if rc != 0:
        raise SystemExit(f"firstfault analyze {bundle} exited {rc}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mb": usage.ru_maxrss / 1024,
            "diagnosis": json.loads(out)}


def grep_expr() -> str:
    """bench_analyze.py's yardstick: every catalog anchor, escaped, in one -E alternation."""
    from firstfault.rules.catalog import load_catalog

    anchors = sorted({a for p in load_catalog().patterns for a in p.anchors})
    return "|".join(re.escape(a).replace("\\ ", " ") for a in anchors)


def grep_child(bundle: Path) -> dict:
    files = [str(p) for p in sorted(bundle.rglob("*.log"))]
    wall, usage, out, _ = run_child(_pin() + ["grep", "-E", "-c", "-e", grep_expr(), *files],
                                    env={**os.environ, "LC_ALL": "C"})
    lines = sum(int(row.rsplit(b":", 1)[-1]) for row in out.splitlines() if row)
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "lines": lines}


class Stages:
    """Exclusive CPU time per stage, by wrapping the engine's stage functions in place.

    CPU time, not wall: on a shared machine the split must not depend on who else runs.
    A wrapper costs about a microsecond a call: it is measured (``calibrate``) and taken
    off, so the split stays honest at a few microseconds a line."""

    clock = staticmethod(time.process_time)

    def __init__(self) -> None:
        self.t: Counter = Counter()
        self.n: Counter = Counter()
        self._stack: list[float] = []
        self.inside = self.per_call = 0.0

    def wrap(self, stage: str, fn: Callable) -> Callable:
        clock, stack, t, n = self.clock, self._stack, self.t, self.n

        def timed(*args: Any, **kw: Any) -> Any:
            t0 = clock()
            stack.append(0.0)
            try:
                return fn(*args, **kw)
            finally:
                dt = clock() - t0
                t[stage] += dt - stack.pop()
                n[stage] += 1
                if stack:
                    stack[-1] += dt
        return timed

    def calibrate(self, calls: int = 200_000) -> None:
        def noop() -> None:
            return None

        probe = Stages()
        timed = probe.wrap("x", noop)
        t0 = self.clock()
        for _ in range(calls):
            noop()
        bare = self.clock() - t0
        t0 = self.clock()
        for _ in range(calls):
            timed()
        self.per_call = max(0.0, (self.clock() - t0 - bare) / calls)
        self.inside = min(self.per_call, probe.t["x"] / calls)


def stage_split(bundle: Path) -> dict:
    """One in-process analyze with the stage functions wrapped; CPU seconds per stage, overhead taken off.

    read: intake, file reads, the prefilter, the walk over candidate lines, the inventory;
    prefix: rules.prefixes.read_head_keyed and read_head (the line's own prefixes and those of lines a
    stamp is inherited from); match: Extractor._match (Pattern.search before it); event: Extractor._event;
    merge: EventSet.add and EventSet.fold. Since _read_line takes a remembered head, a remembered match
    outcome and a repeat's remembered facts itself (issue 24), those count as read, and its fold as merge;
    final: diagnose() (EARLY and FINAL rules, the diagnosis object)."""
    from firstfault.rules import catalog, engine, extract, model

    st = Stages()
    st.calibrate()
    match = (extract.Extractor, "_match") if hasattr(extract.Extractor, "_match") else (catalog.Pattern, "search")
    patches = [(extract, "read_head", "prefix"), (*match, "match"), (extract.Extractor, "_event", "event"),
               (model.EventSet, "add", "merge"), (engine, "diagnose", "final")]
    if hasattr(extract, "read_head_keyed"):     # read_line's own prefixes (read_head: the lines above it)
        patches.append((extract, "read_head_keyed", "prefix"))
    if hasattr(extract, "read_head_missed"):    # since _read_line takes a remembered head itself: the rest
        patches.append((extract, "read_head_missed", "prefix"))
    if hasattr(model.EventSet, "fold"):         # a repeat counted into its event, from inside _event
        patches.append((model.EventSet, "fold", "merge"))
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    try:
        for obj, name, stage in patches:
            setattr(obj, name, st.wrap(stage, getattr(obj, name)))
        engine.load_catalog()                       # parsed before the clock starts, as the child's import does
        t0 = st.clock()
        analysis = engine.analyze_path(bundle)
        total = st.clock() - t0
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)
    calls = sum(st.n.values())
    total -= calls * st.per_call
    split = {s: max(0.0, st.t[s] - st.n[s] * st.inside) for s in STAGES if s != "read"}
    split["read"] = max(0.0, total - sum(split.values()))
    return {"total_s": total, "stages_s": {s: split[s] for s in STAGES}, "calls": dict(st.n),
            "wrapper_us": st.per_call * 1e6, "lines": analysis.stats.lines, "candidates": analysis.stats.candidates,
            "matched": analysis.stats.matched}


def correct(diag: dict, bundle: Path) -> bool:
    want = json.loads((bundle / "expected.json").read_text())
    return (diag["status"] == "attributed" and diag["sub_domain"] == want["sub_domain"]
            and diag["responsible_nodes"] == want["responsible_nodes"])


def measure(case: Case) -> dict:
    bundle = generate(case)
    child = analyze_child(bundle)
    split = stage_split(bundle)
    grep = grep_child(bundle)
    cores = len(os.sched_getaffinity(0))
    spread = analyze_child(bundle, pin=False) if cores > 1 else None
    matched, wall = split["matched"], child["wall_s"]
    d = child["diagnosis"]
    return {
        "case": {"name": case.name, "fault": case.fault, "ranks": case.ranks, "target_matched": case.matched,
                 "noise": case.noise},
        "matched_lines": matched, "total_lines": split["lines"], "candidate_lines": split["candidates"],
        "wall_s": round(wall, 3), "cpu_s": round(child["cpu_s"], 3),
        "matched_lines_per_s": round(matched / wall), "us_per_matched_line": round(wall / matched * 1e6, 2),
        "matched_lines_per_cpu_s": round(matched / child["cpu_s"]),
        "peak_rss_mb": round(child["peak_rss_mb"], 1),
        "correct": correct(d, bundle), "status": d["status"], "sub_domain": d["sub_domain"],
        "responsible_nodes": d["responsible_nodes"],
        "stages_s": {k: round(v, 3) for k, v in split["stages_s"].items()},
        "stages_total_s": round(split["total_s"], 3), "stage_wrapper_us": round(split["wrapper_us"], 3),
        "grep": {"wall_s": round(grep["wall_s"], 3), "cpu_s": round(grep["cpu_s"], 3), "lines": grep["lines"],
                 "ratio_grep_over_firstfault": round(grep["wall_s"] / wall, 3),
                 "ratio_grep_over_firstfault_cpu": round(grep["cpu_s"] / child["cpu_s"], 3)},
        "one_core": bool(_pin()),
        # the same command on every core this bench may use; its diagnosis must be the pinned one's
        "all_cores": None if spread is None else {
            "cores": cores, "wall_s": round(spread["wall_s"], 3), "cpu_s": round(spread["cpu_s"], 3),
            "peak_rss_mb": round(spread["peak_rss_mb"], 1), "same_diagnosis": spread["diagnosis"] == d,
            "speedup": round(wall / spread["wall_s"], 2)},
    }


def human(results: list[dict]) -> str:
    rows = [f"{'case':42} {'matched':>8} {'lines':>9} {'wall s':>7} {'cpu s':>6} {'matched/s':>10} {'us/m':>6} "
            f"{'RSS MB':>7} {'grep s':>7} {'grep/ff':>7}  diagnosis"]
    for r in results:
        g = r["grep"]
        rows.append(f"{r['case']['name']:42} {r['matched_lines']:>8,} {r['total_lines']:>9,} {r['wall_s']:>7.2f} "
                    f"{r['cpu_s']:>6.2f} "
                    f"{r['matched_lines_per_s']:>10,} {r['us_per_matched_line']:>6.1f} {r['peak_rss_mb']:>7.0f} "
                    f"{g['wall_s']:>7.2f} {g['ratio_grep_over_firstfault']:>7.2f}  "
                    f"{r['sub_domain']} {','.join(r['responsible_nodes']) or '-'} "
                    f"{'CORRECT' if r['correct'] else 'WRONG'}")
    spread = [r for r in results if r["all_cores"]]
    if spread:
        rows.append("")
        rows.append(f"{'the same on every core (analyze --jobs)':42} {'cores':>8} {'wall s':>9} {'speedup':>7} "
                    f"{'cpu s':>6} {'RSS MB':>7}  same diagnosis")
        for r in spread:
            a = r["all_cores"]
            rows.append(f"{r['case']['name']:42} {a['cores']:>8} {a['wall_s']:>9.2f} {a['speedup']:>7.2f} "
                        f"{a['cpu_s']:>6.2f} {a['peak_rss_mb']:>7.0f}  {'yes' if a['same_diagnosis'] else 'NO'}")
    rows.append("")
    rows.append(f"{'stage split (in-process, CPU s)':42} " + " ".join(f"{s:>7}" for s in STAGES) + f" {'total':>7}")
    for r in results:
        rows.append(f"{r['case']['name']:42} " + " ".join(f"{r['stages_s'][s]:>7.3f}" for s in STAGES)
                    + f" {r['stages_total_s']:>7.3f}")
    rows.append("")
    rows.append("wall, cpu: `firstfault analyze --json` in a child" + (" pinned to one core" if results and results[0]["one_core"]
                else "") + "; matched/s, us/m: from the wall time")
    rows.append("grep/ff: grep -E -c time / analyze time, wall (>= 1: firstfault at least as fast); on CPU time: "
                + ", ".join(f"{r['grep']['ratio_grep_over_firstfault_cpu']:.2f}" for r in results))
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, help=f"ranks of the job ({GPUS} a node; default set: 512, 2048, 4096)")
    ap.add_argument("--matched", type=int, help="about how many matched lines the cascade prints")
    ap.add_argument("--noise", type=int, help="noise lines (training steps, NCCL INFO, daemons)")
    ap.add_argument("--fault", choices=sorted(EXPECTED), default="xid79", help="the initiating fault (one case)")
    ap.add_argument("--json", action="store_true", help="one JSON object for programs")
    args = ap.parse_args()
    if args.ranks is None and args.matched is None and args.noise is None:
        cases = DEFAULT_SET
    else:
        cases = (Case(args.ranks or 4096, args.matched or 200_000, args.noise or 1_000_000, args.fault),)
    if any(c.ranks < 2 * GPUS or c.ranks % GPUS for c in cases):
        raise SystemExit(f"--ranks must be a multiple of {GPUS}, at least {2 * GPUS}")
    OUT.mkdir(exist_ok=True)
    results = [measure(c) for c in cases]
    load = os.getloadavg()
    if args.json:
        print(json.dumps({"cases": results, "load_avg": [round(x, 2) for x in load]}, indent=2))
    else:
        print(human(results))
        print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0 if all(r["correct"] and (r["all_cores"] or {}).get("same_diagnosis", True) for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
