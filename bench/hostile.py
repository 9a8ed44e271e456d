#!/usr/bin/env python3
"""Hostile-input probes for issue 10: the CLI, the service and the recovery guard, before/after.

    python bench/hostile.py [--firstfault PATH] [--service] [--stream] [--timeout 60] [--only a,b] [--json [PATH]]

Each CLI probe generates its input in a scratch directory and runs ``firstfault analyze
--json`` on it in a fresh child with a hard time limit (a timeout is a result, the
harness goes on) and its peak RSS. One line per probe: name, issue finding, exit code
(or HTTP status), seconds, peak MB, verdict (diagnosis status, the exit-2 reason, or
the traceback's exception). ``--service`` adds the probes against ``firstfault serve``
(bench/hostile_service.py); ``--stream`` the probes against ``firstfault up`` and ``ship``
(bench/hostile_stream.py). ``--json -`` prints JSON instead of the table; ``--json PATH``
prints the table and writes the JSON to PATH. Probes run one at a time.

Before/after (``../ff-before``: a checkout of the old version with its own venv)::

    ../ff-before/.venv/bin/python bench/hostile.py --firstfault ../ff-before/.venv/bin/firstfault --service
    .venv/bin/python bench/hostile.py --firstfault .venv/bin/firstfault --service
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
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.setrecursionlimit(20_000)        # removing the 1,000-deep probe folder recurses per level

import hostile_inputs as H  # noqa: E402
from hostile_run import Probe, run, stderr_verdict  # noqa: E402

MiB = H.MiB
Builder = Callable[[Path], Path]


def cli_probes() -> list[tuple[str, str, Builder, float]]:
    """(name, finding, input builder, MiB of hostile line for a s/MB figure or 0)."""
    b, ln = H.bundle, H.lines
    wd = "torch.watchdog_timeout"
    wl = dict(H.WORKLOAD)
    return [
        ("control.small_bundle", "-", lambda r: b(r, "control", ln(H.FAULT)), 0),
        ("overflow.ran_for_1e14_ms", "1", lambda r: b(r, "ran-for", ln(H.WATCHDOG.format(ran_for=10**14))), 0),
        ("overflow.rank_1e26_prefix", "1", lambda r: b(r, "rank", ln(
            "[rank99999999999999999999999]:" + H.WATCHDOG.format(ran_for=600061).split(":", 1)[1], H.FAULT)), 0),
        ("utf8.invalid_bytes", "8", lambda r: b(r, "utf8", b"\xff\xfe\x80 binary junk \xc3\x28\n"
                                                + H.FAULT.encode() + b" \xed\xa0\x80\xff\n"), 0),
        ("stamp.syslog_iso_9999-12-31", "6", lambda r: b(r, "stamp-iso", ln(H.FAULT), extra={
            "logs/syslog/node-01.log": ln("9999-12-31T23:59:59.999999+00:00 node-01 kernel: " + H.XID)}), 0),
        ("stamp.syslog_iso_9999_offset_-12:00", "6", lambda r: b(r, "stamp-iso-off", ln(H.FAULT), extra={
            "logs/syslog/node-01.log": ln("9999-12-31T23:59:59.000000-12:00 node-01 kernel: " + H.XID)}), 0),
        ("stamp.dmesg_uptime_1e14_s", "6", lambda r: b(r, "stamp-uptime", ln(H.FAULT), workload={
            **wl, "boot_times": {"node-01": "2026-11-01T00:00:00Z"}}, extra={
            "logs/syslog/node-01.log": ln("[99999999999999.000000] " + H.XID)}), 0),
        ("stamp.workload_end_9999-12-31", "6", lambda r: b(r, "wl-end", ln(H.FAULT), workload={
            **wl, "end_time": "9999-12-31T23:59:59Z"}), 0),
        ("stamp.workload_start_0001-01-01", "6", lambda r: b(r, "wl-start", ln(H.FAULT), workload={
            **wl, "start_time": "0001-01-01T00:00:00Z"}), 0),
        ("workload.int_5000_digits", "6", lambda r: b(r, "bigint", ln(H.FAULT),
                                                      workload=H.big_int_workload(5000)), 0),
        ("workload.json_depth_100k", "6", lambda r: b(r, "deepjson", ln(H.FAULT),
                                                      workload=H.deep_json_workload(100_000)), 0),
        ("folder.depth_1000", "6", lambda r: H.deep_folder(r, 1000), 0),
        ("redos.watchdog_22_items", "2", lambda r: b(r, "redos22", ln(H.redos_line(wd, 22))), 0),
        ("redos.watchdog_24_items", "2", lambda r: b(r, "redos24", ln(H.redos_line(wd, 24))), 0),
        ("redos.watchdog_230B_26_items", "2", lambda r: b(r, "redos230", ln(H.redos_line(wd, 26, 230))), 0),
        ("redos.blocking_wait_26_items", "2", lambda r: b(r, "redos-bw", ln(
            H.redos_line("torch.blocking_wait_timeout", 26))), 0),
        ("line.cuda_error_64KiB_spaces", "3", lambda r: H.repeated_line(
            r, "cuda-spaces", b" ", 64 * 1024 + 25, head=b"RuntimeError: CUDA error:"), 64 / 1024),
        # cuda.error's `(?P<error>.+?)\.?\s*$` is quadratic only when a non-space byte ends the run,
        # and the reader cuts lines at 64 KiB (extract.MAX_LINE): so the 'x' must fall inside them.
        ("line.cuda_error_64KiB_spaces_then_x", "3", lambda r: H.repeated_line(
            r, "cuda-spaces-x", b" ", 64 * 1024 - 8, head=b"RuntimeError: CUDA error:", tail=b"x"), 64 / 1024),
        ("line.error_1MiB", "3", lambda r: H.repeated_line(r, "err1", b"Error: ", 1 * MiB), 1),
        ("line.error_4MiB", "3", lambda r: H.repeated_line(r, "err4", b"Error: ", 4 * MiB), 4),
        ("line.error_50MiB", "3", lambda r: H.repeated_line(r, "err50", b"Error: ", 50 * MiB), 50),
        ("archive.tar_gz_bomb_1GiB_zeros", "7", lambda r: H.tar_bomb(r, 1024 * MiB), 0),
        ("archive.zip_bomb_3GiB_zeros", "7", lambda r: H.zip_bomb(r, 3 * 1024 * MiB), 0),
    ]


def cli_verdict(rc: int | None, stdout: Path, stderr: str, timeout: float) -> str:
    if rc is None:
        return f"timeout >{timeout:g} s"
    if rc == 0:
        try:
            d = json.loads(stdout.read_bytes())
            return f"ok: {d.get('status')} {d.get('sub_domain')}"
        except ValueError:
            return "exit 0 but stdout is not JSON"
    return stderr_verdict(stderr) or f"exit {rc}, no stderr"


def run_cli(name: str, finding: str, build: Builder, line_mib: float, ff: str, work: Path,
            timeout: float, mem_mb: int) -> Probe:
    scratch = work / name
    scratch.mkdir()
    t = time.perf_counter()
    path = build(scratch)
    gen_s = time.perf_counter() - t
    size = path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    r = run([ff, "analyze", "--json", str(path)], timeout, work, mem_mb)
    extra: dict[str, object] = {"input_bytes": size, "generate_s": round(gen_s, 1)}
    if line_mib:
        rate = r.seconds / line_mib
        extra["s_per_MB"] = (">" if r.rc is None else "") + f"{rate:.3g}"
    verdict = cli_verdict(r.rc, r.stdout, r.stderr, timeout)
    if line_mib:
        verdict += f" [{extra['s_per_MB']} s/MB]"
    r.stdout.unlink(missing_ok=True)
    shutil.rmtree(scratch, ignore_errors=True)
    return Probe(name, finding, "cli", "timeout" if r.rc is None else str(r.rc), round(r.seconds, 2),
                 r.peak_mb, verdict, extra)


# ------------------------------------------------------------------ regex witness (engine-independent)

WITNESS = """
import json, sys, pathlib, yaml, firstfault.rules as R
import hostile_inputs as H
out = {}
for f in sorted(pathlib.Path(R.__file__).parent.joinpath("catalog").rglob("*.yaml")):
    for p in (yaml.safe_load(f.read_text()) or {}).get("patterns") or []:
        if p.get("id") in H.REDOS_HEADS:
            out[p["id"]] = H.witness_check(p["regex"], p["id"])
print(json.dumps(out))
"""


def run_witness(py: str, work: Path) -> list[Probe]:
    """The catalog's own regexes under Python ``re``: does the built line still match nothing, and
    how fast does the time grow per item? (This is the witness, not the engine: see the redos.* probes.)"""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent))
    r = subprocess.run([py, "-c", WITNESS], capture_output=True, text=True, env=env, timeout=120, cwd=work)
    if r.returncode != 0:
        return [Probe("witness", "2", "witness", str(r.returncode), None, None, stderr_verdict(r.stderr))]
    found = json.loads(r.stdout)
    probes = []
    for rule in H.REDOS_HEADS:
        w = found.get(rule)
        verdict = ("rule not in catalog" if w is None else "the built line matches: not a witness"
                   if w.get("matched") else f"catalog regex under Python re: x{w['growth_per_item']} per item, "
                   f"{w['s_at_16']} s at 16 items")
        probes.append(Probe(f"witness.{rule}", "2", "witness", "-", None, None, verdict, w or {}))
    return probes


# ------------------------------------------------------------------ recovery guard

def expand(hostlist: str) -> list[str]:
    """Slurm hostlist expansion, enough for ``gpu[001-512,600]`` (one bracket group)."""
    m = re.fullmatch(r"([^\[]*)\[([^\]]+)\](.*)", hostlist)
    if not m:
        return [hostlist]
    head, body, tail = m.groups()
    out = []
    for part in body.split(","):
        lo, _, hi = part.partition("-")
        hi = hi or lo
        out += [f"{head}{i:0{len(lo)}d}{tail}" for i in range(int(lo), int(hi) + 1)]
    return out


def run_recovery(ff: str, py: str, work: Path, timeout: float) -> Probe:
    """A real attributed drain diagnosis whose recovery names ``gpu[001-512]``, fed to the sink's dry run."""
    scratch = work / "recovery"
    wl = {**H.WORKLOAD, "nodes": ["gpu-017"], "ranks": {"0": "gpu-017"}}
    xid = "Nov  2 10:00:00 gpu-017 kernel: [814314.921698] " + H.XID
    cuda = ("[rank0]:[E1102 10:00:01.000000000 ProcessGroupNCCL.cpp:1618] RuntimeError: CUDA error: "
            "an illegal memory access was encountered")
    d = H.bundle(scratch, "xid", workload=wl, extra={"logs/syslog/gpu-017.log": H.lines(xid),
                                                     "logs/app/gpu-017.log": H.lines(cuda)})
    a = subprocess.run([ff, "analyze", "--json", str(d)], capture_output=True, timeout=timeout)
    if a.returncode != 0:
        return Probe("recovery.hostlist_gpu[001-512]", "4", "recovery", str(a.returncode), None, None,
                     "analyze of the seed bundle failed: " + stderr_verdict(a.stderr.decode(errors="replace")))
    diag = json.loads(a.stdout)
    seeded = f"{diag['status']} {diag['sub_domain']} {diag['recovery']['action']}"
    if seeded != "attributed gpu_fell_off_bus drain_nodes":       # the engine changed: make it a drain anyway
        diag.update(status="attributed", provisional=False, sub_domain="gpu_fell_off_bus")
        diag["recovery"]["action"] = "drain_nodes"
    diag["recovery"]["nodes"] = ["gpu[001-512]"]
    diag["responsible_nodes"] = ["gpu[001-512]"]
    (scratch / "d.json").write_text(json.dumps(diag))
    r = run([py, "-m", "firstfault.connectors.sinks.recovery", "--fleet-size", "100000",
             "--audit-log", str(scratch / "audit.jsonl"), str(scratch / "d.json")], timeout, work)
    out = r.stdout.read_text(errors="replace")
    r.stdout.unlink(missing_ok=True)
    commands = [ln for ln in out.splitlines() if ln.startswith("DRY-RUN")]
    named = [m.group(1) for c in commands for m in [re.search(r"NodeName=(\S+)", c) or re.search(r"cordon (\S+)", c)]
             if m]
    nodes = sum(len(expand(n)) for n in named)
    refusal = stderr_verdict(r.stderr)
    verdict = (f"would drain {nodes} node(s) in {len(commands)} command(s), guard max 4/hour"
               + (f": {commands[0][8:90]}" if commands else "") + (f"; {refusal}" if refusal else ""))
    shutil.rmtree(scratch, ignore_errors=True)
    return Probe("recovery.hostlist_gpu[001-512]", "4", "recovery", "timeout" if r.rc is None else str(r.rc),
                 round(r.seconds, 2), r.peak_mb, verdict, {"nodes_drained": nodes, "commands": len(commands),
                                                          "seed_diagnosis": seeded})


# ------------------------------------------------------------------ main

def guarded(name: str, finding: str, fn: Callable[[], Probe]) -> Probe:
    """A probe whose own machinery fails is reported as such; the run goes on."""
    try:
        return fn()
    except Exception as exc:
        return Probe(name, finding, "harness", "harness-error", None, None, f"{type(exc).__name__}: {exc}")


def fmt(p: Probe) -> str:
    secs = "-" if p.seconds is None else f"{p.seconds:.2f}"
    mb = "-" if p.peak_mb is None else f"{p.peak_mb:.0f}"
    return f"{p.name:36} {p.finding:4} {p.result[:24]:24} {secs:>8} {mb:>7}  {p.verdict}"


HEADER = f"{'probe':36} {'#':4} {'exit/status':24} {'seconds':>8} {'peakMB':>7}  verdict"


def main(argv: list[str] | None = None) -> int:
    here = Path(sys.executable).with_name("firstfault")
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--firstfault", default=str(here), help="the firstfault executable (default: next to this python)")
    p.add_argument("--service", action="store_true", help="also probe `firstfault serve` on a free loopback port")
    p.add_argument("--stream", action="store_true",
                   help="also probe `firstfault up` + `ship` (embedded broker): invalid UTF-8, poison records")
    p.add_argument("--timeout", type=float, default=60.0, help="hard limit per CLI probe, seconds")
    p.add_argument("--mem-limit-mb", type=int, default=8192, help="address-space cap per probe (0: none)")
    p.add_argument("--session-mib", type=int, default=300, help="body size for POST /ui/session")
    p.add_argument("--service-timeout", type=float, default=3.0, help="FIRSTFAULT_REQUEST_TIMEOUT_S of the server")
    p.add_argument("--heavy-lines", type=int, default=200_000, help="watchdog lines in the legit long request")
    p.add_argument("--delay", type=float, default=1.5,
                   help="seconds after a long request before the concurrent /healthz and small analysis")
    p.add_argument("--only", default="", help="comma-separated substrings: run only matching probes")
    p.add_argument("--json", nargs="?", const="-", metavar="PATH", help="'-': JSON on stdout; PATH: also write it")
    args = p.parse_args(argv)
    ff = str(Path(args.firstfault).absolute())
    py = str(Path(ff).with_name("python"))
    if not Path(ff).exists():
        p.error(f"no firstfault executable at {ff}")
    wanted = [s for s in args.only.split(",") if s]

    def chosen(name: str) -> bool:
        return not wanted or any(w in name for w in wanted)

    table = sys.stderr if args.json == "-" else sys.stdout
    version = subprocess.run([ff, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"# firstfault {ff} ({version}); timeout {args.timeout:g} s; "
          f"load {os.getloadavg()[0]:.2f}; {time.strftime('%Y-%m-%dT%H:%M:%S')}", file=table)
    print(HEADER, file=table, flush=True)
    probes: list[Probe] = []

    def emit(pr: Probe) -> None:
        probes.append(pr)
        print(fmt(pr), file=table, flush=True)

    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        work = Path(tmp)
        if chosen("witness"):
            for pr in run_witness(py, work):
                emit(pr)
        for name, finding, build, line_mib in cli_probes():
            if chosen(name):
                emit(guarded(name, finding, lambda: run_cli(name, finding, build, line_mib, ff, work,
                                                            args.timeout, args.mem_limit_mb)))
        if chosen("recovery"):
            emit(guarded("recovery.hostlist_gpu[001-512]", "4", lambda: run_recovery(ff, py, work, args.timeout)))
        if args.service:
            from hostile_service import Server, ServiceProbes
            server = Server(ff, work, args.service_timeout)
            try:
                sp = ServiceProbes(server, args.session_mib, args.heavy_lines, args.delay)
                for name, finding, fn in sp.probes():
                    if chosen(name):
                        emit(sp.measured(name, finding, fn))
            finally:
                server.close()
        if args.stream and chosen("stream"):
            from hostile_stream import Pipeline, StreamProbes
            try:
                pipe = Pipeline(ff, work)
            except Exception as exc:
                emit(Probe("stream.up", "1,8", "harness", "harness-error", None, None, f"{type(exc).__name__}: {exc}"))
            else:
                try:
                    st = StreamProbes(pipe, ff, work, args.timeout)
                    emit(guarded("stream.utf8", "8", st.invalid_utf8))
                    emit(guarded("stream.valid-after-poison", "1,9", st.poison_then_valid))
                finally:
                    pipe.close()
    doc = {"firstfault": ff, "version": version, "timeout_s": args.timeout,
           "service_timeout_s": args.service_timeout if args.service else None,
           "probes": [asdict(pr) for pr in probes]}
    if args.json == "-":
        print(json.dumps(doc, indent=2))
    elif args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
