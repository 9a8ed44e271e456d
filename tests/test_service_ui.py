"""The diagnosis page in a real browser: `firstfault serve` on a free port, headless Chromium.

Asserts on the DOM after the page's script ran (``--dump-dom``), not on the HTML
source: the root-cause element must name the host and sub_domain and sit in the
first screen (1280x900), which the page's script measures and records.
"""
from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import time
import uuid
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest
import redis

from firstfault.connectors.sinks.redis_store import DiagnosisStore
from firstfault.rules.engine import analyze_path

from conftest import SAMPLES

CHROMIUM = Path("/usr/bin/chromium")
REDIS_URL = "redis://127.0.0.1:6379/0"
WIDTH, HEIGHT = 1280, 900

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is not installed "
                                "(apt-get install -y chromium)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server():
    """`firstfault serve` (through serve_main, as the CLI runs it) with the worked example stored."""
    prefix = f"fftest:{uuid.uuid4().hex}:"
    d = analyze_path(SAMPLES / "worked-example").diagnosis
    DiagnosisStore(REDIS_URL, prefix=prefix).save(d)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTFAULT_")}
    env["FIRSTFAULT_REDIS_PREFIX"] = prefix
    code = ("import sys; from firstfault.connectors.api.serve import serve_main; "
            "sys.exit(serve_main(sys.argv[1:]))")
    proc = subprocess.Popen([sys.executable, "-c", code, "--port", str(port), "--redis-url", REDIS_URL,
                             "--log-level", "warning"], env=env, stderr=subprocess.PIPE, text=True)
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
        r = redis.Redis.from_url(REDIS_URL)
        keys = list(r.scan_iter(match=f"{prefix}*"))
        if keys:
            r.delete(*keys)


def chromium(url: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'chromium-profile'}", f"--window-size={WIDTH},{HEIGHT}", *extra, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


class Elements(HTMLParser):
    """Each element with an id: its attributes and the text inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.by_id: dict[str, dict] = {}
        self.root_attrs: dict[str, str | None] = {}
        self._open: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "html":
            self.root_attrs = a
        if tag in ("br", "img", "input", "link", "meta", "hr"):
            return
        if a.get("id"):
            self.by_id[a["id"]] = {"attrs": a, "text": ""}
        self._open.append((tag, a.get("id")))

    def handle_endtag(self, tag):
        while self._open:
            t, _ = self._open.pop()
            if t == tag:
                break

    def handle_data(self, data):
        for _, el_id in self._open:
            if el_id:
                self.by_id[el_id]["text"] += data


def test_diagnosis_page_shows_root_cause_host_and_sub_domain_in_the_first_screen(server, tmp_path):
    base, _ = server
    url = f"{base}/ui/diagnoses/slurm-4471823"
    assert httpx.get(url).status_code == 200

    shot = tmp_path / "page.png"
    run = chromium(url, tmp_path, f"--screenshot={shot}")
    assert run.returncode == 0, run.stderr[-2000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000       # a real, non-blank render
    assert struct.unpack(">II", png[16:24]) == (WIDTH, HEIGHT)

    run = chromium(url, tmp_path, "--dump-dom")
    assert run.returncode == 0, run.stderr[-2000:]
    dom = Elements()
    dom.feed(run.stdout)
    assert dom.root_attrs.get("data-ui-ready") == "true", "the page script did not run"
    root = dom.by_id["root-cause"]
    assert "node-02" in root["text"] and "nvlink_signal_integrity" in root["text"], root["text"]
    assert root["attrs"].get("data-first-screen") == "true"
    summary = dom.by_id["summary"]
    assert summary["attrs"].get("data-first-screen") == "true"
    assert "status-attributed" in summary["attrs"]["class"] and "attributed" in dom.by_id["status"]["text"]
    assert dom.by_id["root-host"]["text"] == "node-02"
    assert dom.by_id["root-sub-domain"]["text"] == "nvlink_signal_integrity"
    assert "logs/syslog/node-02.log:9" in dom.by_id["root-line"]["text"]
    assert "ROOT CAUSE" in dom.by_id["ev-root"]["text"]
    (tmp_path / "dom.html").write_text(run.stdout)


def test_serve_says_it_is_unauthenticated_on_loopback(server):
    base, proc = server
    proc.terminate()
    proc.wait(timeout=15)
    banner = proc.stderr.read()
    assert "UNAUTHENTICATED" in banner and "loopback only" in banner and "127.0.0.1" in banner
