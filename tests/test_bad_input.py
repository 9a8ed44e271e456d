"""Bad input gets a clear error or a diagnosis, never a traceback."""
import io
import json
import subprocess
import sys
import tarfile
import zipfile

import pytest

from conftest import BASE_WORKLOAD
from archives import archive as _archive


def run(*args):
    return subprocess.run([sys.executable, "-m", "firstfault", *map(str, args)], capture_output=True, text=True)


def test_folder_without_workload_json_or_logs_exits_2_with_one_line(tmp_path):
    # Without workload.json a folder is read as a folder of logs (contract section 4): with none, exit 2.
    (tmp_path / "logs").mkdir()
    r = run("analyze", tmp_path)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "no log file to read" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("content, says", [
    ("{not json", "not valid JSON"),
    (json.dumps({**BASE_WORKLOAD, "start_time": "soon"}), "field 'start_time'"),
    (json.dumps([1, 2]), "JSON object"),
])
def test_invalid_workload_json_exits_2(tmp_path, content, says):
    (tmp_path / "workload.json").write_text(content)
    r = run("analyze", tmp_path)
    assert r.returncode == 2 and says in r.stderr and r.stderr.count("\n") == 1


def test_no_such_path_exits_2(tmp_path):
    r = run("analyze", tmp_path / "nope")
    assert r.returncode == 2 and "no such file or folder" in r.stderr


@pytest.mark.parametrize("files", [
    {"logs/app/node-01.log": bytes(range(256)) * 400},                                   # binary garbage
    {"logs/app/node-01.log": b"x" * (10 * 1024 * 1024) + b"\n"},                          # a 10 MB line
    {"logs/syslog/node-02.log": b"Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:1b:00): \xff\xfe 79\n"},
    {},                                                                                   # empty logs folder
], ids=["binary", "10MB-line", "invalid-utf8", "empty"])
def test_hostile_files_still_give_a_diagnosis(make_bundle, files):
    root = make_bundle(BASE_WORKLOAD, files)
    (root / "logs").mkdir(exist_ok=True)
    r = run("analyze", root, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["status"] == "unattributed" and d["domain"] == "unknown"
    assert "Traceback" not in r.stderr


def test_damaged_relevant_line_is_kept_as_unparsed_evidence(make_bundle):
    root = make_bundle(BASE_WORKLOAD, {"logs/syslog/node-02.log":
                                       b"Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:1b:00): \xff\xfe\n"})
    d = json.loads(run("analyze", root, "--json").stdout)
    step = next(s for s in d["evidence"] if s["rule_id"] == "final.unparsed")
    assert step["events"] == [{"path": "logs/syslog/node-02.log", "line": 1}]





@pytest.mark.parametrize("kind, suffix", [("zip", ".zip"), ("tar", ".tar.gz")])
def test_archives_under_one_top_folder_work(tmp_path, kind, suffix):
    members = {"job/workload.json": json.dumps(BASE_WORKLOAD).encode(),
               "job/logs/app/node-01.log": b"0: hello\n"}
    path = tmp_path / f"bundle{suffix}"
    path.write_bytes(_archive(kind, members))
    r = run("analyze", path, "--json")
    assert r.returncode == 0, r.stderr and json.loads(r.stdout)["workload_id"] == "slurm-100"


@pytest.mark.parametrize("kind, suffix", [("zip", ".zip"), ("tar", ".tar.gz")])
def test_archive_with_unsafe_member_is_refused(tmp_path, kind, suffix):
    members = {"workload.json": json.dumps(BASE_WORKLOAD).encode(), "../evil.log": b"x"}
    path = tmp_path / f"bundle{suffix}"
    path.write_bytes(_archive(kind, members))
    r = run("analyze", path)
    assert r.returncode == 2 and "unsafe path" in r.stderr


# ---------------------------------------------------------------- issue 10, finding 6: overflow and depth

WL = json.dumps(BASE_WORKLOAD)
XID = b"kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid=1, GPU has fallen off the bus.\n"


@pytest.mark.parametrize("content, says", [
    (WL[:-1] + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}", "field 'deep': nested deeper than 64 levels"),
    (WL[:-1] + ', "attempt": ' + "9" * 5000 + "}", "field 'attempt': an integer of 5000 digits"),
    (WL[:-1] + ', "note": ' + "9" * 5000 + "}", "field 'note': an integer of 5000 digits"),
    (json.dumps({**BASE_WORKLOAD, "attempt": 2 ** 70}), "field 'attempt'"),
    (json.dumps({**BASE_WORKLOAD, "time_limit_s": 10 ** 30}), "field 'time_limit_s'"),
    (json.dumps({**BASE_WORKLOAD, "boot_times": {"node-01": "9999-12-31T23:59:59Z"}}), "field 'boot_times.node-01'"),
    (json.dumps({**BASE_WORKLOAD, "start_time": 10 ** 30}), "field 'start_time'"),
    (json.dumps({**BASE_WORKLOAD, "nodes": [f"n{i}" for i in range(2000)], "gpus_per_node": 1024}),
     "nodes x gpus_per_node is 2048000"),
], ids=["nested-100k", "5000-digit-attempt", "5000-digit-extra", "attempt-2^70", "time-limit-1e30", "boot-9999",
        "epoch-1e30", "ranks-2M"])
def test_overflowing_or_deep_workload_json_exits_2_naming_the_field(tmp_path, content, says):
    (tmp_path / "workload.json").write_text(content)
    (tmp_path / "logs" / "app").mkdir(parents=True)
    (tmp_path / "logs" / "app" / "node-01.log").write_text("0: hello\n")
    r = run("analyze", tmp_path)
    assert r.returncode == 2 and says in r.stderr and r.stderr.count("\n") == 1, r.stderr


@pytest.mark.parametrize("files", [
    {"logs/syslog/node-02.log": b"9999-12-31T23:59:59-05:00 node-02 " + XID},
    {"logs/syslog/node-02.log": b"0001-01-01T00:00:00+05:00 node-02 " + XID},
    {"logs/syslog/node-01.log": b"[99999999999999999.000000] NVRM: Xid (PCI:0000:1b:00): 79, pid=1, GPU has fallen "
                                b"off the bus.\n"},
], ids=["iso-9999", "iso-0001", "uptime-1e17"])
def test_a_line_whose_stamp_overflows_is_read_unstamped(make_bundle, files):
    root = make_bundle({**BASE_WORKLOAD, "boot_times": {"node-01": "2026-11-02T09:00:00Z"}}, files)
    r = run("analyze", root, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["domain"] == "gpu" and d["root_cause"]["timestamp"] is None


def test_a_bare_log_whose_stamps_overflow_still_gives_a_diagnosis(tmp_path):
    log = tmp_path / "dmesg.log"
    log.write_bytes(b"9999-12-31T23:59:59-05:00 node-02 " + XID)
    r = run("analyze", log, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["domain"] == "gpu", r.stderr


def _deep(root, levels: int, under: tuple[str, ...] = ()) -> None:
    """A file ``levels`` folders down, made with dir fds (paths past PATH_MAX need them)."""
    import os

    fd = os.open(root, os.O_RDONLY)
    for part in (*under, *["a"] * levels):
        os.mkdir(part, dir_fd=fd)
        nfd = os.open(part, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    out = os.open("x.log", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(out, b"0: hello\n")
    os.close(out)
    os.close(fd)


@pytest.fixture
def deep_root(tmp_path):
    """A folder for a deep tree, removed by rm(1): pytest's own clean-up (shutil.rmtree) recurses
    once a level and would fail on it in a later session, for everyone sharing the temp root."""
    root = tmp_path / "deep"
    root.mkdir()
    yield root
    subprocess.run(["rm", "-rf", "--", str(root)], check=True)


@pytest.mark.parametrize("with_workload, levels", [(True, 1000), (False, 1000), (True, 3000)])
def test_folders_1000_deep_exit_2_naming_the_place(deep_root, with_workload, levels):
    if with_workload:
        (deep_root / "workload.json").write_text(WL)
    _deep(deep_root, levels, ("logs", "app") if with_workload else ())
    r = run("analyze", deep_root)
    assert r.returncode == 2 and "folders nested deeper than 64 levels" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1


def test_folders_a_few_levels_deep_still_work(tmp_path):
    (tmp_path / "workload.json").write_text(WL)
    _deep(tmp_path, 20, ("logs", "app"))
    r = run("analyze", tmp_path, "--json")
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------- issue 10, finding 7: archive expansion

def _bomb(path, kind: str, size: int, name: str = "logs/app/node-01.log") -> None:
    """An archive whose one log expands to ``size`` bytes of short lines, written in pieces."""
    piece = b"0: hello\n" * (1024 * 1024 // 9)
    if kind == "zip":
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
            zf.writestr("workload.json", WL)
            with zf.open(zipfile.ZipInfo(name), "w", force_zip64=True) as out:
                for _ in range(size // len(piece)):
                    out.write(piece)
        return

    class Lines(io.RawIOBase):
        left = size // len(piece) * len(piece)

        def readable(self):
            return True

        def readinto(self, b):
            k = min(len(b), self.left, len(piece))
            b[:k] = piece[:k]
            self.left -= k
            return k

    with tarfile.open(path, "w:gz", compresslevel=1) as tf:
        info = tarfile.TarInfo("workload.json")
        info.size = len(WL)
        tf.addfile(info, io.BytesIO(WL.encode()))
        info = tarfile.TarInfo(name)
        info.size = Lines.left
        tf.addfile(info, io.BufferedReader(Lines(), 1 << 20))


@pytest.mark.parametrize("kind, suffix", [("tar", ".tar.gz"), ("zip", ".zip")])
def test_archive_expansion_past_the_cap_exits_2_naming_it(tmp_path, kind, suffix, monkeypatch):
    path = tmp_path / f"bomb{suffix}"
    _bomb(path, kind, 8 * 1024 * 1024)
    r = run("analyze", path, "--max-archive-bytes", "4M")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "beyond the size limit of 4194304 bytes" in r.stderr and "--max-archive-bytes" in r.stderr
    assert "FIRSTFAULT_MAX_ARCHIVE_BYTES" in r.stderr
    monkeypatch.setenv("FIRSTFAULT_MAX_ARCHIVE_BYTES", "4M")
    assert run("analyze", path).returncode == 2
    assert run("analyze", path, "--max-archive-bytes", "16M").returncode == 0      # the flag wins
    monkeypatch.setenv("FIRSTFAULT_MAX_ARCHIVE_BYTES", "lots")
    r = run("analyze", path)
    assert r.returncode == 2 and "FIRSTFAULT_MAX_ARCHIVE_BYTES: 'lots' is not a size" in r.stderr


def test_the_default_archive_cap_is_the_services(tmp_path):
    from firstfault.connectors.api.settings import ServiceSettings
    from firstfault.rules.bundle import archive_cap_from_env

    assert archive_cap_from_env({}) == ServiceSettings().max_archive_bytes == 1024 ** 3


@pytest.mark.parametrize("kind, suffix", [("tar", ".tar.gz"), ("zip", ".zip")])
def test_archive_members_are_not_held_whole_in_memory(tmp_path, kind, suffix):
    # A 192 MiB log in the archive: the old reader held it (and the archive) in memory.
    path = tmp_path / f"big{suffix}"
    size = 192 * 1024 * 1024
    _bomb(path, kind, size)
    # Python's own allocations (tracemalloc), not RSS: the peak RSS of the same run moved
    # between 87 and 265 MiB with the machine's load (allocator arenas), this does not.
    probe = ("import sys, tracemalloc\nfrom firstfault.cli import main\ntracemalloc.start()\n"
             f"rc = main(['analyze', {str(path)!r}, '--json'])\n"
             "print(tracemalloc.get_traced_memory()[1] >> 20, file=sys.stderr)\n"
             "sys.exit(rc)\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    peak_mib = int(r.stderr.strip().splitlines()[-1])
    assert peak_mib < 96, f"peak of {peak_mib} MiB allocated for a {size >> 20} MiB member"


@pytest.mark.parametrize("files", [
    {"metrics/node-01.jsonl": b"[" * 100_000 + b"]" * 100_000 + b"\n"},                       # RecursionError before
    {"logs/fabricmanager/node-01.log": b"[Dec 31 99999 23:59:59] [ERROR] [tid 1] NVSwitch fatal\n"},
    {"logs/app/rank0.log": b"[rank99999999999999999999999]:[E ProcessGroupNCCL.cpp:563] [Rank 0] Watchdog caught "
                           b"collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, Timeout(ms)=600000) "
                           b"ran for 100000000000000 milliseconds before timing out.\n"},
], ids=["metrics-nested-100k", "fm-year-99999", "rank-and-ran-for-overflow"])
def test_overflowing_lines_in_other_sources_give_a_diagnosis(make_bundle, files):
    root = make_bundle(BASE_WORKLOAD, files)
    r = run("analyze", root, "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert json.loads(r.stdout)["workload_id"] == BASE_WORKLOAD["workload_id"]


@pytest.mark.parametrize("content", ["", "   \n\t\n  \n", "\n" * 5000, " " * 300_000])
def test_a_blank_file_is_empty_not_a_diagnosis(tmp_path, content):
    f = tmp_path / "train.log"
    f.write_text(content)
    r = run("analyze", f)
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert r.stderr.count("\n") == 1 and "train.log: empty" in r.stderr, r.stderr
    assert "bundle" not in r.stderr                  # a bare file is not called a bundle


def test_a_file_blank_at_the_top_with_lines_further_down_is_read(tmp_path):
    f = tmp_path / "train.log"
    f.write_text("\n" * 300_000 + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB\n")
    r = run("analyze", f, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["sub_domain"] == "cuda_oom"


def test_an_archive_that_is_not_one_is_one_line_naming_what_is_wrong(tmp_path):
    import gzip

    bad = tmp_path / "job.tar.gz"
    bad.write_bytes(gzip.compress(b'{"workload_id": "cut short'))          # gzip, but no tar inside
    r = run("analyze", bad)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    # tarfile's reason per compression it tried (five lines) is the one the name says: gzip's.
    assert "job.tar.gz: not a readable tar archive (truncated header)" in r.stderr, r.stderr


# ---------------------------------------------------------------- issue 22, item 7: which workload.json

def _two_records(kind: str, path, first: dict, second: dict, names=("workload.json", "workload.json")) -> None:
    import warnings

    buf = io.BytesIO()
    if kind == "zip":
        with warnings.catch_warnings(), zipfile.ZipFile(buf, "w") as zf:
            warnings.simplefilter("ignore")                   # zipfile warns of the duplicate name, and writes it
            zf.writestr(names[0], json.dumps(first))
            zf.writestr(names[1], json.dumps(second))
            zf.writestr("logs/app/node-01.log", "0: hello\n")
    else:
        with tarfile.open(fileobj=buf, mode="w:gz") as tf:
            for name, data in ((names[0], json.dumps(first).encode()), (names[1], json.dumps(second).encode()),
                               ("logs/app/node-01.log", b"0: hello\n")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())


@pytest.mark.parametrize("kind, suffix", [("zip", ".zip"), ("tar", ".tar.gz")])
@pytest.mark.parametrize("names", [("workload.json", "workload.json"), ("workload.json", "./workload.json")],
                         ids=["same", "dot-slash"])
def test_an_archive_with_two_workload_records_is_refused_not_second_wins(tmp_path, kind, suffix, names):
    path = tmp_path / f"bundle{suffix}"
    _two_records(kind, path, BASE_WORKLOAD, {**BASE_WORKLOAD, "workload_id": "the-second-one"}, names)
    r = run("analyze", path, "--json")
    assert r.returncode == 2, r.stdout[:300]
    assert "'workload.json' appears twice" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_workload_json_linked_to_a_file_outside_the_bundle_is_refused(tmp_path):
    outside = tmp_path / "elsewhere" / "secret.json"
    outside.parent.mkdir()
    outside.write_text(json.dumps({**BASE_WORKLOAD, "workload_id": "read-from-outside"}))
    root = tmp_path / "bundle"
    (root / "logs" / "app").mkdir(parents=True)
    (root / "logs" / "app" / "node-01.log").write_text("0: hello\n")
    (root / "workload.json").symlink_to(outside)
    r = run("analyze", root, "--json")
    assert r.returncode == 2 and "outside the bundle" in r.stderr and r.stderr.count("\n") == 1, (r.stdout, r.stderr)
    assert "read-from-outside" not in r.stdout
    # A link within the bundle is the bundle's own record.
    (root / "records").mkdir()
    (root / "records" / "w.json").write_text(json.dumps(BASE_WORKLOAD))
    (root / "workload.json").unlink()
    (root / "workload.json").symlink_to("records/w.json")
    r = run("analyze", root, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["workload_id"] == BASE_WORKLOAD["workload_id"]


def test_a_partial_workload_json_linked_outside_is_not_read_either(tmp_path):
    outside = tmp_path / "partial.json"
    outside.write_text(json.dumps({"workload_id": "read-from-outside"}))      # partial: keys kept, rest inferred
    root = tmp_path / "logs-folder"
    root.mkdir()
    (root / "node-01.log").write_text("Nov  2 10:03:11 node-01 kernel: hello\n")
    (root / "workload.json").symlink_to(outside)
    r = run("analyze", root, "--json")
    assert "read-from-outside" not in r.stdout
    assert r.returncode == 2 and "outside the bundle" in r.stderr, (r.stdout[:300], r.stderr)
