"""Host memory errors end to end (issue 13): EDAC UE + memory-failure SIGBUS on one node.

A two-node job where node-a's kernel logs an uncorrected DIMM error and kills rank 3 with
SIGBUS, rank 3's agent reports exit -7, and the ranks of node-b time out in NCCL: the
diagnosis must name the host memory error on node-a. Corrected (CE) errors alone must not.

Kernel lines: the EDAC UE, "mce: Uncorrected hardware memory error" and EDAC CE lines are
real (LKML <20210812152548.GA1579021@agluck-desk2.amr.corp.intel.com>, grondo/edac-utils#10);
the SIGBUS line is mm/memory-failure.c kill_proc()'s format filled with rank 3's pid. The
torchrun lines follow samples/host-oom-killer (PyTorch's failure summary) with exit -7.
"""
from __future__ import annotations

from rules.catalog import load_catalog
from rules.engine import analyze_files
from rules.ruletest import extract_one

WORKLOAD = {
    "workload_id": "slurm-4472611", "attempt": 0, "scheduler": "slurm", "state": "FAILED",
    "exit_code": "1:0", "start_time": "2026-11-06T07:30:00Z", "end_time": "2026-11-06T08:51:21Z",
    "nodes": ["node-a", "node-b"], "gpus_per_node": 4, "ranks": {"0": "node-a", "4": "node-b"},
}

_UE = ("Nov  6 08:41:16 node-a kernel: [971317.337683] EDAC MC3: 1 UE memory read error on "
       "CPU_SrcID#0_MC#3_Chan#0_DIMM#0 (channel:0 slot:0 page:0x7e025e offset:0x400 grain:32 -  "
       "err_code:0x00a0:0x0090  SystemAddress:0x7e025e400 ProcessorSocketId:0x0 MemoryControllerId:0x3 "
       "ChannelAddress:0xec04bc00 ChannelId:0x0 RankAddress:0x76025c00 PhysicalRankId:0x1 DimmSlotId:0x0 "
       "Row:0x3b01 Column:0x380 Bank:0x0 BankGroup:0x2 ChipSelect:0x1 ChipId:0x0)")
_CONSUMED = ("Nov  6 08:41:16 node-a kernel: [971317.337601] mce: Uncorrected hardware memory error in "
             "user-access at 7e025e400")
_SIGBUS = ("Nov  6 08:41:16 node-a kernel: [971317.337690] Memory failure: 0x7e025e: Sending SIGBUS to "
           "python:31631 due to hardware memory corruption")
_CE = ("Nov  6 08:41:16 node-a kernel: [971317.337683] EDAC MC0: 1 CE memory read error on "
       "CPU_SrcID#0_Ha#0_Chan#2_DIMM#0 (channel:2 slot:0 page:0x849923 offset:0x380 grain:32 syndrome:0x0 -  "
       "area:DRAM err_code:0001:0092 socket:0 ha:0 channel_mask:4 rank:0)")

_STEPS_A = "\n".join(f"{r}: [2026-11-06 08:40:5{r},000] INFO step 52960 loss 2.31 lr 3.0e-4" for r in range(4))
_STEPS_B = "\n".join(f"{r}: [2026-11-06 08:40:5{r - 4},500] INFO step 52960 loss 2.29 lr 3.0e-4"
                     for r in range(4, 8))

_AGENT_A = """\
0: W1106 08:41:17.002060 31553 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 31628 closing signal SIGTERM
0: W1106 08:41:17.003067 31553 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 31629 closing signal SIGTERM
0: W1106 08:41:17.005139 31553 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 31630 closing signal SIGTERM
0: E1106 08:41:17.476395 31553 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -7) local_rank: 3 (pid: 31631) of binary: /usr/bin/python3
0: torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
0: ============================================================
0: train.py FAILED
0: ------------------------------------------------------------
0: Failures:
0:   <NO_OTHER_FAILURES>
0: ------------------------------------------------------------
0: Root Cause (first observed failure):
0: [0]:
0:   time      : 2026-11-06_08:41:16
0:   host      : node-a
0:   rank      : 3 (local_rank: 3)
0:   exitcode  : -7 (pid: 31631)
0:   error_file: <N/A>
0:   traceback : Signal 7 (SIGBUS) received by PID 31631
0: ============================================================
srun: error: node-a: tasks 0-3: Exited with exit code 1"""

_PEERS_B = "\n".join(
    f"{r}: [rank{r}]:[E1106 08:51:1{r - 4}.722170 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective "
    f"operation timeout: WorkNCCL(SeqNum=52964, OpType=ALLREDUCE, NumelIn=544997376, NumelOut=544997376, "
    f"Timeout(ms)=600000) ran for 60004{r} milliseconds before timing out."
    for r in range(4, 8))
_SOCKET_B = ("4: node-b:178170:178551 [0] misc/socket.cc:49 NCCL WARN socketProgress: "
             "Connection closed by remote peer node-a<49774>")


def _bundle(syslog_a: str) -> dict[str, str]:
    return {
        "logs/syslog/node-a.log": "Nov  6 08:30:01 node-a systemd[1]: Started Slurm node daemon job step.\n"
                                  + syslog_a + "\n",
        "logs/syslog/node-b.log": "Nov  6 08:30:01 node-b systemd[1]: Started Slurm node daemon job step.\n",
        "logs/app/node-a.log": _STEPS_A + "\n" + _AGENT_A + "\n",
        "logs/app/node-b.log": _STEPS_B + "\n" + _SOCKET_B + "\n" + _PEERS_B + "\n",
    }


def test_memory_failure_sigbus_is_attributed_to_the_host():
    diag = analyze_files(WORKLOAD, _bundle("\n".join([_CONSUMED, _UE, _SIGBUS]))).diagnosis
    assert diag.status == "attributed", diag.summary
    assert (diag.domain, diag.sub_domain) == ("host", "host_kernel_error")
    assert diag.responsible_nodes == ["node-a"]
    assert diag.root_cause is not None and diag.root_cause.host == "node-a"
    assert diag.root_cause.kind in ("edac_mc", "memory_failure")
    # the peers' timeouts and the rank's SIGBUS exit are its echoes, not causes of their own
    assert diag.symptom_coverage >= 0.9, diag.symptom_coverage
    assert diag.recovery.action == "drain_nodes" and diag.recovery.nodes == ["node-a"]
    # The rule's own next step, more precise than the host_kernel_error row's (issue 13).
    assert "DIMM" in diag.recovery.next_step and diag.recovery.next_step.startswith("drain node-a")


def test_sigbus_line_alone_is_enough():
    diag = analyze_files(WORKLOAD, _bundle(_SIGBUS)).diagnosis
    assert (diag.status, diag.sub_domain, diag.responsible_nodes) == ("attributed", "host_kernel_error", ["node-a"])
    assert diag.root_cause.kind == "memory_failure"
    assert diag.root_cause.fields.get("pname") == "python" and diag.root_cause.fields.get("pid") == 31631


def test_corrected_errors_alone_are_not_a_cause():
    diag = analyze_files(WORKLOAD, _bundle("\n".join([_CE, _CE]))).diagnosis
    assert diag.sub_domain != "host_kernel_error", diag.summary
    assert diag.root_cause is None or diag.root_cause.kind != "edac_mc"
    assert all(c.sub_domain != "host_kernel_error" for c in diag.candidates or [])


def test_edac_severity_decides_the_role():
    catalog = load_catalog()
    ue = extract_one(catalog, _UE, "syslog")
    ce = extract_one(catalog, _CE, "syslog")
    assert (ue.kind, ue.fields["severity"], ue.fields["label"]) == ("edac_mc", "UE", "CPU_SrcID#0_MC#3_Chan#0_DIMM#0")
    assert (ce.kind, ce.fields["severity"]) == ("edac_mc", "CE")
    from rules.early import run_early
    tagged, _ = run_early(catalog, [ue, ce])
    roles = {ev.fields["severity"]: (ev.role, ev.strength) for ev in tagged}
    assert roles["UE"] == ("root", "strong") and roles["CE"][0] == "context"


_DATALOADER = ("3: RuntimeError: DataLoader worker (pid 31631) is killed by signal: Bus error. It is possible that "
               "dataloader's workers are out of shared memory. Please try to raise your shared memory limit.")


def _with_dataloader_bus_error(syslog_a: str) -> dict[str, str]:
    files = _bundle(syslog_a)
    files["logs/app/node-a.log"] = _STEPS_A + "\n" + _DATALOADER + "\n" + _AGENT_A + "\n"
    return files


def test_bus_error_after_a_memory_error_is_its_echo():
    # PyTorch blames /dev/shm for any SIGBUS; after the kernel's memory-failure kill on the same
    # host it is the memory error's echo (final.explain.memory_error_explains_bus_error).
    diag = analyze_files(WORKLOAD, _with_dataloader_bus_error(_SIGBUS)).diagnosis
    assert (diag.status, diag.sub_domain, diag.responsible_nodes) == ("attributed", "host_kernel_error", ["node-a"])
    assert any(e.rule_id == "final.explain.memory_error_explains_bus_error" and e.target == "shm_error"
               for e in diag.explains), diag.explains


def test_without_the_final_rule_the_bus_error_competes(tmp_path):
    # The rule is what decides it: with it switched off the same bundle is ambiguous.
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "host_memory.yaml").write_text("explains: []\n")
    diag = analyze_files(WORKLOAD, _with_dataloader_bus_error(_SIGBUS), rules=tmp_path).diagnosis
    assert diag.status == "ambiguous"
    assert {c.sub_domain for c in diag.candidates} == {"host_kernel_error", "shm_exhausted"}


def test_bus_error_on_another_host_is_not_explained():
    files = _bundle(_CE)
    files["logs/syslog/node-b.log"] += _SIGBUS.replace("node-a", "node-b") + "\n"
    files["logs/app/node-a.log"] = _STEPS_A + "\n" + _DATALOADER + "\n" + _AGENT_A + "\n"
    diag = analyze_files(WORKLOAD, files).diagnosis
    assert not any(e.rule_id == "final.explain.memory_error_explains_bus_error" for e in diag.explains)
