"""The fabric topology from the files a site already has, as switch/rack -> nodes groups.

Three forms, told apart by content:

* Slurm ``topology.conf`` (topology/tree): ``SwitchName=s0 Nodes=tux[0-3]`` and
  ``SwitchName=s3 Switches=s[0-2]`` lines, parameter names case-insensitive, ``#`` comments,
  hostlist expressions expanded as Slurm does (``connectors/hostlist.py``). A switch with
  ``Nodes=`` is a leaf (level 0); one with ``Switches=`` sits a level above its highest child.
* A small YAML (or JSON) map: ``{switches: {leaf1: "node[01-04]"}, racks: {r12: [node01, ...]}}``
  (each value a hostlist or a list of names); any other top-level key is taken as a kind.
* Kubernetes nodes (``kubectl get nodes -o json``): the nodes' network-topology labels
  (NVIDIA topograph's block/spine levels, ``topology.kubernetes.io/network-level-N``),
  any label with ``rack`` in its key, and last ``topology.kubernetes.io/zone``.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from firstfault.rules.fleet import Group, Topology

from .hostlist import HostlistError, expand

MAX_NODES = 1 << 17

# (label, kind, level): lower level = nearer the node.
K8S_LABELS: tuple[tuple[str, str, int], ...] = (
    ("network.topology.nvidia.com/block", "switch", 0),
    ("network.topology.kubernetes.io/block", "switch", 0),
    ("topology.kubernetes.io/network-level-1", "switch", 0),
    ("network.topology.nvidia.com/spine", "switch", 1),
    ("network.topology.kubernetes.io/spine", "switch", 1),
    ("topology.kubernetes.io/network-level-2", "switch", 1),
    ("network.topology.nvidia.com/datacenter", "switch", 2),
    ("topology.kubernetes.io/network-level-3", "switch", 2),
    ("topology.kubernetes.io/zone", "zone", 3),
)


class TopologyError(ValueError):
    """A topology file that cannot be read; the message says where."""


def _hosts(value: Any, where: str) -> list[str]:
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise TopologyError(f"{where}: expected node names or a hostlist, got {item!r}")
        try:
            out += expand(item, limit=MAX_NODES)
        except HostlistError as exc:
            raise TopologyError(f"{where}: {exc}") from None
    return out


def parse_slurm(text: str, source: str = "topology.conf") -> Topology:
    nodes: dict[str, list[str]] = {}
    children: dict[str, list[str]] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        params: dict[str, str] = {}
        for tok in line.split():
            key, eq, value = tok.partition("=")
            if not eq:
                raise TopologyError(f"{source}:{n}: expected Key=Value, got {tok!r}")
            params[key.lower()] = value
        name = params.get("switchname")
        if not name:
            if {"blockname", "blocksizes"} & params.keys():
                raise TopologyError(f"{source}:{n}: topology/block lines are not read; use a switch/rack YAML")
            raise TopologyError(f"{source}:{n}: a line without SwitchName=")
        if "nodes" in params:
            nodes[name] = _hosts(params["nodes"], f"{source}:{n}")
        if "switches" in params:
            children[name] = _hosts(params["switches"], f"{source}:{n}")
    if not nodes and not children:
        raise TopologyError(f"{source}: no SwitchName= line")
    level: dict[str, int] = {}
    under: dict[str, set[str]] = {}

    def walk(sw: str, seen: frozenset[str]) -> tuple[int, set[str]]:
        if sw in seen:
            raise TopologyError(f"{source}: switch {sw} is its own ancestor")
        if sw not in level:
            kids = [walk(c, seen | {sw}) for c in children.get(sw, [])]
            level[sw] = max((k[0] + 1 for k in kids), default=0)
            under[sw] = set(nodes.get(sw, [])).union(*(k[1] for k in kids)) if kids else set(nodes.get(sw, []))
        return level[sw], under[sw]

    for sw in sorted(nodes.keys() | children.keys()):
        walk(sw, frozenset())
    return Topology(source=f"slurm topology.conf {source}",
                    groups=[Group(kind="switch", name=sw, level=level[sw], nodes=frozenset(under[sw]))
                            for sw in sorted(level) if under[sw]])


def parse_map(data: Any, source: str) -> Topology:
    if not isinstance(data, dict):
        raise TopologyError(f"{source}: expected a mapping of kind -> {{name: nodes}}")
    groups = []
    for key, entries in sorted(data.items()):
        kind = {"switches": "switch", "racks": "rack", "zones": "zone", "blocks": "block"}.get(str(key), str(key))
        if not isinstance(entries, dict):
            raise TopologyError(f"{source}: {key}: expected {{name: nodes}}")
        for name, value in sorted(entries.items()):
            groups.append(Group(kind=kind, name=str(name), level=0 if kind in ("switch", "rack", "block") else 1,
                                nodes=frozenset(_hosts(value, f"{source}: {key}.{name}"))))
    return Topology(source=f"map {source}", groups=groups)


def parse_k8s_nodes(data: Any, source: str) -> Topology:
    items = data.get("items") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise TopologyError(f"{source}: expected a Kubernetes NodeList (kubectl get nodes -o json)")
    members: dict[tuple[str, str, int], set[str]] = defaultdict(set)
    for node in items:
        meta = node.get("metadata", {}) if isinstance(node, dict) else {}
        name, labels = meta.get("name"), meta.get("labels") or {}
        if not isinstance(name, str) or not isinstance(labels, dict):
            continue
        for label, kind, lvl in K8S_LABELS:
            if isinstance(labels.get(label), str):
                members[(kind, labels[label], lvl)].add(name)
        for label, value in labels.items():
            if "rack" in label.lower() and isinstance(value, str):
                members[("rack", value, 0)].add(name)
    return Topology(source=f"kubernetes node labels {source}",
                    groups=[Group(kind=k, name=n, level=lvl, nodes=frozenset(hs))
                            for (k, n, lvl), hs in sorted(members.items())])


_SLURM = re.compile(r"^\s*switchname\s*=", re.I | re.M)


def load_topology(path: str | Path) -> Topology:
    """Read a topology file in any of the three forms; TopologyError says what is wrong."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise TopologyError(f"cannot read topology {p}: {exc.strerror or exc}") from None
    if _SLURM.search(text):
        return parse_slurm(text, p.name)
    try:
        data = json.loads(text) if text.lstrip().startswith(("{", "[")) else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise TopologyError(f"{p}: neither topology.conf, YAML nor JSON: {str(exc).splitlines()[0]}") from None
    if isinstance(data, dict) and (data.get("kind") == "NodeList" or isinstance(data.get("items"), list)):
        return parse_k8s_nodes(data, p.name)
    return parse_map(data, p.name)
