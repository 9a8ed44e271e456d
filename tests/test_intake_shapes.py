"""Bare = folder = bundle (issue 20 item 3): the same lines give the same status, sub_domain and
nodes as one file, in a folder of any layout, and under logs/app/ of a bundle.

bench/accuracy.py --shapes-must-agree checks it on every corpus case; these are the mechanisms.
"""
from __future__ import annotations

import json
from pathlib import Path

from firstfault.rules.engine import analyze_path
from firstfault.rules.intake import open_input, sniff

# Kernel lines a user pasted with the DataLoader's error (PyTorch's own sentence, verbatim).
SHM = ("[ 5012.774512] traps: pt_data_worker[30882] general protection fault ip:7f0c9a3b5a2e sp:7f0c2c9fd6c8 "
       "error:0 in libc-2.31.so[7f0c9a24d000+178000]\n"
       "[ 5012.774530] Code: Unable to access opcode bytes at RIP 0x7f0c9a3b5a04.\n"
       "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).\n")
# NVIDIA/nccl#1045 style: a host named by NCCL's prefix, no workload record naming it.
NCCL_NOROUTE = ("node5:240:240 [6] NCCL INFO Bootstrap : Using eth0:10.0.0.5<0>\n"
                "node5:240:240 [6] misc/socket.cc:533 NCCL WARN socketPollConnect: Connect to 10.0.0.4<56849> "
                "returned 113(No route to host) errno 115(Operation now in progress)\n")
MINIMAL = {"workload_id": "job-7", "state": "UNKNOWN", "start_time": "2000-01-01T00:00:00Z"}


def _three_shapes(tmp_path: Path, name: str, text: str, record: dict | None = None):
    bare = tmp_path / "bare" / name
    bare.parent.mkdir(parents=True)
    bare.write_text(text)
    folder = tmp_path / "folder"
    (folder / "from-node" / "2026-11-02").mkdir(parents=True)
    (folder / "from-node" / "2026-11-02" / (Path(name).stem + ".txt")).write_text(text)
    bundle = tmp_path / "bundle"
    (bundle / "logs" / "app").mkdir(parents=True)
    (bundle / "logs" / "app" / name).write_text(text)
    (bundle / "workload.json").write_text(json.dumps(record or MINIMAL))
    return [analyze_path(p).diagnosis for p in (bare, folder, bundle)]


def test_a_console_line_among_kernel_lines_is_read_as_under_logs_app(tmp_path):
    """Mostly dmesg lines, then the application's: a file sniffed "syslog" was read with the
    kernel's patterns only, and the shm error (an application line) was lost."""
    assert sniff(SHM.splitlines()) == "mixed"
    got = _three_shapes(tmp_path, "train.log", SHM)
    assert [(d.status, d.sub_domain, d.responsible_nodes) for d in got] == [("attributed", "shm_exhausted", [])] * 3


def test_kernel_logs_are_still_sniffed_as_kernel_logs():
    xid = "NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    # a shell prompt and an elision pasted with them are not application lines
    assert sniff(["root@node1:~# dmesg -T | grep NVRM", f"[Mon Feb 23 16:24:18 2025] {xid}", "[...]",
                  f"[Mon Feb 23 16:24:19 2025] {xid}"]) == "syslog"
    # dmesg -T as pasted with an unpadded day, and a kmsg forwarder (Talos)
    assert sniff([f"[Mon Feb 2 22:52:45 2026] {xid}"] * 3) == "syslog"
    assert sniff([f"192.168.11.119: kern:     err: [2026-04-22T21:25:20.466440686Z]: {xid}"] * 3) == "syslog"
    assert sniff([f"[74889.644138] {xid}", "Traceback (most recent call last):", f"[74889.644139] {xid}",
                  f"[74889.644140] {xid}"]) == "mixed"


def test_a_record_that_names_no_nodes_takes_them_from_the_lines_as_a_bare_file_does(tmp_path):
    got = _three_shapes(tmp_path, "out.log", NCCL_NOROUTE)
    assert [(d.sub_domain, d.responsible_nodes) for d in got] == [("network_error", ["node5"])] * 3
    bundle = tmp_path / "bundle"
    intake = open_input(bundle)
    wl = intake.bundle.workload
    # the record's own facts stay: its state, its start, no end read off the lines
    assert (wl.nodes, wl.state, wl.start_time.year, wl.end_time) == (["node5"], "UNKNOWN", 2000, None)
    assert intake.facts().get("window_given") is True        # the record's window, not one read off the lines
    assert "window_given" not in open_input(tmp_path / "bare" / "out.log").facts()
    notes = [m for m in got[2].missing_evidence if m.kind == "workload"]
    assert notes and notes[0].detail.startswith("workload.json names no nodes: ") and "node5 from NCCL line prefix" in notes[0].detail
    assert "time window" not in notes[0].detail
    # a record that names its nodes is the contract's bundle: read as it is, nothing inferred
    (bundle / "workload.json").write_text(json.dumps({**MINIMAL, "nodes": ["node-01"]}))
    intake = open_input(bundle)
    assert intake.bundle.workload.nodes == ["node-01"] and not intake.inferred


def test_the_inferred_window_reads_stamps_in_the_records_time_zone(tmp_path):
    """A partial record with a time zone: the window read off the lines must be the extraction's
    (both in that zone). Read in UTC it was 5 hours early, and the node's own kernel line fell
    outside it: dropped as another job's."""
    (tmp_path / "logs" / "syslog").mkdir(parents=True)
    (tmp_path / "logs" / "syslog" / "node1.log").write_text(
        "Nov  2 10:03:11 node1 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus.\n")
    (tmp_path / "workload.json").write_text(json.dumps({"workload_id": "job-7", "state": "FAILED",
                                                        "timezone": "America/New_York"}))
    wl = open_input(tmp_path).bundle.workload
    assert wl.start_time.hour == 15 and wl.start_time.minute == 3          # 10:03 in New York
    d = analyze_path(tmp_path).diagnosis
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_fell_off_bus", ["node1"])


# NBISweden/Earth-Biogenome-Project-pilot#81: Nextflow keeps each task's output in dot-named files
NEXTFLOW_OOM = ("slurmstepd: error: Detected 1959 oom_kill events in StepId=45226719.batch. Some of the step tasks "
                "have been OOM Killed.\n")


def test_a_task_folder_s_hidden_logs_are_read_and_the_rest_of_what_is_hidden_is_not(tmp_path):
    task = tmp_path / "work" / "3f" / "a1b2c3"
    (task / ".git").mkdir(parents=True)
    (task / ".command.log").write_text(NEXTFLOW_OOM)
    (task / ".command.sh").write_text("#!/bin/bash -ue\n" + NEXTFLOW_OOM)      # the task's script, not a log
    (task / ".git" / "run.log").write_text("RuntimeError: CUDA error: out of memory\n")   # inside a hidden folder
    (task / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    intake = open_input(task)
    assert sorted(f.path.rsplit("/", 1)[-1] for f in intake.bundle.files) == [".command.log"]
    d = analyze_path(task).diagnosis
    assert (d.status, d.sub_domain) == ("attributed", "host_oom")


def test_a_hidden_log_inside_a_bundle_s_layout_is_evidence(tmp_path):
    (tmp_path / "logs" / "app").mkdir(parents=True)
    (tmp_path / "workload.json").write_text(json.dumps({
        "workload_id": "slurm-45226719", "scheduler": "slurm", "state": "FAILED", "attempt": 0,
        "start_time": "2026-11-02T09:00:00Z", "end_time": "2026-11-02T10:00:00Z", "nodes": ["node-01"]}))
    (tmp_path / "logs" / "app" / ".command.log").write_text(NEXTFLOW_OOM)
    (tmp_path / "logs" / "app" / ".command.swp").write_text(NEXTFLOW_OOM)          # an editor's swap file
    d = analyze_path(tmp_path).diagnosis
    assert d.sub_domain == "host_oom"
    assert {r.path for s in d.evidence for r in s.events} - {"workload.json"} == {"logs/app/.command.log"}


# An archive is read as the folder it was made from: a bundle, a folder of logs in any layout, one log.
def test_an_archive_of_one_log_reads_as_the_log_and_takes_its_name(tmp_path):
    import tarfile
    log = tmp_path / "train.log"
    log.write_text("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`\n")
    with tarfile.open(tmp_path / "job-4711-logs.tar.gz", "w:gz") as tar:
        tar.add(log, arcname="train.log")
    d = analyze_path(tmp_path / "job-4711-logs.tar.gz").diagnosis
    assert (d.status, d.sub_domain) == ("attributed", "cuda_oom")
    assert d.workload_id == "job-4711-logs"


def test_a_zipped_bundle_is_the_bundle_even_beside_macos_resource_forks(tmp_path):
    import zipfile
    from conftest import SAMPLES
    sample = SAMPLES / "worked-example"
    with zipfile.ZipFile(tmp_path / "worked-example.zip", "w") as z:
        for p in sorted(sample.rglob("*")):
            if p.is_file():
                z.write(p, f"worked-example/{p.relative_to(sample).as_posix()}")
                rel = p.relative_to(sample)
                z.writestr(f"__MACOSX/worked-example/{rel.parent.as_posix()}/._{p.name}",
                           b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X")
    assert analyze_path(tmp_path / "worked-example.zip").diagnosis.to_json() == analyze_path(sample).diagnosis.to_json()


def test_an_archive_of_a_folder_of_logs_without_a_record_is_read_like_the_folder(tmp_path):
    import tarfile
    folder = tmp_path / "run-17"
    (folder / "node-a").mkdir(parents=True)
    (folder / "node-a" / "slurm.out").write_text(NEXTFLOW_OOM)
    with tarfile.open(tmp_path / "run-17.tgz", "w:gz") as tar:
        tar.add(folder, arcname="run-17")
    got, want = analyze_path(tmp_path / "run-17.tgz").diagnosis, analyze_path(folder).diagnosis
    assert (got.status, got.sub_domain, got.workload_id) == (want.status, want.sub_domain, want.workload_id)
    assert got.sub_domain == "host_oom"
