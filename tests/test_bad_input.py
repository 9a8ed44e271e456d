"""Bad input gets a clear error or a diagnosis, never a traceback."""
import io
import json
import subprocess
import sys
import tarfile
import zipfile

import pytest

from conftest import BASE_WORKLOAD


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


def _archive(kind, members):
    buf = io.BytesIO()
    if kind == "zip":
        with zipfile.ZipFile(buf, "w") as zf:
            for name, data in members.items():
                zf.writestr(name, data)
    else:
        with tarfile.open(fileobj=buf, mode="w:gz") as tf:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


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
