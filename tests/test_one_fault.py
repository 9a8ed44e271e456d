"""One fault, one cause (issue 20): reports of one fault by two layers are one candidate,
and a guessed time never overrules what the catalog knows causally.

Scenarios are the seed's worked example (samples/worked-example, real message formats) and
variants of it; the property tests move clocks and unstamped lines and expect the same answer.
"""
from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from firstfault.rules.engine import analyze_files, analyze_path

from conftest import SAMPLES

WORKED = SAMPLES / "worked-example"
# The worked example's fault decoded another way (Link 05, words 0x00a505c6): still a local
# signal-integrity link-down on node-02 (NVLink5 decode table).
XID149 = ("Nov  2 10:03:11 node-02 kernel: [887881.545061] NVRM: Xid (PCI:0000:1b:00): 149, pid=89695, name=python3, "
          "NETIR_LINK_EVT Fatal XC0 i0 Link 05 (0x00a505c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)")
NCCL_CUDA_220 = ("node-02:89696:89790 [1] transport/p2p.cc:275 NCCL WARN Cuda failure 220 "
                 "'uncorrectable NVLink error was detected during the execution'")
TORCH_NVLINK = ("[rank9]:[E1102 {t} ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank 9] Process group "
                "watchdog thread terminated with exception: CUDA error: uncorrectable NVLink error was detected during the execution")
IB_ERR = ("node-03:184785:184901 [3] transport/net_ib.cc:1712 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<49189> "
          "with error 12, opcode 0, len 0, vendor err 129 (Recv)")
XID94 = "Nov  2 10:03:11 gpu-b kernel: NVRM: Xid (PCI:0000:9b:00): 94, pid=48211, name=python3, Contained: SM (0x1). RST: No, D-RST: No"
CUDA_ECC = "[default3]:[rank11]: RuntimeError: CUDA error: uncorrectable ECC error encountered"
WD = ("[default{local}]:[rank{rank}]:[E1102 10:13:12.{us:06d} ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught "
      "collective operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, "
      "Timeout(ms)=600000) ran for 600054 milliseconds before timing out.")


def _worked_files() -> dict[str, str]:
    return {str(p.relative_to(WORKED)): p.read_text() for p in sorted((WORKED / "logs").rglob("*.log"))}


def _worked_workload() -> dict:
    return json.loads((WORKED / "workload.json").read_text())


def _watchdogs(n: int) -> list[str]:
    lines = [ln.split(": ", 1)[1] for f in sorted((WORKED / "logs" / "app").glob("*.log"))
             for ln in f.read_text().splitlines() if "ProcessGroupNCCL.cpp:632" in ln]
    return lines[:n]


def nvlink_variant(torch_time: str = "10:03:12.418301", nccl_at: int = 0) -> dict[str, str]:
    """The issue's variant: node-02's Xid 149 and its Xid 45s, and one merged app log with an unstamped
    NCCL 'Cuda failure 220' from node-02 (at position ``nccl_at`` among the stamped lines), PyTorch's
    stamped CUDA error for the same NVLink fault, an IB completion error on node-03 and 30 timeouts."""
    files = _worked_files()
    files["logs/syslog/node-02.log"] = files["logs/syslog/node-02.log"].replace(
        files["logs/syslog/node-02.log"].splitlines()[8], XID149)
    stamped = ["[2026-11-02 09:59:20,230] INFO step 45122 loss 2.0175 lr 3.0e-4 tokens/s 41548",
               TORCH_NVLINK.format(t=torch_time), IB_ERR] + _watchdogs(30)
    app = stamped[:nccl_at] + [NCCL_CUDA_220] + stamped[nccl_at:]
    for name in list(files):
        if name.startswith("logs/app/"):
            del files[name]
    files["logs/app/train.log"] = "\n".join(app) + "\n"
    return files


X94_WORKLOAD = {"workload_id": "x94", "attempt": 0, "state": "FAILED", "scheduler": "slurm",
                "start_time": "2026-11-02T09:58:00Z", "end_time": "2026-11-02T10:21:14Z",
                "nodes": ["gpu-a", "gpu-b"], "gpus_per_node": 8}


def xid94_files(cuda_at: int = 1) -> dict[str, str]:
    """A contained Xid 94 on gpu-b; the app's unstamped CUDA ECC line of rank 11 (on gpu-b) at position
    ``cuda_at`` among its stamped lines, then 15 watchdog timeouts of the other ranks."""
    stamped = [f"[default3]:[rank11]:[I1102 10:0{m}:40.000000 train.py:88] step {100 + m}" for m in range(4)]
    app = stamped[:cuda_at] + [CUDA_ECC] + stamped[cuda_at:]
    app += [WD.format(local=r % 8, rank=r, us=r) for r in range(16) if r != 11]
    return {"logs/syslog/gpu-b.log": XID94 + "\n", "logs/app/train.log": "\n".join(app) + "\n"}


def _answer(d) -> tuple:
    return d.status, d.sub_domain, tuple(d.responsible_nodes), d.recovery.action


# ---------------------------------------------------------------- the cases

@pytest.mark.parametrize("torch_time", ["10:03:12.418301", "10:03:10.418301", "10:02:41.000000"])
def test_worked_example_variant_is_one_signal_integrity_fault(torch_time):
    # PyTorch's line stamped after, or before, the driver's (a host's app and kernel logs disagree by seconds).
    d = analyze_files(_worked_workload(), nvlink_variant(torch_time)).diagnosis
    assert _answer(d) == ("attributed", "nvlink_signal_integrity", ("node-02",), "drain_nodes")
    assert d.root_cause.kind == "xid" and d.root_cause.ref.path == "logs/syslog/node-02.log"
    # The NCCL and CUDA reports stay as evidence, explained by the fault they report.
    cuda = next(s for s in d.symptoms if s.kind == "cuda_error")
    assert cuda.count == 2 and cuda.explained
    assert any(s.rule_id == "final.same.driver_nvlink_is_cuda_nvlink" for s in d.evidence)
    assert any(e.join == "same_fault" for e in d.explains)


def test_contained_xid94_is_the_root_and_retries():
    d = analyze_files(X94_WORKLOAD, xid94_files()).diagnosis
    assert _answer(d) == ("attributed", "gpu_memory_ecc", ("gpu-b",), "retry")
    assert d.root_cause.kind == "xid" and d.root_cause.fields["xid"] == 94
    assert "RESTART_APP" in d.recovery.reason


def test_cuda_ecc_alone_still_drains():
    # Without the driver's line nothing says the error was contained: the app's report, in its
    # host's own log, is the cause.
    files = {"logs/app/gpu-b.log": xid94_files()["logs/app/train.log"]}
    d = analyze_files(X94_WORKLOAD, files).diagnosis
    assert _answer(d) == ("attributed", "gpu_memory_ecc", ("gpu-b",), "drain_nodes")


def test_reports_on_different_hosts_are_two_faults():
    # The driver's ECC Xid on gpu-a and CUDA's ECC error in gpu-b's own log: not one fault, and the
    # uncontained one on gpu-b still drains gpu-b.
    files = xid94_files()
    files["logs/syslog/gpu-a.log"] = files.pop("logs/syslog/gpu-b.log").replace("gpu-b", "gpu-a")
    files["logs/app/gpu-b.log"] = files.pop("logs/app/train.log")
    d = analyze_files(X94_WORKLOAD, files).diagnosis
    assert not any(s.rule_id.startswith("final.same.") for s in d.evidence)
    assert (d.status, d.recovery.action, d.recovery.nodes) == ("attributed", "drain_nodes", ["gpu-b"])


def test_a_plain_nvlink_error_is_refined_by_the_decoded_one():
    files = {"logs/syslog/node-02.log": "\n".join([
        "Nov  2 10:03:09 node-02 kernel: NVRM: Xid (PCI:0000:1b:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error "
        "detected on link 6(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)", XID149]) + "\n"}
    d = analyze_files(_worked_workload(), files).diagnosis
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "nvlink_signal_integrity", ["node-02"])
    assert any(s.rule_id == "final.refine.nvlink_signal_integrity" for s in d.evidence)


def test_huge_stated_timeout_is_kept_and_does_not_crash():
    text = ("[E1002 18:06:40.000000 x.cpp:1] RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
            "[rank3]:[E1002 18:16:40.711756918 ProcessGroupNCCL.cpp:756] [Rank 3] Work WorkNCCL(SeqNum=2521, "
            "OpType=ALLREDUCE, NumelIn=160672064, NumelOut=160672064, Timeout(ms)=99999999999999) timed out in blocking wait.\n")
    d = analyze_files({**X94_WORKLOAD, "nodes": ["gpu-b"]}, {"logs/app/train.log": text}).diagnosis
    assert d.status == "attributed" and d.sub_domain == "gpu_memory_ecc"


def test_bare_folder_gives_the_same_answers(tmp_path):
    for name, files in (("nvlink", nvlink_variant("10:03:10.418301")), ("x94", xid94_files())):
        folder = tmp_path / name
        for rel, text in files.items():
            p = folder / Path(rel).name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        d = analyze_path(folder).diagnosis
        want = ("nvlink_signal_integrity", ["node-02"]) if name == "nvlink" else ("gpu_memory_ecc", ["gpu-b"])
        assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", *want)
        assert d.recovery.action != "drain_nodes" or name == "nvlink"


# ---------------------------------------------------------------- properties

_SYSLOG = re.compile(r"^(\w{3}) +(\d+) (\d\d:\d\d:\d\d)")
_BRACKET = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\]")
_GLOG = re.compile(r"\[([EWI])(\d\d)(\d\d) (\d\d:\d\d:\d\d)\.(\d{6})")


def shift_clock(text: str, seconds: float) -> str:
    """Every stamp of a file (syslog, bracketed ISO, glog) moved by ``seconds``: one host's clock off."""
    delta = timedelta(seconds=seconds)
    out = []
    for line in text.splitlines():
        m = _SYSLOG.match(line)
        if m:
            t = datetime.strptime(f"2026 {m[1]} {m[2]} {m[3]}", "%Y %b %d %H:%M:%S") + delta
            line = f"{t:%b} {t.day:2d} {t:%H:%M:%S}" + line[m.end():]
        line = _BRACKET.sub(lambda m: (lambda t: f"[{t:%Y-%m-%d %H:%M:%S},{t.microsecond // 1000:03d}]")(
            datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S") + timedelta(milliseconds=int(m[2])) + delta), line)
        line = _GLOG.sub(lambda m: (lambda t: f"[{m[1]}{t:%m%d %H:%M:%S}.{t.microsecond:06d}")(
            datetime.strptime(f"2026{m[2]}{m[3]} {m[4]}", "%Y%m%d %H:%M:%S") + timedelta(microseconds=int(m[5])) + delta),
            line)
        out.append(line)
    return "\n".join(out) + "\n"


def test_shift_clock_moves_every_stamp_shape():
    text = "Nov  2 10:03:11 node-02 kernel: x\n[2026-11-02 09:59:20,230] INFO\n[rank9]:[E1102 10:03:12.418301 a.cpp:1] y\n"
    assert shift_clock(text, 120) == ("Nov  2 10:05:11 node-02 kernel: x\n[2026-11-02 10:01:20,230] INFO\n"
                                      "[rank9]:[E1102 10:05:12.418301 a.cpp:1] y\n")


_PROPS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_CASES = {
    "worked": (_worked_workload, lambda at: _worked_files(), ("attributed", "nvlink_signal_integrity", ("node-02",), "drain_nodes")),
    "nvlink": (_worked_workload, lambda at: nvlink_variant("10:03:12.418301", at), ("attributed", "nvlink_signal_integrity", ("node-02",), "drain_nodes")),
    "x94": (lambda: X94_WORKLOAD, lambda at: xid94_files(min(at, 4)), ("attributed", "gpu_memory_ecc", ("gpu-b",), "retry")),
}


@_PROPS
@given(case=st.sampled_from(sorted(_CASES)), which=st.integers(0, 7), seconds=st.integers(-300, 300),
       at=st.integers(0, 4))
def test_one_clock_off_or_a_moved_unstamped_line_changes_nothing(case, which, seconds, at):
    workload, make, want = _CASES[case]
    files = make(at)
    name = sorted(files)[which % len(files)]
    files[name] = shift_clock(files[name], seconds)
    assert _answer(analyze_files(workload(), files).diagnosis) == want


@_PROPS
@given(case=st.sampled_from(sorted(_CASES)), host=st.integers(0, 3), seconds=st.integers(-300, 300))
def test_one_host_clock_off_changes_nothing(case, host, seconds):
    workload, make, want = _CASES[case]
    files = make(0)
    hosts = sorted({Path(p).stem for p in files})
    target = hosts[host % len(hosts)]
    files = {p: shift_clock(t, seconds) if Path(p).stem == target else t for p, t in files.items()}
    assert _answer(analyze_files(workload(), files).diagnosis) == want


# ---------------------------------------------------------------- a guessed order is no order

RDZV_TB = ('  File "/root/.local/lib/python3.7/site-packages/torch/distributed/rendezvous.py", line 143, in _env_rendezvous_handler\n'
           '    store = TCPStore(master_addr, master_port, start_daemon)\n'
           'ValueError: host not found: Name or service not known\n')   # kubeflow/pytorch-operator#125
KEYERROR = "KeyError: 'attention_mask'\n"                                   # hpcaitech/ColossalAI#3425


def test_two_distinct_faults_without_times_are_ambiguous_not_ordered_by_file_name():
    # Neither line has a stamp and they are in different files: nothing orders them, and the rule
    # that would demote one (the first traceback explains later ones) reads the pair either way round.
    for a, b in (("node-01", "node-02"), ("node-02", "node-01")):
        d = analyze_files(_worked_workload(), {f"logs/app/{a}.log": RDZV_TB, f"logs/app/{b}.log": KEYERROR}).diagnosis
        assert d.status == "ambiguous", (a, b)
        assert sorted(c.sub_domain for c in d.candidates) == ["rendezvous_error", "user_code_exception"]


def test_line_order_in_one_file_still_decides():
    d = analyze_files(_worked_workload(), {"logs/app/node-01.log": RDZV_TB + KEYERROR}).diagnosis
    assert (d.status, d.sub_domain) == ("attributed", "rendezvous_error")


def test_a_dmesg_without_host_takes_the_host_of_the_same_fault(tmp_path):
    # A folder: node-02's kernel lines as bare dmesg (uptime only, no host), and the merged app log whose
    # NCCL line names node-02 for the same NVLink fault: the fault is node-02's.
    files = nvlink_variant("10:03:10.418301")
    dmesg = "\n".join(ln[ln.index("["):] for ln in files["logs/syslog/node-02.log"].splitlines() if "NVRM" in ln)
    (tmp_path / "dmesg.txt").write_text(dmesg + "\n")
    (tmp_path / "train.log").write_text(files["logs/app/train.log"])
    d = analyze_path(tmp_path).diagnosis
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "nvlink_signal_integrity", ["node-02"])
    step = next(s for s in d.evidence if s.rule_id == "final.same.driver_nvlink_is_cuda_nvlink")
    assert step.detail["host_from_same_fault"]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(["nvlink", "x94"]), which=st.integers(0, 7), seconds=st.integers(-300, 300))
def test_without_the_record_years_come_from_the_input_and_change_nothing(tmp_path_factory, case, which, seconds):
    # No workload.json: every year-less stamp takes its year from the input (full dates, else the
    # files' modification time), one file's clock is off; the causal answer stays.
    workload, make, want = _CASES[case]
    files = make(0)
    name = sorted(files)[which % len(files)]
    files[name] = shift_clock(files[name], seconds)
    folder = tmp_path_factory.mktemp("bare")
    for rel, text in files.items():
        (folder / Path(rel).name).write_text(text)
    d = analyze_path(folder).diagnosis
    assert (d.status, d.sub_domain, tuple(d.responsible_nodes)) == want[:3]
    assert d.recovery.action == want[3]


def test_a_rank_whose_host_is_only_a_placement_guess_joins_the_driver_s_fault():
    # Rank 3 of a merged log: by block placement (3 // 8) it would be gpu-a, but nothing names its host;
    # torchrun's rendezvous may have put it on gpu-b, where the driver logged the contained Xid 94.
    files = xid94_files()
    files["logs/app/train.log"] = files["logs/app/train.log"].replace("[default3]:[rank11]: RuntimeError",
                                                                      "[default3]:[rank3]: RuntimeError")
    d = analyze_files(X94_WORKLOAD, files).diagnosis
    assert _answer(d) == ("attributed", "gpu_memory_ecc", ("gpu-b",), "retry")


def test_a_placement_guess_alone_never_drains():
    files = xid94_files()
    del files["logs/syslog/gpu-b.log"]
    d = analyze_files(X94_WORKLOAD, files).diagnosis         # rank 11 -> gpu-b only by its place
    assert (d.status, d.sub_domain) == ("attributed", "gpu_memory_ecc")
    assert d.recovery.action == "retry_excluding_nodes" and "place in the job" in d.recovery.reason
    # The same line in gpu-b's own log names its host: then the node is drained.
    d = analyze_files(X94_WORKLOAD, {"logs/app/gpu-b.log": files["logs/app/train.log"]}).diagnosis
    assert d.recovery.action == "drain_nodes" and d.recovery.nodes == ["gpu-b"]


# A node set DOWN under a two-node job on the repo's real one-host Slurm cluster (tests/test_slurm_real.py):
# srun and slurmstepd write the same output file, and the two lines land in either order.
NODE_DOWN_WL = {"workload_id": "slurm-5", "attempt": 0, "scheduler": "slurm", "state": "NODE_FAIL", "exit_code": "0:15",
                "start_time": "2026-11-02T10:05:00Z", "end_time": "2026-11-02T10:06:30Z", "nodes": ["n2", "n3"]}
SRUN_NODE_FAIL = "srun: error: Node failure on n3\n"
STEP_BANNER = ("slurmstepd-n2: error: *** STEP 5.0 ON n2 CANCELLED AT 2026-11-02T10:06:23 DUE TO NODE FAILURE, "
               "SEE SLURMCTLD LOG FOR DETAILS ***\n")
AFTER = "srun: Job step aborted: Waiting up to 4 seconds for job step to finish.\nsrun: error: n2: task 0: Terminated\n"


@pytest.mark.parametrize("first", ["srun", "slurmstepd"])
def test_a_node_failure_names_the_failed_node_whichever_line_came_first(first):
    head = SRUN_NODE_FAIL + STEP_BANNER if first == "srun" else STEP_BANNER + SRUN_NODE_FAIL
    d = analyze_files(NODE_DOWN_WL, {"logs/app/n2.log": "rank 0 step 0 loss 2.3000\n" + head + AFTER}).diagnosis
    assert (d.status, d.sub_domain) == ("attributed", "node_failure")
    assert d.responsible_nodes == ["n3"]
    assert d.recovery.nodes == ["n3"]           # never the surviving node that printed the banner


def test_the_banner_alone_names_no_node_to_exclude():
    # it is printed by a node that survived: the failed one is in slurmctld's log or srun's line, not here
    d = analyze_files(NODE_DOWN_WL, {"logs/app/n2.log": STEP_BANNER + AFTER}).diagnosis
    assert d.sub_domain == "node_failure"
    assert d.responsible_nodes == [] and d.recovery.nodes == []


# heronsystems/adeptRL#13: jobacct_gather kills the step over its memory limit; the step's slurmstepd prints the
# plain banner for the SIGKILL. Two writers of one output file: either line may come first.
MEM_KILL = "slurmstepd: Job 1171978 exceeded memory limit (18202456 > 16384000), being killed\n"
PLAIN_BANNER = "slurmstepd: *** JOB 1171978 ON cuda-24-0 CANCELLED AT 2018-10-16T13:24:27 ***\n"


@pytest.mark.parametrize("first", ["kill", "banner"])
def test_a_memory_limit_kill_is_one_cause_with_the_cancellation_it_causes(tmp_path, first):
    f = tmp_path / "slurm-1171978.out"
    f.write_text(MEM_KILL + PLAIN_BANNER if first == "kill" else PLAIN_BANNER + MEM_KILL)
    d = analyze_path(f).diagnosis
    assert (d.status, d.sub_domain) == ("attributed", "host_oom")
    assert d.responsible_nodes == ["cuda-24-0"]


# HAFS (hafs-community/HAFS#101): srun names the node "Orion-01-01", slurmstepd "orion-01-01"
ORION = """slurmstepd: error: Detected 1 oom-kill event(s) in step 3495064.0 cgroup. Some of your processes may have been killed by the cgroup out-of-memory handler.
srun: error: Orion-01-01: task 4: Out Of Memory
srun: Terminating job step 3495064.0
slurmstepd: error: *** STEP 3495064.0 ON orion-01-01 CANCELLED AT 2021-10-27T19:35:36 ***
"""


def test_one_node_spelled_in_two_cases_is_one_node(tmp_path):
    f = tmp_path / "slurm.out"
    f.write_text(ORION)
    d = analyze_path(f).diagnosis
    assert d.sub_domain == "host_oom"
    assert d.responsible_nodes == ["orion-01-01"]          # the node as the record (here: the lines) names it, once


HANG = SAMPLES / "hang-until-timeout"


@pytest.mark.parametrize("syslog_first", [False, True], ids=["app logs first", "kernel logs first"])
def test_a_file_of_logs_end_to_end_is_ordered_by_its_times_across_them(tmp_path, syslog_first):
    # `cat logs/app/*.log logs/syslog/*.log > all.log`: h100-03's Xid 79 (11:00) lies below the job's
    # output, whose time-limit cancel is stamped two hours later. Line order is one writer's order only
    # while the stamps run forward; across the step back the times decide, and the GPU loss that hung
    # the job explains the scheduler's kill, as in the bundle.
    parts = [sorted((HANG / "logs" / "app").glob("*.log")), sorted((HANG / "logs" / "syslog").glob("*.log"))]
    if syslog_first:
        parts.reverse()
    (tmp_path / "all.log").write_text("".join(p.read_text() for group in parts for p in group))
    bundle = analyze_path(HANG).diagnosis
    merged = analyze_path(tmp_path / "all.log").diagnosis
    assert (bundle.status, bundle.sub_domain, bundle.responsible_nodes) == ("attributed", "gpu_fell_off_bus", ["h100-03"])
    assert (merged.status, merged.sub_domain, merged.responsible_nodes) == ("attributed", "gpu_fell_off_bus", ["h100-03"])


def test_within_one_run_of_a_file_line_order_still_decides_against_a_small_step_back():
    # Two tracebacks of one writer with no stamps between them: line order, as before; a stamp a few
    # seconds back (a slow flush) is no second log.
    text = "[2026-11-02 10:00:05,000] INFO step 10\n" + RDZV_TB + "[2026-11-02 10:00:01,000] INFO step 11\n" + KEYERROR
    d = analyze_files(_worked_workload(), {"logs/app/node-01.log": text}).diagnosis
    assert (d.status, d.sub_domain) == ("attributed", "rendezvous_error")


AMBIGUOUS = SAMPLES / "ambiguous-two-faults"


def _ib_fault_moved() -> dict[str, str]:
    """The two-fault sample with node-06's port error told later: its kernel 'Link DOWN' and NCCL's two
    unstamped async-event lines (moved below the first watchdog line of that file, so their time is only
    the lower bound that line gives)."""
    files = {str(p.relative_to(AMBIGUOUS)): p.read_text() for p in sorted((AMBIGUOUS / "logs").rglob("*.log"))}
    app = files["logs/app/node-06.log"].splitlines()
    moved = [line for line in app if "Got async event : port error" in line]
    app = [line for line in app if line not in moved]
    at = next(i for i, line in enumerate(app) if "Watchdog caught collective operation timeout" in line)
    app[at + 1:at + 1] = moved
    files["logs/app/node-06.log"] = "\n".join(app) + "\n"
    syslog = files["logs/syslog/node-06.log"]
    files["logs/syslog/node-06.log"] = syslog.replace("Nov  5 16:20:42 node-06 kernel: mlx5_core",
                                                      "Nov  5 16:30:40 node-06 kernel: mlx5_core")
    assert files["logs/syslog/node-06.log"] != syslog and len(moved) == 2
    return files


def test_a_fault_reported_inside_a_hang_another_fault_began_did_not_start_it():
    wl = json.loads((AMBIGUOUS / "workload.json").read_text())
    assert analyze_path(AMBIGUOUS).diagnosis.status == "ambiguous"       # both at 16:20:4x: nothing orders them
    d = analyze_files(wl, _ib_fault_moved()).diagnosis
    # The port error is told ten minutes into the hang the Xid 48 began (the watchdogs ran 600 s); an
    # unstamped line's inherited time is a lower bound, and it is past the hang's start.
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_memory_ecc", ["node-03"])
