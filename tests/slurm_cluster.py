"""The tests' one-host Slurm cluster (munged, slurmdbd on the local MariaDB, slurmctld and one slurmd per
node name, on free ports, state under one directory) is scripts/slurm_one_host.py, the command a user
starts to try `firstfault up --slurm` on one machine; this makes it importable as ``slurm_cluster``."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

if "slurm_one_host" not in sys.modules:
    _spec = importlib.util.spec_from_file_location(
        "slurm_one_host", Path(__file__).resolve().parents[1] / "scripts" / "slurm_one_host.py")
    assert _spec is not None and _spec.loader is not None
    sys.modules["slurm_one_host"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["slurm_one_host"])

from slurm_one_host import (CLIENTS, DAEMONS, NODES, RecordedProcess, SlurmCluster,  # noqa: E402,F401
                            SlurmUnavailable, missing, wait_for)
