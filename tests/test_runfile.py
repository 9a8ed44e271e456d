"""The run file of `firstfault up`: where it lives, atomic writes, stale pids, and how a command resolves the broker."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from firstfault.streams import runfile
from firstfault.streams.runfile import NO_BROKER, NoBroker, RunInfo


def info(pid: int, **kw) -> RunInfo:
    base = dict(bootstrap="127.0.0.1:45001", redis="memory", prefix="firstfault.", pid=pid,
                started_at="2026-11-03T10:00:00Z", rules_version="sha256:abc", log_file="/tmp/x/up.log")
    return RunInfo(**{**base, **kw})


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_path_prefers_the_override_then_the_runtime_dir_then_the_cache(tmp_path):
    home = str(tmp_path / "home")
    assert runfile.run_file_path({"FIRSTFAULT_RUN_FILE": "/x/y.json", "XDG_RUNTIME_DIR": "/run/user/1"}) == Path("/x/y.json")
    assert runfile.run_file_path({"XDG_RUNTIME_DIR": "/run/user/1", "HOME": home}) == Path("/run/user/1/firstfault/up.json")
    assert runfile.run_file_path({"XDG_CACHE_HOME": "/c", "HOME": home}) == Path("/c/firstfault/up.json")
    assert runfile.run_file_path({"HOME": home}) == Path(home) / ".cache" / "firstfault" / "up.json"
    # Relative XDG values are invalid by the spec: ignored.
    assert runfile.run_file_path({"XDG_RUNTIME_DIR": "rel", "HOME": home}) == Path(home) / ".cache" / "firstfault" / "up.json"


def test_write_is_atomic_private_and_round_trips(tmp_path):
    path = tmp_path / "deep" / "firstfault" / "up.json"
    runfile.write(info(123), path)
    runfile.write(info(456, redis="redis://:secret@h:6379/0"), path)     # replaces, never appends
    assert runfile.read(path) == info(456, redis="redis://:secret@h:6379/0")
    assert runfile.read(path).redis_url == "redis://:secret@h:6379/0"
    assert info(1).redis_url is None                                       # "memory": the in-process store
    assert sorted(p.name for p in path.parent.iterdir()) == ["up.json"]     # no temp file left behind
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_remove_only_removes_its_own(tmp_path):
    path = tmp_path / "up.json"
    runfile.write(info(111), path)
    assert runfile.remove(path, 222) is False and path.exists()            # a newer `up` replaced it
    assert runfile.remove(path, 111) is True and not path.exists()
    assert runfile.remove(path, 111) is False


def test_pid_alive_tells_running_from_exited_and_zombie():
    assert runfile.pid_alive(os.getpid())
    assert not runfile.pid_alive(dead_pid())
    assert not runfile.pid_alive(0)
    z = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while runfile.pid_alive(z.pid) and time.monotonic() < deadline:    # exited, not reaped: a zombie
        time.sleep(0.05)
    try:
        assert not runfile.pid_alive(z.pid)
    finally:
        z.wait()


def test_lookup_ignores_missing_garbage_and_stale_files_and_says_why(tmp_path):
    path = tmp_path / "up.json"
    assert runfile.lookup(path) == runfile.Lookup(path, None, None)
    path.write_text("{not json")
    found = runfile.lookup(path)
    assert found.info is None and "not a firstfault run file" in found.note
    pid = dead_pid()
    runfile.write(info(pid), path)
    found = runfile.lookup(path)
    assert found.info is None and f"stale run file {path}" in found.note and f"pid {pid}" in found.note
    runfile.write(info(os.getpid()), path)
    found = runfile.lookup(path)
    assert found.info.pid == os.getpid() and found.note is None


def test_resolve_takes_flag_then_variable_then_a_live_run_file(tmp_path):
    path = tmp_path / "up.json"
    runfile.write(info(os.getpid(), redis="redis://127.0.0.1:6379/3", prefix="mine."), path)
    env = {"FIRSTFAULT_RUN_FILE": str(path)}

    r = runfile.resolve("flag:9092", env={**env, "FIRSTFAULT_KAFKA_BOOTSTRAP": "var:9092"})
    assert (r.bootstrap, r.redis_url, r.prefix, r.run) == ("flag:9092", None, None, None)   # run file not read
    r = runfile.resolve(None, env={**env, "FIRSTFAULT_KAFKA_BOOTSTRAP": "var:9092", "FIRSTFAULT_REDIS_URL": "redis://v"})
    assert (r.bootstrap, r.redis_url, r.run) == ("var:9092", "redis://v", None)

    r = runfile.resolve(None, env=env)
    assert (r.bootstrap, r.redis_url, r.prefix, r.path) == ("127.0.0.1:45001", "redis://127.0.0.1:6379/3", "mine.", path)
    assert r.run.pid == os.getpid()
    # The run file's store and prefix, each unless given explicitly.
    r = runfile.resolve(None, "redis://flag", "p.", env={**env, "FIRSTFAULT_REDIS_URL": "redis://var"})
    assert (r.bootstrap, r.redis_url, r.prefix) == ("127.0.0.1:45001", "redis://flag", "p.")
    r = runfile.resolve(None, env={**env, "FIRSTFAULT_REDIS_URL": "redis://var", "FIRSTFAULT_TOPIC_PREFIX": "q."})
    assert (r.redis_url, r.prefix) == ("redis://var", "q.")
    runfile.write(info(os.getpid()), path)
    assert runfile.resolve(None, env=env).redis_url is None                 # up ran with the in-memory store
    assert runfile.stored_redis(env=env) is None
    runfile.write(info(os.getpid(), redis="redis://127.0.0.1:6379/3"), path)
    assert runfile.stored_redis(env=env) == "redis://127.0.0.1:6379/3"
    assert runfile.stored_redis("redis://flag", env=env) == "redis://flag"


def test_resolve_without_a_running_up_is_one_clear_line(tmp_path):
    path = tmp_path / "up.json"
    env = {"FIRSTFAULT_RUN_FILE": str(path)}
    with pytest.raises(NoBroker) as exc:
        runfile.resolve(None, env=env)
    assert str(exc.value) == NO_BROKER
    runfile.write(info(dead_pid()), path)
    with pytest.raises(NoBroker) as exc:
        runfile.resolve(None, env=env)
    assert str(exc.value).startswith(NO_BROKER) and "stale run file" in str(exc.value)
    assert "\n" not in str(exc.value)
    assert runfile.stored_redis(env=env) is None


# ---------------------------------------------------------------- a run file is not trusted for being there
def valid(path: Path, **kw) -> RunInfo:
    """A run file this process could have written (its own pid), at ``path``; what it says."""
    runfile.write(info(os.getpid(), **kw), path)
    return runfile.read(path)


def test_a_forged_run_file_naming_another_live_process_is_stale(tmp_path):
    path = tmp_path / "up.json"
    for forged in (info(1), info(1, pid_start="0:1")):       # pid 1 is alive, and it is not that `up`
        path.write_text(forged.model_dump_json())
        path.chmod(0o600)
        found = runfile.lookup(path)
        assert found.info is None and f"stale run file {path}" in found.note and "pid 1 " in found.note, found
        assert "the `firstfault up` that wrote it" in found.note
        with pytest.raises(NoBroker) as exc:
            runfile.resolve(None, env={"FIRSTFAULT_RUN_FILE": str(path)})
        assert "stale run file" in str(exc.value) and "\n" not in str(exc.value)


def test_the_writer_records_its_start_so_a_reused_pid_is_told_apart(tmp_path):
    path = tmp_path / "up.json"
    mine = valid(path)
    assert mine.pid_start and runfile.lookup(path).info == mine
    path.write_text(mine.model_copy(update={"pid_start": mine.pid_start + "0"}).model_dump_json())
    found = runfile.lookup(path)
    assert found.info is None and "stale run file" in found.note


def test_a_run_file_others_can_write_is_not_trusted(tmp_path):
    path = tmp_path / "up.json"
    valid(path)
    for mode in (0o620, 0o602, 0o666):
        path.chmod(mode)
        found = runfile.lookup(path)
        assert found.info is None and "writable by others" in found.note and oct(mode)[2:] in found.note, found
    path.chmod(0o644)                                           # readable by others is the writer's choice
    assert runfile.lookup(path).info is not None


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_run_file_owned_by_someone_else_is_not_trusted(tmp_path):
    path = tmp_path / "up.json"
    valid(path)
    os.chown(path, 4242, -1)
    found = runfile.lookup(path)
    assert found.info is None and "owned by uid 4242" in found.note, found


def test_a_huge_run_file_is_refused_unread(tmp_path, monkeypatch):
    path = tmp_path / "up.json"
    text = valid(path).model_dump_json()
    path.write_text(text + " " * (1 << 20))                    # still valid JSON, a MiB of it
    path.chmod(0o600)
    reads: list[int] = []
    real_read = os.read
    monkeypatch.setattr(runfile.os, "read", lambda fd, n: reads.append(n) or real_read(fd, n))
    found = runfile.lookup(path)
    assert found.info is None and "larger than 64 KiB" in found.note, found
    assert sum(reads) <= runfile.MAX_BYTES + 1


def test_a_run_file_that_is_a_symlink_or_a_fifo_is_not_followed_or_waited_on(tmp_path):
    elsewhere = tmp_path / "elsewhere.json"
    valid(elsewhere)
    path = tmp_path / "up.json"
    path.symlink_to(elsewhere)
    found = runfile.lookup(path)
    assert found.info is None and "symbolic link" in found.note, found
    assert runfile.remove(path, os.getpid()) is False and elsewhere.exists()
    path.unlink()
    os.mkfifo(path, 0o600)                                      # a reader would wait for a writer forever
    found = runfile.lookup(path)
    assert found.info is None and "not a regular file" in found.note, found


def test_write_replaces_a_symlink_never_its_target(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    path = tmp_path / "up.json"
    path.symlink_to(victim)
    runfile.write(info(os.getpid()), path)
    assert victim.read_text() == "keep me" and not path.is_symlink() and runfile.lookup(path).info is not None


def test_up_log_is_made_anew_never_written_through_a_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    log = tmp_path / "run" / "up.log"
    log.parent.mkdir()
    log.symlink_to(victim)
    fd = runfile.fresh_log(log)
    os.write(fd, b"this run\n")
    os.close(fd)
    assert victim.read_text() == "keep me" and not log.is_symlink() and log.read_text() == "this run\n"
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


def test_up_is_not_blocked_by_a_forged_run_file_and_says_so_in_one_line(tmp_path):
    path = tmp_path / "run" / "up.json"
    path.parent.mkdir(mode=0o700)
    path.write_text(info(1).model_dump_json())                  # pid 1: alive, and not an `up`
    path.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTFAULT_")}
    # A rules directory that is not there stops it right after the run-file check: no pipeline starts.
    env.update(FIRSTFAULT_RUN_FILE=str(path), FIRSTFAULT_RULES=str(tmp_path / "no-rules"))
    p = subprocess.run([sys.executable, "-m", "firstfault", "up"], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and "already running" not in p.stderr, p.stderr
    assert lines[0] == (f"firstfault up: ignoring stale run file {path}: it records no start time, so pid 1 "
                        "cannot be confirmed as the `firstfault up` that wrote it; replacing it"), p.stderr
    assert "rules directory does not exist" in lines[1] and len(lines) == 2, p.stderr
