"""Service probes for bench/hostile.py: `firstfault serve` on a free loopback port (issue 10).

The server runs with a write token (so the unauthenticated paths are the ones an
attacker has) and a short request timeout (so "a request past the timeout" is cheap
to provoke with legitimate work). Its RSS is sampled from /proc during each probe.
"""
from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import hostile_inputs as H
from hostile_run import PeakSampler, Probe, proc_kib

TOKEN = "probe-write-token"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, firstfault: str, workdir: Path, timeout_s: float) -> None:
        self.port = free_port()
        env = dict(os.environ, FIRSTFAULT_WRITE_TOKENS=TOKEN, FIRSTFAULT_REQUEST_TIMEOUT_S=str(timeout_s))
        env.pop("FIRSTFAULT_REDIS_URL", None)
        self.log = (workdir / "serve.log").open("wb")
        self.proc = subprocess.Popen([firstfault, "serve", "--host", "127.0.0.1", "--port", str(self.port),
                                      "--log-level", "warning"], stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"firstfault serve exited {self.proc.returncode}; see {workdir / 'serve.log'}")
            if request(self.port, "GET", "/healthz", timeout=2)[0] == 200:
                return
            time.sleep(0.3)
        raise RuntimeError("firstfault serve did not answer /healthz within 60 s")

    def rss_mb(self) -> float:
        return (proc_kib(self.proc.pid, "VmRSS") or 0) / 1024

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def request(port: int, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None, timeout: float = 120) -> tuple[int | str, float, bytes]:
    """(status or error text, seconds, body)."""
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, time.perf_counter() - start, data
    except (OSError, http.client.HTTPException) as exc:
        return f"error: {type(exc).__name__}", time.perf_counter() - start, b""
    finally:
        conn.close()


def stream_post(port: int, path: str, total: int, content_type: str, head: bytes,
                timeout: float = 300) -> tuple[int | str, float, int]:
    """POST ``head`` + filler to ``total`` bytes in 1 MiB sends; (status, seconds, bytes the server took)."""
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    sent = 0
    try:
        conn.putrequest("POST", path)
        conn.putheader("Content-Type", content_type)
        conn.putheader("Content-Length", str(total))
        conn.endheaders()
        conn.send(head)
        sent = len(head)
        block = b"a" * H.MiB
        try:
            while sent < total:
                conn.send(block[:total - sent])
                sent += min(len(block), total - sent)
        except OSError:
            pass                     # the server answered early and closed: read its answer
        resp = conn.getresponse()
        resp.read()
        return resp.status, time.perf_counter() - start, sent
    except (OSError, http.client.HTTPException) as exc:
        return f"error: {type(exc).__name__}", time.perf_counter() - start, sent
    finally:
        conn.close()


def series(port: int) -> tuple[int, int]:
    """(request series lines, distinct ``method`` label values) on /metrics; (-1, -1) if unreadable."""
    status, _, body = request(port, "GET", "/metrics", timeout=30)
    if status != 200:
        return -1, -1
    rows = [ln for ln in body.decode(errors="replace").splitlines() if ln.startswith("firstfault_http_request")]
    return len(rows), len({m for ln in rows for m in re.findall(r'method="([^"]*)"', ln)})


class ServiceProbes:
    """The service probes, run one at a time against one server."""

    def __init__(self, server: Server, session_mib: int, heavy_lines: int, delay: float) -> None:
        self.s, self.port, self.delay = server, server.port, delay
        self.session_mib = session_mib
        self.small = H.analyze_json(H.lines(H.FAULT))
        self.heavy_body = H.analyze_json(H.heavy_app(heavy_lines))
        self.redos_body = H.analyze_json(H.lines(H.redos_line("torch.watchdog_timeout", 26, 230)))
        self.long4 = H.analyze_json(b"Error: " * (4 * H.MiB // 7) + b"\n")

    def analyze(self, body: bytes) -> tuple[int | str, float, bytes]:
        return request(self.port, "POST", "/v1/analyze", body, AUTH)

    def wait_idle(self, limit: float = 180) -> float:
        """Seconds until a small analysis answers 200 within 2 s (the engine is free again)."""
        start = time.monotonic()
        while time.monotonic() - start < limit:
            status, secs, _ = self.analyze(self.small)
            if status == 200 and secs < 2:
                break
            time.sleep(0.5)
        return round(time.monotonic() - start, 1)

    def measured(self, name: str, finding: str, fn: Callable[[], tuple[str, float | None, str, dict]]) -> Probe:
        idle = self.wait_idle()
        sampler = PeakSampler(self.s.proc.pid, key="VmRSS", tree=False, every=0.05)
        base = self.s.rss_mb()
        sampler.start()
        try:
            result, secs, verdict, extra = fn()
        except Exception as exc:                         # a probe's failure is a result, not a crash
            result, secs, verdict, extra = "harness-error", None, f"{type(exc).__name__}: {exc}", {}
        peak = sampler.stop()
        extra = {"server_rss_before_mb": round(base, 1), "waited_idle_s": idle, **extra}
        if self.s.proc.poll() is not None:
            verdict += f" | SERVER EXITED {self.s.proc.returncode}"
        return Probe(name, finding, "service", str(result), None if secs is None else round(secs, 2),
                     round(peak, 1), verdict, extra)

    # ---------------------------------------------------------------- probes

    def metrics_methods(self) -> tuple[str, float | None, str, dict]:
        before, methods_before = series(self.port)
        start = time.perf_counter()
        statuses = set()
        for i in range(50):
            statuses.add(request(self.port, f"PROBE{i:03d}", "/metrics", timeout=10)[0])
        secs = time.perf_counter() - start
        after, methods_after = series(self.port)
        return (f"+{after - before} series", secs,
                f"50 made-up methods (answers {sorted(map(str, statuses))}): request series {before} -> {after}, "
                f"method labels {methods_before} -> {methods_after}",
                {"series_before": before, "series_after": after, "methods_before": methods_before,
                 "methods_after": methods_after})

    def ui_session(self) -> tuple[str, float | None, str, dict]:
        total = self.session_mib * H.MiB
        base = self.s.rss_mb()
        status, secs, sent = stream_post(self.port, "/ui/session", total, "application/x-www-form-urlencoded",
                                         b"token=not-a-token&next=/ui/&pad=")
        # The peak MB column is the server's RSS: it shows whether the body was held, which
        # the bytes sent do not (a server may drain and drop what it refused).
        return (str(status), secs, f"{self.session_mib} MiB form with a wrong token: the client sent "
                f"{sent / H.MiB:.0f} MiB before the answer; server RSS {base:.0f} MB before",
                {"base_rss_mb": round(base, 1), "sent_mib": sent / H.MiB})

    def _long(self, long_body: bytes, label: str) -> tuple[str, float | None, str, dict]:
        """``long_body``; ``delay`` s later /healthz and a small analysis alongside it (during); as soon
        as the long one has answered, another small analysis (after). Is anything stuck behind it?"""
        got: dict[str, tuple[int | str, float, bytes]] = {}

        def call(key: str, fn: Callable[[], tuple[int | str, float, bytes]]) -> threading.Thread:
            t = threading.Thread(target=lambda: got.setdefault(key, fn()))
            t.start()
            return t

        long = call("long", lambda: self.analyze(long_body))
        time.sleep(self.delay)
        others = [call("health", lambda: request(self.port, "GET", "/healthz", timeout=180)),
                  call("during", lambda: self.analyze(self.small))]
        long.join()
        got["after"] = self.analyze(self.small)
        for t in others:
            t.join()
        (ls, lsec, _), health, during, after = got["long"], got["health"], got["during"], got["after"]
        return (f"{ls} / {during[0]} / {after[0]}", lsec,
                f"{label}: {ls} in {lsec:.1f} s | during (+{self.delay:g} s): /healthz {health[0]} in "
                f"{health[1]:.1f} s, small analysis {during[0]} in {during[1]:.1f} s | right after: small "
                f"analysis {after[0]} in {after[1]:.1f} s",
                {"long_status": ls, "long_s": round(lsec, 2), "healthz_during_status": health[0],
                 "healthz_during_s": round(health[1], 2), "small_during_status": during[0],
                 "small_during_s": round(during[1], 2), "small_after_status": after[0],
                 "small_after_s": round(after[1], 2)})

    def redos(self) -> tuple[str, float | None, str, dict]:
        return self._long(self.redos_body, "230-byte ReDoS line")

    def long_line(self) -> tuple[str, float | None, str, dict]:
        return self._long(self.long4, "4 MiB 'Error: ' line")

    def heavy(self) -> tuple[str, float | None, str, dict]:
        return self._long(self.heavy_body, f"legit analysis of {len(self.heavy_body) / H.MiB:.0f} MiB past the timeout")

    def probes(self) -> list[tuple[str, str, Callable[[], tuple[str, float | None, str, dict]]]]:
        """(name, issue finding, probe), in the order they run."""
        return [
            ("svc.metrics_made_up_methods", "5", self.metrics_methods),
            (f"svc.ui_session_{self.session_mib}MiB", "5", self.ui_session),
            ("svc.redos_230B", "2,3", self.redos),
            ("svc.line_4MiB", "3", self.long_line),
            ("svc.heavy_past_timeout", "3", self.heavy),
        ]
