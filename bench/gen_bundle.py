#!/usr/bin/env python3
"""Generate a large evidence bundle for benchmarking firstfault.

    python bench/gen_bundle.py OUT_DIR [--nodes 512] [--gpus-per-node 8]
                               [--lines 1000000] [--seed 7] [--noise-only]

The bundle is one failed Slurm job: ``workload.json`` (FAILED, 1:0),
``expected.json`` (the right diagnosis), ``logs/app/<host>.log`` (srun
``--label`` output of the host's tasks; the task id is the global rank) and
``logs/syslog/<host>.log`` (RFC 3164 syslog), totalling exactly ``--lines``
lines.  About 96-97 % are noise (training step lines, NCCL INFO start-up
chatter, routine daemon and benign kernel lines).  The signal: one GPU falls
off the bus (Xid 79) on one node at T; its rank dies on the CUDA error and that
node's torchrun agent stops the node; every other rank ((nodes-1)*gpus of them)
hits the PyTorch NCCL watchdog timeout ~10 min after T, with status, teardown
and a few NCCL remote-error lines; each node's agent prints its ChildFailedError
block; srun reports each node's tasks.  One other host's clock runs 4 s fast.

``--noise-only`` writes ``OUT_DIR/noise.log`` instead: ``--lines`` noise lines
only (app and syslog noise mixed), to time a prefilter against ``grep -E``.

Deterministic for a given seed and arguments; stdlib only; files are written
with large buffered writes.  Prints a one-line summary.
"""
from __future__ import annotations

import argparse
import calendar
import json
import os
import random
import sys
import time

START = calendar.timegm((2026, 11, 2, 8, 0, 0))   # job start, 2026-11-02T08:00:00Z
FAULT_AFTER_S = 2 * 3600               # the GPU falls off the bus 2 h into the job
TIMEOUT_MS = 600000
MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
BUS = ["18", "2a", "3a", "5d", "9b", "ab", "ba", "db"]
LIB = "/usr/local/lib/python3.10/dist-packages"
AGENT_TB = [
    "Traceback (most recent call last):",
    '  File "/usr/local/bin/torchrun", line 8, in <module>',
    "    sys.exit(main())",
    f'  File "{LIB}/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 355, in wrapper',
    "    return f(*args, **kwargs)",
    f'  File "{LIB}/torch/distributed/run.py", line 919, in main',
    "    run(args)",
    f'  File "{LIB}/torch/distributed/run.py", line 910, in run',
    "    elastic_launch(",
    f'  File "{LIB}/torch/distributed/launcher/api.py", line 138, in __call__',
    "    return launch_agent(self._config, self._entrypoint, list(args))",
    f'  File "{LIB}/torch/distributed/launcher/api.py", line 269, in launch_agent',
    "    raise ChildFailedError(",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "=" * 60,
    "train.py FAILED",
    "-" * 60,
    "Failures:",
    "  <NO_OTHER_FAILURES>",
    "-" * 60,
    "Root Cause (first observed failure):",
]


class Stamps:
    """Cached formatters; times are integer microseconds since the epoch."""

    def __init__(self):
        self._sec: dict[int, time.struct_time] = {}
        self._py: dict[int, str] = {}
        self._rfc: dict[int, str] = {}
        self._hms: dict[int, str] = {}

    def _tm(self, s: int) -> time.struct_time:
        tm = self._sec.get(s)
        if tm is None:
            tm = self._sec[s] = time.gmtime(s)
        return tm

    def pylog(self, us: int) -> str:                       # [2026-11-02 10:01:00,123]
        s, rest = divmod(us, 1_000_000)
        b = self._py.get(s)
        if b is None:
            b = self._py[s] = time.strftime("%Y-%m-%d %H:%M:%S", self._tm(s))
        return f"[{b},{rest // 1000:03d}]"

    def rfc3164(self, us: int) -> str:                     # Nov  2 10:03:11
        s = us // 1_000_000
        b = self._rfc.get(s)
        if b is None:
            tm = self._tm(s)
            b = self._rfc[s] = f"{MONTHS[tm.tm_mon - 1]} {tm.tm_mday:>2} {time.strftime('%H:%M:%S', tm)}"
        return b

    def hms(self, us: int) -> tuple[time.struct_time, str, int]:
        s, rest = divmod(us, 1_000_000)
        b = self._hms.get(s)
        if b is None:
            b = self._hms[s] = time.strftime("%H:%M:%S", self._tm(s))
        return self._tm(s), b, rest

    def c10(self, us: int, sev: str = "E") -> str:          # E1102 10:13:12.044871
        tm, b, rest = self.hms(us)
        return f"{sev}{tm.tm_mon}{tm.tm_mday:02d} {b}.{rest:06d}"

    def elastic(self, us: int, sev: str) -> str:            # W1102 10:13:12.044871
        tm, b, rest = self.hms(us)
        return f"{sev}{tm.tm_mon:02d}{tm.tm_mday:02d} {b}.{rest:06d}"

    def iso(self, us: int) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", self._tm(us // 1_000_000))

    def elastic_time(self, us: int) -> str:
        return time.strftime("%Y-%m-%d_%H:%M:%S", self._tm(us // 1_000_000))


SYSLOG_DAEMON = [
    ("systemd[1]", "Started Session {n} of User root."),
    ("systemd-logind[1543]", "New session {n} of user root."),
    ("CRON[{p}]", "(root) CMD (command -v debian-sa1 > /dev/null && debian-sa1 1 1)"),
    ("chronyd[1187]", "Selected source 10.0.255.1"),
    ("systemd[1]", "Started Session {n} of User root."),
    ("chronyd[1187]", "Selected source 10.0.255.1"),
]


def syslog_noise_line(st: Stamps, host: str, us: int, k: int, uptime_us: int) -> str:
    """Routine daemon chatter, with an occasional benign kernel line."""
    if k % 97 == 13:
        return (f"{st.rfc3164(us)} {host} kernel: [{uptime_us // 1_000_000:5d}.{uptime_us % 1_000_000:06d}] "
                f"perf: interrupt took too long ({2501 + k % 400} > 2500), lowering "
                f"kernel.perf_event_max_sample_rate to {79750 - (k % 7) * 250}")
    if k % 211 == 57:
        return (f"{st.rfc3164(us)} {host} kernel: [{uptime_us // 1_000_000:5d}.{uptime_us % 1_000_000:06d}] "
                "nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, "
                "skipping further processing")
    proc, msg = SYSLOG_DAEMON[k % len(SYSLOG_DAEMON)]
    return f"{st.rfc3164(us)} {host} {proc.format(p=100000 + (k * 7919) % 900000)}: {msg.format(n=20 + k)}"


# Pre-formatted pieces of the training step line (the bulk of every bundle).
LOSS = [f"{i / 10000:.4f}" for i in range(30000)]          # "0.0000" .. "2.9999"
TPS = [str(40100 + i) for i in range(2048)]


def loss_base(step: int) -> int:
    """Index into LOSS of the mean loss at `step`, minus half the jitter."""
    return max(12000, 29000 - step // 5) - 512


def step_line(st: Stamps, rank: int, us: int, step: int, u: int) -> str:
    """One training step line; `u` is 21 random bits (loss jitter, throughput)."""
    return (f"{rank}: {st.pylog(us)} INFO step {step} loss {LOSS[loss_base(step) + (u & 1023)]} "
            f"lr 3.0e-4 tokens/s {TPS[u >> 10 & 2047]}")


class Gen:
    def __init__(self, args):
        self.a = args
        self.r = random.Random(args.seed)
        self.st = Stamps()
        n, g = args.nodes, args.gpus_per_node
        if n < 2 or not 1 <= g <= 16:
            raise SystemExit("need --nodes >= 2 and 1 <= --gpus-per-node <= 16")
        w = max(3, len(str(n)))
        self.nodes = [f"gpu-{i:0{w}d}" for i in range(1, n + 1)]
        self.G = g
        self.R = n * g
        r = self.r
        self.culprit_i = r.randrange(n)
        self.culprit = self.nodes[self.culprit_i]
        self.culprit_local = r.randrange(g)
        self.victim = self.culprit_i * g + self.culprit_local
        others = [i for i in range(n) if i != self.culprit_i]
        self.skewed = self.nodes[r.choice(others)]
        self.skew = {h: 0 for h in self.nodes}
        self.skew[self.skewed] = 4_000_000
        self.base_pid = [r.randint(20000, 240000) for _ in range(n)]
        self.boot = [START * 1_000_000 - r.randint(3 * 86400, 40 * 86400) * 1_000_000 for _ in range(n)]
        self.start = START * 1_000_000
        self.fault = self.start + FAULT_AFTER_S * 1_000_000 + r.randint(0, 999_999)

    # -- helpers
    def bus(self, local: int) -> str:
        return BUS[local] if local < len(BUS) else f"{0x20 + local * 8:02x}"

    def pid(self, rank: int) -> int:
        return self.base_pid[rank // self.G] + rank % self.G

    def agent_pid(self, node_i: int) -> int:
        return self.base_pid[node_i] - 57

    # -- signal lines (everything that is not noise), per file as (us, seq, text)
    def signal(self) -> dict[str, list]:
        r, st, G = self.r, self.st, self.G
        files: dict[str, list] = {}
        seq = [0]

        def put(path, us, text):
            seq[0] += 1
            files.setdefault(path, []).append((us, seq[0], text))

        def app(rank, us, text):
            put(f"logs/app/{self.nodes[rank // G]}.log", us, f"{rank}: {text}")

        def c10(rank, us, line, msg):
            h = self.nodes[rank // G]
            app(rank, us, f"[rank{rank}]:[{st.c10(us + self.skew[h])} ProcessGroupNCCL.cpp:{line}] {msg}")

        def agent_block(node_i, us, root_rank, code, when, killed=()):
            h = self.nodes[node_i]
            lab = node_i * G
            ap = self.agent_pid(node_i)
            for k in killed:
                app(lab, us, f"{st.elastic(us + self.skew[h], 'W')} {ap} torch/distributed/elastic/"
                             f"multiprocessing/api.py:897] Sending process {self.pid(k)} closing signal SIGTERM")
                us += r.randint(300, 2500)
            us += r.randint(300_000, 1_200_000)
            app(lab, us, f"{st.elastic(us + self.skew[h], 'E')} {ap} torch/distributed/elastic/multiprocessing/"
                         f"api.py:869] failed (exitcode: {code}) local_rank: {root_rank % G} "
                         f"(pid: {self.pid(root_rank)}) of binary: /usr/bin/python3")
            us += r.randint(2000, 9000)
            pid = self.pid(root_rank)
            lines = AGENT_TB + [
                "[0]:",
                f"  time      : {st.elastic_time(when + self.skew[h])}",
                f"  host      : {h}",
                f"  rank      : {root_rank} (local_rank: {root_rank % G})",
                f"  exitcode  : {code} (pid: {pid})",
                "  error_file: <N/A>",
                f"  traceback : Signal {-code} (SIGABRT) received by PID {pid}",
                "=" * 60,
            ]
            for line in lines:
                app(lab, us, line)
            return us

        def batch(us, text):
            put(f"logs/app/{self.nodes[0]}.log", us, text)

        # Culprit host: Xid 79 (with the driver's once-per-GPU identity lines).
        h, ci, cl = self.culprit, self.culprit_i, self.culprit_local
        pci = f"0000:{self.bus(cl)}:00"
        serial = str(r.randint(1320000000000, 1659999999999))
        uuid = f"{r.getrandbits(128):032x}"
        uuid = f"GPU-{uuid[:8]}-{uuid[8:12]}-{uuid[12:16]}-{uuid[16:20]}-{uuid[20:]}"

        def kern(us, msg):
            up = us - self.boot[ci]
            put(f"logs/syslog/{h}.log", us, f"{st.rfc3164(us + self.skew[h])} {h} kernel: "
                                             f"[{up // 1_000_000:5d}.{up % 1_000_000:06d}] {msg}")

        f = self.fault
        kern(f - 11, f"NVRM: GPU at PCI:{pci}: {uuid}")
        kern(f - 3, f"NVRM: GPU Board Serial Number: {serial}")
        kern(f, f"NVRM: Xid (PCI:{pci}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
        kern(f + 4, f"NVRM: GPU {pci}.0: GPU has fallen off the bus.")
        kern(f + 7, f"NVRM: GPU {pci}.0: GPU serial number is {serial}.")
        # Its rank dies on the CUDA error; the agent stops the node.
        t = f + r.randint(700_000, 1_100_000)
        c10(self.victim, t, 1899, f"[PG ID 0 PG GUID 0(default_pg) Rank {self.victim}] Process group watchdog "
                                  "thread terminated with exception: CUDA error: unspecified launch failure")
        sib = [ci * G + k for k in range(G) if k != cl]
        t = agent_block(ci, t + 300_000, self.victim, -6, t + 100_000, sib)
        batch(t + 900_000, f"srun: error: {h}: {task_list(range(ci * G, ci * G + G))}: Exited with exit code 1")

        # Every other rank: the watchdog cascade one PG timeout later.
        seqnum = 40000 + r.randint(0, 50000)
        numel = 1073741824
        aborts = {}
        for rank in range(self.R):
            if rank // G == ci:
                continue
            ran = TIMEOUT_MS + r.randint(11, 1400)
            t = f + r.randint(100_000, 1_100_000) + ran * 1000
            work = (f"WorkNCCL(SeqNum={seqnum}, OpType=ALLREDUCE, NumelIn={numel}, NumelOut={numel}, "
                    f"Timeout(ms)={TIMEOUT_MS}) ran for {ran} milliseconds before timing out.")
            pg = f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}]"
            c10(rank, t, 632, f"[Rank {rank}] Watchdog caught collective operation timeout: {work}")
            t += r.randint(200, 900)
            c10(rank, t, 2268, f"{pg}  failure detected by watchdog at work sequence id: {seqnum} PG status: "
                               f"last enqueued work: {seqnum + r.randint(6, 13)}, last completed work: {seqnum - 1}")
            t += r.randint(20, 90)
            c10(rank, t, 670, "Stack trace of the failed collective not found, potentially because "
                              "FlightRecorder is disabled. You can enable it by setting "
                              "TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero value.")
            t += r.randint(30, 300)
            c10(rank, t, 684, f"[Rank {rank}] Some NCCL operations have failed or timed out. Due to the "
                              "asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
                              "corrupted/incomplete data.")
            t += r.randint(20, 80)
            c10(rank, t, 690, f"[Rank {rank}] To avoid data inconsistency, we are taking the entire process down.")
            t += r.randint(100, 600)
            c10(rank, t, 1414, f"{pg} Process group watchdog thread terminated with exception: "
                               f"[Rank {rank}] Watchdog caught collective operation timeout: {work}")
            aborts[rank] = t + r.randint(50_000, 300_000)
        # A few proxy threads notice peers going away during the teardown.
        # (a rank can only notice a peer that died before it did itself)
        gone = {i: min(aborts[i * G + k] for k in range(G)) for i in range(len(self.nodes)) if i != ci}
        by_gone = sorted(gone, key=gone.get)
        for rank in sorted(r.sample(sorted(aborts), max(1, len(aborts) // 64))):
            peers = [i for i in by_gone if i != rank // G and gone[i] + 200_000 < aborts[rank]]
            if not peers:
                continue
            peer = r.choice(peers[:64])
            t = gone[peer] + r.randint(50_000, min(250_000, aborts[rank] - gone[peer] - 50_000))
            host = self.nodes[rank // G]
            tid = self.pid(rank) + 311
            app(rank, t, f"{host}:{self.pid(rank)}:{tid} [{rank % G}] misc/socket.cc:49 NCCL WARN socketProgress: "
                         f"Connection closed by remote peer {self.nodes[peer]}<{r.randint(32768, 60999)}>")
            app(rank, t + 300, f"{host}:{self.pid(rank)}:{tid} [{rank % G}] proxy.cc:1143 NCCL WARN Socket recv "
                               f"failed while polling for opId=0x{r.randint(0x7f0000000000, 0x7fffffffffff) >> 5 << 5:x}")
        end = 0
        for i in range(len(self.nodes)):
            if i == ci:
                continue
            ranks = sorted(range(i * G, i * G + G), key=aborts.get)
            end = max(end, agent_block(i, aborts[ranks[-1]] + 300_000, ranks[0], -6, aborts[ranks[0]]))
        t = end + 500_000
        order = [i for i in range(len(self.nodes)) if i != ci]
        r.shuffle(order)
        for i in order:
            batch(t, f"srun: error: {self.nodes[i]}: {task_list(range(i * G, i * G + G))}: Exited with exit code 1")
            t += r.randint(20_000, 200_000)
        self.end = t + 1_500_000
        for v in files.values():
            v.sort()
        return files

    # -- noise
    def write_bundle(self, out: str) -> tuple[int, int, int]:
        a, st, G, r = self.a, self.st, self.G, self.r
        sig = self.signal()
        n_sig = sum(len(v) for v in sig.values())
        noise = a.lines - n_sig
        if noise < self.R * 5:
            raise SystemExit(f"--lines {a.lines} too small: the failure alone takes {n_sig} lines "
                             f"and every rank needs a few noise lines")
        n_sys = max(len(self.nodes), noise * 3 // 100)
        n_app = noise - n_sys
        per_rank = [n_app // self.R + (1 if k < n_app % self.R else 0) for k in range(self.R)]
        per_host_sys = [n_sys // len(self.nodes) + (1 if k < n_sys % len(self.nodes) else 0)
                        for k in range(len(self.nodes))]
        os.makedirs(os.path.join(out, "logs", "app"), exist_ok=True)
        os.makedirs(os.path.join(out, "logs", "syslog"), exist_ok=True)
        t_init = self.start + 20_000_000
        t_train = self.start + 60_000_000
        t_last = self.fault - 2_000_000
        max_steps = max(per_rank) - 4
        interval = (t_last - t_train) // max(1, max_steps)
        step_s = 0.9
        total_lines = total_bytes = n_files = 0
        comm_id = f"0x{r.getrandbits(64):016x}"
        for i, h in enumerate(self.nodes):
            sk = self.skew[h]
            buf = []
            add = buf.append
            ip = f"10.{i // 250}.{i % 250}.{1 + (i // 62500)}"
            ranks = range(i * G, i * G + G)
            # start-up chatter: 4 NCCL INFO lines per rank
            for rank in ranks:
                lr = rank % G
                pid = self.pid(rank)
                pre = f"{rank}: {h}:{pid}:{pid} [{lr}] NCCL INFO "
                nxt = (rank + 1) % self.R
                via = "via P2P/IPC" if nxt // G == i else "[send] via NET/IB/0"
                add(f"{pre}Bootstrap : Using ib0:{ip}<0>")
                add(f"{pre}Channel 00/0 : {rank}[{lr}] -> {nxt}[{nxt % G}] {via}")
                add(f"{pre}Connected all rings")
                add(f"{pre}comm 0x{0x55a00000000 + rank * 0x1f3a1 + (pid & 0xfff):x}0 rank {rank} nranks {self.R} "
                    f"cudaDev {lr} nvmlDev {lr} busId {self.bus(lr)}000 commId {comm_id} - Init COMPLETE")
            # training: tick-major so the file is in time order
            steps = [per_rank[rank] - 4 for rank in ranks]
            labels = [f"{rank}: [" for rank in ranks]
            offs = [lr * 7_013 for lr in range(G)]
            bits = r.getrandbits
            pycache = st.pylog
            for k in range(max(steps)):
                tick = t_train + k * interval + (k * 7919 + i * 104729) % 65536
                step = int((tick - t_train) / 1e6 / step_s)
                head = f" INFO step {step} loss "
                lb = loss_base(step)
                s_, rest = divmod(tick + sk, 1_000_000)
                sec = pycache(s_ * 1_000_000)[1:-5]          # "2026-11-02 10:01:00"
                for lr in range(G):
                    if k < steps[lr]:
                        ms = (rest + offs[lr]) // 1000
                        stamp = f"{sec},{ms:03d}]" if ms < 1000 else pycache(tick + sk + offs[lr])[1:]
                        u = bits(21)
                        add(f"{labels[lr]}{stamp}{head}{LOSS[lb + (u & 1023)]} lr 3.0e-4 "
                            f"tokens/s {TPS[u >> 10]}")
            # the failure, in time order
            for _, _, text in sig.get(f"logs/app/{h}.log", ()):
                add(text)
            path = os.path.join(out, "logs", "app", f"{h}.log")
            data = ("\n".join(buf) + "\n").encode()
            with open(path, "wb", buffering=1 << 20) as fh:
                fh.write(data)
            total_lines += len(buf)
            total_bytes += len(data)
            n_files += 1
            # syslog: daemon chatter across the job, the Xid lines merged in by time
            n = per_host_sys[i]
            t0 = self.start - 1_800_000_000
            span = self.end - t0
            sig_sys = sig.get(f"logs/syslog/{h}.log", [])
            j = 0
            buf = []
            add = buf.append
            for k in range(n):
                us = t0 + (span * k) // n + r.randint(0, 900_000)
                while j < len(sig_sys) and sig_sys[j][0] <= us:
                    add(sig_sys[j][2])
                    j += 1
                add(syslog_noise_line(st, h, us + sk, k + i, us - self.boot[i]))
            for _, _, text in sig_sys[j:]:
                add(text)
            path = os.path.join(out, "logs", "syslog", f"{h}.log")
            data = ("\n".join(buf) + "\n").encode()
            with open(path, "wb", buffering=1 << 20) as fh:
                fh.write(data)
            total_lines += len(buf)
            total_bytes += len(data)
            n_files += 1
        workload = {
            "workload_id": f"slurm-{5100000 + a.seed}",
            "attempt": 0,
            "scheduler": "slurm",
            "state": "FAILED",
            "exit_code": "1:0",
            "start_time": st.iso(self.start),
            "end_time": st.iso(self.end),
            "nodes": self.nodes,
            "gpus_per_node": G,
            "ranks": {"0": self.nodes[0], str(G): self.nodes[1]},
            "time_limit_s": 86400,
        }
        expected = {"status": "attributed", "terminal_state": "failed", "domain": "gpu",
                    "sub_domain": "gpu_fell_off_bus", "responsible_nodes": [self.culprit], "suspect_nodes": [],
                    "recovery_action": "drain_nodes"}
        for name, obj in (("workload.json", workload), ("expected.json", expected)):
            with open(os.path.join(out, name), "w", encoding="utf-8", newline="\n") as fh:
                fh.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")
        self.n_signal = n_sig
        return n_files, total_lines, total_bytes

    def write_noise(self, out: str) -> tuple[int, int, int]:
        """--lines noise lines in one file: in every 100, 3 syslog lines, 4 NCCL INFO lines, 93 step lines."""
        a, st, G, r = self.a, self.st, self.G, self.r
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, "noise.log")
        R = self.R
        labels = [f"{rank}: [" for rank in range(R)]
        pycache = st.pylog
        bits = r.getrandbits
        total = total_bytes = 0
        t = self.start
        k = 0
        with open(path, "wb", buffering=1 << 20) as fh:
            while total < a.lines:
                chunk = []
                add = chunk.append
                for _ in range(min(655, (a.lines - total + 99) // 100)):
                    for m in range(3):
                        i = (k + m) % R // G
                        add(syslog_noise_line(st, self.nodes[i], t, k + m, t - self.boot[i]))
                    for m in range(4):
                        rank = (k + 3 + m) % R
                        i, lr = divmod(rank, G)
                        pid = self.pid(rank)
                        nxt = (rank + 1) % R
                        via = "via P2P/IPC" if nxt // G == i else "[send] via NET/IB/0"
                        add(f"{rank}: {self.nodes[i]}:{pid}:{pid} [{lr}] NCCL INFO Channel 0{m}/0 : "
                            f"{rank}[{lr}] -> {nxt}[{nxt % G}] {via}")
                    step = (t - self.start) // 900_000
                    head = f" INFO step {step} loss "
                    lb = loss_base(step)
                    s_, rest = divmod(t, 1_000_000)
                    sec = pycache(s_ * 1_000_000)[1:-5]
                    for m in range(7, 100):
                        off = m * 7_013
                        ms = (rest + off) // 1000
                        stamp = f"{sec},{ms:03d}]" if ms < 1000 else pycache(t + off)[1:]
                        u = bits(21)
                        add(f"{labels[(k + m) % R]}{stamp}{head}{LOSS[lb + (u & 1023)]} lr 3.0e-4 "
                            f"tokens/s {TPS[u >> 10]}")
                    k += 100
                    t += 701_300
                del chunk[a.lines - total:]
                total += len(chunk)
                data = ("\n".join(chunk) + "\n").encode()
                fh.write(data)
                total_bytes += len(data)
        return 1, total, total_bytes


def task_list(ranks) -> str:
    ranks = sorted(ranks)
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ("task " if len(ranks) == 1 else "tasks ") + ",".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Generate a large firstfault evidence bundle (see module doc).")
    ap.add_argument("out_dir")
    ap.add_argument("--nodes", type=int, default=512)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--noise-only", action="store_true", help="write OUT_DIR/noise.log with noise lines only")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    g = Gen(args)
    if args.noise_only:
        files, lines, size = g.write_noise(args.out_dir)
        dt = time.perf_counter() - t0
        print(f"{os.path.join(args.out_dir, 'noise.log')}: files={files} lines={lines} bytes={size} "
              f"noise=100.0% seed={args.seed} in {dt:.2f}s")
        return 0
    files, lines, size = g.write_bundle(args.out_dir)
    dt = time.perf_counter() - t0
    G = g.G
    print(f"{args.out_dir}: files={files} lines={lines} bytes={size} "
          f"noise={100.0 * (lines - g.n_signal) / lines:.1f}% culprit={g.culprit} "
          f"gpu=0000:{g.bus(g.culprit_local)}:00 rank={g.victim} "
          f"(ranks {g.culprit_i * G}-{g.culprit_i * G + G - 1}) fault={g.st.iso(g.fault)} "
          f"skewed={g.skewed}(+4s) seed={args.seed} in {dt:.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
