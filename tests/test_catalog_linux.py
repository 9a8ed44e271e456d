"""Linux kernel sites added from the kernel's source (issue 21): real-format kernel lines through
the real engine. Patterns: rules/catalog/extract/linux.yaml; roles: rules/catalog/early/linux.yaml;
the enumeration of sites: rules/emitters/linux.yaml (checked with the others in tests/test_docs.py)."""

import pytest

from firstfault.rules.engine import analyze_path

from conftest import diag

WD = ("{rank}: [rank{rank}]:[E1102 {t} ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective operation timeout: "
      "WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for {ran} milliseconds before timing out.")


def wd_file(ranks, t="10:13:12.044871", ran=600054):
    return "\n".join(WD.format(rank=r, t=t, ran=ran) for r in ranks) + "\n"


def kern(host, *lines):
    """Syslog lines of ``host``'s kernel, (hh:mm:ss, message) each."""
    return "".join(f"Nov  2 {t} {host} kernel: {msg}\n" for t, msg in lines)


def hang_with(syslog_node02):
    return diag({"logs/syslog/node-02.log": syslog_node02, "logs/app/node-01.log": wd_file(range(0, 8))})


# ------------------------------------------------------------------ OOM forms of older kernels

MEMCG_RHEL6 = (
    ("10:03:11", "[6710782.257588] Task in /LXC011175068174 killed as a result of limit of /LXC011175068174"),
    ("10:03:13", "[6710784.698347] Memory cgroup out of memory: Kill process 215701 (java) score 854 or sacrifice child"),
    ("10:03:13", "[6710784.707978] Killed process 215701, UID 679, (java) total-vm:11017300kB, anon-rss:7152432kB, file-rss:1232kB"),
)


def test_memcg_oom_of_an_old_kernel_is_a_host_oom():
    d = hang_with(kern("node-02", *MEMCG_RHEL6))
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "host_oom", ["node-02"])


@pytest.mark.parametrize("line", [MEMCG_RHEL6[0][1], MEMCG_RHEL6[1][1], MEMCG_RHEL6[2][1]])
def test_each_old_memcg_line_alone_names_the_oom(line):
    d = hang_with(kern("node-02", ("10:03:11", line)))
    assert (d.status, d.sub_domain) == ("attributed", "host_oom")


def test_bare_dmesg_of_a_docker_memcg_oom(tmp_path):
    # medium.com/dm03514-tech-blog (4.4 kernel): the kill line is in the modern "(comm)" form,
    # but the selection and "Task in" lines are what say it was the container's limit.
    p = tmp_path / "dmesg.txt"
    p.write_text(
        "[14808.063986] Task in /docker/34186d9bd07706222bd427bb647ceed81e8e108eb653ff73c7137099fca1cab6 killed as a result of limit of /docker/34186d9bd07706222bd427bb647ceed81e8e108eb653ff73c7137099fca1cab6\n"
        "[14808.063994] memory: usage 204800kB, limit 204800kB, failcnt 4563\n"
        "[14808.063995] memory+swap: usage 0kB, limit 9007199254740988kB, failcnt 0\n"
        "[14808.064125] Memory cgroup out of memory: Kill process 11344 (main) score 904 or sacrifice child\n"
        "[14808.083306] Killed process 11344 (main) total-vm:390360kB, anon-rss:183712kB, file-rss:1016kB\n")
    d = analyze_path(p).diagnosis
    assert (d.status, d.sub_domain) == ("attributed", "host_oom")


def test_panic_deadlocked_on_memory_is_an_oom_not_a_kernel_error():
    d = hang_with(kern("node-02",
                       ("10:03:11", "[ 2211.305814] Out of memory and no killable processes..."),
                       ("10:03:11", "[ 2211.305901] Kernel panic - not syncing: System is deadlocked on memory")))
    assert (d.status, d.sub_domain) == ("attributed", "host_oom")


# ------------------------------------------------------------------ PCIe containment

DPC = (("10:03:11", "[48210.551203] pcieport 0000:16:02.0: DPC: containment event, status:0x1f01 source:0x0000"),
       ("10:03:11", "[48210.551219] pcieport 0000:16:02.0: DPC: unmasked uncorrectable error detected"))


def test_dpc_containment_drains_its_host():
    d = hang_with(kern("node-02", *DPC))
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "pcie_error", ["node-02"])
    assert d.recovery.action == "drain_nodes"


def test_dpc_then_hca_pci_error_is_one_pcie_fault():
    d = hang_with(kern("node-02", *DPC, ("10:03:11",
        "[48210.560144] mlx5_core 0000:18:00.0: mlx5_pci_err_detected Device state = 1 health sensors: 1 pci_status: 1. Enter, pci channel state = 2")))
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "pcie_error", ["node-02"])


def test_slot_link_up_at_boot_is_not_a_fault():
    d = hang_with(kern("node-02", ("10:03:11", "[    4.410207] pcieport 0000:00:1c.0: pciehp: Slot(8): Link Up")))
    assert d.status == "unattributed" and d.responsible_nodes == []


# ------------------------------------------------------------------ stalls

def test_rcu_stall_alone_is_a_weak_kernel_error_never_drained():
    d = hang_with(kern("node-02", ("10:03:11", "[  553.456118] rcu: INFO: rcu_sched detected stalls on CPUs/tasks:")))
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "host_kernel_error", ["node-02"])
    assert d.recovery.action != "drain_nodes"


def test_nfs_outage_before_an_rcu_stall_is_the_cause():
    d = hang_with(kern("node-02",
                       ("10:02:40", "[  520.112233] nfs: server nfs01 not responding, still trying"),
                       ("10:03:11", "[  553.456118] rcu: INFO: rcu_sched detected stalls on CPUs/tasks:")))
    assert (d.status, d.sub_domain) == ("attributed", "storage_io_error")


# ------------------------------------------------------------------ user-space crashes: echo only

SEGV = "[812345.123456] pt_main_thread[3121877]: segfault at 8 ip 00007f9ac21b4f62 sp 00007f99c7ffe2a0 error 4 in libnccl.so.2[7f9ac1e00000+1a3c000]"


def test_segfault_alone_is_no_confident_answer_but_names_the_host():
    d = hang_with(kern("node-02", ("10:03:11", SEGV)))
    assert d.status == "unattributed"
    assert d.responsible_nodes == [] and "node-02" in d.suspect_nodes


def test_segfault_after_a_machine_check_is_the_machine_check():
    d = hang_with(kern("node-02",
                       ("10:03:10", "[812344.100001] mce: [Hardware Error]: Machine check events logged"),
                       ("10:03:10", "[812344.100002] EDAC MC0: 1 UE memory read error on CPU_SrcID#0_MC#0_Chan#1_DIMM#0 (channel:1 slot:0 page:0x849923 offset:0x380 grain:32 -  err_code:0101:0091 socket:0 imc:0 rank:0)"),
                       ("10:03:11", SEGV)))
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "host_kernel_error", ["node-02"])


# ------------------------------------------------------------------ RDMA / NIC / storage

def test_gid_add_failure_is_weak_ib_evidence():
    d = hang_with(kern("node-02", ("10:03:11",
        "[ 1203.448112] __ib_cache_gid_add: unable to add gid 0000:0000:0000:0000:0000:ffff:0a0a:0c07 error=-28")))
    assert (d.status, d.sub_domain) == ("attributed", "ib_link_error")
    assert d.recovery.action == "retry_excluding_nodes"


def test_nvme_completion_polled_is_not_a_fault():
    d = hang_with(kern("node-02", ("10:03:11", "[73311.902118] nvme nvme1: I/O 812 QID 17 timeout, completion polled")))
    assert d.status == "unattributed" and d.responsible_nodes == []


def test_nvme_timeout_then_io_error_is_storage():
    d = hang_with(kern("node-02",
                       ("10:03:05", "[73311.902118] nvme nvme1: I/O 812 QID 17 timeout, aborting"),
                       ("10:03:11", "[73342.011902] nvme nvme1: controller is down; will reset: CSTS=0xffffffff, PCI_STATUS=0xffff"),
                       ("10:03:11", "[73342.120001] Aborting journal on device nvme1n1p1-8.")))
    assert (d.status, d.sub_domain) == ("attributed", "storage_io_error")


# ------------------------------------------------------------------ a hung task inside a file system

# huggingface/m4-logs tr_141 (num_workers_0-try3/dmesg.txt): a task blocked in GPFS (mmfs26/mmfslinux frames)
GPFS_HUNG = """[Thu Mar  2 15:59:56 2023] INFO: task epilog.sh:76609 blocked for more than 120 seconds.
[Thu Mar  2 15:59:56 2023]       Tainted: P           OE    --------- -  - 4.18.0-372.36.1.el8_6.x86_64 #1
[Thu Mar  2 15:59:56 2023] "echo 0 > /proc/sys/kernel/hung_task_timeout_secs" disables this message.
[Thu Mar  2 15:59:56 2023] task:epilog.sh       state:D stack:    0 pid:76609 ppid: 76603 flags:0x00000080
[Thu Mar  2 15:59:56 2023] Call Trace:
[Thu Mar  2 15:59:56 2023]  __schedule+0x2d1/0x860
[Thu Mar  2 15:59:56 2023]  ? cxiUiomove+0x326/0x3c0 [mmfslinux]
[Thu Mar  2 15:59:56 2023]  schedule+0x35/0xa0
[Thu Mar  2 15:59:56 2023]  cxiWaitEventWait+0x208/0x330 [mmfslinux]
[Thu Mar  2 15:59:56 2023]  ? wake_up_q+0x70/0x70
[Thu Mar  2 15:59:56 2023]  _ZN6ThCond12internalWaitEP16KernelSynchStatejPv+0x58/0x250 [mmfs26]
"""


def test_a_task_hung_inside_gpfs_is_the_file_system_not_the_host_s_kernel(tmp_path):
    p = tmp_path / "dmesg.txt"
    p.write_text(GPFS_HUNG)
    d = analyze_path(p).diagnosis
    assert (d.status, d.sub_domain) == ("attributed", "storage_io_error")
    assert d.recovery.action != "drain_nodes"


def test_a_task_hung_elsewhere_stays_a_kernel_report(tmp_path):
    p = tmp_path / "dmesg.txt"
    p.write_text("".join(line for line in GPFS_HUNG.splitlines(keepends=True) if "[mmfs" not in line))
    d = analyze_path(p).diagnosis
    assert d.sub_domain == "host_kernel_error"


def test_the_same_task_reported_again_later_still_meets_its_frames(tmp_path):
    """khungtaskd repeats its report every two minutes: the events span first to last report, and the
    frames of the last one are the same fault as it (rules/order.py within)."""
    later = GPFS_HUNG.replace("Thu Mar  2 15:59:56 2023", "Thu Mar  2 16:59:58 2023")
    p = tmp_path / "dmesg.txt"
    p.write_text(GPFS_HUNG.split("[Thu Mar  2 15:59:56 2023] Call Trace:")[0] + later)
    d = analyze_path(p).diagnosis
    assert (d.status, d.sub_domain) == ("attributed", "storage_io_error")


# triton-inference-server/server#3738: a soft lockup that reached the user's terminal as a wall message
# (rsyslog's RSYSLOG_WallFmt: a header naming the host, then " <tag><message>"), pasted bare.
WALL = """Message from syslogd@goku1 Dec 26 10:26:29 ...
 kernel:[ 3151.617450] watchdog: BUG: soft lockup - CPU#81 stuck for 23s! [tritonserver:73305]
"""


def test_a_wall_message_s_header_names_the_host_of_its_kernel_line(tmp_path):
    (tmp_path / "console.txt").write_text(WALL)
    d = analyze_path(tmp_path / "console.txt").diagnosis
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "host_kernel_error", ["goku1"])


def test_without_its_header_the_kernel_line_names_no_host(tmp_path):
    (tmp_path / "console.txt").write_text(WALL.splitlines()[1] + "\n")
    d = analyze_path(tmp_path / "console.txt").diagnosis
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "host_kernel_error", [])
