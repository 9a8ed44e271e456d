"""scripts/slurm_one_host.py, the one-host Slurm a user starts to try `firstfault up --slurm` (README, "On a
Slurm cluster"): `start DIR` leaves a cluster whose `sinfo` lists n1-n3 and prints the SLURM_CONF to export;
`stop DIR` cancels its jobs and leaves no process of DIR running.

It may run while the session cluster of conftest_slurm is up: nothing is shared. Its ports are free ones
picked at start, and its munge socket, state, logs and MariaDB (its own, on a free port) are under DIR."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import slurm_cluster  # noqa: F401  (loads scripts/slurm_one_host.py as the module slurm_one_host)
import slurm_one_host
from slurm_one_host import SlurmCluster, missing

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "slurm_one_host.py"


def one_host(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=300)


def of_dir(root: Path) -> list[str]:
    """Live processes whose command line or environment names ``root`` (daemons, job steps, jobs)."""
    hits = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            seen = (p / "cmdline").read_bytes() + (p / "environ").read_bytes()
        except OSError:
            continue
        if str(root).encode() in seen:
            cmdline = (p / "cmdline").read_bytes().replace(bytes(1), b" ").decode(errors="replace")
            hits.append(f"{p.name}: {cmdline}")
    return hits


def test_start_leaves_a_cluster_with_three_nodes_and_stop_leaves_nothing_running(tmp_path):
    why = missing(own_mariadb=True)
    if why:
        pytest.skip(why)
    root = tmp_path / "cluster"
    started = one_host("start", str(root))
    try:
        assert started.returncode == 0, started.stderr
        conf = root / "etc" / "slurm.conf"
        assert started.stdout == f"export SLURM_CONF={conf}\n", started.stdout       # what a shell can eval
        assert "nodes n1 n2 n3" in started.stderr and "stop it with:" in started.stderr, started.stderr
        c = SlurmCluster.recorded(root)
        assert set(c.running()) == {"mariadbd", "munged", "slurmdbd", "slurmctld", "slurmd-n1", "slurmd-n2",
                                    "slurmd-n3"}
        env = {**os.environ, "SLURM_CONF": str(conf)}
        sinfo = subprocess.run(["sinfo", "--noheader", "--Node", "--format=%N %T"], env=env, capture_output=True,
                               text=True, timeout=60)
        assert sorted(sinfo.stdout.split()) == sorted(["n1", "idle", "n2", "idle", "n3", "idle"]), sinfo
        # A job still running when the cluster stops is cancelled with it.
        job = c.sbatch("#!/bin/bash\nsleep 600\n", "--job-name=left-running")
        c.wait_job(job, {"RUNNING"}, timeout_s=120)
        again = one_host("start", str(root))
        assert again.returncode == 1 and "already runs" in again.stderr, again
    finally:
        stopped = one_host("stop", str(root))
    assert stopped.returncode == 0 and "stopped " in stopped.stderr, stopped
    assert SlurmCluster.recorded(root).running() == []
    assert of_dir(root) == []
    # Stopped once more, it says nothing of DIR runs.
    assert "was running" in one_host("stop", str(root)).stderr


def test_it_says_what_is_missing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(slurm_one_host, "_found", lambda name: name not in ("slurmdbd", "mariadbd"))
    assert slurm_one_host.main(["start", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "slurmdbd, mariadbd missing" in err
    assert "apt-get install -y --no-install-recommends slurm-wlm slurmdbd munge mariadb-server" in err
    monkeypatch.setattr(slurm_one_host, "_found", lambda name: True)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert slurm_one_host.main(["start", str(tmp_path / "c")]) == 2
    assert "needs root" in capsys.readouterr().err
    assert slurm_one_host.main(["stop", str(tmp_path / "c")]) == 2
    assert "as root" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_stop_of_a_directory_without_a_cluster_says_so(tmp_path, capsys):
    if os.geteuid() != 0:
        pytest.skip("stop runs as root")
    assert slurm_one_host.main(["stop", str(tmp_path)]) == 1
    assert "no cluster was started" in capsys.readouterr().err


def test_a_recorded_pid_that_now_names_another_process_is_left_alone():
    me = slurm_one_host.RecordedProcess(os.getpid(), "0")          # our PID, another start time
    assert me.poll() == 0
    me.terminate()                                                 # not signalled: we are still here
    mine = slurm_one_host.RecordedProcess(os.getpid(), slurm_one_host._start_time(os.getpid()))
    assert mine.poll() is None
