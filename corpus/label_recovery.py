#!/usr/bin/env python3
"""Give every real case an expected ``recovery_action``, from its label alone.

    python corpus/label_recovery.py [--check]

The action follows from the case's labelled status, sub_domain and responsible_nodes by
the policy in corpus/README.md ("Recovery labels"), written down here on its own so the
engine's taxonomy is checked against a second statement of the policy, not copied from it.
This script never runs the engine. ``--check`` exits 1 if a case.json lacks the label or
disagrees with the policy, instead of writing it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

CASES = Path(__file__).resolve().parent / "real"

# What an automated system may do for an attributed cause, when the lines name the host.
ATTRIBUTED = {
    # A GPU, NVLink/NVSwitch or host fault: the node must leave the pool until repaired.
    "gpu_fell_off_bus": "drain_nodes", "gpu_memory_ecc": "drain_nodes", "gpu_hardware_fault": "drain_nodes",
    "nvlink_signal_integrity": "drain_nodes", "nvlink_error": "drain_nodes", "nvswitch_fatal": "drain_nodes",
    "host_kernel_error": "drain_nodes", "pcie_error": "drain_nodes", "driver_library_mismatch": "drain_nodes",
    # A link or a lost node: rerun elsewhere, then look at the node.
    "ib_link_error": "retry_excluding_nodes", "node_failure": "retry_excluding_nodes",
    # Transient or external: a rerun may pass.
    "network_error": "retry", "evicted": "retry", "preempted": "retry", "rendezvous_error": "retry",
    # The job's own doing: its owner changes something first.
    "cuda_oom": "notify_owner", "illegal_memory_access": "notify_owner", "user_code_exception": "notify_owner",
    "nccl_config_error": "notify_owner", "collective_mismatch": "notify_owner", "host_oom": "notify_owner",
    "shm_exhausted": "notify_owner", "storage_io_error": "notify_owner", "walltime_exceeded": "notify_owner",
    # A person stopped it.
    "user_cancelled": "none",
}
NODE_ACTIONS = ("drain_nodes", "retry_excluding_nodes")


def expected_action(case: dict, case_dir: Path) -> str:
    expected = case["expected"]
    status = expected["status"]
    if status == "no_failure":
        return "none"
    if status != "attributed":
        return "notify_owner"           # ambiguous, unattributed: nothing automatic
    action = ATTRIBUTED[expected["sub_domain"]]
    if action == "drain_nodes" and case.get("confidence") == "low":
        action = "retry_excluding_nodes"    # indirect evidence: keep the node out of the rerun, do not drain it
    if action in NODE_ACTIONS and not (expected.get("responsible_nodes") or _sole_node(case_dir / case["input"])):
        return "notify_owner"           # no host known: a person must find the node first
    return action


def _sole_node(input_path: Path) -> bool:
    """The scheduler record names exactly one node: the host is known without a line naming it."""
    record = input_path / "workload.json"
    if not record.is_file():
        return False
    return len(json.loads(record.read_text()).get("nodes") or []) == 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Label each corpus case's expected recovery action from its label.")
    ap.add_argument("--check", action="store_true", help="verify the labels instead of writing them")
    args = ap.parse_args(argv)
    bad = 0
    for path in sorted(CASES.glob("*/case.json")):
        case = json.loads(path.read_text())
        want = expected_action(case, path.parent)
        if args.check:
            if case["expected"].get("recovery_action") != want:
                print(f"{path.parent.name}: recovery_action {case['expected'].get('recovery_action')!r}, "
                      f"policy says {want!r}")
                bad += 1
            continue
        if case["expected"].get("recovery_action") != want:
            text = path.read_text()
            ascii_only = text == json.dumps(case, indent=2) + "\n"    # keep each file's own escaping
            case["expected"]["recovery_action"] = want
            path.write_text(json.dumps(case, indent=2, ensure_ascii=ascii_only) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
