"""The year of a stamp that carries none (issue 20 item 4).

Syslog ``Nov  2 10:03:11`` and glog ``E1203 00:00:07.812004`` stamps have no year. It comes from
full dates in the same file, then in the input's other files, then workload.json's start_time,
then the file's modification time (a guess the diagnosis names under missing_evidence), never
from a fixed date. Stamps that carry their year (ISO, ``dmesg -T``) and dmesg uptime are not
touched by any of it.
"""
from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

from firstfault.render import summary
from firstfault.rules.engine import analyze_path
from firstfault.rules.intake import open_input

# A Hydra-logged training job on Slurm that reached its time limit at midnight: full stamps
# (Python logging through Hydra), slurmstepd's banner with its own date, then PyTorch's C++
# watchdog lines, whose glog stamps have no year.
SLURM_TIME_LIMIT = """\
[2026-12-02 22:00:04,118][__main__][INFO] - Starting training: 4 nodes x 8 GPUs, world size 32
[2026-12-02 22:00:09,402][lightning.fabric.utilities.distributed][INFO] - Initializing distributed: GLOBAL_RANK: 5, MEMBER: 6/32
[2026-12-02 22:01:13,774][__main__][INFO] - Restored checkpoint step 48000 from /lustre/ckpt/run-17/step-48000
[2026-12-02 23:59:58,771][__main__][INFO] - step 51210 loss 1.873 lr 2.4e-05 tokens/s 41234
slurmstepd: error: *** JOB 918273 ON gpu-a-003 CANCELLED AT 2026-12-03T00:00:07 DUE TO TIME LIMIT ***
[rank5]:[E1203 00:00:07.812004 ProcessGroupNCCL.cpp:1834] [PG ID 0 PG GUID 0(default_pg) Rank 5] Process group watchdog thread terminated with exception: NCCL error: remote process exited or there was a network error, NCCL version 2.21.5
[rank5]:[E1203 00:00:07.812004 ProcessGroupNCCL.cpp:1834] ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.
[rank2]:[E1203 00:00:07.913220 ProcessGroupNCCL.cpp:1834] [PG ID 0 PG GUID 0(default_pg) Rank 2] Process group watchdog thread terminated with exception: NCCL error: remote process exited or there was a network error, NCCL version 2.21.5
srun: Job step aborted: Waiting up to 32 seconds for job step to finish.
slurmstepd: error: *** STEP 918273.0 ON gpu-a-003 CANCELLED AT 2026-12-03T00:00:07 DUE TO TIME LIMIT ***
"""
# NVIDIA/open-gpu-kernel-modules: a GPU falls off the bus (syslog, no year in the stamp).
XID79_SYSLOG = ("Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', "
                "name=<unknown>, GPU has fallen off the bus.\n")
XID79_MSG = "NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def _at(path: Path, text: str, mtime: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mtime is not None:
        ts = datetime.fromisoformat(mtime).replace(tzinfo=timezone.utc).timestamp()
        os.utime(path, (ts, ts))
    return path


def _workload_notes(d) -> str:
    return " | ".join(m.detail for m in d.missing_evidence if m.kind == "workload")


def test_glog_stamps_take_the_year_of_the_files_full_stamps(tmp_path):
    """The bare Slurm output: its glog lines are on 2026-12-03 like the banner, so the time limit
    explains them (it was `unattributed` when they were given 2023)."""
    # The file's modification time says another year: the file's own dates win over it.
    p = _at(tmp_path / "slurm-918273.out", SLURM_TIME_LIMIT, mtime="2019-06-01T00:00:00")
    d = analyze_path(p).diagnosis
    assert (d.status, d.sub_domain) == ("attributed", "walltime_exceeded")
    assert d.root_cause.timestamp == "2026-12-03T00:00:07.000000Z"
    watchdog = [s for s in d.symptoms if s.kind == "watchdog_exception"]
    assert watchdog and watchdog[0].first.startswith("2026-12-03T00:00:07.812004") and watchdog[0].explained
    assert "modification time" not in _workload_notes(d)
    # The inferred window is the file's: it starts with its first stamped line.
    assert open_input(p).bundle.workload.start_time == datetime(2026, 12, 2, 22, 0, 4, 118000, tzinfo=timezone.utc)


def test_a_glog_stamp_after_new_year_takes_the_next_year(tmp_path):
    text = ("[2026-12-31 23:59:58,000][__main__][INFO] - step 51210 loss 1.873\n"
            "slurmstepd: error: *** JOB 918273 ON gpu-a-003 CANCELLED AT 2027-01-01T00:00:03 DUE TO TIME LIMIT ***\n"
            "[rank5]:[E101 00:00:03.812004 ProcessGroupNCCL.cpp:1834] [PG ID 0 PG GUID 0(default_pg) Rank 5] Process group "
            "watchdog thread terminated with exception: NCCL error: remote process exited or there was a network error, "
            "NCCL version 2.21.5\n")
    d = analyze_path(_at(tmp_path / "slurm-918273.out", text, mtime="2019-06-01T00:00:00")).diagnosis
    assert (d.status, d.sub_domain) == ("attributed", "walltime_exceeded")
    watchdog = [s for s in d.symptoms if s.kind == "watchdog_exception"]
    assert watchdog and watchdog[0].first.startswith("2027-01-01T00:00:03")


def test_a_bare_syslog_alone_takes_its_year_from_its_modification_time_and_says_so(tmp_path):
    p = _at(tmp_path / "syslog", XID79_SYSLOG, mtime="2026-11-20T08:00:00")
    d = analyze_path(p).diagnosis
    assert (d.status, d.sub_domain) == ("attributed", "gpu_fell_off_bus")
    assert d.root_cause.timestamp == "2026-11-02T10:03:11.000000Z"
    notes = _workload_notes(d)
    assert "2026, guessed from the file's modification time (2026-11-20)" in notes and "syslog" in notes
    text = summary(d)
    assert "2026-11-02 10:03:11" in text and "modification time (2026-11-20)" in text
    assert "2023-" not in text and "2024-" not in text


def test_the_modification_time_bounds_the_year_from_above(tmp_path):
    """A log is written before its modification time: 'Dec 30' in a file last written in July 2026
    is December 2025, not the nearer December 2026 that had not come yet."""
    p = _at(tmp_path / "kern.log", XID79_SYSLOG.replace("Nov  2", "Dec 30"), mtime="2026-07-20T08:00:00")
    d = analyze_path(p).diagnosis
    assert d.root_cause.timestamp == "2025-12-30T10:03:11.000000Z"
    assert "2025, guessed from the file's modification time (2026-07-20)" in _workload_notes(d)


def test_no_usable_modification_time_guesses_from_today_and_says_so(tmp_path):
    p = _at(tmp_path / "kern.log", XID79_SYSLOG)
    os.utime(p, (0, 0))                       # an archive member without a time reads as 1970
    d = analyze_path(p).diagnosis
    year = int(d.root_cause.timestamp[:4])
    now = datetime.now(timezone.utc)
    assert year in (now.year - 1, now.year) and datetime.fromisoformat(d.root_cause.timestamp[:19]) <= now.replace(tzinfo=None)
    assert "guessed from the day of the analysis" in _workload_notes(d)


def test_year_from_another_file_of_the_input_whatever_the_names(tmp_path):
    """A dmesg without years beside an application log with full dates: the dates' year, not the
    modification time's, and no guess to name. The files' names and order do not matter."""
    app = "[2026-11-02 10:01:00,123][__main__][INFO] - step 100 loss 2.1\n"
    for first, second in (("a-kern.log", "z-train.log"), ("z-kern.log", "a-train.log")):
        root = tmp_path / first
        _at(root / "node" / first, XID79_SYSLOG, mtime="2019-06-01T00:00:00")
        _at(root / second, app, mtime="2019-06-01T00:00:00")
        d = analyze_path(root).diagnosis
        assert d.root_cause.timestamp == "2026-11-02T10:03:11.000000Z", (first, second)
        assert "modification time" not in _workload_notes(d)


def test_year_from_workload_json_before_the_modification_time(tmp_path):
    _at(tmp_path / "kern.log", XID79_SYSLOG, mtime="2019-06-01T00:00:00")
    (tmp_path / "workload.json").write_text(json.dumps({"workload_id": "job-7", "start_time": "2025-11-02T09:58:00Z"}))
    d = analyze_path(tmp_path).diagnosis               # a partial record: state is inferred
    assert d.root_cause.timestamp == "2025-11-02T10:03:11.000000Z"
    assert "modification time" not in _workload_notes(d)


def test_a_record_that_names_no_node_yields_to_the_files_full_dates(tmp_path):
    """Contract section 2's order holds in a bundle too: a record naming no node (its nodes come
    from the lines) whose start_time is far from them does not date a file's year-less stamps that
    another file's full dates place (ho7-host-shm-enospc-nccl-dp16-vllm-decode-llmd-352, refolded)."""
    app = "[2026-11-02 10:01:00,123][__main__][INFO] - step 100 loss 2.1\n"
    _at(tmp_path / "logs" / "app" / "train.log", app)
    _at(tmp_path / "logs" / "syslog" / "node-02.log", XID79_SYSLOG)
    (tmp_path / "workload.json").write_text(json.dumps(
        {"workload_id": "job-7", "state": "UNKNOWN", "start_time": "2000-01-01T00:00:00Z"}))
    d = analyze_path(tmp_path).diagnosis
    assert (d.sub_domain, d.root_cause.timestamp) == ("gpu_fell_off_bus", "2026-11-02T10:03:11.000000Z")


def test_the_year_anchors_a_shipped_input_carries_are_the_stream_s_too(tmp_path):
    """``ship`` puts the intake's year anchors on the record (engine.intake_extra), and an extractor
    built from that record alone (the stream's) reads the file's stamps in the same year."""
    from firstfault.rules.engine import intake_extra
    from firstfault.rules.extract import Extractor
    from firstfault.rules.prefixes import read_head
    from firstfault.schemas import WorkloadRecord
    _at(tmp_path / "logs" / "app" / "train.log", "[2026-11-02 10:01:00,123][__main__][INFO] - step 100 loss 2.1\n")
    _at(tmp_path / "logs" / "syslog" / "node-02.log", XID79_SYSLOG)
    (tmp_path / "workload.json").write_text(json.dumps(
        {"workload_id": "job-7", "state": "UNKNOWN", "start_time": "2000-01-01T00:00:00Z"}))
    intake = open_input(tmp_path)
    assert set(intake.year_anchors) == {"logs/syslog/node-02.log"}
    wl = intake.bundle.workload
    shipped = WorkloadRecord.model_validate({**wl.model_dump(), **(wl.model_extra or {}), **intake_extra(intake)})
    ex = Extractor(__import__("firstfault.rules.engine", fromlist=["load_catalog"]).load_catalog(), shipped)
    stamp = read_head(XID79_SYSLOG.rstrip("\n"), ex.context("node-02", "logs/syslog/node-02.log")).stamp
    assert stamp.isoformat() == "2026-11-02T10:03:11+00:00"
    assert read_head(XID79_SYSLOG.rstrip("\n"), ex.context("node-02")).stamp.year != 2026     # the record's year


def test_dmesg_uptime_iso_and_ctime_stamps_are_unaffected(tmp_path):
    """Stamps with their own year keep it, whatever the modification time; uptime stays order only."""
    cases = {
        "journal.log": (f"2026-11-02T10:03:11.123456+00:00 node-02 kernel: {XID79_MSG}\n", "2026-11-02T10:03:11.123456Z"),
        "dmesg-T.txt": (f"[Mon Nov  2 10:03:11 2026] {XID79_MSG}\n", "2026-11-02T10:03:11.000000Z"),
        "dmesg.txt": (f"[74889.644138] {XID79_MSG}\n", None),
    }
    for name, (text, want) in cases.items():
        p = _at(tmp_path / name, text, mtime="2019-06-01T00:00:00")
        d = analyze_path(p).diagnosis
        assert d.sub_domain == "gpu_fell_off_bus", name
        assert d.root_cause.timestamp == want, name
        assert "guessed" not in _workload_notes(d), name


def test_lines_without_any_date_give_the_same_diagnosis_whatever_the_mtime(tmp_path):
    text = 'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\nKeyError: \'attention_mask\'\n'
    ids = []
    for i, when in enumerate((1_600_000_000, 1_780_000_000)):
        f = tmp_path / f"{i}" / "train.log"
        f.parent.mkdir()
        f.write_text(text)
        os.utime(f, (when, when))
        ids.append(analyze_path(f).diagnosis.diagnosis_id)
    assert ids[0] == ids[1]
