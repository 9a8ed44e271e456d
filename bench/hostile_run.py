"""Run one probe command in a fresh child with a hard time limit and a peak-RSS measure.

Peak RSS comes from ``/usr/bin/time -v`` when present; a sampler reading VmHWM of the
child's process tree backs it up (and is the only figure for a run killed at the limit).
The child gets its own session, so a timeout kills its whole tree and nothing else.
"""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

TIME = Path("/usr/bin/time")


@dataclass
class Probe:
    """One probe's result, as printed and as --json."""
    name: str
    finding: str                 # issue 10 finding number(s)
    kind: str                    # cli | service | recovery | witness
    result: str                  # exit code, HTTP status, or "timeout"
    seconds: float | None
    peak_mb: float | None
    verdict: str
    extra: dict[str, object] = field(default_factory=dict)


def proc_kib(pid: int, key: str) -> int | None:
    """A ``VmRSS``/``VmHWM`` line of /proc/PID/status, in KiB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


class PeakSampler(threading.Thread):
    """Largest VmHWM (or VmRSS) seen in a process tree, sampled every ``every`` seconds."""

    def __init__(self, pid: int, key: str = "VmHWM", tree: bool = True, every: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.pid, self.key, self.tree, self.every = pid, key, tree, every
        self.peak_kib = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            for p in _tree(self.pid) if self.tree else [self.pid]:
                self.peak_kib = max(self.peak_kib, proc_kib(p, self.key) or 0)
            self._halt.wait(self.every)

    def stop(self) -> float:
        self._halt.set()
        self.join()
        return self.peak_kib / 1024


@dataclass
class Run:
    rc: int | None               # None: killed at the time limit
    seconds: float
    peak_mb: float | None
    stdout: Path
    stderr: str


def _limit_memory(mem_mb: int) -> None:
    if mem_mb:
        cap = mem_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def run(argv: list[str], timeout: float, workdir: Path, mem_mb: int = 0,
        env: dict[str, str] | None = None) -> Run:
    """``argv`` in a new session; killed (whole tree) after ``timeout`` seconds."""
    fd, out_name = tempfile.mkstemp(prefix="stdout-", dir=workdir)
    os.close(fd)
    out, err, tv = Path(out_name), Path(out_name + ".err"), Path(out_name + ".time")
    use_time = TIME.exists()
    full = ([str(TIME), "-v", "-o", str(tv)] if use_time else []) + argv
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    with out.open("wb") as so, err.open("wb") as se:
        child = subprocess.Popen(full, stdout=so, stderr=se, stdin=subprocess.DEVNULL, env=env,
                                 start_new_session=True, preexec_fn=lambda: _limit_memory(mem_mb))
        sampler = PeakSampler(child.pid)
        sampler.start()
        try:
            rc: int | None = child.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            rc = None
    seconds = time.perf_counter() - start
    sampled = sampler.stop()
    peak: float | None = sampled or None
    if rc is not None and use_time:
        for line in tv.read_text(errors="replace").splitlines():
            if "Maximum resident set size" in line:
                peak = int(line.rsplit(":", 1)[1]) / 1024
    elif rc is not None and not use_time:
        # ru_maxrss of all children is a running max: only a rise is this child's.
        after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        if after > before:
            peak = after / 1024
    stderr = err.read_text(errors="replace")
    err.unlink(missing_ok=True)
    tv.unlink(missing_ok=True)
    return Run(rc, seconds, None if peak is None else round(peak, 1), out, stderr)


def stderr_verdict(stderr: str) -> str:
    """A traceback's last line (the exception), else the first non-empty line."""
    text = [ln for ln in stderr.splitlines() if ln.strip()]
    if not text:
        return ""
    if any(ln.startswith("Traceback") for ln in text):
        return "TRACEBACK " + text[-1].strip()[:200]
    return text[0].strip()[:200]
