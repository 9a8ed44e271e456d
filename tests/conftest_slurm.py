"""A real Slurm cluster for the session (tests/slurm_cluster.py). Load with
``pytest_plugins = ["conftest_slurm"]``.

``slurm_cluster`` is one cluster for the whole session: munged, slurmdbd on the local
MariaDB (a database of its own), slurmctld and slurmd for nodes n1..n3. ``SLURM_CONF``
points at it for the session, so ``sbatch``, ``sacct``, ``squeue`` and the connector
reach it the way they reach any cluster. Where Slurm, root or MariaDB is missing the
tests skip and say why (scripts/test.sh installs the packages when it can).
"""
from __future__ import annotations

import os

import pytest

from slurm_cluster import SlurmCluster, SlurmUnavailable, missing


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    why = missing()
    if why:
        pytest.skip(why)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except SlurmUnavailable as exc:
        pytest.skip(str(exc))
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    yield cluster
    if previous is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = previous
    cluster.stop()
