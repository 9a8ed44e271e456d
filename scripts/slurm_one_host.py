#!/usr/bin/env python3
"""A real Slurm cluster on one machine: to try ``firstfault up --slurm`` on, and the one the tests use.

    sudo python3 scripts/slurm_one_host.py start DIR    # prints: export SLURM_CONF=DIR/etc/slurm.conf
    sudo python3 scripts/slurm_one_host.py stop DIR

``start`` runs munged, MariaDB (its own, in DIR, on a free port), slurmdbd, slurmctld and one slurmd
per node name (n1, n2, n3: partition ``main``), all on this host, on free ports, with every file
under DIR; the daemons keep running after it returns and their PIDs are noted in DIR/cluster.json.
``stop`` cancels the cluster's jobs and stops those processes by PID, nothing else. It runs as root
(slurmd starts each job as its user) and needs Debian's slurm-wlm, slurmdbd, munge and mariadb-server;
nothing else, and no service of the system is started or changed. The standard library only: it
runs with any python3.

Nothing is faked: jobs go through ``sbatch`` to the real ``slurmctld``, run under the real
``slurmd``/``slurmstepd``, and land in the real accounting (``sacct --json`` from slurmdbd).
Every wait is on a readiness condition with a generous bound, never a fixed sleep, so a busy
machine only makes it slower. The tests (tests/slurm_cluster.py, tests/conftest_slurm.py) use the
same class, with the MariaDB already running on 127.0.0.1:3306.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

DAEMONS = ("munged", "slurmdbd", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "sacct", "scontrol", "sinfo", "scancel", "sacctmgr")
MARIADB = ("mariadbd", "mariadb-install-db")
NODES = ("n1", "n2", "n3")
PACKAGES = "slurm-wlm slurmdbd munge mariadb-server"
RECORD = "cluster.json"


class SlurmUnavailable(RuntimeError):
    """This machine cannot run the cluster (not installed, not root, no MariaDB): tests skip."""


def _found(name: str) -> bool:
    return shutil.which(name) is not None or Path("/usr/sbin", name).exists()


def missing(own_mariadb: bool = False) -> str | None:
    """Why a cluster cannot start here, or None."""
    absent = [p for p in DAEMONS + CLIENTS + (MARIADB if own_mariadb else ()) if not _found(p)]
    if absent:
        return (f"Slurm is not installed ({', '.join(absent)} missing): "
                f"apt-get install -y --no-install-recommends {PACKAGES}")
    if os.geteuid() != 0:
        return "the one-host cluster runs slurmd, which starts each job as its user: it needs root (sudo)"
    return None


def _which(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def _start_time(pid: int) -> str | None:
    """The kernel's start time of a live (not zombie) process, which tells it from a later one of that PID."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


class RecordedProcess:
    """A daemon started by an earlier ``start``, known by its PID and start time: what ``stop`` stops
    (the subset of ``subprocess.Popen`` that ``SlurmCluster.stop`` uses)."""

    def __init__(self, pid: int, started: str) -> None:
        self.pid, self.started, self.returncode = pid, started, None

    def poll(self) -> int | None:
        if _start_time(self.pid) != self.started:
            self.returncode = 0 if self.returncode is None else self.returncode
        return self.returncode

    def _signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        try:
            wait_for(f"pid {self.pid} to exit", lambda: self.poll() is not None, timeout or 1e9, every_s=0.1)
        except TimeoutError:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0) from None
        return self.returncode or 0


class SlurmCluster:
    """``start()`` brings the cluster up (seconds); ``stop()`` cancels jobs and stops every daemon by PID.

    ``mysql=None`` runs a MariaDB of its own under ``root`` (what the command line does); the tests
    give the one already running. ``detach`` puts the daemons in a session of their own, so they
    outlive the command that started them and its terminal.
    """

    def __init__(self, root: Path, mysql: tuple[str, int] | None = ("127.0.0.1", 3306),
                 nodes: tuple[str, ...] = NODES, cpus_per_node: int = 8, detach: bool = False) -> None:
        self.root = Path(root).absolute()
        self.own_mariadb = mysql is None
        self.mysql = mysql or ("127.0.0.1", 0)
        self.nodes = nodes
        self.cpus = cpus_per_node
        self.detach = detach
        tag = uuid.uuid4().hex[:8]
        self.cluster = f"ff{tag}"                      # also the prefix of slurmdbd's tables
        self.database = f"firstfault_slurm_{tag}"
        self.host = socket.gethostname().split(".")[0]
        self.procs: dict[str, subprocess.Popen | RecordedProcess] = {}
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

    def start_now(self, job_id: int, timeout_s: float = 300.0) -> dict[str, str]:
        """Start a pending job now rather than at its BeginTime; its record once it has left PENDING.

        A requeued job may not start for 2 minutes. slurmctld finishes a requeue only once the old
        incarnation's steps have ended (``batch_requeue_fini``), which on a busy machine can come after
        an update made as soon as the job shows PENDING; so the update is made again for as long as
        the scheduler gives BeginTime as the reason, and the wait is on the job's state, not a guess.
        """
        def started() -> dict[str, str] | None:
            job = self.job(job_id)
            if job.get("JobState") != "PENDING":
                return job
            if job.get("Reason") == "BeginTime":
                self.run("scontrol", "update", f"JobId={job_id}", "StartTime=now", check=False)
            return None
        return wait_for(f"job {job_id} to leave PENDING", started, timeout_s, every_s=0.5)

    def sacct(self, job_id: int) -> list[dict[str, Any]]:
        out = self.run("sacct", "--json", "--duplicates", "--jobs", str(job_id))
        return json.loads(out.stdout).get("jobs") or []

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "--noheader", "--Node", "--format=%N %T", check=False)
        return dict(line.split()[:2] for line in out.stdout.splitlines() if len(line.split()) >= 2)

    # ------------------------------------------------------------ lifecycle

    def start(self, timeout_s: float = 120.0) -> "SlurmCluster":
        why = missing(self.own_mariadb)
        if why:
            raise SlurmUnavailable(why)
        if not self.own_mariadb and not self._mysql_answers():
            raise SlurmUnavailable(f"no MariaDB on {self.mysql[0]}:{self.mysql[1]} for slurmdbd")
        for d in ("etc", "munge", "state", "log", "jobs", *(f"spool/{n}" for n in self.nodes)):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        # Others may reach the munge socket (so a user's sbatch and sacct work); the key stays 0600.
        os.chmod(self.root / "munge", 0o755)
        try:
            if self.own_mariadb:
                self._start_mariadb(timeout_s)
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
            if self.own_mariadb:             # a try-out cluster: every user's jobs (the tests' are all root's)
                ids = self.run("squeue", "--noheader", "--format=%A", check=False).stdout.split()
                if ids:
                    self.run("scancel", "--full", *ids, check=False)
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
        self._save()
        if not self.own_mariadb and shutil.which("mysql"):
            subprocess.run(["mysql", "-h", self.mysql[0], "-P", str(self.mysql[1]), "-uroot",
                            "-e", f"DROP DATABASE IF EXISTS {self.database}"], capture_output=True, timeout=60)

    # ------------------------------------------------------------ the record in DIR (for `stop DIR`)

    def _save(self) -> None:
        """DIR/cluster.json: what ``stop`` needs, rewritten after each daemon starts or stops."""
        procs = {}
        for name, p in self.procs.items():
            started = p.started if isinstance(p, RecordedProcess) else _start_time(p.pid)
            if started is not None:
                procs[name] = {"pid": p.pid, "started": started}
        record = {"cluster": self.cluster, "database": self.database, "conf": str(self.conf),
                  "mysql": list(self.mysql), "own_mariadb": self.own_mariadb, "nodes": list(self.nodes),
                  "procs": procs}
        tmp = self.root / f".{RECORD}.tmp"
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        tmp.replace(self.root / RECORD)

    @classmethod
    def recorded(cls, root: Path) -> "SlurmCluster":
        """The cluster a ``start`` left running in ``root``, from its record."""
        root = Path(root).absolute()
        record = json.loads((root / RECORD).read_text())
        c = cls(root, mysql=None if record["own_mariadb"] else tuple(record["mysql"]), nodes=tuple(record["nodes"]))
        c.mysql = tuple(record["mysql"])
        c.cluster, c.database = record["cluster"], record["database"]
        c.procs = {name: RecordedProcess(p["pid"], p["started"]) for name, p in record["procs"].items()}
        return c

    def running(self) -> list[str]:
        return [name for name, p in self.procs.items() if p.poll() is None]

    # ------------------------------------------------------------ processes

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.root / "log" / f"{name}.out", "ab")
        proc = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=self.detach)
        log.close()
        self.procs[name] = proc
        self._save()
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

    def _start_mariadb(self, timeout_s: float) -> None:
        """A MariaDB of our own for slurmdbd: data under DIR/mysql, 127.0.0.1 on a free port, root without
        password (reachable from this host only); none of the system's configuration is read."""
        d = self.root / "mysql"
        data = d / "data"
        if not (data / "mysql").is_dir():
            out = subprocess.run([_which("mariadb-install-db"), "--no-defaults", f"--datadir={data}", "--user=root",
                                  "--auth-root-authentication-method=normal", "--skip-test-db"],
                                 capture_output=True, text=True, timeout=timeout_s, check=False)
            (self.root / "log" / "mariadb-install-db.out").write_text(out.stdout + out.stderr)
            if out.returncode != 0:
                raise RuntimeError(f"mariadb-install-db exited {out.returncode}:\n{(out.stdout + out.stderr)[-2000:]}")
        self.mysql = ("127.0.0.1", free_port())
        self._spawn("mariadbd", [_which("mariadbd"), "--no-defaults", f"--datadir={data}", "--user=root",
                                 "--bind-address=127.0.0.1", f"--port={self.mysql[1]}", f"--socket={d / 'mysqld.sock'}",
                                 f"--pid-file={d / 'mysqld.pid'}", f"--log-error={self.root / 'log' / 'mariadbd.log'}",
                                 "--skip-log-bin", "--innodb-buffer-pool-size=64M"])
        self._ready("mariadbd", f"MariaDB on port {self.mysql[1]}", self._mysql_answers, timeout_s)

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


# ---------------------------------------------------------------- the command line

# What start leaves in DIR; a DIR holding a stopped cluster of ours is cleared of these and reused.
OURS = ("etc", "munge", "state", "log", "spool", "mysql", RECORD, "slurmdbd.pid", "slurmctld.pid")


def _start(root: Path) -> int:
    if (root / RECORD).exists():
        old = SlurmCluster.recorded(root)
        if old.running():
            print(f"a cluster already runs in {root} ({', '.join(old.running())}): "
                  f"stop it first (scripts/slurm_one_host.py stop {root})", file=sys.stderr)
            return 1
        for name in OURS:
            p = root / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    elif root.exists() and any(root.iterdir()):
        print(f"{root} is not empty and holds no cluster of ours: name a new or empty directory", file=sys.stderr)
        return 1
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)                              # users other than root read slurm.conf and reach munge
    t0 = time.monotonic()
    c = SlurmCluster(root, mysql=None, detach=True)
    print(f"starting a one-host Slurm in {root} ...", file=sys.stderr)
    c.start()
    print(f"up in {time.monotonic() - t0:.1f} s: cluster {c.cluster}, nodes {' '.join(c.nodes)} on {c.host} "
          f"(partition main, {c.cpus} CPUs each), daemons' logs in {root / 'log'}\n"
          f"stop it with: sudo python3 {Path(__file__).resolve()} stop {root}\n"
          f"for Slurm's commands (sbatch, squeue, sacct) and firstfault, in each shell:", file=sys.stderr)
    print(f"export SLURM_CONF={c.conf}", flush=True)
    return 0


def _stop(root: Path) -> int:
    if not (root / RECORD).exists():
        print(f"no cluster was started in {root} (no {RECORD})", file=sys.stderr)
        return 1
    c = SlurmCluster.recorded(root)
    alive = c.running()
    c.stop()
    print(f"stopped {', '.join(alive)}" if alive else f"nothing of {root} was running", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="slurm_one_host.py", description=__doc__.split("\n\nNothing is faked")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=("start", "stop"))
    ap.add_argument("dir", type=Path, help="where the cluster keeps its configuration, state and logs")
    args = ap.parse_args(argv)
    root = args.dir.expanduser().absolute()
    if args.action == "stop":
        if os.geteuid() != 0:
            print("the one-host cluster's daemons run as root: stop it as root (sudo)", file=sys.stderr)
            return 2
        return _stop(root)
    why = missing(own_mariadb=True)
    if why:
        print(why, file=sys.stderr)
        return 2
    try:
        return _start(root)
    except (RuntimeError, TimeoutError, OSError) as exc:
        print(f"the cluster did not start (its daemons were stopped): {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
