"""Gzipped logs (logrotate's kern.log.2.gz, nvidia-bug-report.sh's nvidia-bug-report.log.gz) are read
as they expand, in a bundle folder, in a bundle archive, in a folder of logs and alone."""
import gzip
import io
import shutil
import subprocess
import sys
import tarfile

import pytest

from firstfault.rules.bundle import ArchiveLimitError, compressed_log, gunzipped, gzip_size, log_name, open_bundle
from firstfault.rules.engine import analyze_path
from firstfault.rules.intake import open_input

from conftest import SAMPLES

WORKED = SAMPLES / "worked-example"
TEXT = b"".join(b"Nov  2 10:%02d:00 node-02 kernel: line %d of a rotated log\n" % (i % 60, i) for i in range(5000))


def _pieces(data: bytes, size: int):
    return lambda: iter([data[i:i + size] for i in range(0, len(data), size)])


def _read(data: bytes, size: int = 7, cap: int = 1 << 30) -> bytes:
    return b"".join(gunzipped(_pieces(data, size), "x.log.gz", cap)())


def _gzipped_copy(src, dst):
    shutil.copytree(src, dst)
    for p in sorted((dst / "logs").rglob("*.log")):
        p.with_name(p.name + ".gz").write_bytes(gzip.compress(p.read_bytes()))
        p.unlink()
    return dst


def test_which_names_are_gzipped_logs():
    assert compressed_log("logs/syslog/node-02.log.gz") and compressed_log("nvidia-bug-report.log.GZ")
    assert not compressed_log("job.tar.gz") and not compressed_log("job.tgz") and not compressed_log("a.log")
    assert log_name("logs/app/rank-3.log.gz") == "logs/app/rank-3.log" and log_name("a.tar.gz") == "a.tar.gz"


def test_every_member_is_read_whatever_the_pieces():
    data = gzip.compress(TEXT[:1000]) + gzip.compress(TEXT[1000:])      # `cat a.gz b.gz` is one gzip file
    for size in (1, 7, 4096, len(data)):
        assert _read(data, size) == TEXT


def test_a_member_bigger_than_a_piece_comes_whole():
    big = TEXT * 45                                 # about 9 MiB: more than one CHUNK of output per input piece
    data = gzip.compress(big, 1) + gzip.compress(TEXT, 1)
    got = list(gunzipped(_pieces(data, 1 << 20), "x.log.gz", 1 << 30)())
    assert b"".join(got) == big + TEXT and max(map(len, got)) <= 8 * 1024 * 1024
    small = list(gunzipped(_pieces(data, 1 << 20), "x.log.gz", 1 << 30, piece=4096)())   # a kind sniff's reads
    assert b"".join(small) == big + TEXT and max(map(len, small)) <= 4096


def test_bytes_that_are_not_gzip_are_read_as_they_are():
    assert _read(TEXT) == TEXT
    assert _read(b"") == b""


def test_a_cut_stream_is_read_up_to_the_cut_and_a_damaged_one_does_not_raise():
    data = gzip.compress(TEXT)
    got = _read(data[:len(data) // 2])
    assert got and TEXT.startswith(got)
    damaged = bytearray(data)
    damaged[len(data) // 2:len(data) // 2 + 64] = b"\xff" * 64
    assert isinstance(_read(bytes(damaged)), bytes)


def test_expanding_past_the_cap_is_an_archive_limit_error():
    bomb = gzip.compress(b"\0" * (4 << 20))
    with pytest.raises(ArchiveLimitError) as err:
        _read(bomb, 4096, cap=1 << 20)
    assert err.value.limit == "bytes" and err.value.cap == 1 << 20 and "x.log.gz" in str(err.value)


def test_the_size_counted_for_progress_is_the_expanded_one(tmp_path):
    p = tmp_path / "a.log.gz"
    p.write_bytes(gzip.compress(TEXT))
    assert gzip_size(p) == gzip_size(p.read_bytes()) == len(TEXT)
    q = tmp_path / "b.log.gz"
    q.write_bytes(TEXT[:10])
    assert gzip_size(q) == 10


def _essentials(d):
    rc = d["root_cause"] or {}
    return (d["status"], d["sub_domain"], d["responsible_nodes"], d["recovery"], rc.get("text"),
            (rc.get("ref") or {}).get("line"), d["symptom_coverage"], len(d["symptoms"]))


def test_a_bundle_folder_with_gzipped_logs(tmp_path):
    plain = analyze_path(WORKED).diagnosis.to_dict()
    bundle = _gzipped_copy(WORKED, tmp_path / "b")
    assert all(f.path.endswith(".log.gz") for f in open_bundle(bundle).files)
    got = analyze_path(bundle).diagnosis.to_dict()
    assert _essentials(got) == _essentials(plain)
    assert got["root_cause"]["ref"]["path"] == plain["root_cause"]["ref"]["path"] + ".gz"    # the file the user has


def test_a_bundle_archive_holding_gzipped_logs(tmp_path):
    bundle = _gzipped_copy(WORKED, tmp_path / "job-1")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        tf.add(bundle, arcname="job-1")
    (tmp_path / "job-1.tar.gz").write_bytes(buf.getvalue())
    assert _essentials(analyze_path(tmp_path / "job-1.tar.gz").diagnosis.to_dict()) == \
        _essentials(analyze_path(WORKED).diagnosis.to_dict())


def test_a_gzipped_log_alone_and_in_a_folder_of_logs(tmp_path):
    syslog = (WORKED / "logs" / "syslog" / "node-02.log").read_bytes()
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "node-02.log").write_bytes(syslog)
    (tmp_path / "zipped").mkdir()
    (tmp_path / "zipped" / "node-02.log.gz").write_bytes(gzip.compress(syslog))
    for name in ("node-02.log", ""):
        plain = analyze_path(tmp_path / "plain" / name).diagnosis.to_dict()
        got = analyze_path(tmp_path / "zipped" / (name + ".gz" if name else "")).diagnosis.to_dict()
        assert _essentials(got) == _essentials(plain) and plain["status"] == "attributed"
        if name:
            assert got["workload_id"] == plain["workload_id"] == "node-02"      # not node-02.log


def test_an_archive_inside_a_folder_of_logs_is_still_skipped(tmp_path):
    shutil.copy(WORKED / "logs" / "syslog" / "node-02.log", tmp_path / "node-02.log")
    (tmp_path / "old.tar.gz").write_bytes(gzip.compress(b"not read"))
    intake = open_input(tmp_path)
    assert [f.path for f in intake.bundle.files] == ["node-02.log"]
    assert any("old.tar.gz" in w for w in intake.warnings)


def test_the_cap_given_holds_in_a_bundle_folder_too(tmp_path):
    bundle = _gzipped_copy(WORKED, tmp_path / "b")
    (bundle / "logs" / "app" / "big.log.gz").write_bytes(gzip.compress(b"step 1 loss 2.0\n" * (100 << 10)))
    with pytest.raises(ArchiveLimitError):
        analyze_path(bundle, max_archive_bytes=1 << 20)
    assert analyze_path(bundle).diagnosis.status == "attributed"


def test_a_gzip_bomb_is_refused_with_the_cap_named(tmp_path):
    (tmp_path / "dmesg.log.gz").write_bytes(gzip.compress(b"kernel: x\n" * (300 << 10)))
    out = subprocess.run([sys.executable, "-m", "firstfault", "analyze", str(tmp_path / "dmesg.log.gz"),
                          "--max-archive-bytes", "1M"], capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    assert "size limit of 1048576 bytes" in out.stderr and "dmesg.log.gz" in out.stderr
