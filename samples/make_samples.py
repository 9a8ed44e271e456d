#!/usr/bin/env python3
"""Write firstfault's sample evidence bundles, deterministically.

    python samples/make_samples.py            # rewrite every sample folder
    python samples/make_samples.py --only worked-example --out "$(mktemp -d)"

stdlib only. Running it twice gives byte-identical folders: every random choice
comes from a ``random.Random`` seeded with the sample's name, and nothing reads
the wall clock.

The bundles follow docs/bundle.md (the layout and workload.json); docs/diagnosis.md
describes what expected.json's fields mean. Every log line that matters has the shape
the producing software prints (kernel, NVIDIA driver, NCCL, PyTorch, torchrun, Slurm;
the rule catalog's examples in rules/catalog/ hold real lines of each), varying only
host names, numbers, pids and stamps; routine training output and routine syslog daemon
lines are plain noise written for these samples.

Layout conventions used by every sample (see samples/README.md):
* ``logs/app/<host>.log`` holds the output of that host's srun tasks, each line
  prefixed by srun ``--label`` with the task id = global rank
  (node_index * gpus_per_node + local_rank).  Lines the per-node torchrun agent
  prints carry the label of the node's first task.  srun's own messages and
  slurmstepd's JOB/STEP banners carry no label and sit in the first (batch)
  host's file, as they would in the batch script's output.
* ``logs/syslog/<host>.log`` holds that host's kernel/daemon lines with RFC 3164
  headers (no year); the host in the header equals the file's host.
* A host with a skewed clock has every stamp it writes (syslog header, glog,
  Python logging, torchrun ``time``) shifted by the same offset.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
from datetime import datetime, timedelta, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
UTC = timezone.utc
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

# PCI bus numbers of the 8 GPUs of one node, in CUDA (PCI) order, per machine type.
BUS_H100 = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]
BUS_H100_B = ["18", "2a", "3a", "5d", "9b", "ab", "ba", "db"]
BUS_B200 = ["1b", "43", "52", "61", "9d", "c3", "d1", "df"]
BUS_A100 = ["07", "0f", "47", "4e", "87", "90", "b7", "bd"]

OOM_DOC = ("If reserved but unallocated memory is large try setting "
           "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
           "See documentation for Memory Management  "
           "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
DUMP_TAIL = ("This is most likely caused by incorrect usages of collectives, e.g., wrong sizes "
             "used across ranks, the order of collectives is not same for all ranks or the "
             "scheduled collective, for some reason, didn't run. Additionally, this can be "
             "caused by GIL deadlock or other reasons such as network errors or bugs in the "
             "communications library (e.g. NCCL), etc. ")


# --------------------------------------------------------------------------- time

def T(iso: str) -> int:
    """'2026-11-02T10:03:11.412' (UTC) -> microseconds since the epoch."""
    dt = datetime.fromisoformat(iso).replace(tzinfo=UTC)
    return (dt - EPOCH) // timedelta(microseconds=1)


def S(seconds: float) -> int:
    return int(round(seconds * 1_000_000))


def _dt(t: int) -> datetime:
    return EPOCH + timedelta(microseconds=t)


def iso_z(t: int) -> str:
    return _dt(t).strftime("%Y-%m-%dT%H:%M:%SZ")


def f_rfc3164(t: int) -> str:
    d = _dt(t)
    return f"{MONTHS[d.month - 1]} {d.day:>2} {d:%H:%M:%S}"


def f_c10(t: int, sev: str = "E") -> str:
    """c10 (PyTorch C++) glog-style stamp: month not zero-padded (E723, E1102)."""
    d = _dt(t)
    return f"{sev}{d.month}{d.day:02d} {d:%H:%M:%S}.{d.microsecond:06d}"


def f_pyglog(t: int, sev: str = "W") -> str:
    """torch.distributed.elastic's glog-like Python stamp (W0726 10:59:50.786825)."""
    d = _dt(t)
    return f"{sev}{d.month:02d}{d.day:02d} {d:%H:%M:%S}.{d.microsecond:06d}"


def f_pylog(t: int) -> str:
    d = _dt(t)
    return f"[{d:%Y-%m-%d %H:%M:%S},{d.microsecond // 1000:03d}]"


def f_elastic_time(t: int) -> str:
    return _dt(t).strftime("%Y-%m-%d_%H:%M:%S")


def f_slurm_time(t: int) -> str:
    return _dt(t).strftime("%Y-%m-%dT%H:%M:%S")


def task_list(ranks: list[int]) -> str:
    """srun's task list: 'task 24' or 'tasks 2,4-5,7'."""
    ranks = sorted(ranks)
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ("task " if len(ranks) == 1 else "tasks ") + ",".join(parts)


# --------------------------------------------------------------------------- bundle

class Job:
    """One sample bundle: the job's shape plus the lines written so far."""

    def __init__(self, name: str, job_id: int, nodes: list[str], *, bus: list[str],
                 start: str, nranks_gpu: int = 8, ip_prefix: str = "10.0.0.",
                 python: str = "python3.10", script: str = "train.py"):
        self.name = name
        self.job_id = job_id
        self.nodes = nodes
        self.G = nranks_gpu
        self.N = len(nodes) * nranks_gpu
        self.bus = bus
        self.start = T(start)
        self.rng = random.Random(name)
        self.script = script
        self.pylib = f"/usr/local/lib/{python}/dist-packages"
        self.files: dict[str, list[tuple[int, int, str]]] = {}
        self._seq = 0
        self.skew = {h: 0 for h in nodes}           # microseconds added to every stamp
        self.syslog_hosts = list(nodes)
        self.uptime_hosts = set(nodes)              # kernel lines carry a [uptime] stamp
        r = self.rng
        self.ip = {h: f"{ip_prefix}{i + 1}" for i, h in enumerate(nodes)}
        self.boot = {h: self.start - S(r.randint(3 * 86400, 40 * 86400) + r.random()) for h in nodes}
        self.agent_pid = {}
        self.pid, self.tid_proxy, self.comm = {}, {}, {}
        for i, h in enumerate(nodes):
            base = r.randint(18000, 240000)
            self.agent_pid[h] = base - r.randint(30, 90)
            for lr in range(self.G):
                rank = i * self.G + lr
                self.pid[rank] = base + lr
                self.tid_proxy[rank] = base + lr + r.randint(120, 900)
                self.comm[rank] = f"0x{r.randint(0x55a00000000, 0x55fffffffff) * 16:x}"
        self.comm_id = f"0x{r.getrandbits(64):016x}"
        self.serial = {}

    def set_pids(self, host: str, base: int) -> None:
        """Give one node's agent and workers consecutive pids starting near `base`."""
        r = self.rng
        self.agent_pid[host] = base - r.randint(30, 90)
        for rank in self.ranks_of(host):
            self.pid[rank] = base + self.local(rank)
            self.tid_proxy[rank] = self.pid[rank] + r.randint(120, 900)

    # -- addressing
    def host(self, rank: int) -> str:
        return self.nodes[rank // self.G]

    def local(self, rank: int) -> int:
        return rank % self.G

    def first_rank(self, host: str) -> int:
        return self.nodes.index(host) * self.G

    def ranks_of(self, host: str) -> list[int]:
        b = self.first_rank(host)
        return list(range(b, b + self.G))

    def pci(self, host: str, local: int) -> str:
        return f"0000:{self.bus[local]}:00"

    def lt(self, host: str, t: int) -> int:
        return t + self.skew[host]

    # -- raw emission
    def put(self, path: str, t: int, text: str) -> None:
        self._seq += 1
        self.files.setdefault(path, []).append((t, self._seq, text))

    def app(self, rank: int, t: int, text: str) -> None:
        """A line written by task `rank` (srun --label prefix)."""
        self.put(f"logs/app/{self.host(rank)}.log", t, f"{rank}: {text}")

    def batch(self, t: int, text: str) -> None:
        """srun's / slurmstepd's own line in the batch host's output (no label)."""
        self.put(f"logs/app/{self.nodes[0]}.log", t, text)

    def kern(self, host: str, t: int, msg: str) -> None:
        if host not in self.syslog_hosts:
            return
        lt = self.lt(host, t)
        if host in self.uptime_hosts:
            up = t - self.boot[host]
            msg = f"[{up // 1_000_000:5d}.{up % 1_000_000:06d}] {msg}"
        self.put(f"logs/syslog/{host}.log", t, f"{f_rfc3164(lt)} {host} kernel: {msg}")

    def daemon(self, host: str, t: int, proc: str, msg: str) -> None:
        if host not in self.syslog_hosts:
            return
        self.put(f"logs/syslog/{host}.log", t, f"{f_rfc3164(self.lt(host, t))} {host} {proc}: {msg}")

    # -- application line shapes
    def nccl_info(self, rank: int, t: int, msg: str, proxy: bool = False) -> None:
        tid = self.tid_proxy[rank] if proxy else self.pid[rank]
        self.app(rank, t, f"{self.host(rank)}:{self.pid[rank]}:{tid} [{self.local(rank)}] NCCL INFO {msg}")

    def nccl_warn(self, rank: int, t: int, where: str, msg: str, proxy: bool = True) -> None:
        tid = self.tid_proxy[rank] if proxy else self.pid[rank]
        self.app(rank, t, f"{self.host(rank)}:{self.pid[rank]}:{tid} [{self.local(rank)}] {where} NCCL WARN {msg}")

    def c10(self, rank: int, t: int, cpp_line: int, msg: str, sev: str = "E") -> None:
        stamp = f_c10(self.lt(self.host(rank), t), sev)
        self.app(rank, t, f"[rank{rank}]:[{stamp} ProcessGroupNCCL.cpp:{cpp_line}] {msg}")

    def pg(self, rank: int) -> str:
        return f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}]"

    def pylog(self, rank: int, t: int, msg: str, level: str = "INFO") -> None:
        self.app(rank, t, f"{f_pylog(self.lt(self.host(rank), t))} {level} {msg}")

    def agent(self, host: str, t: int, sev: str, line: int, msg: str) -> None:
        stamp = f_pyglog(self.lt(host, t), sev)
        self.app(self.first_rank(host), t,
                 f"{stamp} {self.agent_pid[host]} torch/distributed/elastic/multiprocessing/api.py:{line}] {msg}")

    # ------------------------------------------------------------------ phases
    def syslog_noise(self, t0: int, t1: int, every_s: float = 240.0) -> None:
        """Routine daemon chatter on every host, nothing any rule should care about."""
        r = self.rng
        for h in self.nodes:
            t = t0 + S(r.uniform(5, every_s))
            session = r.randint(20, 400)
            while t < t1:
                k = r.randrange(4)
                if k == 0:
                    session += 1
                    self.daemon(h, t, "systemd[1]", f"Started Session {session} of User root.")
                elif k == 1:
                    self.daemon(h, t, f"CRON[{r.randint(100000, 999999)}]",
                                "(root) CMD (command -v debian-sa1 > /dev/null && debian-sa1 1 1)")
                elif k == 2:
                    session += 1
                    self.daemon(h, t, "systemd-logind[1543]", f"New session {session} of user root.")
                else:
                    self.daemon(h, t, "chronyd[1187]", "Selected source 10.0.255.1")
                t += S(r.uniform(0.5, 1.5) * every_s)

    def slurmd_launch(self, t: int) -> None:
        for h in self.nodes:
            self.daemon(h, t + S(self.rng.uniform(0.0, 0.4)), "systemd[1]", "Started Slurm node daemon job step.")

    def nccl_init(self, t0: int, version: str = "2.21.5+cuda12.4", extra=None) -> None:
        """NCCL_DEBUG=INFO start-up chatter of every rank."""
        r = self.rng
        for rank in range(self.N):
            h = self.host(rank)
            lr = self.local(rank)
            t = t0 + S(r.uniform(0.0, 2.0))
            self.nccl_info(rank, t, f"Bootstrap : Using ib0:{self.ip[h]}<0>")
            if rank == 0:
                self.nccl_info(rank, t + 900, f"NCCL version {version}")
            if extra:
                extra(rank, t + 1200)
            nxt = (rank + 1) % self.N
            via = "via P2P/IPC" if self.host(nxt) == h else "[send] via NET/IB/0"
            t += S(r.uniform(1.0, 3.0))
            self.nccl_info(rank, t, f"Channel 00/0 : {rank}[{lr}] -> {nxt}[{self.local(nxt)}] {via}")
            self.nccl_info(rank, t + 310, f"Channel 01/0 : {rank}[{lr}] -> {nxt}[{self.local(nxt)}] {via}")
            t += S(r.uniform(0.5, 1.5))
            self.nccl_info(rank, t, "Connected all rings")
            self.nccl_info(rank, t + S(r.uniform(0.05, 0.4)),
                           f"comm {self.comm[rank]} rank {rank} nranks {self.N} cudaDev {lr} nvmlDev {lr} "
                           f"busId {self.bus[lr]}000 commId {self.comm_id} - Init COMPLETE")

    def training(self, t0: int, t1: int, every_s: float, step0: int, step_s: float,
                 ranks=None, stop=None) -> int:
        """Step lines from every rank in `ranks` every `every_s` seconds in [t0, t1).

        `stop` maps rank -> time after which that rank prints nothing more.
        Returns the step number reached at t1.
        """
        r = self.rng
        ranks = range(self.N) if ranks is None else ranks
        loss0 = 2.9 - 0.00002 * step0
        for rank in ranks:
            t = t0 + S(r.uniform(0, min(every_s, 5.0)))
            end = min(t1, stop.get(rank, t1)) if stop else t1
            while t < end:
                step = step0 + int((t - t0) / 1e6 / step_s)
                loss = max(1.2, loss0 - 0.00002 * (step - step0)) + r.uniform(-0.05, 0.05)
                tps = 41000 + r.randint(-900, 900)
                self.pylog(rank, t, f"step {step} loss {loss:.4f} lr 3.0e-4 tokens/s {tps}")
                t += S(every_s + r.uniform(-0.3, 0.3))
        return step0 + int((t1 - t0) / 1e6 / step_s)

    # ------------------------------------------------------------------ faults
    def gpu_identity(self, host: str, t: int, local: int) -> None:
        """The once-per-GPU UUID / serial lines the driver prints before its first Xid."""
        r = self.rng
        u = r.getrandbits(128)
        h = f"{u:032x}"
        uuid = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
        serial = str(r.randint(1320000000000, 1659999999999))
        self.serial[(host, local)] = serial
        self.kern(host, t, f"NVRM: GPU at PCI:{self.pci(host, local)}: {uuid}")
        self.kern(host, t + 8, f"NVRM: GPU Board Serial Number: {serial}")

    def xid79(self, host: str, t: int, local: int) -> None:
        pci = self.pci(host, local)
        self.gpu_identity(host, t - 11, local)
        self.kern(host, t, f"NVRM: Xid (PCI:{pci}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
        self.kern(host, t + 4, f"NVRM: GPU {pci}.0: GPU has fallen off the bus.")
        self.kern(host, t + 7, f"NVRM: GPU {pci}.0: GPU serial number is {self.serial[(host, local)]}.")

    def watchdog_timeout(self, rank: int, onset: int, seq: int, enqueued: int, completed: int,
                         numel: int = 544997376, timeout_ms: int = 600000, ran_for: int | None = None) -> int:
        """The watchdog's timeout, status and teardown lines; returns the abort time."""
        r = self.rng
        ran = ran_for if ran_for is not None else timeout_ms + r.randint(11, 1400)
        t = onset + ran * 1000
        work = (f"WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn={numel}, NumelOut={numel}, "
                f"Timeout(ms)={timeout_ms}) ran for {ran} milliseconds before timing out.")
        self.c10(rank, t, 632, f"[Rank {rank}] Watchdog caught collective operation timeout: {work}")
        t += r.randint(200, 900)
        self.c10(rank, t, 2268, f"{self.pg(rank)}  failure detected by watchdog at work sequence id: {seq} "
                                f"PG status: last enqueued work: {enqueued}, last completed work: {completed}")
        t += r.randint(20, 90)
        self.c10(rank, t, 670, "Stack trace of the failed collective not found, potentially because "
                               "FlightRecorder is disabled. You can enable it by setting "
                               "TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero value.")
        t += r.randint(30, 300)
        self.c10(rank, t, 684, f"[Rank {rank}] Some NCCL operations have failed or timed out. Due to the "
                               "asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
                               "corrupted/incomplete data.")
        t += r.randint(20, 80)
        self.c10(rank, t, 690, f"[Rank {rank}] To avoid data inconsistency, we are taking the entire process down.")
        t += r.randint(100, 600)
        self.c10(rank, t, 1414, f"{self.pg(rank)} Process group watchdog thread terminated with exception: "
                                f"[Rank {rank}] Watchdog caught collective operation timeout: {work}")
        return t + S(r.uniform(0.05, 0.3))

    @staticmethod
    def alive_at(aborts: dict, candidates, t: int) -> int:
        """The first candidate rank whose process is still alive a little after t."""
        for rank in candidates:
            if aborts.get(rank, 1 << 62) > t + S(0.1):
                return rank
        raise ValueError("no candidate rank is still alive at that time")

    def socket_closed(self, rank: int, t: int, peer_host: str) -> None:
        r = self.rng
        self.nccl_warn(rank, t, "misc/socket.cc:49",
                       f"socketProgress: Connection closed by remote peer {peer_host}<{r.randint(32768, 60999)}>")
        self.nccl_warn(rank, t + r.randint(50, 400), "proxy.cc:1143",
                       f"Socket recv failed while polling for opId=0x{r.randint(0x7f0000000000, 0x7fffffffffff) >> 5 << 5:x}")

    def ib_completion_error(self, rank: int, t: int, peer_host: str) -> None:
        r = self.rng
        self.nccl_warn(rank, t, "transport/net_ib.cc:1696",
                       f"NET/IB : Got completion from peer {self.ip[peer_host]}<{r.randint(32768, 60999)}> "
                       "with error 12, opcode 0, len 0, vendor err 129 (Send)")
        self.nccl_info(rank, t + 40, "transport/net.cc:1176 -> 6", proxy=True)
        self.nccl_info(rank, t + 55, "proxy.cc:793 -> 6", proxy=True)

    def agent_failure(self, host: str, t: int, failed: list[tuple[int, int, int]],
                      killed: list[int] = ()) -> int:
        """torchrun's per-node failure report.

        failed: [(rank, exitcode, when)] with the first observed failure first.
        killed: ranks still running that the agent terminates.
        """
        r = self.rng
        t += r.randint(1, 999)
        for rank in killed:
            self.agent(host, t, "W", 897, f"Sending process {self.pid[rank]} closing signal SIGTERM")
            t += r.randint(300, 2500)
        t += S(r.uniform(0.3, 1.2))
        root = failed[0]
        self.agent(host, t, "E", 869, f"failed (exitcode: {root[1]}) local_rank: {self.local(root[0])} "
                                      f"(pid: {self.pid[root[0]]}) of binary: /usr/bin/python3")
        lab = self.first_rank(host)
        lib = self.pylib
        tb = [
            "Traceback (most recent call last):",
            '  File "/usr/local/bin/torchrun", line 8, in <module>',
            "    sys.exit(main())",
            f'  File "{lib}/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 355, in wrapper',
            "    return f(*args, **kwargs)",
            f'  File "{lib}/torch/distributed/run.py", line 919, in main',
            "    run(args)",
            f'  File "{lib}/torch/distributed/run.py", line 910, in run',
            "    elastic_launch(",
            f'  File "{lib}/torch/distributed/launcher/api.py", line 138, in __call__',
            "    return launch_agent(self._config, self._entrypoint, list(args))",
            f'  File "{lib}/torch/distributed/launcher/api.py", line 269, in launch_agent',
            "    raise ChildFailedError(",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
            "=" * 60,
            f"{self.script} FAILED",
            "-" * 60,
            "Failures:",
        ]

        def entry(idx: int, f: tuple[int, int, int]) -> list[str]:
            rank, code, when = f
            pid = self.pid[rank]
            if code < 0:
                sig = {6: "SIGABRT", 9: "SIGKILL", 15: "SIGTERM"}[-code]
                why = f"Signal {-code} ({sig}) received by PID {pid}"
            else:
                why = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
            return [f"[{idx}]:",
                    f"  time      : {f_elastic_time(self.lt(host, when))}",
                    f"  host      : {host}",
                    f"  rank      : {rank} (local_rank: {self.local(rank)})",
                    f"  exitcode  : {code} (pid: {pid})",
                    "  error_file: <N/A>",
                    f"  traceback : {why}"]

        if len(failed) == 1:
            tb.append("  <NO_OTHER_FAILURES>")
        else:
            for i, f in enumerate(failed[1:], start=1):
                tb.extend(entry(i, f))
        tb.append("-" * 60)
        tb.append("Root Cause (first observed failure):")
        tb.extend(entry(0, root))
        tb.append("=" * 60)
        t += r.randint(2000, 9000)
        for line in tb:
            self.put(f"logs/app/{host}.log", t, f"{lab}: {line}")
        return t

    def srun_exit(self, t: int, host: str, ranks: list[int], how: str = "Exited with exit code 1") -> None:
        self.batch(t, f"srun: error: {host}: {task_list(ranks)}: {how}")

    # ------------------------------------------------------------------ output
    def write(self, out: str, workload: dict, expected: dict) -> None:
        if os.path.isdir(out):
            shutil.rmtree(out)
        os.makedirs(out)
        for path in sorted(self.files):
            full = os.path.join(out, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            rows = sorted(self.files[path])
            with open(full, "w", encoding="utf-8", newline="\n") as fh:
                fh.write("".join(text + "\n" for _, _, text in rows))
        for fname, obj in (("workload.json", workload), ("expected.json", expected)):
            with open(os.path.join(out, fname), "w", encoding="utf-8", newline="\n") as fh:
                fh.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")

    def workload(self, state: str, exit_code: str, end: int, time_limit_s: int = 14400, **extra) -> dict:
        w = {
            "workload_id": f"slurm-{self.job_id}",
            "attempt": 0,
            "scheduler": "slurm",
            "state": state,
            "exit_code": exit_code,
            "start_time": iso_z(self.start),
            "end_time": iso_z(end),
            "nodes": list(self.nodes),
            "gpus_per_node": self.G,
            "ranks": {"0": self.nodes[0], str(self.G): self.nodes[1]},
            "time_limit_s": time_limit_s,
        }
        w.update(extra)
        return w


def expected(status: str, terminal: str, domain: str, sub: str,
             responsible=(), suspect=(), recovery: str = "notify_owner") -> dict:
    """The right diagnosis' key fields; ``recovery`` is the action a recovery system should take."""
    return {"status": status, "terminal_state": terminal, "domain": domain, "sub_domain": sub,
            "responsible_nodes": sorted(responsible), "suspect_nodes": sorted(suspect),
            "recovery_action": recovery}


# =========================================================================== samples

def worked_example(out: str) -> None:
    """NVLink5 link down (Xid 149, alignment loss) on node-02 -> three kinds of NCCL echo."""
    nodes = [f"node-{i:02d}" for i in range(1, 5)]
    j = Job("worked-example", 4471823, nodes, bus=BUS_B200, start="2026-11-02T09:58:00")
    j.skew["node-04"] = S(3.0)                       # node-04's clock runs 3 s fast
    r = j.rng
    j.syslog_noise(T("2026-11-02T09:40:00"), T("2026-11-02T10:14:00"))
    j.slurmd_launch(T("2026-11-02T09:58:01"))
    j.nccl_init(T("2026-11-02T09:58:21"))
    fault = T("2026-11-02T10:03:11.412")
    j.training(T("2026-11-02T09:59:00"), fault - S(1.5), 20.0, 45100, 0.9)

    # node-02, GPU 0000:1b:00 (local rank 0 = rank 8): NVLink5 link down.
    culprit, local = "node-02", 0
    victim = j.first_rank(culprit) + local
    pci = j.pci(culprit, local)
    j.gpu_identity(culprit, fault - 9, local)
    j.kern(culprit, fault, f"NVRM: Xid (PCI:{pci}): 149, pid={j.pid[victim]}, name=python3, NETIR_LINK_EVT Fatal "
                           "XC0 i0 Link 08 (0x004505c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)")
    for k, ch in enumerate(("00000001", "00000002", "0000000c")):
        j.kern(culprit, fault + S(0.004) + k * 731,
               f"NVRM: Xid (PCI:{pci}): 45, pid={j.pid[victim]}, name=python3, Ch {ch} caused by previous Xid 149")
    j.kern(culprit, fault + S(0.571),
           f"NVRM: Xid (PCI:{pci}): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)")

    # Everyone but rank 8 enqueues SeqNum 45390 and waits for the GPU that lost its link.
    aborts = {}
    for rank in range(j.N):
        if rank == victim:
            continue
        onset = fault + S(r.uniform(0.15, 0.95))
        aborts[rank] = j.watchdog_timeout(rank, onset, 45390, 45390 + r.randint(8, 13), 45389)
    # Echoes as node-02's processes go away: a socket peer, an IB peer.
    node02_gone = min(aborts[x] for x in j.ranks_of(culprit) if x in aborts)
    t_sock, t_ib = node02_gone + S(0.21), node02_gone + S(0.48)
    sock_rank = j.alive_at(aborts, [3, 5, 1, 6, 0, 2, 4, 7], t_sock)
    ib_rank = j.alive_at(aborts, [19, 21, 17, 22, 16, 18, 20, 23], t_ib)
    j.socket_closed(sock_rank, t_sock, culprit)
    j.ib_completion_error(ib_rank, t_ib, culprit)

    end = 0
    for h in nodes:
        rk = [x for x in j.ranks_of(h) if x in aborts]
        rk.sort(key=lambda x: aborts[x])
        first = rk[0]
        killed = [x for x in j.ranks_of(h) if x == victim]
        failed = [(first, -6, aborts[first])] + [(x, -6, aborts[x]) for x in rk[1:3]]
        t_done = j.agent_failure(h, aborts[rk[-1]] + S(0.4), failed, killed)
        end = max(end, t_done)
    t = end + S(0.6)
    order = ["node-03", "node-01", "node-04", "node-02"]
    for h in order:
        rk = j.ranks_of(h)
        if h == "node-03":
            j.srun_exit(t, h, [ib_rank])
            t += S(0.05)
            j.srun_exit(t, h, [x for x in rk if x != ib_rank])
        else:
            j.srun_exit(t, h, rk)
        t += S(r.uniform(0.1, 0.7))
    j.write(out, j.workload("FAILED", "1:0", t + S(1.2)),
            expected("attributed", "failed", "interconnect", "nvlink_signal_integrity", [culprit],
                     recovery="drain_nodes"))


def gpu_fell_off_bus(out: str) -> None:
    """32 nodes; gpu-017 loses a GPU from PCIe; 248 ranks time out 10 min later."""
    nodes = [f"gpu-{i:03d}" for i in range(1, 33)]
    j = Job("gpu-fell-off-bus-32node", 4472001, nodes, bus=BUS_H100_B, start="2026-11-02T09:48:00",
            ip_prefix="10.0.1.")
    j.skew["gpu-009"] = S(4.0)                       # gpu-009's clock runs 4 s fast
    r = j.rng
    culprit, local = "gpu-017", 4                    # GPU 0000:9b:00, rank 132
    victim = j.first_rank(culprit) + local
    pci = j.pci(culprit, local)
    fault = T("2026-11-02T10:00:00.282")
    j.syslog_noise(T("2026-11-02T09:40:00"), T("2026-11-02T10:10:30"), every_s=300)
    j.slurmd_launch(T("2026-11-02T09:48:01"))
    j.nccl_init(T("2026-11-02T09:48:25"))
    j.training(T("2026-11-02T09:49:00"), fault - S(0.8), 60.0, 88000, 0.95)

    port = "0000:9a:00.0"
    t = fault - S(63.4)
    for k in range(4):                               # corrected AER burst a minute before
        j.kern(culprit, t, f"pcieport {port}: PCIe Bus Error: severity=Corrected, type=Data Link Layer, "
                           "id=9a00(Transmitter ID)")
        j.kern(culprit, t + 179, f"pcieport {port}:    [12] Replay Timer Timeout  ")
        t += S(r.uniform(0.8, 2.6))
    t = fault - S(0.102)
    j.kern(culprit, t, f"pcieport {port}: AER: Uncorrected (Fatal) error received: id=9a00")
    j.kern(culprit, t + 13, f"pcieport {port}: PCIe Bus Error: severity=Uncorrected (Fatal), "
                            "type=Transaction Layer, id=9a00(Receiver ID)")
    j.kern(culprit, t + 153, f"pcieport {port}:    [ 5] Surprise Down Error    (First)")
    j.kern(culprit, t + 208, f"nvidia {pci}.0: device has no AER-aware driver")
    j.xid79(culprit, fault, local)

    # The rank on the lost GPU: its watchdog dies on the CUDA error; the agent stops the node.
    t = fault + S(0.94) + r.randint(1, 999)
    j.c10(victim, t, 1899, f"{j.pg(victim)} Process group watchdog thread terminated with exception: "
                           "CUDA error: unspecified launch failure")
    others_local = [x for x in j.ranks_of(culprit) if x != victim]
    t_agent = j.agent_failure(culprit, t + S(0.3), [(victim, -6, t + S(0.1))], others_local)
    j.srun_exit(t_agent + S(0.9), culprit, j.ranks_of(culprit))

    aborts = {}
    for rank in range(j.N):
        if j.host(rank) == culprit:
            continue
        onset = fault + S(r.uniform(0.1, 1.1))
        aborts[rank] = j.watchdog_timeout(rank, onset, 88213, 88213 + r.randint(6, 13), 88212,
                                          numel=1073741824)
    # A few proxy threads notice peers going away during the teardown.
    for rank, peer in ((127, "gpu-018"), (140, "gpu-016"), (201, "gpu-030")):
        t_sock = min(aborts[x] for x in j.ranks_of(peer)) + S(0.15)
        base = j.first_rank(j.host(rank))
        cand = [rank] + [base + (rank - base + k) % j.G for k in range(1, j.G)]
        j.socket_closed(j.alive_at(aborts, cand, t_sock), t_sock, peer)

    end = 0
    for h in nodes:
        if h == culprit:
            continue
        rk = sorted(j.ranks_of(h), key=lambda x: aborts[x])
        failed = [(rk[0], -6, aborts[rk[0]])]
        if r.random() < 0.5:
            failed.append((rk[1], -6, aborts[rk[1]]))
        end = max(end, j.agent_failure(h, aborts[rk[-1]] + S(0.3), failed))
    t = end + S(0.5)
    for h in sorted((h for h in nodes if h != culprit), key=lambda _: r.random()):
        j.srun_exit(t, h, j.ranks_of(h))
        t += S(r.uniform(0.02, 0.2))
    # Contract section 2: an uncorrectable AER just before the Xid 79 is the root (pcie_error).
    j.write(out, j.workload("FAILED", "1:0", t + S(1.5)),
            expected("attributed", "failed", "host", "pcie_error", [culprit], recovery="drain_nodes"))


def cuda_oom_one_rank(out: str) -> None:
    """Rank 5 on a100-01 runs out of GPU memory; a100-02's ranks see remote errors and time out."""
    nodes = ["a100-01", "a100-02"]
    j = Job("cuda-oom-one-rank", 4472113, nodes, bus=BUS_A100, start="2026-11-04T14:00:00")
    r = j.rng
    j.syslog_noise(T("2026-11-04T13:50:00"), T("2026-11-04T14:33:00"))
    j.slurmd_launch(T("2026-11-04T14:00:01"))
    j.nccl_init(T("2026-11-04T14:00:24"))
    oom = T("2026-11-04T14:22:37.114")
    j.training(T("2026-11-04T14:01:00"), oom - S(2.0), 30.0, 12000, 1.6)
    victim = 5
    lib = j.pylib
    tb = [
        "Traceback (most recent call last):",
        '  File "/workspace/train.py", line 412, in <module>',
        "    main()",
        '  File "/workspace/train.py", line 388, in main',
        "    loss = train_step(model, batch, optimizer)",
        '  File "/workspace/train.py", line 241, in train_step',
        '    logits = model(batch["input_ids"])',
        f'  File "{lib}/torch/nn/modules/module.py", line 1553, in _wrapped_call_impl',
        "    return self._call_impl(*args, **kwargs)",
        f'  File "{lib}/torch/nn/modules/module.py", line 1562, in _call_impl',
        "    return forward_call(*args, **kwargs)",
        '  File "/workspace/model.py", line 187, in forward',
        "    h = self.lm_head(self.norm(x)).float()",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 5 has a total "
        "capacity of 79.14 GiB of which 1.87 GiB is free. Including non-PyTorch memory, this process has "
        "77.26 GiB memory in use. Of the allocated memory 70.11 GiB is allocated by PyTorch, and 6.63 GiB "
        "is reserved by PyTorch but unallocated. " + OOM_DOC,
    ]
    for line in tb:
        j.app(victim, oom, f"[rank{victim}]: {line}")
    exit_t = oom + S(1.32)
    siblings = [x for x in j.ranks_of("a100-01") if x != victim]
    t_agent = j.agent_failure("a100-01", exit_t + S(0.2), [(victim, 1, exit_t)], siblings)
    j.srun_exit(t_agent + S(0.8), "a100-01", j.ranks_of("a100-01"))
    gone = exit_t + S(1.1)
    for rank in (8, 11, 14):
        j.socket_closed(rank, gone + S(r.uniform(0.05, 0.6)), "a100-01")
    aborts = {}
    for rank in j.ranks_of("a100-02"):
        onset = oom + S(r.uniform(0.12, 0.8))
        aborts[rank] = j.watchdog_timeout(rank, onset, 31207, 31207 + r.randint(2, 6), 31206, numel=268435456)
    rk = sorted(aborts, key=aborts.get)
    end = j.agent_failure("a100-02", aborts[rk[-1]] + S(0.3),
                          [(rk[0], -6, aborts[rk[0]]), (rk[1], -6, aborts[rk[1]])])
    j.srun_exit(end + S(0.7), "a100-02", j.ranks_of("a100-02"))
    j.write(out, j.workload("FAILED", "1:0", end + S(2.3)),
            expected("attributed", "failed", "application", "cuda_oom", ["a100-01"]))


def walltime_timeout(out: str) -> None:
    """The job ran normally until its 4 h limit; NCCL errors come from the SIGTERM teardown."""
    nodes = [f"node-{i:02d}" for i in range(1, 5)]
    j = Job("walltime-timeout", 4471900, nodes, bus=BUS_H100, start="2026-11-03T10:00:00")
    r = j.rng
    j.syslog_noise(T("2026-11-03T09:50:00"), T("2026-11-03T14:01:00"), every_s=900)
    j.slurmd_launch(T("2026-11-03T10:00:01"))
    j.nccl_init(T("2026-11-03T10:00:22"))
    limit = T("2026-11-03T14:00:07")
    step = j.training(T("2026-11-03T10:01:00"), limit - S(3.0), 300.0, 0, 0.45)
    for hour in range(1, 4):
        t = T("2026-11-03T10:01:00") + S(hour * 3600 + 12.5)
        s = int(hour * 3600 / 0.45)
        j.pylog(0, t, f"saved checkpoint to /lustre/ckpt/run-42/step_{s:06d}")
    j.batch(limit, "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.")
    j.batch(limit + 180, f"slurmstepd: error: *** JOB {j.job_id} ON {nodes[0]} CANCELLED AT "
                         f"{f_slurm_time(limit)} DUE TO TIME LIMIT ***")
    j.batch(limit + 391, f"slurmstepd: error: *** STEP {j.job_id}.0 ON {nodes[0]} CANCELLED AT "
                         f"{f_slurm_time(limit)} DUE TO TIME LIMIT ***")
    for h in nodes:
        t = limit + S(r.uniform(0.05, 0.3))
        for rank in j.ranks_of(h):
            j.agent(h, t, "W", 897, f"Sending process {j.pid[rank]} closing signal SIGTERM")
            t += r.randint(200, 900)
    # Teardown echoes, all after the limit.
    j.socket_closed(17, limit + S(0.91), "node-02")
    j.nccl_warn(30, limit + S(1.07), "misc/socket.cc:518",
                f"Net : Call to recv from {j.ip['node-01']}<{r.randint(32768, 60999)}> failed : Broken pipe")
    j.socket_closed(2, limit + S(1.22), "node-04")
    t = limit + S(2.4)
    for h in ["node-02", "node-04", "node-01", "node-03"]:
        j.srun_exit(t, h, j.ranks_of(h), "Terminated")
        t += S(r.uniform(0.05, 0.4))
    j.write(out, j.workload("TIMEOUT", "0:15", t + S(1.0)),
            expected("attributed", "timeout", "scheduler", "walltime_exceeded"))


def ambiguous_two_faults(out: str) -> None:
    """A DBE on node-03's GPU and an IB port down on node-06, 1.6 s apart; both fit the cascade."""
    nodes = [f"node-{i:02d}" for i in range(1, 9)]
    j = Job("ambiguous-two-faults", 4472230, nodes, bus=BUS_H100, start="2026-11-05T16:00:00")
    j.uptime_hosts.discard("node-06")               # node-06's rsyslog template has no [uptime]
    r = j.rng
    j.syslog_noise(T("2026-11-05T15:50:00"), T("2026-11-05T16:31:00"))
    j.slurmd_launch(T("2026-11-05T16:00:01"))
    j.nccl_init(T("2026-11-05T16:00:25"))
    dbe = T("2026-11-05T16:20:41.312")
    ib_down = T("2026-11-05T16:20:42.870")
    j.training(T("2026-11-05T16:01:00"), dbe - S(1.0), 30.0, 20100, 0.85)

    gpu_host, gl = "node-03", 1                      # GPU 0000:2a:00, rank 17
    ecc_rank = j.first_rank(gpu_host) + gl
    pci = j.pci(gpu_host, gl)
    j.gpu_identity(gpu_host, dbe - 10, gl)
    j.kern(gpu_host, dbe, f"NVRM: Xid (PCI:{pci}): 48, pid='<unknown>', name=<unknown>, An uncorrectable "
                          "double bit error (DBE) has been detected on GPU in the framebuffer at physAddr "
                          "0x3ffc2a860 partition 5, subpartition 0.")
    j.kern("node-06", ib_down, "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link DOWN")

    # node-03 rank 17 dies on the ECC error; the node's agent stops its siblings.
    t = dbe + S(0.61) + r.randint(1, 999)
    j.c10(ecc_rank, t, 1899, f"{j.pg(ecc_rank)} Process group watchdog thread terminated with exception: "
                             "CUDA error: uncorrectable ECC error encountered")
    sib = [x for x in j.ranks_of(gpu_host) if x != ecc_rank]
    t_agent = j.agent_failure(gpu_host, t + S(0.35), [(ecc_rank, -6, t + S(0.1))], sib)
    j.srun_exit(t_agent + S(0.8), gpu_host, j.ranks_of(gpu_host))
    # node-06's NCCL sees the port go; its IB peers' sends fail about 30 s later.
    for rank in (45, 42):
        j.nccl_warn(rank, ib_down + S(r.uniform(0.05, 0.2)), "transport/net_ib.cc:133",
                    "NET/IB : Got async event : port error")
    for rank in (39, 48):
        j.ib_completion_error(rank, ib_down + S(r.uniform(30.5, 31.5)), "node-06")

    aborts = {}
    for rank in range(j.N):
        if j.host(rank) == gpu_host:
            continue
        onset = dbe + S(r.uniform(0.2, 1.9))
        aborts[rank] = j.watchdog_timeout(rank, onset, 23077, 23077 + r.randint(5, 12), 23076)
    end = 0
    for h in nodes:
        if h == gpu_host:
            continue
        rk = sorted(j.ranks_of(h), key=lambda x: aborts[x])
        end = max(end, j.agent_failure(h, aborts[rk[-1]] + S(0.3), [(rk[0], -6, aborts[rk[0]])]))
    t = end + S(0.5)
    for h in nodes:
        if h != gpu_host:
            j.srun_exit(t, h, j.ranks_of(h))
            t += S(r.uniform(0.05, 0.3))
    j.write(out, j.workload("FAILED", "1:0", t + S(1.1)),
            expected("ambiguous", "failed", "ambiguous", "ambiguous"))


def unattributed_straggler(out: str) -> None:
    """Rank 13 never issues collective 8812; no hardware/OS/app root anywhere."""
    nodes = [f"node-{i:02d}" for i in range(1, 5)]
    j = Job("unattributed-straggler", 4472345, nodes, bus=BUS_H100, start="2026-11-06T08:00:00")
    j.syslog_hosts = ["node-01", "node-04"]         # node-02 and node-03 shipped no syslog
    r = j.rng
    j.syslog_noise(T("2026-11-06T07:50:00"), T("2026-11-06T08:53:00"))
    j.slurmd_launch(T("2026-11-06T08:00:01"))
    j.nccl_init(T("2026-11-06T08:00:23"))
    stall = T("2026-11-06T08:42:05.230")
    j.training(T("2026-11-06T08:01:00"), stall - S(1.0), 30.0, 6500, 0.55)
    straggler = 13
    aborts = {}
    for rank in range(j.N):
        if rank == straggler:
            continue
        onset = stall + S(r.uniform(0.05, 0.7))
        aborts[rank] = j.watchdog_timeout(rank, onset, 8812, 8812 + r.randint(0, 3), 8811, numel=134217728)
    first_to = min(aborts, key=aborts.get)
    t = min(aborts.values()) + S(0.34)
    j.c10(straggler, t, 1987, f"{j.pg(straggler)} Received a dump signal due to a collective timeout from  "
                              f"rank {first_to} and we will try our best to dump the debug info. Last enqueued "
                              f"NCCL work: 8811, last completed NCCL work: 8811.{DUMP_TAIL}")
    aborts[straggler] = t + S(r.uniform(1.0, 2.0))
    end = 0
    for h in nodes:
        rk = sorted(j.ranks_of(h), key=lambda x: aborts[x])
        failed = [(rk[0], -6, aborts[rk[0]])] + [(x, -6, aborts[x]) for x in rk[1:3]]
        end = max(end, j.agent_failure(h, aborts[rk[-1]] + S(0.3), failed))
    t = end + S(0.5)
    for h in ["node-03", "node-01", "node-04", "node-02"]:
        j.srun_exit(t, h, j.ranks_of(h))
        t += S(r.uniform(0.05, 0.4))
    j.write(out, j.workload("FAILED", "1:0", t + S(1.0)),
            expected("unattributed", "failed", "unknown", "unattributed", suspect=["node-02"]))


def clean_completion(out: str) -> None:
    """Completed job with scary-looking but benign noise."""
    nodes = [f"hgx-b{i:02d}" for i in range(1, 5)]
    j = Job("clean-completion", 4472400, nodes, bus=BUS_H100, start="2026-11-07T06:00:00")
    r = j.rng
    boot = T("2026-11-07T05:40:00")
    for h in nodes:                                  # hosts booted 20 min before the job
        j.boot[h] = boot + S(r.uniform(0, 30))
        t = j.boot[h] + S(11.097374 + r.uniform(0, 1.0))
        for k, dev in enumerate(("mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5")):
            pcidev = ["0000:1a:00.0", "0000:3c:00.0", "0000:9c:00.0", "0000:ab:00.0"][k]
            j.kern(h, t, f"mlx5_core {pcidev}: Port module event: module {k}, Cable plugged")
            j.kern(h, t + S(9.2), f"mlx5_core {pcidev} {dev}: Port: 1 Link INIT")
            j.kern(h, t + S(10.5 + r.uniform(0, 0.3)), f"mlx5_core {pcidev} {dev}: Port: 1 Link ACTIVE")
            t += S(r.uniform(0.01, 0.05))
    j.syslog_noise(T("2026-11-07T05:45:00"), T("2026-11-07T07:31:00"), every_s=400)
    j.slurmd_launch(T("2026-11-07T06:00:01"))

    def plugin_noise(rank: int, t: int) -> None:
        j.nccl_info(rank, t, "NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.")
        j.nccl_info(rank, t + 150, "dlvsym failed on mlx5dv_get_data_direct_sysfs_path - "
                                   "/lib/x86_64-linux-gnu/libmlx5.so.1: undefined symbol: "
                                   "mlx5dv_get_data_direct_sysfs_path, version MLX5_1.25")

    j.nccl_init(T("2026-11-07T06:00:24"), extra=plugin_noise)
    done = T("2026-11-07T07:29:48")
    j.training(T("2026-11-07T06:01:00"), done, 120.0, 0, 0.7)
    # A lone row-remap on hgx-b02: bookkeeping, the job carries on.
    t = T("2026-11-07T06:47:13.528")
    j.gpu_identity("hgx-b02", t - 10, 3)
    j.kern("hgx-b02", t, f"NVRM: Xid (PCI:{j.pci('hgx-b02', 3)}): 63, pid={j.pid[11]}, Row Remapper: New row "
                         "marked for remapping, reset gpu to activate.")
    # Corrected AER on hgx-b03: fixed by link-level retry.
    t = T("2026-11-07T06:12:40.101")
    for k in range(3):
        j.kern("hgx-b03", t, "pcieport 0000:5c:00.0: PCIe Bus Error: severity=Corrected, type=Data Link Layer, "
                             "id=5c00(Transmitter ID)")
        j.kern("hgx-b03", t + 175, "pcieport 0000:5c:00.0:    [12] Replay Timer Timeout  ")
        t += S(r.uniform(40, 900))
    # The harmless nvidia-peermem mitigation print on hgx-b04.
    t = T("2026-11-07T06:03:02.771")
    for _ in range(5):
        j.kern("hgx-b04", t, "nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, "
                             "skipping further processing")
        t += S(r.uniform(300, 1500))
    j.pylog(0, done + S(1.2), "training complete at step 7700, saved final checkpoint to "
                              "/lustre/ckpt/run-51/step_007700")
    for rank in range(j.N):
        lr = j.local(rank)
        j.nccl_info(rank, done + S(4.0 + r.uniform(0, 1.5)),
                    f"comm {j.comm[rank]} rank {rank} nranks {j.N} cudaDev {lr} busId {j.bus[lr]}000 "
                    "- Destroy COMPLETE")
    j.write(out, j.workload("COMPLETED", "0:0", done + S(9.0)),
            expected("no_failure", "completed", "none", "none", recovery="none"))


def hang_until_timeout(out: str) -> None:
    """Xid 79 at 11:00 on h100-03, then a silent hang until the 13:00 time limit."""
    nodes = [f"h100-{i:02d}" for i in range(1, 5)]
    j = Job("hang-until-timeout", 4472500, nodes, bus=BUS_H100, start="2026-11-05T09:00:00")
    r = j.rng
    j.syslog_noise(T("2026-11-05T08:50:00"), T("2026-11-05T13:01:00"), every_s=900)
    j.slurmd_launch(T("2026-11-05T09:00:01"))
    j.nccl_init(T("2026-11-05T09:00:23"))
    fault = T("2026-11-05T11:00:02.418")
    j.training(T("2026-11-05T09:01:00"), fault - S(2.0), 300.0, 0, 0.6)
    culprit, local = "h100-03", 6                    # GPU 0000:ba:00, rank 22
    j.xid79(culprit, fault, local)
    limit = T("2026-11-05T13:00:04")
    j.batch(limit, "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.")
    j.batch(limit + 203, f"slurmstepd: error: *** JOB {j.job_id} ON {nodes[0]} CANCELLED AT "
                         f"{f_slurm_time(limit)} DUE TO TIME LIMIT ***")
    j.batch(limit + 377, f"slurmstepd: error: *** STEP {j.job_id}.0 ON {nodes[0]} CANCELLED AT "
                         f"{f_slurm_time(limit)} DUE TO TIME LIMIT ***")
    for h in nodes:
        t = limit + S(r.uniform(0.05, 0.3))
        for rank in j.ranks_of(h):
            j.agent(h, t, "W", 897, f"Sending process {j.pid[rank]} closing signal SIGTERM")
            t += r.randint(200, 900)
    t = limit + S(32.4)
    for h in ["h100-01", "h100-02", "h100-04", "h100-03"]:
        j.srun_exit(t, h, j.ranks_of(h), "Terminated")
        t += S(r.uniform(0.05, 0.3))
    j.write(out, j.workload("TIMEOUT", "0:15", t + S(1.0)),
            expected("attributed", "timeout", "gpu", "gpu_fell_off_bus", [culprit], recovery="drain_nodes"))


def host_oom_killer(out: str) -> None:
    """The kernel OOM killer kills rank 11 (local rank 3) on dgx-a02."""
    nodes = [f"dgx-a{i:02d}" for i in range(1, 5)]
    j = Job("host-oom-killer", 4472610, nodes, bus=BUS_A100, start="2026-11-06T07:30:00")
    j.skew["dgx-a04"] = S(5.0)                       # dgx-a04's clock runs 5 s fast
    r = j.rng
    culprit, local = "dgx-a02", 3
    victim = j.first_rank(culprit) + local
    j.set_pids(culprit, 31631 - local)             # the worker the OOM killer takes is pid 31631
    j.syslog_noise(T("2026-11-06T07:20:00"), T("2026-11-06T08:52:00"))
    j.slurmd_launch(T("2026-11-06T07:30:01"))
    j.nccl_init(T("2026-11-06T07:30:26"))
    kill = T("2026-11-06T08:41:16.402")
    j.training(T("2026-11-06T07:31:00"), kill - S(3.0), 30.0, 30400, 1.1)
    j.kern(culprit, kill - 1046, "python invoked oom-killer: gfp_mask=0x6200ca(GFP_HIGHUSER_MOVABLE), order=0, "
                                 "oom_score_adj=0")
    j.kern(culprit, kill - 15, "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0-1,"
                               f"global_oom,task_memcg=/system.slice/slurmstepd.scope/job_{j.job_id}/step_0/"
                               f"user/task_0,task=python,pid=31631,uid=1000")
    j.kern(culprit, kill, "Out of memory: Killed process 31631 (python) total-vm:812334592kB, "
                          "anon-rss:251804416kB, file-rss:81920kB, shmem-rss:0kB, UID:1000 pgtables:498212kB "
                          "oom_score_adj:0")
    j.kern(culprit, kill + S(0.913), "oom_reaper: reaped process 31631 (python), now anon-rss:0kB, "
                                     "file-rss:0kB, shmem-rss:0kB")
    sib = [x for x in j.ranks_of(culprit) if x != victim]
    t_agent = j.agent_failure(culprit, kill + S(0.6), [(victim, -9, kill + S(0.05))], sib)
    j.srun_exit(t_agent + S(0.7), culprit, j.ranks_of(culprit))
    gone = kill + S(1.8)
    for rank, peer_rank in ((3, 11), (19, 11), (27, 12)):
        j.socket_closed(rank, gone + S(r.uniform(0.05, 0.5)), j.host(peer_rank))
    aborts = {}
    for rank in range(j.N):
        if j.host(rank) == culprit:
            continue
        onset = kill + S(r.uniform(0.1, 0.9))
        aborts[rank] = j.watchdog_timeout(rank, onset, 52964, 52964 + r.randint(3, 9), 52963)
    end = 0
    for h in nodes:
        if h == culprit:
            continue
        rk = sorted(j.ranks_of(h), key=lambda x: aborts[x])
        end = max(end, j.agent_failure(h, aborts[rk[-1]] + S(0.3),
                                       [(rk[0], -6, aborts[rk[0]]), (rk[1], -6, aborts[rk[1]])]))
    t = end + S(0.5)
    for h in ["dgx-a04", "dgx-a01", "dgx-a03"]:
        j.srun_exit(t, h, j.ranks_of(h))
        t += S(r.uniform(0.05, 0.4))
    j.write(out, j.workload("FAILED", "1:0", t + S(1.0)),
            expected("attributed", "failed", "host", "host_oom", [culprit]))


SAMPLES = {
    "worked-example": worked_example,
    "gpu-fell-off-bus-32node": gpu_fell_off_bus,
    "cuda-oom-one-rank": cuda_oom_one_rank,
    "walltime-timeout": walltime_timeout,
    "ambiguous-two-faults": ambiguous_two_faults,
    "unattributed-straggler": unattributed_straggler,
    "clean-completion": clean_completion,
    "hang-until-timeout": hang_until_timeout,
    "host-oom-killer": host_oom_killer,
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=HERE, help="parent folder of the sample folders (default: samples/)")
    ap.add_argument("--only", nargs="*", choices=sorted(SAMPLES), help="write only these samples")
    args = ap.parse_args(argv)
    for name in args.only or SAMPLES:
        SAMPLES[name](os.path.join(args.out, name))
        print(f"wrote {os.path.join(args.out, name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
