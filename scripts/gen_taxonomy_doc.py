#!/usr/bin/env python3
"""Write docs/taxonomy.md from the catalog's taxonomy (rules/catalog/data/taxonomy.yaml).

    python scripts/gen_taxonomy_doc.py            # rewrite docs/taxonomy.md
    python scripts/gen_taxonomy_doc.py --check    # exit 1 when the committed file is stale

The sub_domains, their one-line meaning and their default recovery come from the
catalog file itself, so the page cannot drift from what the engine uses
(tests/test_docs.py runs --check's comparison). What the catalog does not hold
(a domain's scope, the typical evidence of a sub_domain) is written here; a domain
or sub_domain without it stops the script, naming it, so a new row gets its text.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TAXONOMY = ROOT / "rules" / "catalog" / "data" / "taxonomy.yaml"
OUT = ROOT / "docs" / "taxonomy.md"

DOMAINS = {
    "gpu": "the GPU itself: its memory, its firmware, its link to the host",
    "interconnect": "NVLink and NVSwitch, the GPU-to-GPU fabric inside a node or rack",
    "network": "the fabric between hosts: InfiniBand, RoCE, Ethernet sockets",
    "storage": "the file systems the job reads and writes",
    "host": "the node around the GPUs: kernel, host memory, PCIe, driver install, the node as a whole",
    "application": "the training program, its launcher and its NCCL settings: the node is not at fault",
    "scheduler": "the scheduler ended the job on purpose",
}

# Typical evidence per sub_domain (contract section 3): the lines a person can look for.
EVIDENCE = {
    "gpu_fell_off_bus": 'Xid 79, "GPU has fallen off the bus"',
    "gpu_memory_ecc": 'uncorrectable ECC: Xid 48, 94, 95, row-remap failure (Xid 64), '
                      'CUDA "uncorrectable ECC error encountered"',
    "gpu_hardware_fault": "other GPU hardware or firmware faults: GSP timeouts (Xid 119, 120), Xid 62, "
                          "Xid 154 asking for a reset or reboot",
    "nvlink_signal_integrity": "NVLink5 Xids (144-150) whose error words decode to link down / signal "
                               "integrity (NVIDIA's action INVESTIGATE_LINK_SI)",
    "nvlink_error": "other NVLink faults: Xid 74, the fatal decodings of Xid 144-150",
    "nvswitch_fatal": "NVSwitch SXid lines, Fabric Manager fatal errors",
    "ib_link_error": "InfiniBand / RoCE port down, mlx5 errors, NCCL IB completion errors "
                     "(weak on their own: see below)",
    "network_error": "other socket or fabric failures between hosts",
    "storage_io_error": "NFS / Lustre / object-store failures, no space left, checkpoint I/O errors",
    "host_oom": "the kernel OOM killer killed a training process (`Out of memory: Killed process`)",
    "host_kernel_error": "kernel panic, soft lockup, hung task, machine-check",
    "pcie_error": "PCIe AER uncorrectable (fatal) errors on a GPU's or NIC's bus",
    "node_failure": "the scheduler's NODE_FAIL (or a lost node) with no finer evidence",
    "shm_exhausted": '`/dev/shm` full or too small: bus errors in data-loader workers, '
                     '"No space left on device" on shared memory',
    "driver_library_mismatch": '"Driver/library version mismatch": the kernel driver and the user-space '
                               'library disagree, e.g. after an unattended upgrade',
    "evicted": "Kubernetes evicted the pod under node pressure (`Failed/Evicted`, eviction events)",
    "cuda_oom": "`CUDA out of memory` / `torch.OutOfMemoryError` in the application",
    "illegal_memory_access": "CUDA illegal address or MMU fault caused by the program (Xid 13, 31 with "
                             "application context, device-side asserts)",
    "user_code_exception": "a Python exception in the user's program that ended a rank",
    "nccl_config_error": "NCCL invalid usage or misconfiguration: a wrong `NCCL_SOCKET_IFNAME`, no "
                         "usable interface, a topology file for another machine type",
    "collective_mismatch": "ranks called different collectives or shapes (desync), or only some "
                           "ranks reached a barrier",
    "rendezvous_error": "the launcher could not form the group: port in use, rendezvous timeout, "
                        "wrong master address",
    "walltime_exceeded": "`CANCELLED ... DUE TO TIME LIMIT`, state TIMEOUT",
    "preempted": "the scheduler preempted the job (state PREEMPTED, preemption events)",
    "user_cancelled": "`CANCELLED by <uid>`: a person cancelled the job",
}

ACTIONS = {
    "none": "nothing to do",
    "retry": "rerun the job as it was (on the same nodes if the scheduler picks them)",
    "retry_excluding_nodes": "rerun the job without `recovery.nodes`",
    "drain_nodes": "take `recovery.nodes` out of service until someone has looked at them",
    "notify_owner": "tell a person (the job's owner); nothing is done automatically",
}

HEAD = """\
# Taxonomy: what a diagnosis can blame

<!-- Generated by scripts/gen_taxonomy_doc.py from rules/catalog/data/taxonomy.yaml.
     Do not edit by hand: run `python scripts/gen_taxonomy_doc.py`. -->

Every attributed diagnosis names a `domain` and a `sub_domain` from the table below
(`root_cause.domain` / `root_cause.sub_domain` and the top-level `domain` / `sub_domain`
of the [diagnosis](diagnosis.md)); every candidate of an ambiguous diagnosis names one
too. Three statuses set the top-level fields to fixed values instead:

| status | `domain` | `sub_domain` |
| --- | --- | --- |
| `ambiguous` | the candidates' shared domain, else `ambiguous` | `ambiguous` |
| `unattributed` | `unknown` | `unattributed` |
| `no_failure` | `none` | `none` |

The "default recovery" column is `recovery.action` for an attributed diagnosis of that
sub_domain and "what to do next" is `recovery.next_step`. The engine adjusts the default:

* Where the row would drain or exclude nodes, NVIDIA's own resolution for the Xid that
  was logged decides: `RESTART_APP` gives `retry` (a contained Xid 94 restarts the
  application, it does not drain); `RESET_GPU`, `RESTART_BM`, `RESTART_VM` and `REBOOT`
  give `drain_nodes`. The resolution is appended to `next_step`
  (`(NVIDIA: RESET_GPU, then INVESTIGATE_LINK_SI)`).
* Weak evidence never drains: when every chosen root is weak (an NCCL IB completion
  error, a CUDA error string other faults also produce), `drain_nodes` becomes
  `retry_excluding_nodes`.
* When no host is named, `drain_nodes` and `retry_excluding_nodes` become `notify_owner`:
  a rerun would likely land on the same broken node, so a person finds it first (the
  `next_step` starts "find the host that logged the root-cause line").
* `recovery.nodes` is set only for `drain_nodes` and `retry_excluding_nodes`, so an
  `application` or `scheduler` fault never names a node there.
* A rule may carry a more precise `next_step` than its row (a host memory error says to
  test the DIMM).
* `ambiguous` and `unattributed` always give `notify_owner`, with a `next_step` saying
  what to collect; `no_failure` gives `none`.

`recovery.reason` always says which of these applied.

Recovery actions:
"""

TAIL = """
NCCL timeouts, watchdog aborts, `ChildFailedError`, "remote process exited" and exit-code
lines are symptoms, never a sub_domain of their own: when nothing explains them the
diagnosis is `unattributed`, with `suspect_nodes` where the collective pattern points at a
rank.

The rows come from `rules/catalog/data/taxonomy.yaml` (the `summary` and `next_step` of
each row are read from there; `firstfault rules lint` checks that every rule's tag names
a row). Sub_domains are added as the catalog grows; none is renamed.
"""


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def render(taxonomy_path: Path = TAXONOMY) -> str:
    """The whole page, deterministic: domains and rows in the catalog file's order."""
    data = yaml.safe_load(taxonomy_path.read_text(encoding="utf-8"))
    domains = data["domains"]
    missing = [f"domain {d!r}" for d in domains if d not in DOMAINS]
    missing += [f"sub_domain {d}/{s}" for d, subs in domains.items() for s in subs if s not in EVIDENCE]
    missing += [f"recovery action {row.get('recovery')!r}" for subs in domains.values() for row in subs.values()
                if row.get("recovery") not in ACTIONS]
    if missing:
        raise SystemExit(f"gen_taxonomy_doc: no text for {', '.join(missing)}: add it to "
                         f"scripts/gen_taxonomy_doc.py")
    out = [HEAD]
    out += ["| action | what it means |", "| --- | --- |"]
    out += [f"| `{a}` | {text} |" for a, text in ACTIONS.items()]
    out.append("")
    rows = sum(len(subs) for subs in domains.values())
    out.append(f"## The {len(domains)} domains and {rows} sub_domains")
    out.append("")
    for domain, subs in domains.items():
        out.append(f"### `{domain}`: {DOMAINS[domain]}")
        out.append("")
        out.append("| sub_domain | what it means | typical evidence | default recovery | what to do next |")
        out.append("| --- | --- | --- | --- | --- |")
        for sub, row in subs.items():
            out.append(f"| `{sub}` | {_cell(row.get('summary', ''))} | {_cell(EVIDENCE[sub])} "
                       f"| `{row['recovery']}` | {_cell(row.get('next_step', ''))} |")
        out.append("")
    out.append(TAIL.strip("\n"))
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write docs/taxonomy.md from the catalog's taxonomy.")
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/taxonomy.md differs from the generated page")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        current = OUT.read_text(encoding="utf-8") if OUT.exists() else ""
        if current != text:
            print("docs/taxonomy.md is stale: run python scripts/gen_taxonomy_doc.py", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
