"""A real one-host Slurm cluster for tests: munged, slurmdbd (on the local MariaDB), slurmctld and one
slurmd per node name, all ours, on free ports, with state under one directory.

Nothing is faked: jobs go through ``sbatch`` to the real ``slurmctld``, run under the real
``slurmd``/``slurmstepd``, and land in the real accounting (``sacct --json`` from slurmdbd).
Every wait is on a readiness condition with a generous bound, never a fixed sleep, so a
busy machine only makes it slower. Daemons run in the foreground and are stopped by PID.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from firstfault.streams.broker import free_port

DAEMONS = ("munged", "slurmdbd", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "sacct", "scontrol", "sinfo", "scancel", "sacctmgr")
NODES = ("n1", "n2", "n3")


class SlurmUnavailable(RuntimeError):
    """This machine cannot run the cluster (not installed, not root, no MariaDB): tests skip."""


def missing() -> str | None:
    """Why a cluster cannot start here, or None."""
    absent = [p for p in DAEMONS + CLIENTS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]
    if absent:
        return f"Slurm is not installed ({', '.join(absent)} missing): apt-get install slurm-wlm slurmdbd munge"
    if os.geteuid() != 0:
        return "the test cluster runs slurmd, which starts jobs as their user: needs root"
    return None


def _which(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def wait_for(what: str, check: Callable[[], Any], timeout_s: float, every_s: float = 0.1) -> Any:
    """Poll ``check`` until it returns something true; its value, or TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")
        time.sleep(every_s)


class SlurmCluster:
    """``start()`` brings the cluster up (seconds); ``stop()`` cancels jobs and stops every daemon by PID."""

    def __init__(self, root: Path, mysql: tuple[str, int] = ("127.0.0.1", 3306), nodes: tuple[str, ...] = NODES,
                 cpus_per_node: int = 8) -> None:
        self.root = Path(root)
        self.mysql = mysql
        self.nodes = nodes
        self.cpus = cpus_per_node
        tag = uuid.uuid4().hex[:8]
        self.cluster = f"ff{tag}"                      # also the prefix of slurmdbd's tables
        self.database = f"firstfault_slurm_{tag}"
        self.host = socket.gethostname().split(".")[0]
        self.procs: dict[str, subprocess.Popen] = {}
        self.conf = self.root / "etc" / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # ------------------------------------------------------------ commands

    def run(self, *argv: str, check: bool = True, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster."""
        out = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout_s, check=False)
        if check and out.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {out.returncode}: {out.stderr.strip()[:500]}")
        return out

    def sbatch(self, script: str, *opts: str, cwd: Path | None = None) -> int:
        """Submit ``script`` (text of a batch script); the job id."""
        cwd = Path(cwd or self.root / "jobs")
        cwd.mkdir(parents=True, exist_ok=True)
        path = cwd / f"job-{uuid.uuid4().hex[:8]}.sh"
        path.write_text(script)
        out = self.run("sbatch", "--parsable", f"--chdir={cwd}", *opts, str(path))
        return int(out.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """slurmctld's record of a job, ``scontrol -o show job`` as {key: value} (22.05's scontrol has no JSON)."""
        out = self.run("scontrol", "-o", "show", "job", str(job_id), check=False)
        return dict(f.split("=", 1) for f in out.stdout.split() if "=" in f) if out.returncode == 0 else {}

    def wait_job(self, job_id: int, states: set[str], timeout_s: float = 120.0) -> dict[str, str]:
        """Wait until slurmctld puts the job in one of ``states``; its record."""
        def reached() -> dict[str, str] | None:
            job = self.job(job_id)
            return job if job.get("JobState") in states else None
        return wait_for(f"job {job_id} to reach {sorted(states)}", reached, timeout_s, every_s=0.25)

    def sacct(self, job_id: int) -> list[dict[str, Any]]:
        out = self.run("sacct", "--json", "--duplicates", "--jobs", str(job_id))
        return json.loads(out.stdout).get("jobs") or []

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "--noheader", "--Node", "--format=%N %T", check=False)
        return dict(line.split()[:2] for line in out.stdout.splitlines() if len(line.split()) >= 2)

    # ------------------------------------------------------------ lifecycle

    def start(self, timeout_s: float = 120.0) -> "SlurmCluster":
        why = missing()
        if why:
            raise SlurmUnavailable(why)
        if not self._mysql_answers():
            raise SlurmUnavailable(f"no MariaDB on {self.mysql[0]}:{self.mysql[1]} for slurmdbd")
        for d in ("etc", "munge", "state", "log", "jobs", *(f"spool/{n}" for n in self.nodes)):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o700)
        try:
            self._start_munge(timeout_s)
            self._write_conf()
            self._start_slurmdbd(timeout_s)
            self._start_slurmctld(timeout_s)
            self._start_slurmds(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Cancel what still runs, then stop the daemons (newest first) by PID and drop the database."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.run("scancel", "--full", "--user=root", check=False)
            try:      # let slurmd end the job steps it started before it goes away itself
                wait_for("jobs to end", lambda: not self.run("squeue", "--noheader", check=False).stdout.strip(),
                         30.0, every_s=0.2)
            except TimeoutError:
                pass
        for name in reversed(list(self.procs)):
            proc = self.procs.pop(name)
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        if shutil.which("mysql"):
            subprocess.run(["mysql", "-h", self.mysql[0], "-P", str(self.mysql[1]), "-uroot",
                            "-e", f"DROP DATABASE IF EXISTS {self.database}"], capture_output=True, timeout=60)

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.root / "log" / f"{name}.out", "ab")
        proc = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        self.procs[name] = proc
        return proc

    def _alive(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is not None:
            tail = (self.root / "log" / f"{name}.out").read_text(errors="replace")[-2000:]
            logs = sorted((self.root / "log").glob("*.log"))
            tail += "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in logs)
            raise RuntimeError(f"{name} exited {proc.returncode}:\n{tail}")

    def _ready(self, name: str, what: str, check: Callable[[], Any], timeout_s: float) -> None:
        def ok() -> Any:
            self._alive(name)
            return check()
        wait_for(what, ok, timeout_s, every_s=0.1)

    def _mysql_answers(self) -> bool:
        try:
            with socket.create_connection(self.mysql, timeout=2):
                return True
        except OSError:
            return False

    # ------------------------------------------------------------ daemons

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    def _start_munge(self, timeout_s: float) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        d = self.root / "munge"
        # --force: munged refuses to run as root, or with a socket outside /run, unless told.
        self._spawn("munged", [_which("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--pid-file={d / 'munged.pid'}",
                               f"--log-file={self.root / 'log' / 'munged.log'}", f"--seed-file={d / 'munged.seed'}"])

        def answers() -> bool:
            with socket.socket(socket.AF_UNIX) as s:
                try:
                    s.connect(str(self.munge_socket))
                    return True
                except OSError:
                    return False
        self._ready("munged", "munged's socket", answers, timeout_s)

    def _write_conf(self) -> None:
        self.dbd_port, self.ctld_port = free_port(), free_port()
        self.node_ports = {n: free_port() for n in self.nodes}
        r = self.root
        auth = f"AuthType=auth/munge\nAuthInfo=socket={self.munge_socket}\n"
        dbd = r / "etc" / "slurmdbd.conf"
        dbd.write_text(
            auth
            + f"DbdHost={self.host}\nDbdAddr=127.0.0.1\nDbdPort={self.dbd_port}\nSlurmUser=root\n"
            f"PidFile={r / 'slurmdbd.pid'}\nLogFile={r / 'log' / 'slurmdbd.log'}\nDebugLevel=info\n"
            f"StorageType=accounting_storage/mysql\nStorageHost={self.mysql[0]}\nStoragePort={self.mysql[1]}\n"
            f"StorageUser=root\nStorageLoc={self.database}\n")
        os.chmod(dbd, 0o600)                           # slurmdbd refuses a readable config (it holds the DB password)
        nodes = "".join(f"NodeName={n} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={p} "
                        f"CPUs={self.cpus} RealMemory=1000 State=UNKNOWN\n" for n, p in self.node_ports.items())
        self.conf.write_text(
            auth
            + f"ClusterName={self.cluster}\nSlurmctldHost={self.host}(127.0.0.1)\nSlurmctldPort={self.ctld_port}\n"
            f"SlurmUser=root\nSlurmdUser=root\nCredType=cred/munge\n"
            f"StateSaveLocation={r / 'state'}\nSlurmdSpoolDir={r / 'spool' / '%n'}\n"
            f"SlurmctldPidFile={r / 'slurmctld.pid'}\nSlurmdPidFile={r / 'spool' / '%n' / 'slurmd.pid'}\n"
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}\nSlurmdLogFile={r / 'log' / 'slurmd-%n.log'}\n"
            "SlurmctldDebug=info\nSlurmdDebug=info\n"
            # no cgroups in a test sandbox; processes are tracked by their parent pids
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n"
            "SwitchType=switch/none\nMpiDefault=none\nSlurmdParameters=config_overrides\n"
            # 22.05 authenticates to slurmdbd with the munge socket named here, not AuthInfo's
            f"AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=127.0.0.1\n"
            f"AccountingStoragePass={self.munge_socket}\nMailProg=/bin/true\n"
            f"AccountingStoragePort={self.dbd_port}\nJobCompType=jobcomp/none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\nSchedulerType=sched/builtin\n"
            # A job at its limit is signalled at once and killed 2 s later; a dead slurmd is not
            # declared so by timeout on a busy machine, and a node set DOWN stays DOWN until
            # resumed (tests set nodes DOWN themselves). CPUs are overstated (config_overrides)
            # so every scenario's jobs run at once.
            "OverTimeLimit=0\nKillWait=2\nSlurmdTimeout=600\nSlurmctldTimeout=600\nMessageTimeout=30\n"
            "InactiveLimit=0\nMinJobAge=600\nReturnToService=1\nJobRequeue=0\n"
            + nodes
            + f"PartitionName=main Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP\n")

    def _start_slurmdbd(self, timeout_s: float) -> None:
        self._spawn("slurmdbd", [_which("slurmdbd"), "-D"])

        def listening() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", self.dbd_port), timeout=1):
                    return True
            except OSError:
                return False
        self._ready("slurmdbd", f"slurmdbd on port {self.dbd_port}", listening, timeout_s)

    def _start_slurmctld(self, timeout_s: float) -> None:
        self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i"])
        self._ready("slurmctld", "scontrol ping: UP",
                    lambda: "is UP" in self.run("scontrol", "ping", check=False, timeout_s=30).stdout, timeout_s)

    def _start_slurmds(self, timeout_s: float) -> None:
        for n in self.nodes:
            self._spawn(f"slurmd-{n}", [_which("slurmd"), "-D", "-N", n])

        def idle() -> bool:
            for n in self.nodes:
                self._alive(f"slurmd-{n}")
            states = self.node_states()
            return all(states.get(n) == "idle" for n in self.nodes)
        wait_for(f"nodes {','.join(self.nodes)} idle", idle, timeout_s, every_s=0.2)
