"""A webhook endpoint on a local port for the sink tests: a real HTTP server, recording every POST."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """A webhook endpoint: records every POST; can fail the first N with a status, or refuse all."""

    def __init__(self, port: int = 0, fail_first: int = 0, status: int = 503, retry_after: str | None = None):
        self.requests: list[dict] = []
        self.fail_first, self.status, self.retry_after = fail_first, status, retry_after
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):                         # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.requests.append({"t": time.monotonic(), "path": self.path,
                                       "type": self.headers.get("Content-Type"), "body": json.loads(body)})
                if len(outer.requests) <= outer.fail_first:
                    self.send_response(outer.status)
                    if outer.retry_after:
                        self.send_header("Retry-After", outer.retry_after)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                reply = b"ok"
                self.send_response(200)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
