"""The built-in FINAL rules, in the order they run (highest priority first).

Each reads and writes a :class:`firstfault.rules.final.FinalContext` and leaves a
step in the evidence trail when it does something.
"""
from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from datetime import timedelta
from typing import NamedTuple

from ..bundle import source_of
from ..clears import apply_clears
from ..early import render
from ..final import FinalContext, coverage, reachable, reporter_only, run_explains
from ..identity import fold_identities
from ..model import Ev
from ..order import POINT, first_cause, placed, root_order
from . import final_rule

_S = {"workload": {"workload_id": "ex", "state": "FAILED", "start_time": "2026-11-02T09:58:00Z",
                   "end_time": "2026-11-02T10:21:14Z", "nodes": ["node-01", "node-02"], "gpus_per_node": 8}}
_XID79 = "Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
_WD = ("3: [rank3]:[E1102 10:13:12.044871 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective operation timeout: "
       "WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for 600054 milliseconds before timing out.")


def _scenario(files: dict[str, str], **workload) -> dict:
    return {"workload": {**_S["workload"], **workload}, "files": files}


@final_rule(
    id="final.scope", priority=1000, title="Blame only the workload's hosts and time",
    description="Root candidates from hosts outside the workload, from before its start (beyond a slack: "
                "a fault on an allocated node may kill the job at start-up) or after its end (beyond the "
                "clock tolerance: a fault logged after the job ended did not end it) are kept as context "
                "and never blamed.",
    examples={"fires": [_scenario({"logs/syslog/node-09.log": _XID79.replace("node-02", "node-09")}),
                        # an srun retry's fault, 31 s after the previous attempt ended
                        _scenario({"logs/syslog/node-02.log": _XID79}, end_time="2026-11-02T10:02:40Z")],
              "quiet": [_scenario({"logs/syslog/node-02.log": _XID79}),
                        _scenario({"logs/syslog/node-02.log": _XID79}, end_time="2026-11-02T10:03:05Z")]},
)
def scope(ctx: FinalContext) -> None:
    wl = ctx.workload
    before = timedelta(seconds=float(ctx.settings["window_slack_s"]))
    after = timedelta(seconds=float(ctx.settings["end_slack_s"]))
    start, end = wl.start_time - before, (wl.end_time + after) if wl.end_time else None
    nodes = set(wl.nodes)
    # Without a scheduler record the window was read off the lines themselves: nothing is outside it.
    info = ctx.settings.get("_inventory", {})
    timed = not info.get("inferred") or bool(info.get("window_given"))
    out: list[Ev] = []
    for ev in ctx.roots:
        if ev.source == "scheduler" and ev.kind == "scheduler_end":
            continue
        # Only a node's own log (kernel, Fabric Manager) can hold another job's node: lines of the
        # workload's output files are the workload's, whatever name their prefix gives the host.
        node_file = source_of(ev.path) in ("syslog", "fabricmanager")
        outside_host = bool(nodes) and ev.host is not None and ev.host not in nodes and node_file
        # A node's own log holds other jobs' time; the job's output files only its own, unless a
        # line's full date (not a year-less stamp whose year is a guess) says otherwise.
        dated = timed and ev.stamp is not None and (node_file or ev.quality == "exact")
        early = dated and ev.stamp < start
        late = dated and end is not None and ev.stamp > end
        if outside_host or early or late:
            ctx.excluded.add(id(ev))
            ev.fields["excluded"] = "host not in workload" if outside_host else "outside the workload's time"
            out.append(ev)
    if out:
        ctx.step("final.scope", "exclude", out)


_DESCRIBED = ("Name:             llama-ft-worker-1\n"
              "Node:             gpu-node-7/10.0.0.7\n"
              "    State:          Terminated\n"
              "      Reason:       OOMKilled\n"
              "      Exit Code:    137\n"
              "      Started:      Fri, 15 Sep 2023 09:56:14 +0200\n"
              "      Finished:     Fri, 15 Sep 2023 09:56:17 +0200\n")


@final_rule(
    id="final.record_time", priority=1010, title="A report's record takes the time it states",
    description="A line whose pattern says its stated time is its record's (dates_above: kubectl describe's "
                "'Finished:' closing a container state) gives that time to the untimed lines up to that many "
                "lines above it in its file, on its host (the state's reason and exit code): each takes the "
                "nearest such line below it. A report is not a log: its lines have no stamps of their own.",
    examples={"fires": [_scenario({"logs/scheduler/describe.txt": _DESCRIBED}, start_time="2023-09-15T07:40:02Z",
                                  end_time="2023-09-15T07:56:17Z", nodes=["gpu-node-7"])],
              "quiet": [_scenario({"logs/scheduler/describe.txt": _DESCRIBED.replace("      Finished:", "      Ended:")},
                                  start_time="2023-09-15T07:40:02Z", nodes=["gpu-node-7"])]},
)
def record_time(ctx: FinalContext) -> None:
    reach = {p.id: p.dates_above for p in ctx.catalog.patterns if p.dates_above}
    closers: dict[str, list[Ev]] = defaultdict(list)
    for ev in ctx.events:
        if ev.pattern in reach and ev.stamp is not None and ev.quality in POINT:
            closers[ev.path].append(ev)
    dated: list[Ev] = []
    for ev in ctx.events:
        if ev.quality in POINT or ev.pattern in reach or ev.path not in closers:
            continue
        below = [c for c in closers[ev.path] if 0 < c.line - ev.line <= reach[c.pattern] and c.host == ev.host]
        if below:
            at = min(below, key=lambda c: c.line).stamp
            ev.stamp = ev.last_stamp = ev.onset = at
            ev.quality = "exact"
            dated.append(ev)
    if dated:
        ctx.step("final.record_time", "date", dated)


@final_rule(
    id="final.gpu_map", priority=950, title="Map PCI bus ids to GPU index and rank",
    description="NCCL's 'Init COMPLETE' lines give rank, CUDA device and busId per host; kernel events on "
                "that host and bus id get the GPU index and rank.",
    examples={"fires": [_scenario({
        "logs/app/node-02.log": "node-02:4711:4790 [3] NCCL INFO comm 0x9f2ef80 rank 11 nranks 16 cudaDev 3 nvmlDev 3 busId 1b000 commId 0x1 - Init COMPLETE",
        "logs/syslog/node-02.log": _XID79})],
        "quiet": [_scenario({"logs/syslog/node-02.log": _XID79})]},
)
def gpu_map(ctx: FinalContext) -> None:
    table: dict[tuple[str, str], tuple[int | None, int | None]] = {}
    for ev in ctx.events:
        if ev.kind != "nccl_init" or not ev.host:
            continue
        bus = ev.fields.get("bus_id")
        pci = _bus_to_pci(bus)
        if pci:
            dev = ev.fields.get("cuda_dev")
            rank = ev.fields.get("rank")
            table[(ev.host, pci)] = (dev if isinstance(dev, int) else None, rank if isinstance(rank, int) else None)
    mapped = []
    for ev in ctx.events:
        if ev.pci and ev.host and (ev.host, ev.pci) in table:
            dev, rank = table[(ev.host, ev.pci)]
            if ev.gpu_index is None and dev is not None:
                ev.gpu_index = dev
            if ev.rank is None and rank is not None:
                ev.rank = rank
                ev.ranks.add(rank)
            mapped.append(ev)
    if mapped:
        ctx.step("final.gpu_map", "enrich", mapped, mappings=len(table))


def _bus_to_pci(bus) -> str | None:
    """NCCL packs the PCI address as hex: domain >>20, bus [19:12], device [11:4], function [3:0]."""
    if bus is None:
        return None
    try:
        v = int(str(bus), 16)
    except ValueError:
        return None
    return f"{v >> 20:04x}:{(v >> 12) & 0xff:02x}:{(v >> 4) & 0xff:02x}.{v & 0xf:x}"


@final_rule(
    id="final.clock", priority=900, title="Estimate host clock offsets and onsets",
    description="Watchdog timeouts of one collective began at about the same instant on every rank "
                "(stamp minus 'ran for'); the per-host difference from the median is that host's clock "
                "offset. Onsets are corrected by it and the bound is recorded.",
    examples={"fires": [_scenario({
        "logs/app/node-01.log": _WD, "logs/app/node-02.log": _WD.replace("3: [rank3]", "11: [rank11]").replace("10:13:12", "10:13:16"),
        "logs/app/node-03.log": _WD.replace("3: [rank3]", "19: [rank19]")}, nodes=["node-01", "node-02", "node-03"])],
        "quiet": [_scenario({"logs/syslog/node-02.log": _XID79})]},
)
def clock(ctx: FinalContext) -> None:
    groups: dict[tuple, dict[str, float]] = defaultdict(dict)
    for ev in ctx.events:
        if ev.kind == "watchdog_timeout" and ev.onset is not None and ev.host:
            key = (ev.fields.get("seq"), ev.fields.get("op"), ev.fields.get("timeout_ms"))
            t = ev.onset.timestamp()
            have = groups[key].get(ev.host)
            groups[key][ev.host] = t if have is None else min(have, t)
    residuals: dict[str, list[float]] = defaultdict(list)
    for hosts in groups.values():
        if len(hosts) < 3:
            continue
        mid = statistics.median(hosts.values())
        for host, t in hosts.items():
            residuals[host].append(t - mid)
    offsets = {h: round(statistics.median(r), 3) for h, r in residuals.items()}
    spread = [abs(x - offsets[h]) for h, r in residuals.items() for x in r]
    if offsets:
        # How well the offsets are known: the worst residual after correction, at least half a second.
        ctx.clock_bound_s = round(max([0.5] + spread), 3)
        ctx.offsets = {h: o for h, o in offsets.items() if abs(o) > ctx.clock_bound_s}
    for ev in ctx.events:
        base = ev.onset if ev.onset is not None else ev.stamp
        ev.corrected_onset = None if base is None else base - timedelta(seconds=ctx.offsets.get(ev.host or "", 0.0))
    if offsets:
        ctx.step("final.clock", "estimate", [], offsets_s=dict(sorted(ctx.offsets.items())),
                 hosts_measured=len(offsets), bound_s=ctx.clock_bound_s,
                 unmeasured_tolerance_s=float(ctx.settings["clock_tolerance_s"]))


def _promote(ev: Ev, domain: str, sub_domain: str, strength: str, output: str) -> None:
    """Make ``ev`` a root candidate of the given taxonomy, with its sentence."""
    ev.role, ev.domain, ev.sub_domain, ev.strength = "root", domain, sub_domain, strength
    ev.output = render(output, ev)


_XID45_149 = "kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149"


@final_rule(
    id="final.referred_cause", priority=860, title="A marker that names its cause stands in for it",
    description="Xid 45 says which earlier Xid stopped the channel ('caused by previous Xid N'). When that Xid's "
                "own line is not in the evidence on that host, the marker becomes a root of the referred Xid's "
                "domain, weak (it never drains a node by itself), with the marker line as its evidence. "
                "Source: NVIDIA Xid catalog (Xid 45: preemptive cleanup due to a previous error); "
                "NVIDIA/open-gpu-kernel-modules#1150 (the lines of the example).",
    examples={"fires": [_scenario({"logs/syslog/node-02.log": "Nov  2 10:03:11 node-02 " + _XID45_149})],
              "quiet": [_scenario({"logs/syslog/node-02.log":
                                   "Nov  2 10:03:10 node-02 kernel: NVRM: Xid (PCI:0000:dc:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)\n"
                                   "Nov  2 10:03:11 node-02 " + _XID45_149})]},
)
def referred_cause(ctx: FinalContext) -> None:
    from ..decoders import decoder_named

    seen = {(e.host, e.fields.get("xid")) for e in ctx.events if e.kind == "xid"}
    promoted = []
    for ev in ctx.events:
        cause = ev.fields.get("caused_by_xid")
        if ev.kind != "xid" or ev.role not in ("marker", "symptom", "context") or not isinstance(cause, int):
            continue
        if cause == ev.fields.get("xid") or (ev.host, cause) in seen:
            continue            # the cause's own line is here (or the marker points at itself)
        tag = decoder_named("xid")({"xid": cause, "msg": "", "pci": ev.pci, "host": ev.host, "rank": ev.rank})
        if tag is None or tag.role != "root":
            continue
        ev.fields["referred_xid"] = cause
        _promote(ev, tag.domain, tag.sub_domain, "weak", f"Xid {cause} on GPU {{gpu}}[[ of {{host}}]], known from the "
                 f"Xid 45 that names it (its own line is not in the evidence)")
        promoted.append(ev)
    if promoted:
        ctx.step("final.referred_cause", "promote", promoted, referred=sorted({e.fields["referred_xid"] for e in promoted}))


_SXID_DETAIL = ("Nov  2 10:03:10 node-02 kernel: nvidia-nvswitch1: SXid (PCI:0000:aa:00.0): 24007, Severity 1 Engine "
                "instance 12 Sub-engine instance 00")


@final_rule(
    id="final.lone_sxid_detail", priority=855, title="An SXid detail line without its headline",
    description="The NVSwitch driver prints a headline ('SXid ...: N, Fatal, Link ...') and detail lines "
                "('Severity 1 Engine instance ...', 'Data {...}'). When only a detail line of a code the catalog "
                "calls fatal is in the evidence (an excerpt), it stands for the switch's fatal error. "
                "Source: vllm-project/vllm#40652 (the example line); NVIDIA Fabric Manager user guide (SXid classes).",
    examples={"fires": [_scenario({"logs/syslog/node-02.log": _SXID_DETAIL})],
              "quiet": [_scenario({"logs/syslog/node-02.log": _SXID_DETAIL.replace("24007", "24001")})]},
)
def lone_sxid_detail(ctx: FinalContext) -> None:
    headlines = {e.host for e in ctx.events if e.kind == "sxid" and e.role == "root"}
    promoted = []
    for ev in ctx.events:
        if ev.kind != "sxid" or ev.role != "context" or ev.host in headlines:
            continue
        if ev.fields.get("sxid_class") not in ("fatal", "always_fatal"):
            continue
        _promote(ev, "interconnect", "nvswitch_fatal", "strong", f"SXid {ev.fields.get('sxid')} "
                 f"({ev.fields.get('sxid_name')}), fatal in NVIDIA's catalog, on an NVSwitch[[ of {{host}}]] "
                 f"(only its detail line is in the evidence)")
        promoted.append(ev)
    if promoted:
        ctx.step("final.lone_sxid_detail", "promote", promoted)


_RDZV_TB = ('  File "/root/.local/lib/python3.7/site-packages/torch/distributed/rendezvous.py", line 143, in _env_rendezvous_handler\n'
            '    store = TCPStore(master_addr, master_port, start_daemon)\n'
            'ValueError: host not found: Name or service not known')
_PANDARALLEL_TB = ('INFO: Pandarallel will use Memory file system to transfer data between the main process and workers.\n'
                   'Traceback (most recent call last):\n'
                   '  File "/opt/conda/envs/pytorch/lib/python3.9/site-packages/pandarallel/core.py", line 263, in closure\n'
                   '    pickle.dump(chunk, filedescriptor)\n'
                   'OSError: [Errno 28] No space left on device')


class _Area(NamedTuple):
    """What an error raised inside a code area is: the event kinds it retags, and as what."""
    kinds: tuple[str, ...]
    errno: int | None                 # only this errno (a storage_error's), or any
    domain: str
    sub_domain: str
    output: str                       # rendered on the error; {frame_func}: the frame's function, {exc_type}: the error's


_FRAME_AREAS = {
    "rendezvous": _Area(("python_exception",), None, "application", "rendezvous_error",
                        "{exc_type} raised in the rendezvous code ({frame_func})[[: {message}]]"),
    # pandarallel's memory-file-system mode pickles each chunk into /dev/shm (its MEMORY_FS_ROOT)
    "memory_fs": _Area(("storage_error",), 28, "host", "shm_exhausted",
                       "/dev/shm exhausted[[ on {host}]]: pandarallel could not write a data chunk to the memory "
                       "file system (No space left on device)"),
}
_FRAME_REACH = 40          # lines above an exception that belong to its traceback


@final_rule(
    id="final.traceback_frames", priority=858, title="An error raised inside a known code area takes that area's cause",
    description="A plain exception (ValueError: host not found, ...) whose traceback runs through torch.distributed's "
                "rendezvous code (rendezvous.py, the elastic rendezvous handlers) happened while the process group was "
                "being formed: its sub_domain is rendezvous_error, not a user code exception. An ENOSPC raised where "
                "pandarallel pickles a data chunk for its workers (memory-file-system mode writes them under /dev/shm) "
                "is /dev/shm exhausted, not a full data disk. The frames are the lines just above the error in the "
                "same file. Sources: kubeflow/pytorch-operator#125; nalepae/pandarallel pandarallel/core.py "
                "(parallelize_with_memory_file_system, MEMORY_FS_ROOT), hpcaitech/Open-Sora#663.",
    examples={"fires": [_scenario({"logs/app/node-01.log": _RDZV_TB}),
                        _scenario({"logs/app/node-01.log": _PANDARALLEL_TB})],
              "quiet": [_scenario({"logs/app/node-01.log": _RDZV_TB.split("\n")[-1]}),
                        _scenario({"logs/app/node-01.log": _PANDARALLEL_TB.split("\n")[-1]})]},
)
def traceback_frames(ctx: FinalContext) -> None:
    frames = [e for e in ctx.events if e.kind == "traceback_frame" and e.fields.get("area") in _FRAME_AREAS]
    changed = []
    for ev in ctx.events:
        if ev.role != "root":
            continue
        for fr in frames:
            area = _FRAME_AREAS[fr.fields["area"]]
            if ev.kind not in area.kinds or (area.errno is not None and ev.fields.get("errno") != area.errno):
                continue
            if fr.path == ev.path and 0 < ev.line - fr.line <= _FRAME_REACH:
                ev.domain, ev.sub_domain = area.domain, area.sub_domain
                text = area.output.replace("{frame_func}", str(fr.fields.get("func")))
                ev.output = render(text.replace("{exc_type}", str(ev.fields.get("exc_type"))), ev)
                changed.append(ev)
                break
    if changed:
        ctx.step("final.traceback_frames", "retag", changed, to=sorted({e.sub_domain for e in changed}))


# The messages of sirzzang.github.io's note (2026-07-29), on a node and at a time of the examples' workload.
_XID120 = "Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:2a:00): 120, GSP kernel exception: load access page fault (cause:0xd) @ pc:0xffffffff9300188a, partition:4#0"
_XID154_RESET = "Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:{pci}:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"


@final_rule(
    id="final.lone_recovery_action", priority=850, title="Xid 154 asks for a reset: a GPU fault, or the driver's verdict on one",
    description="Xid 154 states the recovery action another Xid needs; when no other Xid on that GPU "
                "explains it and it asks for a GPU reset or a node reboot, it is itself the evidence of a GPU fault. "
                "When it follows a GPU fault the catalog reads as weak on the same GPU (a GSP exception, Xid 120, "
                "whose investigation NVIDIA files under software), the driver's own verdict that this GPU needs a "
                "reset makes that fault firm: the node leaves the pool until it is reset. "
                "Source: NVIDIA Xid catalog (Xid 154, GPU recovery action changed); sirzzang.github.io's "
                "2026-07-29 kernel-message note (the lines of the second example).",
    examples={"fires": [_scenario({"logs/syslog/node-02.log": "Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"}),
                        _scenario({"logs/syslog/node-02.log": _XID120 + "\n" + _XID154_RESET.format(pci="2a")})],
              "quiet": [_scenario({"logs/syslog/node-02.log": _XID79 + "\nNov  2 10:03:12 node-02 kernel: NVRM: Xid (PCI:0000:1b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"}),
                        _scenario({"logs/syslog/node-02.log": _XID120 + "\n" + _XID154_RESET.format(pci="3b")})]},
)
def lone_recovery_action(ctx: FinalContext) -> None:
    # Another Xid on the same host (a peer GPU's NVLink fault, a fallen GPU) is what the driver
    # reacts to across GPUs that share a fabric: then the 154 is that fault's echo, not a cause.
    others = {e.host for e in ctx.events if e.kind == "xid" and e.fields.get("xid") != 154}
    promoted, confirmed = [], []
    for ev in ctx.events:
        if ev.kind != "xid" or ev.fields.get("xid") != 154 or ev.role != "marker":
            continue
        action = ev.fields.get("recovery_action_code")
        if action in (None, 0):
            continue
        if ev.host in others:
            confirmed += [r for r in ctx.events if _asks_reset_of(ev, r) and r not in confirmed]
            continue
        _promote(ev, "gpu", "gpu_hardware_fault", "strong",
                 "GPU {gpu}[[ on {host}]] asks for recovery action {recovery_action} (Xid 154) with no other Xid")
        promoted.append(ev)
    for root in confirmed:
        root.strength = "strong"
    if promoted:
        ctx.step("final.lone_recovery_action", "promote", promoted)
    if confirmed:
        ctx.step("final.lone_recovery_action", "confirm", confirmed)


def _asks_reset_of(marker: Ev, root: Ev) -> bool:
    """Is ``marker`` (an Xid 154) the driver's verdict on ``root``: a weak GPU-domain Xid root of the same GPU,
    logged before it (the same second counts; an unstamped line is not placed against it)?"""
    if not (root.kind == "xid" and root.role == "root" and root.domain == "gpu" and root.strength == "weak"
            and root.host == marker.host and root.pci is not None and root.pci == marker.pci):
        return False
    return root.stamp is not None and marker.stamp is not None and root.stamp <= marker.stamp


_ECC94 = "Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:9b:00): 94, pid=48211, name=python3, Contained: SM (0x1). RST: No, D-RST: No"
_CUDA_ECC = "11: [rank11]: RuntimeError: CUDA error: uncorrectable ECC error encountered"


@final_rule(
    id="final.identity", priority=620, title="One fault, one candidate",
    description="Applies the catalog's identity relations (same_fault, refines: rules/catalog/final/identity.yaml) "
                "before the explains rules: a report that another report's fault accounts for (CUDA's error string "
                "for the driver's Xid on that host, a plain NVLink error beside its signal-integrity decode) is "
                "folded into that candidate, whichever line a clock puts first.",
    examples={"fires": [_scenario({"logs/syslog/node-02.log": _ECC94,
                                   "logs/app/node-02.log": "11: [2026-11-02 10:02:40,000] INFO step 1200\n" + _CUDA_ECC})],
              "quiet": [_scenario({"logs/syslog/node-02.log": _ECC94}),
                        _scenario({"logs/syslog/node-01.log": _ECC94.replace("node-02", "node-01"),
                                   "logs/app/node-02.log": "11: [2026-11-02 10:02:40,000] INFO step 1200\n" + _CUDA_ECC})]},
)
def identity(ctx: FinalContext) -> None:
    before = len(ctx.fault_of)
    fold_identities(ctx)
    if len(ctx.fault_of) > before:
        ctx.step("final.identity", "fold", [], reports=len(ctx.fault_of) - before)


@final_rule(
    id="final.explains", priority=600, title="Draw the explains edges",
    description="Runs the declarative explains rules (rules/catalog/final): each links a root candidate to the "
                "symptoms and later roots it explains, by a named join; an explained root is demoted to a symptom.",
    examples={"fires": [_scenario({"logs/syslog/node-02.log": _XID79, "logs/app/node-01.log": _WD})],
              "quiet": [_scenario({"logs/app/node-01.log": _WD})]},
)
def explains(ctx: FinalContext) -> None:
    run_explains(ctx)
    if ctx.edges:
        ctx.step("final.explains", "edges", [], edges=len(ctx.edges), demoted_roots=len(ctx.explained_by))


# mghpcc/aicr-benchmarks@9fd27bd2:Benchmark_WG/pytorch-training/rtx_pro_6000/resnet152/logs/bench_1node_17462.out
_PORT_ERR = ("[2026-05-11 18:22:08] a0007:68265:68340 [0] transport/net_ib.cc:253 NCCL WARN NET/IB : "
             "mlx5_3:1 Got non-fatal async event: port error(10)")
_PORT_UP = ("[2026-05-11 18:28:14] a0007:68264:68328 [0] transport/net_ib.cc:253 NCCL WARN NET/IB : "
            "mlx5_3:1 Got non-fatal async event: port active(9)")
_A0007 = {"nodes": ["a0007"], "start_time": "2026-05-11T18:18:00Z", "end_time": "2026-05-11T18:40:00Z"}


@final_rule(
    id="final.cleared", priority=590, title="A fault that cleared is weak evidence",
    description="Applies the catalog's clears relations (rules/catalog/final/clears.yaml) after the explains "
                "rules: a root report that explains nothing and is followed on its host, after its last occurrence, "
                "by a report that the fault cleared (an HCA port back to active) becomes weak evidence: alone it "
                "names a suspect, never a node to drain or exclude.",
    examples={"fires": [_scenario({"logs/app/a0007.log": _PORT_ERR + "\n" + _PORT_UP}, **_A0007)],
              "quiet": [_scenario({"logs/app/a0007.log": _PORT_ERR}, **_A0007),
                        _scenario({"logs/app/a0007.log": _PORT_UP}, **_A0007)]},
)
def cleared(ctx: FinalContext) -> None:
    count = apply_clears(ctx)
    if count:
        ctx.step("final.cleared", "weaken", [], reports=count)


@final_rule(
    id="final.completed", priority=510, title="A completed workload has no failure",
    description="The scheduler says the attempt completed: the diagnosis is no_failure whatever the logs "
                "show; root candidates seen are listed in the trail, not blamed.",
    examples={"fires": [_scenario({"logs/syslog/node-02.log": _XID79}, state="COMPLETED")],
              "quiet": [_scenario({"logs/syslog/node-02.log": _XID79})]},
)
def completed(ctx: FinalContext) -> None:
    if ctx.workload.terminal_state != "completed":
        return
    ctx.status = "no_failure"
    seen = [e for e in ctx.events if e.role in ("root", "symptom")]
    ctx.step("final.completed", "no_failure", seen, reason="the workload completed",
             ignored_roots=len([e for e in seen if e.role == "root"]))


_DONE = "`Trainer.fit` stopped: `max_steps=400000` reached."
# DeepSpeed's per-node launcher on a two-process run that finished (Arnoochka/Transformer-Parallelism deepspeed.log)
_DS_START = "[2025-09-11 22:29:35,050] [INFO] [launch.py:152:main] nnodes=1, num_local_procs=2, node_rank=0"
_DS_OK = ("[2025-09-11 22:30:00,068] [INFO] [launch.py:351:main] Process 9520 exits successfully.\n"
          "[2025-09-11 22:30:01,069] [INFO] [launch.py:351:main] Process 9521 exits successfully.")
# torchelastic's agent restarting the worker group (torch/distributed/elastic/agent/server/api.py)
_RESTART = "[default] Worker group FAILED. 2/3 attempts left; will restart worker group"


@final_rule(
    id="final.completed_in_lines", priority=505, title="A run whose own lines say it finished has no failure",
    description="Without a scheduler state (a bare log), the trainer's end-of-run line (Lightning, Hugging Face "
                "Trainer, W&B's success) is the evidence the run completed, when no cause comes before it in its "
                "file; errors after it are teardown. A cause the launcher restarted the workers after (torchelastic's "
                "'will restart worker group', before the end line in the same file) was recovered from. DeepSpeed's "
                "launcher ends a launch normally when each of its num_local_procs processes on each of its nnodes nodes "
                "'exits successfully' (deepspeed/launcher/launch.py): the last of those lines is then the end. Source: "
                "uzh-rpg/RVT#40, PrimeIntellect-ai/prime-rl#417, NVIDIA/NeMo's resiliency demo, "
                "Arnoochka/Transformer-Parallelism's deepspeed.log.",
    examples={"fires": [_scenario({"logs/app/node-01.log": "wandb: Network error (TransientError), entering retry loop.\n" + _DONE},
                                  state="UNKNOWN"),
                        _scenario({"logs/app/node-01.log": "Exception: Simulating a crash at step 17!\n" + _RESTART + "\n" + _DONE},
                                  state="UNKNOWN"),
                        _scenario({"logs/app/node-01.log": _DS_START + "\nwandb: Network error (TransientError), entering retry loop.\n"
                                   + _DS_OK}, state="UNKNOWN")],
              "quiet": [_scenario({"logs/app/node-01.log": _DONE}),
                        _scenario({"logs/app/node-01.log": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n" + _DONE},
                                  state="UNKNOWN"),
                        _scenario({"logs/app/node-01.log": _RESTART + "\nException: Simulating a crash at step 17!\n" + _DONE},
                                  state="UNKNOWN"),
                        # one of the two processes said so: one process's end, not the launch's
                        _scenario({"logs/app/node-01.log": _DS_START + "\nwandb: Network error (TransientError), entering retry loop.\n"
                                   + _DS_OK.split("\n")[0]}, state="UNKNOWN")]},
)
def completed_in_lines(ctx: FinalContext) -> None:
    if ctx.status is not None or ctx.workload.terminal_state != "unknown":
        return
    done = [e for e in ctx.events if e.kind == "run_completed"] + _launcher_all_exited(ctx)
    if not done:
        return
    last = max(done, key=lambda e: (e.path, e.line))
    # The launcher restarted the workers between a cause and the end: that cause was recovered from.
    recovered = max((e.line for e in ctx.events if e.kind == "launch_restart" and e.path == last.path
                     and e.line < last.line), default=0)
    firm = [r for r in ctx.independent_roots if r.strength != "echo"
            and not (r.path == last.path and r.line < recovered)]
    # A cause before the end of the run, or one that cannot be placed against it, is a failure; after
    # it, the scheduler ending the job (a hang at exit until the time limit) or a firm fault that is
    # not an exit-time exception (a CUDA OOM in the test loop after fit) is one too.
    if any(r.path != last.path or r.line < last.line or _after_the_end_fails(r) for r in firm):
        return
    ctx.status = "no_failure"
    ctx.step("final.completed_in_lines", "no_failure", done,
             reason="the program's own end-of-run line; what follows it is teardown",
             teardown=len([r for r in ctx.roots if r.path == last.path and r.line > last.line]))


def _launcher_all_exited(ctx: FinalContext) -> list[Ev]:
    """DeepSpeed's per-node launcher logs "Process N exits successfully." for each local process that returned
    0 and tears the node down at the first that does not: when every node it names (nnodes) has that line
    for each of its num_local_procs processes, after its last "nnodes=..., num_local_procs=..." line, the
    launch ended normally. The last such line stands for the run's end (empty: not every process said so)."""
    starts = [e for e in ctx.events if e.kind == "launch_local_procs"]
    oks = [e for e in ctx.events if e.kind == "launch_process_ok"]
    if not starts or not oks:
        return []
    start = max(starts, key=lambda e: (e.path, e.line))
    nnodes, nprocs = start.fields.get("nnodes"), start.fields.get("num_local_procs")
    if not isinstance(nnodes, int) or not isinstance(nprocs, int) or nnodes < 1 or nprocs < 1:
        return []
    after = [e for e in oks if e.path == start.path and e.line > start.line]
    pids: dict[str | None, set] = defaultdict(set)
    for e in after:
        pids[e.host].add(e.fields.get("pid"))
    if sum(len(p) >= nprocs for p in pids.values()) < nnodes:
        return []
    return [max(after, key=lambda e: e.line)]


def _after_the_end_fails(root: Ev) -> bool:
    return root.domain == "scheduler" or (root.strength == "strong" and root.kind != "python_exception")


@final_rule(
    id="final.choose", priority=500, title="Choose the initiating event",
    description="Among root candidates that no other root explains, those whose symptom coverage reaches "
                "min_coverage and is within ambiguity_margin of the best fit. One sub_domain fits: attributed. "
                "Several: ambiguous, each a candidate. None: unattributed. A completed workload: no_failure.",
    examples={"fires": [_scenario({"logs/syslog/node-02.log": _XID79, "logs/app/node-01.log": _WD})],
              "quiet": [_scenario({"logs/syslog/node-02.log": _XID79}, state="COMPLETED")]},
)
def choose(ctx: FinalContext) -> None:
    if ctx.status is not None:
        return
    settings = ctx.settings
    roots = sorted(ctx.independent_roots, key=root_order)
    for r in roots:
        ctx.coverage_of[id(r)] = coverage(ctx, [r])
    best = max((ctx.coverage_of[id(r)] for r in roots), default=0.0)
    fits = [r for r in roots if ctx.coverage_of[id(r)] >= float(settings["min_coverage"])
            and ctx.coverage_of[id(r)] >= best - float(settings["ambiguity_margin"])]
    unclocked = [r for r in fits if not placed(r)]
    if unclocked:
        ctx.step("final.choose", "ordered_by_position", unclocked,
                 reason="no stamp of their own: placed by line order within their file and by the "
                        "stamped lines around them, which do not contradict them")
    if fits and all(r.strength == "echo" for r in fits):
        # Weak evidence alone (contract section 2): text that other faults also produce.
        ctx.status = "unattributed"
        ctx.coverage = best
        ctx.suspects.update(r.host for r in fits if r.host)
        ctx.suspects.update(peer_hosts(ctx, fits))
        ctx.step("final.choose", "unattributed", fits,
                 reason="only weak evidence (an echo other faults also produce) and nothing firmer joins it",
                 weak=[r.sub_domain for r in fits])
        return
    if not fits:
        # The only cause in sight, with no clock to place it against its echoes, initiates
        # unless stamps contradict it (a stamped root that explains too little stays out).
        firm = [r for r in roots if r.strength != "echo"]
        if firm and len({r.sub_domain for r in firm}) == 1 and not _stamped_before(ctx, firm):
            fits = firm
            ctx.step("final.choose", "only_cause", firm,
                     reason="the only cause in the lines and nothing stamped contradicts it",
                     coverage=max(ctx.coverage_of[id(r)] for r in firm))
    if not fits:
        ctx.status = "unattributed"
        ctx.coverage = best
        # Root evidence that does not explain the failure is still evidence against its host.
        ctx.suspects.update(r.host for r in roots if r.host)
        ctx.step("final.choose", "unattributed", roots,
                 reason="no root candidate" if not roots else "no root candidate explains enough of the symptoms",
                 best_coverage=best, min_coverage=float(settings["min_coverage"]))
        return
    # Echo evidence beside firmer candidates is not a candidate of its own.
    firm = [r for r in fits if r.strength != "echo"]
    groups: dict[str, list[Ev]] = defaultdict(list)
    for r in firm:
        groups[r.sub_domain or "?"].append(r)
    if len(groups) == 1:
        ctx.status = "attributed"
        ctx.chosen = first_cause(ctx, firm)
        ctx.coverage = coverage(ctx, ctx.chosen)
        ctx.step("final.choose", "attribute", ctx.chosen, coverage=ctx.coverage,
                 considered=len(roots), fitting=len(fits))
        return
    ctx.status = "ambiguous"
    for sub, members in sorted(groups.items(), key=lambda kv: root_order(sorted(kv[1], key=root_order)[0])):
        members = sorted(members, key=root_order)
        cov = max(ctx.coverage_of[id(m)] for m in members)
        ctx.candidates.append({"members": members, "sub_domain": sub, "domain": members[0].domain, "coverage": cov})
    ctx.coverage = max(c["coverage"] for c in ctx.candidates)
    ctx.step("final.choose", "ambiguous", firm, candidates=[c["sub_domain"] for c in ctx.candidates],
             coverages=[c["coverage"] for c in ctx.candidates])


def _stamped_before(ctx: FinalContext, roots: list[Ev]) -> bool:
    """Does a symptom with its own stamp, unexplained by these roots, precede them all?"""
    starts = [ctx.when(r) for r in roots]
    if any(t is None or not placed(r) for t, r in zip(starts, roots)):
        return False                          # an unclocked root: no stamp can contradict it
    first = min(starts)
    covered = {id(t) for r in roots for t in reachable(ctx, r)}
    return any(placed(s) and id(s) not in covered and ctx.when(s) < first - ctx.tol() for s in ctx.symptoms)


def peer_hosts(ctx: FinalContext, evs: list[Ev]) -> set[str]:
    """Hosts a line names as its peer (NCCL's 'peer 10.1.2.3<port>'), IP mapped where the logs allow."""
    ip_hosts = ctx.settings.get("_inventory", {}).get("ip_hosts", {})
    out = set()
    for ev in evs:
        peer = ev.fields.get("peer")
        if not isinstance(peer, str) or not peer:
            continue
        name = peer.split("<", 1)[0]
        host = ip_hosts.get(name) or (name if name in ctx.workload.nodes else None)
        if host:
            out.add(host)
    return out


@final_rule(
    id="final.straggler", priority=400, title="Point at the rank everyone waited for",
    description="When watchdog status lines show a minority of ranks that never enqueued the collective the "
                "others timed out on (last enqueued below that sequence number), their hosts are suspects.",
    examples={"fires": [_scenario({
        "logs/app/node-01.log": "3: [rank3]:[E1102 10:13:12.511299168 ProcessGroupNCCL.cpp:2268] [PG ID 0 PG GUID 0(default_pg) Rank 3]  failure detected by watchdog at work sequence id: 812 PG status: last enqueued work: 812, last completed work: 811\n"
                                "4: [rank4]:[E1102 10:13:12.511299168 ProcessGroupNCCL.cpp:2268] [PG ID 0 PG GUID 0(default_pg) Rank 4]  failure detected by watchdog at work sequence id: 812 PG status: last enqueued work: 812, last completed work: 811",
        "logs/app/node-02.log": "11: [rank11]:[E1102 10:13:12.511299168 ProcessGroupNCCL.cpp:2268] [PG ID 0 PG GUID 0(default_pg) Rank 11]  failure detected by watchdog at work sequence id: 811 PG status: last enqueued work: 811, last completed work: 811"})],
        "quiet": [_scenario({"logs/app/node-01.log": _WD})]},
)
def straggler(ctx: FinalContext) -> None:
    if ctx.status in ("no_failure", "attributed"):
        return
    reports = [e for e in ctx.events if e.kind in _SEQ_KINDS]
    timed_out = [e for e in reports if isinstance(e.fields.get("seq"), int)]
    if not timed_out:
        return

    def stuck_at(evs: list[Ev]) -> int:
        weight: Counter = Counter()
        for ev in evs:
            weight[ev.fields["seq"]] += max(len(ev.ranks), 1)
        return max(weight.items(), key=lambda kv: (kv[1], kv[0]))[0]

    overall = stuck_at(timed_out)
    groups: dict[str, list[Ev]] = defaultdict(list)
    for ev in reports:
        groups[str(ev.fields.get("pg"))].append(ev)
    found: list[Ev] = []
    for _pg, evs in sorted(groups.items()):
        with_seq = [e for e in evs if isinstance(e.fields.get("seq"), int)]
        target = stuck_at(with_seq) if with_seq else overall
        behind = [e for e in evs
                  if (isinstance(e.fields.get("last_enqueued"), int) and e.fields["last_enqueued"] < target)
                  or (isinstance(e.fields.get("seq"), int) and e.fields["seq"] < target)]
        behind_ranks = set().union(*(e.ranks for e in behind)) if behind else set()
        all_ranks = set().union(*(e.ranks for e in reports))
        # A minority that never enqueued what everyone else waits on: the one they waited for.
        if behind and len(behind_ranks) * 2 < max(len(all_ranks), 1):
            found.extend(behind)
    hosts = sorted({ev.host for ev in found if ev.host})
    if hosts:
        ctx.suspects.update(hosts)
        ctx.step("final.straggler", "suspect", found, hosts=hosts, stuck_at=overall)


_SEQ_KINDS = ("watchdog_status", "watchdog_timeout", "dump_signal")


@final_rule(
    id="final.missing", priority=300, title="Say what evidence is missing",
    description="Job hosts with no syslog, ranks with no log line, hosts whose dmesg stamps could not be "
                "placed in time (no boot time), hosts without metrics when metrics were collected.",
    examples={"fires": [_scenario({"logs/syslog/node-02.log": _XID79})],
              "quiet": [_scenario({"logs/syslog/node-02.log": _XID79, "logs/syslog/node-01.log": _XID79.replace("node-02", "node-01"),
                                   "logs/app/node-01.log": _WD, "logs/app/node-02.log": _WD.replace("3: [rank3]", "11: [rank11]")},
                                  gpus_per_node=1)]},
)
def missing(ctx: FinalContext) -> None:
    info = ctx.settings.get("_inventory", {})
    wl = ctx.workload
    # What analyze inferred because the input had no scheduler record (contract: kind `workload`),
    # and how each host was named (the evidence trail keeps it for a person to check).
    out: list[dict] = [dict(m) for m in info.get("inferred", ())]
    if info.get("host_origin") or info.get("ip_hosts"):
        ctx.step("final.missing", "hosts_inferred", [], hosts=dict(info.get("host_origin", {})),
                 ip_to_host=dict(info.get("ip_hosts", {})))
    syslog_hosts = set(info.get("syslog_hosts", ()))
    no_syslog = sorted(h for h in wl.nodes if h not in syslog_hosts)
    if no_syslog:
        out.append({"kind": "syslog", "detail": "job hosts with no kernel/syslog log", "hosts": no_syslog, "ranks": []})
    if wl.gpus_per_node and wl.nodes:
        expected = set(range(len(wl.nodes) * wl.gpus_per_node))
        seen = set(info.get("app_ranks", ()))
        app_hosts = set(info.get("app_hosts", ()))
        for ev in ctx.events:
            if ev.source == "app":
                seen |= ev.ranks
        seen |= {r for r in expected if wl.host_of_rank(r) in app_hosts}
        lacking = sorted(expected - seen)
        if lacking:
            hosts = sorted({h for r in lacking if (h := wl.host_of_rank(r))})
            out.append({"kind": "app_log", "detail": "ranks with no application log line", "hosts": hosts, "ranks": lacking})
    untimed = sorted({e.host for e in ctx.events if e.quality == "order_only" and e.host and e.role == "root"})
    if untimed:
        out.append({"kind": "boot_time", "detail": "dmesg uptime stamps could not be placed in time: add boot_times",
                    "hosts": untimed, "ranks": []})
    metric_hosts = info.get("metric_hosts")
    if metric_hosts is not None and info.get("has_metrics"):
        gap = sorted(h for h in wl.nodes if h not in metric_hosts)
        if gap:
            out.append({"kind": "metrics", "detail": "job hosts with no metric samples", "hosts": gap, "ranks": []})
    if ctx.status == "unattributed":
        # What would help most next: the suspects' logs first.
        out.sort(key=lambda m: (not (set(m["hosts"]) & ctx.suspects), m["kind"]))
    ctx.missing = out
    if out:
        ctx.step("final.missing", "list", [], kinds=[m["kind"] for m in out])


@final_rule(
    id="final.recovery", priority=200, title="Propose a recovery action",
    description="From the taxonomy's recovery table for an attributed sub_domain, with the responsible nodes; "
                "a root that is only weak evidence never drains a node; ambiguous and unattributed only notify.",
    examples={"fires": [_scenario({"logs/syslog/node-02.log": _XID79, "logs/app/node-01.log": _WD})],
              "quiet": [_scenario({"logs/app/node-01.log": _WD}, state="COMPLETED")]},
)
def recovery(ctx: FinalContext) -> None:
    if ctx.status == "no_failure":
        ctx.recovery = {"action": "none", "nodes": [], "reason": "the workload completed",
                        "next_step": "nothing to recover"}
        return
    if ctx.status != "attributed":
        why = ("several causes fit and nothing decides between them" if ctx.status == "ambiguous"
               else "no cause is proven by the lines")
        ctx.recovery = {"action": "notify_owner", "nodes": [],
                        "reason": f"{ctx.status}: {why}, so nothing is drained or excluded automatically",
                        "next_step": _collect_next(ctx)}
        ctx.step("final.recovery", "notify_owner", [], reason=f"{ctx.status}: no automated action")
        return
    # Each chosen report's own action (NVIDIA's resolution for its Xid, its strength); the most
    # severe decides, on the hosts of the reports that call for it: a contained Xid 94 on one
    # node does not make an uncontained error on another a retry.
    entry = ctx.catalog.taxonomy.get(ctx.chosen[0].domain or "", {}).get(ctx.chosen[0].sub_domain or "", {})
    base = entry.get("recovery", "notify_owner")
    own_actions = [(r, *_own_action(r, base)) for r in ctx.chosen]
    # max() keeps the first of equals: the initiating report decides among equally severe ones.
    root, action, why = max(own_actions, key=lambda a: _SEVERITY.get(a[1], 0))
    severe = ("drain_nodes", "retry_excluding_nodes")
    nodes = [] if root.domain == "scheduler" else sorted({r.host for r, act, _ in own_actions
                                                          if r.host and act in severe and not reporter_only(r)})
    reasons = [f"{root.sub_domain} ({entry.get('summary', root.kind)})"] + why
    unnamed = False
    vendor = _vendor(root)
    if action in ("drain_nodes", "retry_excluding_nodes") and not nodes:
        # A rerun would likely land on the same broken node: a person must find it first.
        action = "notify_owner"
        unnamed = True
        reasons.append("no host is named in the lines, so no node can be drained or excluded automatically")
    if root.domain == "application":
        reasons.append("an application fault: the node where it happened is not at fault")
    keep = action in ("drain_nodes", "retry_excluding_nodes")
    # The rule that tagged the root may know better than its sub_domain's row (a DIMM, not "the node").
    own = next((r.tag.next_step for r in ctx.catalog.early if r.id in root.early_rules and r.tag and r.tag.next_step), None)
    step = render(own, root) if own else entry.get("next_step", "")
    if unnamed and step:
        step = f"find the host that logged the root-cause line, then {step}"
    if isinstance(vendor, str) and vendor not in ("IGNORE", "RESTART_APP"):
        extra = root.fields.get("investigatory")
        step = f"{step} (NVIDIA: {vendor}" + (f", then {extra})" if isinstance(extra, str) and extra != vendor else ")")
    ctx.recovery = {"action": action, "nodes": nodes if keep else [],
                    "reason": "; ".join(reasons) + f": {action}" + (f" {', '.join(nodes)}" if keep else ""),
                    "next_step": step}
    ctx.step("final.recovery", action, [root], nodes=ctx.recovery["nodes"])


# NVIDIA's Xid catalog resolution buckets -> how much recovery may do.
_VENDOR_ACTION = {"RESTART_APP": "retry", "RESET_GPU": "drain_nodes", "RESTART_BM": "drain_nodes",
                  "RESTART_VM": "drain_nodes", "REBOOT": "drain_nodes"}
_SEVERITY = {"drain_nodes": 3, "retry_excluding_nodes": 2, "retry": 1}


def _vendor(root: Ev) -> str | None:
    """NVIDIA's resolution belongs to the Xid that was logged, not to one a marker refers to."""
    vendor = None if "referred_xid" in root.fields else root.fields.get("immediate")
    return vendor if isinstance(vendor, str) else None


def _own_action(root: Ev, action: str) -> tuple[str, list[str]]:
    """What one chosen report calls for, from its sub_domain's ``action``, and why it differs."""
    why = []
    vendor = _vendor(root)
    if vendor in _VENDOR_ACTION and action in ("drain_nodes", "retry_excluding_nodes"):
        # NVIDIA's resolution for the Xid decides how much of the node is affected.
        action = _VENDOR_ACTION[vendor]
        why.append(f"NVIDIA's resolution for this Xid is {vendor}")
    if action == "drain_nodes" and root.strength != "strong":
        action = "retry_excluding_nodes"
        why.append("the evidence is indirect, so the node is excluded from the rerun, not drained")
    elif action == "drain_nodes" and root.fields.get("host_basis") == "rank_placement":
        # rank // GPUs-per-node names a node only when ranks were placed in the record's node order.
        action = "retry_excluding_nodes"
        why.append("its host is only the rank's place in the job, not a line that names it, so the node is "
                   "excluded from the rerun, not drained")
    return action, why


def _and(items: list[str], limit: int = 8, noun: str = "hosts") -> str:
    """['a', 'b', 'c'] -> 'a, b and c'; past ``limit``, 'a, ..., h and 24 more hosts'."""
    if len(items) > limit:
        return f"{', '.join(items[:limit])} and {len(items) - limit} more {noun}"
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _ask_for(missing: dict) -> str:
    """A missing_evidence entry as what a person fetches, naming the hosts: the next step's words."""
    hosts = _and(missing["hosts"]) if missing["hosts"] else "the job's hosts"
    kind = missing["kind"]
    if kind == "syslog":
        return f"the kernel log (syslog, journalctl -k or dmesg -T) of {hosts}"
    if kind == "app_log":
        spans: list[list[int]] = []
        for r in sorted(missing["ranks"]):
            if spans and spans[-1][1] == r - 1:
                spans[-1][1] = r
            else:
                spans.append([r, r])
        ranks = [f"{a}" if a == b else f"{a}-{b}" for a, b in spans]
        which = f"rank{'s' if len(missing['ranks']) != 1 else ''} {_and(ranks, 8, 'ranges')}" if ranks else "its ranks"
        return f"the application log of {which} (on {hosts})"
    if kind == "boot_time":
        return f"the boot time of {hosts} (boot_times in workload.json), so their dmesg stamps can be placed in time"
    if kind == "metrics":
        return f"the GPU metric samples of {hosts}"
    return f"{missing['detail']} ({hosts})"


def _collect_next(ctx: FinalContext) -> str:
    """For ambiguous and unattributed diagnoses: the evidence that would help most."""
    if ctx.status == "ambiguous":
        hosts = sorted({m.host for c in ctx.candidates for m in c["members"] if m.host})
        return ("collect the kernel logs (dmesg with times, or boot times) of "
                + (_and(hosts) if hosts else "the hosts involved") + " to order the candidates")
    first = ctx.missing[0] if ctx.missing else None
    if first and first["kind"] != "workload":
        return "collect " + _ask_for(first)
    if ctx.suspects:
        # Ask only for what the input lacks: a suspect whose logs are here needs a look at the host itself.
        info = ctx.settings.get("_inventory", {})
        have_kernel = set(info.get("syslog_hosts", ()))
        have_app = set(info.get("app_hosts", ())) | {e.host for e in ctx.events if e.source == "app" and e.host}
        hosts = sorted(h for h in ctx.suspects if h)
        asks = [f"the {what} of {', '.join(lack)}" for what, have in (("kernel log", have_kernel), ("application log", have_app))
                if (lack := [h for h in hosts if h not in have])]
        if asks:
            return "collect " + " and ".join(asks)
        return (f"the logs of {', '.join(hosts)} are in the input already: look at the host itself "
                "(nvidia-smi, dmesg -T, a py-spy dump of its hung ranks) before the rerun")
    return "collect every rank's full log and each host's kernel log (dmesg -T) around the failure"


def responsible(ctx: FinalContext) -> list[str]:
    if ctx.status != "attributed" or not ctx.chosen:
        return []
    if ctx.chosen[0].domain == "scheduler":
        return []
    return sorted({r.host for r in ctx.chosen if r.host and not reporter_only(r)})


@final_rule(
    id="final.unparsed", priority=100, title="Keep unreadable lines as evidence",
    description="Lines that looked relevant (a prefilter anchor hit) but were damaged (invalid UTF-8, over-long) "
                "and matched no pattern are listed so an operator can read them.",
    examples={"fires": [_scenario({"logs/syslog/node-02.log": "Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:1b:00): \udcff"})],
              "quiet": [_scenario({"logs/syslog/node-02.log": _XID79})]},
)
def unparsed(ctx: FinalContext) -> None:
    damaged = [e for e in ctx.events if e.kind == "unparsed"]
    if damaged:
        ctx.step("final.unparsed", "keep", damaged, lines=sum(e.count for e in damaged))
