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

The caps are per file, whatever its form: a regular file of at most
FIRSTFAULT_TOPOLOGY_MAX_BYTES (read no further), at most FIRSTFAULT_TOPOLOGY_MAX_NAMES names
once every hostlist is expanded and every switch's nodes gathered (each group's membership
counts, so a hostlist reused through YAML aliases or a deep switch tree counts every time),
YAML or JSON nested at most :data:`MAX_DEPTH` deep with at most :data:`MAX_ALIASES` aliases,
switches nested at most :data:`MAX_DEPTH` levels. Past any of them the file is a
:class:`TopologyError` of one line, never a MemoryError or RecursionError.

:func:`cached_topology` reads a file once and again only when it changed (device, inode, size,
modification or change time): the service asks it on every request.
"""
from __future__ import annotations

import json
import os
import re
import stat
import threading
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from firstfault.rules.fleet import Group, Topology

from .hostlist import HostlistError, expand

MAX_NODES = 1 << 17                 # one hostlist expression
MAX_BYTES = 64 * 1024 * 1024        # FIRSTFAULT_TOPOLOGY_MAX_BYTES: one file
MAX_NAMES = 1 << 20                 # FIRSTFAULT_TOPOLOGY_MAX_NAMES: one file, every group's names together
MAX_DEPTH = 64                      # YAML/JSON nesting; switch levels in topology.conf
MAX_ALIASES = 256                   # YAML aliases (*name) in one file
BYTES_VARIABLE = "FIRSTFAULT_TOPOLOGY_MAX_BYTES"
NAMES_VARIABLE = "FIRSTFAULT_TOPOLOGY_MAX_NAMES"

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


def _short(value: Any, n: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= n else text[:n] + "…"


def _one_line(text: str, n: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n] + "…"


def _cap(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise TopologyError(f"{name}: not a whole number: {_short(raw)}") from None
    if value < 1:
        raise TopologyError(f"{name}: must be at least 1, got {value}")
    return value


class _Budget:
    """Names a file may still produce (FIRSTFAULT_TOPOLOGY_MAX_NAMES)."""

    def __init__(self, source: str, cap: int) -> None:
        self.source, self.cap, self.left = source, cap, cap

    def spend(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise TopologyError(f"{self.source}: more than {self.cap} node names once hostlists are expanded and "
                                f"switches gathered ({NAMES_VARIABLE}); is a hostlist or an alias repeated?")


def _hosts(value: Any, where: str, budget: _Budget) -> list[str]:
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise TopologyError(f"{where}: expected node names or a hostlist, got {_short(item)}")
        try:
            names = expand(item, limit=MAX_NODES)
        except HostlistError as exc:
            raise TopologyError(_one_line(f"{where}: {exc}")) from None
        budget.spend(max(1, len(names)))
        out += names
    return out


def parse_slurm(text: str, source: str = "topology.conf", budget: _Budget | None = None) -> Topology:
    budget = budget or _Budget(source, MAX_NAMES)
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
                raise TopologyError(f"{source}:{n}: expected Key=Value, got {_short(tok)}")
            params[key.lower()] = value
        name = params.get("switchname")
        if not name:
            if {"blockname", "blocksizes"} & params.keys():
                raise TopologyError(f"{source}:{n}: topology/block lines are not read; use a switch/rack YAML")
            raise TopologyError(f"{source}:{n}: a line without SwitchName=")
        budget.spend(1)
        if "nodes" in params:
            nodes[name] = _hosts(params["nodes"], f"{source}:{n}", budget)
        if "switches" in params:
            children[name] = _hosts(params["switches"], f"{source}:{n}", budget)
    if not nodes and not children:
        raise TopologyError(f"{source}: no SwitchName= line")
    level: dict[str, int] = {}
    under: dict[str, frozenset[str]] = {}

    # Depth first without recursion: a chain of thousands of switches is an error, not a RecursionError.
    for start in sorted(nodes.keys() | children.keys()):
        if start in level:
            continue
        path, on_path, todo = [start], {start}, [iter(children.get(start, ()))]
        while path:
            child = next(todo[-1], None)
            if child is None:
                sw = path.pop()
                todo.pop()
                on_path.discard(sw)
                kids = children.get(sw, ())
                level[sw] = max((level[c] + 1 for c in kids), default=0)
                members = set(nodes.get(sw, ()))
                for c in kids:
                    members |= under[c]
                budget.spend(len(members))
                under[sw] = frozenset(members)
                continue
            if child in on_path:
                raise TopologyError(f"{source}: switch {_short(child)} is its own ancestor")
            if child in level:
                continue
            if len(path) >= MAX_DEPTH:
                raise TopologyError(f"{source}: switches nested more than {MAX_DEPTH} levels deep "
                                    f"(below {_short(start)})")
            path.append(child)
            on_path.add(child)
            todo.append(iter(children.get(child, ())))
    return Topology(source=f"slurm topology.conf {source}",
                    groups=[Group(kind="switch", name=sw, level=level[sw], nodes=under[sw])
                            for sw in sorted(level) if under[sw]])


def parse_map(data: Any, source: str, budget: _Budget | None = None) -> Topology:
    budget = budget or _Budget(source, MAX_NAMES)
    if not isinstance(data, dict):
        raise TopologyError(f"{source}: expected a mapping of kind -> {{name: nodes}}")
    groups = []
    for key, entries in sorted(data.items(), key=lambda kv: str(kv[0])):
        kind = {"switches": "switch", "racks": "rack", "zones": "zone", "blocks": "block"}.get(str(key), str(key))
        if not isinstance(entries, dict):
            raise TopologyError(f"{source}: {_short(key)}: expected {{name: nodes}}")
        for name, value in sorted(entries.items(), key=lambda kv: str(kv[0])):
            budget.spend(1)
            groups.append(Group(kind=kind, name=str(name), level=0 if kind in ("switch", "rack", "block") else 1,
                                nodes=frozenset(_hosts(value, f"{source}: {_short(key, 40)}.{_short(name, 40)}",
                                                       budget))))
    return Topology(source=f"map {source}", groups=groups)


def parse_k8s_nodes(data: Any, source: str, budget: _Budget | None = None) -> Topology:
    budget = budget or _Budget(source, MAX_NAMES)
    items = data.get("items") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise TopologyError(f"{source}: expected a Kubernetes NodeList (kubectl get nodes -o json)")
    members: dict[tuple[str, str, int], set[str]] = defaultdict(set)
    for node in items:
        budget.spend(1)
        meta = node.get("metadata") if isinstance(node, dict) else None
        if not isinstance(meta, dict):          # `metadata: null`, a list...: not a node we can name
            continue
        name, labels = meta.get("name"), meta.get("labels") or {}
        if not isinstance(name, str) or not isinstance(labels, dict):
            continue
        for label, kind, lvl in K8S_LABELS:
            if isinstance(labels.get(label), str):
                budget.spend(1)
                members[(kind, labels[label], lvl)].add(name)
        for label, value in labels.items():
            if isinstance(label, str) and "rack" in label.lower() and isinstance(value, str):
                budget.spend(1)
                members[("rack", value, 0)].add(name)
    return Topology(source=f"kubernetes node labels {source}",
                    groups=[Group(kind=k, name=n, level=lvl, nodes=frozenset(hs))
                            for (k, n, lvl), hs in sorted(members.items())])


_SLURM = re.compile(r"^\s*switchname\s*=", re.I | re.M)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)      # libyaml's parser is a loop, not a recursion


def _check_yaml_shape(text: str, where: str) -> None:
    """Nesting depth and aliases counted on the event stream, before anything is built."""
    depth = aliases = 0
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise TopologyError(f"{where}: nested more than {MAX_DEPTH} levels deep")
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise TopologyError(f"{where}: more than {MAX_ALIASES} YAML aliases (*name); "
                                    f"write the hostlists out")


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """libyaml's reason and where, on one line ("exceeded maximum nesting depth, line 1, column 1007")."""
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if not problem:
        return _one_line(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    at = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return _one_line(f"{problem}{at}")


def _parse_structured(text: str, where: str) -> Any:
    try:
        if text.lstrip().startswith(("{", "[")):
            try:
                return json.loads(text)
            except RecursionError:
                raise TopologyError(f"{where}: nested too deeply") from None
            except ValueError:
                pass                             # not JSON after all: YAML flow style, read below
        _check_yaml_shape(text, where)
        return yaml.load(text, Loader=_LOADER)   # noqa: S506 (a safe loader)
    except yaml.YAMLError as exc:
        raise TopologyError(f"{where}: neither topology.conf, YAML nor JSON: {_yaml_problem(exc)}") from None
    except RecursionError:
        raise TopologyError(f"{where}: nested too deeply") from None


def _kind_of(mode: int) -> str:
    for test, word in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return word
    return "not a regular file"


FileKey = tuple[int, int, int, int, int]


def _key(st: os.stat_result) -> FileKey:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _read(p: Path, max_bytes: int) -> tuple[str, FileKey]:
    """The file's text, refused unless it is a regular file of at most ``max_bytes`` (checked before
    reading; a FIFO is opened without blocking and never read)."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise TopologyError(f"cannot read topology {p}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TopologyError(f"topology {p} is {_kind_of(st.st_mode)}, not a regular file")
        if st.st_size > max_bytes:
            raise TopologyError(f"topology {p} is {st.st_size} bytes, more than {max_bytes} ({BYTES_VARIABLE})")
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:                     # it grew while we read
            raise TopologyError(f"topology {p} is more than {max_bytes} bytes ({BYTES_VARIABLE})")
    except OSError as exc:
        raise TopologyError(f"cannot read topology {p}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", errors="replace"), _key(st)


def _load(path: str | Path, env: Mapping[str, str] | None = None) -> tuple[Topology, FileKey]:
    env = os.environ if env is None else env
    p = Path(path)
    max_bytes, max_names = _cap(env, BYTES_VARIABLE, MAX_BYTES), _cap(env, NAMES_VARIABLE, MAX_NAMES)
    text, key = _read(p, max_bytes)
    budget = _Budget(p.name, max_names)
    if _SLURM.search(text):
        return parse_slurm(text, p.name, budget), key
    data = _parse_structured(text, str(p))
    if isinstance(data, dict) and (data.get("kind") == "NodeList" or isinstance(data.get("items"), list)):
        return parse_k8s_nodes(data, p.name, budget), key
    return parse_map(data, p.name, budget), key


def load_topology(path: str | Path, env: Mapping[str, str] | None = None) -> Topology:
    """Read a topology file in any of the three forms; TopologyError says what is wrong, in one line."""
    try:
        return _load(path, env)[0]
    except (MemoryError, RecursionError) as exc:     # a last guard: the caps above should come first
        raise TopologyError(f"{path}: too big or too deep to read ({type(exc).__name__})") from None


_cache: dict[str, tuple[FileKey, Topology | str]] = {}
_cache_lock = threading.Lock()
_CACHE_FILES = 8


def cached_topology(path: str | Path, env: Mapping[str, str] | None = None) -> Topology:
    """:func:`load_topology`, parsed once per version of the file: a ``stat`` per call, and a new
    parse only when the file's device, inode, size, modification or change time moved. A file
    that could not be read is remembered too (the same error, without reading it again)."""
    env = os.environ if env is None else env
    name = str(path)
    try:
        now = _key(os.stat(name))
    except OSError as exc:
        raise TopologyError(f"cannot read topology {name}: {exc.strerror or exc}") from None
    caps = (env.get(BYTES_VARIABLE, ""), env.get(NAMES_VARIABLE, ""))
    with _cache_lock:
        hit = _cache.get(name)
    if hit is not None and hit[0] == (*now, *caps):
        if isinstance(hit[1], str):
            raise TopologyError(hit[1])
        return hit[1]
    try:
        topo, key = _load(name, env)
        entry: Topology | str = topo
    except TopologyError as exc:
        key, entry = now, str(exc)
    except (MemoryError, RecursionError) as exc:
        key, entry = now, f"{name}: too big or too deep to read ({type(exc).__name__})"
    with _cache_lock:
        if name not in _cache and len(_cache) >= _CACHE_FILES:
            _cache.pop(next(iter(_cache)))
        _cache[name] = ((*key, *caps), entry)       # type: ignore[assignment]
    if isinstance(entry, str):
        raise TopologyError(entry)
    return entry
