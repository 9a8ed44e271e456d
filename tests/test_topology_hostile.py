"""Topology files under hostile input: capped per file, never a traceback.

Each file here once ended in a MemoryError, a RecursionError, an AttributeError or a hang
(issue 22, item 2). Now each is one line: `firstfault nodes` exits 2, the service answers
its report with a note, and the service parses a file once and again only when it changes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from firstfault.connectors import topology_map
from firstfault.connectors.api.app import create_app
from firstfault.connectors.api.settings import ServiceSettings
from firstfault.connectors.topology_map import MAX_DEPTH, TopologyError, cached_topology, load_topology

ROOT = Path(__file__).resolve().parents[1]


def nodes_cli(topology: Path | str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTFAULT_")}
    return subprocess.run([sys.executable, "-m", "firstfault", "nodes", "--topology", str(topology)],
                          env={**clean, **env}, cwd=ROOT, capture_output=True, text=True, timeout=120)


def one_line_exit_2(run: subprocess.CompletedProcess, *words: str) -> None:
    assert run.returncode == 2, (run.returncode, run.stderr[-2000:])
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr[-2000:]
    assert len(run.stderr) < 1000, run.stderr[:300]
    for w in words:
        assert w in run.stderr, run.stderr


# ---------------------------------------------------------------- the hostile files

def many_big_hostlists(tmp_path: Path) -> Path:
    """7 KB of topology.conf, each line a 131,072-host hostlist: billions of names if believed."""
    f = tmp_path / "topology.conf"
    f.write_text("".join(f"SwitchName=s{i} Nodes=n[000000-131071]\n" for i in range(200)))
    assert f.stat().st_size < 8_000
    return f


def alias_bomb(tmp_path: Path, uses: int = 1000) -> Path:
    """10.9 KB of YAML: one anchored hostlist reused a thousand times."""
    f = tmp_path / "racks.yaml"
    f.write_text("racks:\n  r0: &h n[000000-131071]\n" + "".join(f"  r{i}: *h\n" for i in range(1, uses)))
    return f


def switch_chain(tmp_path: Path, levels: int = 3000) -> Path:
    f = tmp_path / "chain.conf"
    f.write_text("SwitchName=s0 Nodes=n[1-4]\n" + "".join(f"SwitchName=s{i} Switches=s{i - 1}\n"
                                                          for i in range(1, levels)))
    return f


def deep_yaml(tmp_path: Path, depth: int = 100_000) -> Path:
    f = tmp_path / "deep.yaml"
    f.write_text("racks: " + "[" * depth + "]" * depth + "\n")
    return f


def deep_json(tmp_path: Path, depth: int = 100_000) -> Path:
    f = tmp_path / "deep.json"
    f.write_text("[" * depth + "]" * depth)
    return f


def fifo(tmp_path: Path) -> Path:
    f = tmp_path / "topology.yaml"
    os.mkfifo(f)
    return f


@pytest.mark.parametrize("make, words", [
    (many_big_hostlists, ("FIRSTFAULT_TOPOLOGY_MAX_NAMES",)),
    (alias_bomb, ("aliases",)),
    (switch_chain, (f"more than {MAX_DEPTH} levels",)),
    (deep_yaml, ("nest",)),             # libyaml's own cap (1,000 flow levels) or ours, whichever is first
    (lambda tmp_path: deep_yaml(tmp_path, 500), (f"more than {MAX_DEPTH} levels",)),
    (deep_json, ("nested too deeply",)),
    (fifo, ("a FIFO",)),
    (lambda tmp_path: Path("/dev/zero"), ("character device",)),
    (lambda tmp_path: tmp_path, ("directory",)),
], ids=["7kb-conf", "alias-bomb", "switch-chain-3000", "yaml-100k-deep", "yaml-500-deep", "json-100k-deep", "fifo", "dev-zero",
        "directory"])
def test_each_hostile_topology_is_one_line_and_exit_2(tmp_path, make, words):
    path = make(tmp_path)
    with pytest.raises(TopologyError) as err:
        load_topology(path)
    assert "\n" not in str(err.value) and len(str(err.value)) < 600
    for w in words:
        assert w in str(err.value)
    one_line_exit_2(nodes_cli(path), *words)


def test_aliases_within_the_cap_still_count_every_use_against_the_names(tmp_path):
    f = alias_bomb(tmp_path, uses=200)            # under the alias cap; 200 x 131,072 names if believed
    with pytest.raises(TopologyError, match="FIRSTFAULT_TOPOLOGY_MAX_NAMES"):
        load_topology(f)
    small = tmp_path / "small.yaml"
    small.write_text("racks:\n  r1: &h [a1, a2]\n  r2: *h\n")
    assert {g.name: sorted(g.nodes) for g in load_topology(small).groups} == {"r1": ["a1", "a2"], "r2": ["a1", "a2"]}


def test_the_caps_are_settings(tmp_path):
    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=leaf1 Nodes=node[01-40]\nSwitchName=spine Switches=leaf1\n")
    assert len(load_topology(conf).groups) == 2
    with pytest.raises(TopologyError, match="more than 50 node names"):
        load_topology(conf, env={"FIRSTFAULT_TOPOLOGY_MAX_NAMES": "50"})       # 40 + leaf1's 40 + ...
    with pytest.raises(TopologyError, match=r"more than 20 \(FIRSTFAULT_TOPOLOGY_MAX_BYTES\)"):
        load_topology(conf, env={"FIRSTFAULT_TOPOLOGY_MAX_BYTES": "20"})
    one_line_exit_2(nodes_cli(conf, FIRSTFAULT_TOPOLOGY_MAX_BYTES="20"), "FIRSTFAULT_TOPOLOGY_MAX_BYTES")
    with pytest.raises(TopologyError, match="FIRSTFAULT_TOPOLOGY_MAX_NAMES: not a whole number"):
        load_topology(conf, env={"FIRSTFAULT_TOPOLOGY_MAX_NAMES": "lots"})


def test_a_fifo_does_not_hang_the_reader(tmp_path):
    path = fifo(tmp_path)
    done: list[BaseException] = []
    t = threading.Thread(target=lambda: done.append(pytest.raises(TopologyError, load_topology, path).value),
                         daemon=True)
    t.start()
    t.join(30)
    if t.is_alive():                      # unblock the reader before failing
        with open(path, "w"):
            pass
        pytest.fail("reading a FIFO topology blocked")
    assert "FIFO" in str(done[0])


def test_a_nodelist_with_null_metadata_reads_the_other_nodes(tmp_path):
    f = tmp_path / "nodes.json"
    f.write_text(json.dumps({"kind": "NodeList", "items": [
        {"metadata": None}, None, {"metadata": []}, {"metadata": {"name": "n0", "labels": None}},
        {"metadata": {"name": "n1", "labels": {"network.topology.nvidia.com/block": "b1", "my-rack": "r9"}}}]}))
    t = load_topology(f)
    assert {(g.kind, g.name): sorted(g.nodes) for g in t.groups} == {("switch", "b1"): ["n1"], ("rack", "r9"): ["n1"]}


def test_a_map_with_keys_of_mixed_types_is_read(tmp_path):
    f = tmp_path / "mixed.yaml"
    f.write_text("racks:\n  1: [a]\n  r2: [b]\n7: {x: [c]}\n")
    assert {(g.kind, g.name) for g in load_topology(f).groups} == {("rack", "1"), ("rack", "r2"), ("7", "x")}


def test_a_switch_cycle_is_named(tmp_path):
    f = tmp_path / "cycle.conf"
    f.write_text("SwitchName=a Switches=b\nSwitchName=b Switches=a Nodes=n1\n")
    with pytest.raises(TopologyError, match="its own ancestor"):
        load_topology(f)


# ---------------------------------------------------------------- parsed once, reloaded on change

def test_the_service_parses_a_file_once_and_again_when_it_changes(tmp_path, monkeypatch):
    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=leaf1 Nodes=node[01-04]\n")
    parses = []
    real = topology_map._load
    monkeypatch.setattr(topology_map, "_load", lambda *a, **k: parses.append(1) or real(*a, **k))
    first = cached_topology(conf)
    assert cached_topology(conf) is first and cached_topology(str(conf)) is first and len(parses) == 1
    conf.write_text("SwitchName=leaf1 Nodes=node[01-08]\nSwitchName=leaf2 Nodes=node[09-10]\n")
    second = cached_topology(conf)
    assert len(parses) == 2 and {g.name for g in second.groups} == {"leaf1", "leaf2"}
    # A bad file is remembered as bad, not parsed again on every call.
    conf.write_text("SwitchName=s1 Nodes=n[3-1]\n")
    for _ in range(3):
        with pytest.raises(TopologyError, match="start after end"):
            cached_topology(conf)
    assert len(parses) == 3


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_the_service_reports_without_a_hostile_topology_and_says_why(tmp_path, monkeypatch):
    bomb = many_big_hostlists(tmp_path)
    monkeypatch.setenv("FIRSTFAULT_TOPOLOGY", str(bomb))
    app = create_app(ServiceSettings())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        for path in ("/v1/nodes", "/v1/nodes/node-01", "/ui/nodes"):
            r = await c.get(path)
            assert r.status_code == 200, (path, r.status_code, r.text[:300])
        notes = (await c.get("/v1/nodes")).json()["notes"]
    assert any(n.startswith("topology not used:") and "FIRSTFAULT_TOPOLOGY_MAX_NAMES" in n for n in notes), notes
