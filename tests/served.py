"""`firstfault serve` in a child process against the test Redis under a key prefix of its own:
started, waited for (/healthz), stopped, and its keys deleted. Shared by the page and curl tests."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import redis

from firstfault.streams.broker import free_port


@contextmanager
def served(redis_url: str, prefix: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """(base URL, process) of a service reading and writing ``redis_url`` under ``prefix``."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTFAULT_")}
    env["FIRSTFAULT_REDIS_PREFIX"] = prefix
    proc = subprocess.Popen([sys.executable, "-m", "firstfault", "serve", "--port", str(port),
                             "--redis-url", redis_url, "--log-level", "warning"],
                            env=env, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the service did not start within 60 s"
            time.sleep(0.2)
        yield base, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        r = redis.Redis.from_url(redis_url)
        keys = list(r.scan_iter(match=f"{prefix}*"))
        if keys:
            r.delete(*keys)
