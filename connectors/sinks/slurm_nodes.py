"""What slurmctld says of nodes, read before the recovery sink drains them: ``scontrol -o show node``.

``scontrol update NodeName=n State=DRAIN Reason=...`` on a node that is already drained or
down succeeds and replaces its reason (and the user and time beside it) with ours: an
operator's note on why the node was taken out would be lost. So the sink asks first and
leaves such nodes alone.

Format (Slurm's ``src/api/node_info.c``, one node a line with ``-o``): ``State=`` is the base
state and its flags joined by ``+`` (``IDLE+DRAIN``, ``DOWN+NOT_RESPONDING``, ``MIXED+DRAIN``);
``Reason=<text> [<user>@<time>]`` follows near the end of the line, before the optional
``Comment=``/``Extra=``/``InstanceId=``/``InstanceType=``. A name slurmctld does not know
prints ``Node <name> not found`` and makes the exit status 1, the others are still printed.
"""
from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# A node with any of these in its State is out of service already (node_state_string_complete's words).
OUT_OF_SERVICE = frozenset({"DOWN", "DRAIN", "FAIL"})
_NAME = re.compile(r"(?:^|\s)NodeName=(\S+)")
_STATE = re.compile(r"\sState=(\S+)")
_REASON = re.compile(r"\sReason=(.*?)(?: \[([^\]@\s]*)@[^\]]*\])?(?= (?:Comment|Extra|InstanceId|InstanceType)=|\s*$)")


@dataclass(frozen=True)
class NodeState:
    name: str
    state: str
    reason: str = ""
    reason_by: str = ""

    @property
    def out_of_service(self) -> bool:
        return bool(OUT_OF_SERVICE & set(self.state.split("+")))

    def audit(self) -> dict[str, str]:
        return {"state": self.state, "reason": self.reason, "reason_by": self.reason_by}


def parse_show_node(text: str) -> dict[str, NodeState]:
    """``scontrol -o show node`` output -> {node name: its state}; lines of unknown nodes are skipped."""
    nodes: dict[str, NodeState] = {}
    for line in text.splitlines():
        name, state = _NAME.search(line), _STATE.search(line)
        if not (name and state):
            continue
        reason = _REASON.search(line)
        nodes[name.group(1)] = NodeState(name.group(1), state.group(1),
                                         reason.group(1) if reason else "", (reason and reason.group(2)) or "")
    return nodes


def node_states(nodes: Sequence[str], scontrol: str = "scontrol", runner: Callable[..., Any] = subprocess.run,
                timeout_s: float = 30.0) -> dict[str, NodeState]:
    """slurmctld's view of ``nodes`` (one RPC); those it does not know, or all if it cannot be asked, are absent."""
    try:
        res = runner([scontrol, "-o", "show", "node", ",".join(nodes)], capture_output=True, text=True,
                     timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse_show_node(getattr(res, "stdout", "") or "")
