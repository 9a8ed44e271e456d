"""Drive headless Chromium over the DevTools protocol on a pipe (--remote-debugging-pipe).

Enough for a page test that must act (choose a file, submit a form): open a tab, run a
script in it, set a file input, wait for a condition. No extra package: the protocol is
JSON messages separated by NUL bytes on fds 3 (to the browser) and 4 (from it).
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any


class Browser:
    def __init__(self, chromium: Path, profile: Path) -> None:
        to_browser_r, self._w = os.pipe()
        self._r, from_browser_w = os.pipe()

        def fds() -> None:       # in the child: the protocol's fixed descriptors
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        self.proc = subprocess.Popen(
            [str(chromium), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank"],
            preexec_fn=fds, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buf = b""
        self._id = 0
        self.session: str | None = None

    def send(self, method: str, params: dict | None = None, session: bool = True, timeout: float = 30) -> dict:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" not in self._buf:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no answer to {method}")
                chunk = os.read(self._r, 1 << 16)
                if not chunk:
                    raise RuntimeError("the browser closed the pipe")
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def open(self, url: str) -> None:
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=False)["sessionId"]
        self.send("Page.enable")
        self.send("Page.setBypassCSP", {"enabled": True})     # the test's own scripts; the page's CSP is not under test
        self.send("Page.navigate", {"url": url})

    def eval(self, expression: str) -> Any:
        got = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        return got.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = self.eval(expression)
            except RuntimeError:         # the page is between documents
                value = None
            if value:
                return value
            time.sleep(0.2)
        raise TimeoutError(f"still false after {timeout} s: {expression}")

    def set_file(self, selector: str, path: Path, attempts: int = 50) -> None:
        """Give the file input ``path``. A node id is only good for the document it came from: when a
        navigation (a login's redirect) replaces the document between the lookups and the call, the
        lookups are made again in the new one."""
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:                         # the document may be replaced after any of these three calls
                root = self.send("DOM.getDocument")["root"]["nodeId"]
                node = self.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
                if node:
                    self.send("DOM.setFileInputFiles", {"files": [str(path)], "nodeId": node})
                    return
                assert not last, f"no element matches {selector}"   # the new document has not got that far yet
            except RuntimeError as exc:
                if "Could not find node" not in str(exc) or last:
                    raise
            time.sleep(0.2)

    def close(self) -> None:
        try:
            self.send("Browser.close", session=False, timeout=5)
        except Exception:        # already gone: fall through to terminate
            pass
        for fd in (self._w, self._r):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
