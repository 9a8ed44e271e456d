"""Stream probes for bench/hostile.py: `firstfault up` (embedded broker, one partition) (issue 10).

One partition, so a poison record and the valid workload shipped after it share the
extractor's partition, as in the issue. A workload's outcome is read back from the
diagnoses topic (`firstfault diagnoses --json`) and compared with `analyze --json` on
the same bundle.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import hostile_inputs as H
from hostile_run import Probe, run, stderr_verdict


class Pipeline:
    def __init__(self, firstfault: str, workdir: Path) -> None:
        self.ff, self.work = firstfault, workdir
        env = {k: v for k, v in os.environ.items()
               if k not in ("FIRSTFAULT_KAFKA_BOOTSTRAP", "FIRSTFAULT_REDIS_URL", "FIRSTFAULT_METRICS_PORT")}
        self.log_path = workdir / "up.log"
        self.log = self.log_path.open("wb")
        self.proc = subprocess.Popen([firstfault, "up", "--partitions", "1", "--prefix", "hostile."],
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                     start_new_session=True, cwd=workdir)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            text = self.log_path.read_text(errors="replace")
            if m := re.search(r"firstfault up: broker (\S+)", text):
                if "ready (Ctrl-C to stop)" in text:
                    self.bootstrap = m.group(1)
                    time.sleep(3)                    # let the workers join their groups
                    return
            if self.proc.poll() is not None:
                raise RuntimeError(f"firstfault up exited {self.proc.returncode}; see {self.log_path}")
            time.sleep(0.5)
        raise RuntimeError("firstfault up was not ready within 120 s")

    def args(self) -> list[str]:
        return ["--bootstrap", self.bootstrap, "--prefix", "hostile."]

    def restarts(self) -> int:
        return len(re.findall(r"exited with code .* restarting", self.log_path.read_text(errors="replace")))

    def diagnoses(self, workload_id: str) -> list[dict]:
        r = subprocess.run([self.ff, "diagnoses", "--json", "--idle", "2", *self.args()],
                           capture_output=True, text=True, timeout=120)
        out = []
        for line in r.stdout.splitlines():
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if d.get("workload_id") == workload_id:
                out.append(d)
        return out

    def wait_final(self, workload_id: str, limit: float) -> tuple[list[dict], float]:
        """Every diagnosis of ``workload_id`` once a non-provisional one is there (or at ``limit``)."""
        start = time.monotonic()
        seen: list[dict] = []
        while time.monotonic() - start < limit:
            seen = self.diagnoses(workload_id)
            if any(not d.get("provisional") for d in seen):
                break
            time.sleep(2)
        return seen, time.monotonic() - start

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def _summary(d: dict | None) -> str:
    if d is None:
        return "none"
    return f"{d.get('status')} {d.get('sub_domain')}" + (f" (rev {d['revision']})" if d.get("revision") is not None
                                                          else "")


def _analyze(ff: str, path: Path) -> str:
    r = subprocess.run([ff, "analyze", "--json", str(path)], capture_output=True, timeout=120)
    if r.returncode != 0:
        return f"analyze exit {r.returncode}"
    return _summary(json.loads(r.stdout))


class StreamProbes:
    def __init__(self, pipe: Pipeline, ff: str, work: Path, timeout: float) -> None:
        self.p, self.ff, self.work, self.timeout = pipe, ff, work / "stream", timeout
        self.work.mkdir(exist_ok=True)

    def _bundle(self, name: str, app: bytes) -> Path:
        return H.bundle(self.work, name, app, workload={**H.WORKLOAD, "workload_id": f"hostile-{name}"})

    def _ship(self, path: Path) -> tuple[str, float, str, float | None]:
        r = run([self.ff, "ship", *self.p.args(), str(path)], self.timeout, self.work)
        r.stdout.unlink(missing_ok=True)
        return ("timeout" if r.rc is None else str(r.rc)), r.seconds, stderr_verdict(r.stderr), r.peak_mb

    def _outcome(self, name: str, path: Path, shipped: tuple[str, float, str, float | None], finding: str,
                 label: str) -> Probe:
        rc, secs, err, peak = shipped
        seen, waited = self.p.wait_final(f"hostile-{name}", 90)
        final = next((d for d in reversed(seen) if not d.get("provisional")), None)
        first_final = next((d for d in seen if not d.get("provisional")), None)
        want = _analyze(self.ff, path)
        restarts = self.p.restarts()
        verdict = (f"{label}: ship exit {rc}{' (' + err + ')' if err and rc != '0' else ''}; topic final "
                   f"{_summary(final)} (first final {_summary(first_final)}) vs analyze {want}; "
                   f"worker restarts so far {restarts}")
        return Probe(f"stream.{name}", finding, "stream", rc, round(secs, 2), peak, verdict,
                     {"topic_final": _summary(final), "topic_first_final": _summary(first_final),
                      "analyze": want, "waited_s": round(waited, 1), "restarts": restarts,
                      "diagnoses_seen": len(seen), "same_as_analyze": _summary(final).split(" (rev")[0] == want})

    def invalid_utf8(self) -> Probe:
        """Finding 8: `ship` of a log with non-UTF-8 bytes, and what reaches the diagnoses topic."""
        path = self._bundle("utf8", b"\xff\xfe\x80 binary junk \xc3\x28\n" + H.FAULT.encode() + b" \xed\xa0\x80\xff\n")
        return self._outcome("utf8", path, self._ship(path), "8", "bundle with invalid UTF-8")

    def poison_then_valid(self) -> Probe:
        """Findings 1 and 9: poison lines (ran_for 1e14 ms, a rank past 2**63) shipped twice (the first
        time they wait for the workload's start and die with the held buffer; the second time the start
        is known and the extractor re-reads them on every restart), then a valid workload."""
        poison = self._bundle("poison", H.lines(H.WATCHDOG.format(ran_for=10**14),
                                                "[rank99999999999999999999999]:" + H.FAULT))
        first = self._ship(poison)
        time.sleep(12)
        second = self._ship(poison)
        valid = self._bundle("valid-after-poison", H.lines(H.FAULT))
        return self._outcome("valid-after-poison", valid, self._ship(valid), "1,9",
                             f"poison shipped twice (exit {first[0]}, {second[0]}), then a valid workload")
