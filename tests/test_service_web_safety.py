"""Other web sites against the service: cross-site writes refused, the Host header checked,
and the pages' own upload form working with tokens set (issue 22, items 3 and 7).

The attack runs as it would: a page on another origin, opened in headless Chromium, posts
a form (and a no-cors fetch) to the service on loopback. The plain HTTP tests pin down
the rules: a browser's cross-site write is refused (Sec-Fetch-Site, else Origin), a
same-origin one and a request with neither header (curl, programs) are not.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from firstfault.connectors.api.app import create_app
from firstfault.connectors.api.auth import UI_COOKIE
from firstfault.connectors.api.settings import ServiceSettings

from test_service_ui import CHROMIUM
from firstfault.streams.broker import free_port

LOG = "Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
WRITE = "web-safety-write-token"


@pytest.fixture
def anyio_backend():
    return "asyncio"


def client(app, base_url: str = "http://test") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base_url)


def upload(**headers: str) -> dict:
    return {"files": {"bundle": ("slurm-66.out", LOG.encode())}, "headers": headers}


async def stored(c: httpx.AsyncClient, **headers: str) -> list[str]:
    r = await c.get("/v1/diagnoses", headers=headers)
    assert r.status_code == 200, r.text[:300]
    return [d["workload_id"] for d in r.json()["items"]]


# ---------------------------------------------------------------- plain HTTP

@pytest.mark.anyio
@pytest.mark.parametrize("headers", [
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},
    {"Sec-Fetch-Site": "cross-site", "Origin": "http://test"},           # the browser's word wins
    {"Origin": "http://evil.example"},                                   # an older browser: Origin only
    {"Origin": "null"},                                                  # a sandboxed frame, a data: URL
    {"Origin": "http://test:8080"},                                      # another port is another origin
], ids=["cross-site", "same-site", "cross-site-own-origin", "foreign-origin", "null-origin", "other-port"])
async def test_a_cross_site_write_is_refused_and_nothing_is_stored(headers):
    async with client(create_app(ServiceSettings())) as c:
        r = await c.post("/v1/analyze", **upload(Accept="text/html,*/*;q=0.8", **headers))
        assert r.status_code == 403, r.text[:300]
        assert r.json()["error"]["code"] == "cross_site_request"
        assert await stored(c) == []
        r = await c.post("/ui/session", content=b"token=x&next=/ui/", headers={
            "Content-Type": "application/x-www-form-urlencoded", **headers})
        assert r.status_code == 403 and "another web site" in r.text and 'name="token"' not in r.text


@pytest.mark.anyio
@pytest.mark.parametrize("headers", [
    {},                                                                  # curl, programs
    {"Sec-Fetch-Site": "same-origin", "Origin": "http://test"},          # the service's own page
    {"Sec-Fetch-Site": "none"},                                          # typed by the user
    {"Origin": "http://test"},                                           # an older browser, same origin
], ids=["no-headers", "same-origin", "user-initiated", "own-origin"])
async def test_a_same_origin_write_and_a_program_are_served(headers):
    async with client(create_app(ServiceSettings())) as c:
        r = await c.post("/v1/analyze", **upload(**headers))
        assert r.status_code == 200, r.text[:300]
        assert await stored(c) == ["slurm-66"]


@pytest.mark.anyio
async def test_the_pages_login_cookie_reaches_the_upload_route():
    """With tokens set the index's form posts to /v1/analyze: the login cookie must be sent there."""
    app = create_app(ServiceSettings(write_tokens=frozenset({WRITE})))
    async with client(app) as c:
        r = await c.post("/ui/session", content=f"token={WRITE}&next=/ui/".encode(),
                         headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert r.status_code == 303
        cookie = next(h for h in r.headers.get_list("set-cookie") if h.startswith(f"{UI_COOKIE}={WRITE}"))
        assert "Path=/;" in cookie and "SameSite=strict" in cookie and "HttpOnly" in cookie, cookie
        r = await c.post("/v1/analyze", **upload(Accept="text/html", **{"Sec-Fetch-Site": "same-origin"}))
        assert r.status_code == 303 and r.headers["location"].startswith("/ui/diagnoses/slurm-66"), r.text[:300]
        # The API's reads still want a bearer token; the cookie is the pages'.
        assert (await c.get("/v1/diagnoses")).status_code == 401
        assert await stored(c, Authorization=f"Bearer {WRITE}") == ["slurm-66"]


@pytest.mark.anyio
async def test_the_host_header_is_checked_on_loopback():
    async def reach(settings: ServiceSettings, host: str, server: tuple[str, int] = ("127.0.0.1", 8080)) -> int:
        app = create_app(settings)
        inner = app.build_middleware_stack()
        seen: list[int] = []

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            if message["type"] == "http.response.start":
                seen.append(message["status"])

        await inner({"type": "http", "method": "GET", "path": "/healthz", "raw_path": b"/healthz", "query_string": b"",
                     "headers": [(b"host", host.encode())], "server": server, "client": ("127.0.0.1", 5000),
                     "scheme": "http", "http_version": "1.1", "root_path": "", "app": app}, receive, send)
        return seen[0]

    loopback = ServiceSettings()
    for ok in ("127.0.0.1:8080", "localhost:8080", "LOCALHOST", "[::1]:8080", "ui.localhost:8080", "127.0.0.2"):
        assert await reach(loopback, ok) == 200, ok
    for bad in ("evil.example:8080", "rebound.attacker.test", "10.0.0.5:8080"):
        assert await reach(loopback, bad) == 400, bad
    # Bound elsewhere, any host, unless the names are set; set, they hold everywhere.
    everywhere = ServiceSettings(host="0.0.0.0", read_tokens=frozenset({"r"}))
    assert await reach(everywhere, "ff.example.com", ("10.0.0.5", 8080)) == 200
    named = ServiceSettings.from_env({"FIRSTFAULT_ALLOWED_HOSTS": "ff.example.com, *.corp.example"})
    assert await reach(named, "ff.example.com") == 200 and await reach(named, "a.corp.example:443") == 200
    assert await reach(named, "localhost:8080") == 400 and await reach(named, "corp.example.evil") == 400
    assert await reach(ServiceSettings(allowed_hosts=frozenset({"*"})), "anything.test") == 200


@pytest.mark.anyio
async def test_a_refused_host_gets_one_json_line_naming_the_setting():
    app = create_app(ServiceSettings(allowed_hosts=frozenset({"ff.example.com"})))
    async with client(app, "http://rebound.attacker.test") as c:
        r = await c.get("/v1/diagnoses")
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_host" and "FIRSTFAULT_ALLOWED_HOSTS" in r.json()["error"]["message"]


# ---------------------------------------------------------------- the attack, in a browser

ATTACK = """<!doctype html><html><body>
<form id="f" method="post" action="{target}/v1/analyze" enctype="multipart/form-data">
  <input type="file" name="bundle" id="file">
</form>
<script>
const file = new File([{log!r}], "slurm-666.out", {{type: "text/plain"}});
const dt = new DataTransfer();
dt.items.add(file);
document.getElementById("file").files = dt.files;
const fd = new FormData();
fd.append("bundle", new File([{log!r}], "slurm-777.out", {{type: "text/plain"}}));
window.fetched = false;
fetch("{target}/v1/analyze", {{method: "POST", mode: "no-cors", body: fd, credentials: "include"}})
  .catch(() => null).then(() => {{ window.fetched = true; }});
</script></body></html>"""


@pytest.fixture
def attacker():
    """A web site of its own: http://localhost:PORT/ (another site than 127.0.0.1) serves the attack page."""
    page: dict[str, bytes] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = page.get("html", b"")
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://localhost:{server.server_address[1]}", page
    finally:
        server.shutdown()
        server.server_close()


def start_service(tmp_path: Path, **env: str):
    """`firstfault serve` as the CLI runs it: loopback, the in-process store."""
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTFAULT_")}
    code = "import sys; from firstfault.connectors.api.serve import serve_main; sys.exit(serve_main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, "--port", str(port), "--log-level", "warning"],
                            env={**clean, **env}, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, proc.stderr.read()
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return base, proc
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the service did not start within 60 s"
        time.sleep(0.2)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()


def listed(base: str, token: str | None = None) -> list[str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return [d["workload_id"] for d in httpx.get(f"{base}/v1/diagnoses", headers=headers).json()["items"]]


def attack(browser, base: str, attacker_url: str, page: dict[str, bytes]) -> None:
    page["html"] = ATTACK.format(target=base, log=LOG).encode()
    browser.open(f"{attacker_url}/")
    browser.wait_for("window.fetched === true")
    browser.eval("document.getElementById('f').submit()")
    browser.wait_for(f"location.href.startsWith('{base}/v1/analyze') && !!document.body && "
                     "document.body.innerText.includes('cross_site_request')")


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is not installed (apt-get install -y chromium)")
def test_a_page_on_another_site_cannot_post_to_the_tokenless_service(tmp_path, attacker):
    from cdp import Browser

    attacker_url, page = attacker
    base, proc = start_service(tmp_path)
    browser = Browser(CHROMIUM, tmp_path / "cdp-profile")
    try:
        attack(browser, base, attacker_url, page)
        assert listed(base) == []          # neither the form nor the fetch was analysed or stored
        # The service's own page still uploads (same origin).
        browser.open(f"{base}/ui/")
        browser.wait_for("document.documentElement.getAttribute('data-ui-ready') === 'true'")
        log = tmp_path / "slurm-88.out"
        log.write_text(LOG)
        browser.set_file("#upload input[type=file]", log)
        browser.eval("document.getElementById('upload').requestSubmit()")
        browser.wait_for("location.pathname === '/ui/diagnoses/slurm-88'")
        assert listed(base) == ["slurm-88"]
    finally:
        browser.close()
        stop(proc)


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is not installed (apt-get install -y chromium)")
def test_with_tokens_the_pages_form_uploads_after_login_and_another_site_still_cannot(tmp_path, attacker):
    from cdp import Browser

    attacker_url, page = attacker
    base, proc = start_service(tmp_path, FIRSTFAULT_WRITE_TOKENS=WRITE)
    browser = Browser(CHROMIUM, tmp_path / "cdp-profile")
    try:
        browser.open(f"{base}/ui/")                        # 401: the page is the login form
        browser.wait_for("!!document.querySelector('form.login input[name=token]')")
        browser.eval(f"document.querySelector('form.login input[name=token]').value = {WRITE!r}; "
                     "document.querySelector('form.login').requestSubmit()")
        browser.wait_for("location.pathname === '/ui/' && !!document.getElementById('upload')")
        log = tmp_path / "slurm-99.out"
        log.write_text(LOG)
        browser.set_file("#upload input[type=file]", log)
        browser.eval("document.getElementById('upload').requestSubmit()")
        browser.wait_for("location.pathname === '/ui/diagnoses/slurm-99' && "
                         "document.documentElement.getAttribute('data-ui-ready') === 'true'")
        assert listed(base, WRITE) == ["slurm-99"]
        attack(browser, base, attacker_url, page)         # the visitor is signed in: still refused
        assert listed(base, WRITE) == ["slurm-99"]
    finally:
        browser.close()
        stop(proc)
