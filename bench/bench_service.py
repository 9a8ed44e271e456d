#!/usr/bin/env python3
"""Benchmark: POST /v1/analyze on a typical bundle against `firstfault serve --workers 2`.

    python bench/bench_service.py [--duration 20] [--concurrency 4] [--workers 2]
                                  [--sample samples/gpu-fell-off-bus-32node] [--json]

Starts the service (through serve_main, as `firstfault serve` does) on a free port
in a child process, checks one answer against the engine's own output, then posts
the bundle in the JSON form from this process's client threads, each waiting for
its answer before sending again, for a bounded time. Prints requests/s and the
p50/p90/p99 latency of successful requests.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def payload(sample: Path) -> bytes:
    files = {p.relative_to(sample).as_posix(): p.read_bytes().decode("utf-8", "surrogateescape")
             for p in sorted(sample.rglob("*"))
             if p.is_file() and p.relative_to(sample).parts[0] in ("logs", "metrics")}
    return json.dumps({"workload": json.loads((sample / "workload.json").read_text()), "files": files}).encode()


def start_server(port: int, workers: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTFAULT_")}   # in-memory store, no auth
    code = "import sys; from firstfault.connectors.api.serve import serve_main; sys.exit(serve_main(sys.argv[1:]))"
    return subprocess.Popen([sys.executable, "-c", code, "--port", str(port), "--workers", str(workers),
                             "--log-level", "warning"], env=env, stderr=subprocess.PIPE, text=True)


def wait_ready(base: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the service exited: {proc.stderr.read()}")
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit("the service did not become ready")


def tree_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) of ``pid`` and every process below it (uvicorn's workers), from /proc."""
    try:
        stats = {}
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    f = (d / "stat").read_text().rsplit(")", 1)[1].split()
                except OSError:                 # gone meanwhile
                    continue
                stats[int(d.name)] = (int(f[1]), int(f[11]) + int(f[12]))   # ppid, utime + stime
    except OSError:
        return None
    tree, todo = set(), [pid]
    while todo:
        cur = todo.pop()
        tree.add(cur)
        todo.extend(p for p, (ppid, _) in stats.items() if ppid == cur and p not in tree)
    return sum(stats[p][1] for p in tree if p in stats) / os.sysconf("SC_CLK_TCK")


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, round(q / 100 * len(sorted_values) + 0.5) - 1))   # nearest rank
    return sorted_values[k]


def run_clients(url: str, body: bytes, concurrency: int, duration: float) -> tuple[list[float], dict[int, int], float]:
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    lock = threading.Lock()
    start = time.perf_counter()
    stop_at = start + duration

    def client() -> None:
        with httpx.Client(timeout=120, headers={"content-type": "application/json"}) as c:
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                status = c.post(url, content=body).status_code
                dt = time.perf_counter() - t0
                with lock:
                    statuses[status] = statuses.get(status, 0) + 1
                    if status == 200:
                        latencies.append(dt)

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, statuses, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sample", type=Path, default=ROOT / "samples" / "gpu-fell-off-bus-32node")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of load (after warm-up)")
    ap.add_argument("--concurrency", type=int, default=4, help="client threads, one request in flight each")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)

    from firstfault.rules.engine import analyze_path

    body = payload(args.sample)
    expected = analyze_path(args.sample).diagnosis.to_json()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_server(port, args.workers)
    try:
        wait_ready(base, proc)
        for _ in range(2 * args.workers):           # warm every worker; check the answer is the engine's
            r = httpx.post(f"{base}/v1/analyze", content=body, headers={"content-type": "application/json"},
                           timeout=120)
            if r.status_code != 200 or r.text != expected:
                raise SystemExit(f"wrong answer from the service: {r.status_code} {r.text[:300]}")
        server0, client0 = tree_cpu_s(proc.pid), time.process_time()
        latencies, statuses, wall = run_clients(f"{base}/v1/analyze", body, args.concurrency, args.duration)
        server1, client1 = tree_cpu_s(proc.pid), time.process_time()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()

    lat = sorted(latencies)
    lines = sum(json.loads(body)["files"][p].count("\n") for p in json.loads(body)["files"])
    result = {
        "sample": args.sample.name, "body_bytes": len(body), "lines": lines,
        "workers": args.workers, "concurrency": args.concurrency, "cpus": os.cpu_count(),
        "duration_s": round(wall, 2), "requests": sum(statuses.values()), "ok": len(lat),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "requests_per_s": round(len(lat) / wall, 2),
        "latency_ms": {"p50": round(percentile(lat, 50) * 1000, 1), "p90": round(percentile(lat, 90) * 1000, 1),
                       "p99": round(percentile(lat, 99) * 1000, 1), "max": round(lat[-1] * 1000, 1) if lat else None,
                       "mean": round(statistics.fmean(lat) * 1000, 1) if lat else None},
        # Where the machine's CPU went per request: the service's processes and this client's threads
        # (both on the same cores: the client's share is capacity the service does not get).
        "server_cpu_ms_per_request": round((server1 - server0) / len(lat) * 1000, 1)
        if lat and server0 is not None and server1 is not None else None,
        "client_cpu_ms_per_request": round((client1 - client0) / len(lat) * 1000, 1) if lat else None,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        lm = result["latency_ms"]
        print(f"POST /v1/analyze  {result['sample']} ({len(body) / 1e6:.2f} MB JSON, {lines} lines)  "
              f"workers={args.workers} clients={args.concurrency} cpus={result['cpus']}")
        print(f"  {result['requests_per_s']} requests/s over {result['duration_s']} s "
              f"({result['ok']} ok of {result['requests']}; statuses {result['statuses']})")
        print(f"  latency p50 {lm['p50']} ms  p90 {lm['p90']} ms  p99 {lm['p99']} ms  max {lm['max']} ms")
        print(f"  CPU per request: server {result['server_cpu_ms_per_request']} ms, "
              f"client {result['client_cpu_ms_per_request']} ms")
    return 0 if len(lat) == sum(statuses.values()) and lat else 1


if __name__ == "__main__":
    raise SystemExit(main())
