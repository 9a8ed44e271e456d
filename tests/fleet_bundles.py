"""Bundles for the fleet-memory tests, made of real log lines diagnosed by the real engine.

* Xid 79: the first lines of corpus/real/hw-xid79-dmesg-nvidia-docker-1553 (dmesg, uptime stamps),
  with the node's boot time chosen so the Xid lands at the wanted instant.
* IB link down: the catalog's real mlx5 line (rules/catalog/early/kernel.yaml, early.ib.port_down),
  behind the RFC 3164 syslog prefix the same file's examples carry.
"""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

from firstfault.rules.engine import analyze_path
from firstfault.schemas import Diagnosis

ROOT = Path(__file__).resolve().parents[1]
XID79_DMESG = ROOT / "corpus" / "real" / "hw-xid79-dmesg-nvidia-docker-1553" / "input" / "dmesg.txt"
XID79_UPTIME = 1084456.074562          # the stamp of the Xid line in that dmesg
IB_DOWN = "mlx5_core 0000:08:00.0 mlx5_0: Port: 1 Link DOWN"


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _workload(wid: str, attempt: int, nodes: list[str], at: datetime, **extra) -> dict:
    return {"workload_id": wid, "attempt": attempt, "scheduler": "slurm", "state": "FAILED", "exit_code": "1:0",
            "start_time": _iso(at - timedelta(minutes=5)), "end_time": _iso(at + timedelta(minutes=15)),
            "nodes": nodes, "gpus_per_node": 8, **extra}


def xid79_bundle(root: Path, wid: str, node: str, at: datetime, attempt: int = 0, other: str = "node-99") -> Path:
    d = root / f"{wid}-{attempt}"
    (d / "logs" / "syslog").mkdir(parents=True)
    boot = at - timedelta(seconds=XID79_UPTIME)
    (d / "workload.json").write_text(json.dumps(_workload(wid, attempt, [node, other], at,
                                                          boot_times={node: boot.isoformat().replace("+00:00", "Z")})))
    lines = XID79_DMESG.read_text().splitlines()[:8]
    (d / "logs" / "syslog" / f"{node}.log").write_text("\n".join(lines) + "\n")
    return d


def ib_bundle(root: Path, wid: str, node: str, at: datetime, attempt: int = 0, other: str = "node-99") -> Path:
    d = root / f"{wid}-{attempt}"
    (d / "logs" / "syslog").mkdir(parents=True)
    (d / "workload.json").write_text(json.dumps(_workload(wid, attempt, sorted([node, other]), at)))
    stamp = at.strftime("%b %d %H:%M:%S").replace(" 0", "  ", 1) if at.day < 10 else at.strftime("%b %d %H:%M:%S")
    (d / "logs" / "syslog" / f"{node}.log").write_text(f"{stamp} {node} kernel: {IB_DOWN}\n")
    return d


def diagnose(bundle: Path) -> Diagnosis:
    return analyze_path(str(bundle)).diagnosis


T0 = datetime(2026, 11, 2, 10, 3, 11, tzinfo=timezone.utc)


def retarget(d: Diagnosis, wid: str, host: str, at: datetime) -> Diagnosis:
    """The same attributed diagnosis as workload ``wid``, blaming ``host`` at ``at`` (no engine run)."""
    stamp = at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    assert d.root_cause is not None
    rc = d.root_cause.model_copy(update={"host": host, "onset": stamp, "timestamp": stamp})
    return d.model_copy(update={"workload_id": wid, "diagnosis_id": f"sha256:{wid}", "root_cause": rc,
                                "responsible_nodes": [host], "suspect_nodes": [],
                                "recovery": d.recovery.model_copy(update={"nodes": [host]})})
