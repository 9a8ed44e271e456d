"""The built catalog kept on disk (rules/catalog_cache.py): a restored catalog diagnoses exactly
as a fresh build does, a change to what it was built from is another key, and a cache that is
corrupt, not ours or turned off means a build, never an error."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from firstfault.rules import catalog_cache
from firstfault.rules.bundle import open_bundle
from firstfault.rules.catalog import BUILTIN_CATALOG, _build, catalog_files, catalog_version
from firstfault.rules.engine import analyze_bundle
from firstfault.rules.prefilter import anchor_index, build_anchor_index
from firstfault.rules.regex import LinearRegex, _Pending

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = sorted(p for p in (ROOT / "samples").iterdir() if (p / "workload.json").exists())


def _counting_build(files, root, calls):
    def build():
        calls.append(root)
        return _build(files, root, strict=True)[0]
    return build


def _load(files, root, calls):
    return catalog_cache.load(catalog_version(files), root, _counting_build(files, root, calls))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    where = tmp_path / "cache"
    monkeypatch.setenv("FIRSTFAULT_CACHE_DIR", str(where))
    return where


def test_a_restored_catalog_diagnoses_byte_for_byte_as_a_fresh_build(cache):
    files = catalog_files(BUILTIN_CATALOG)
    calls: list[str] = []
    fresh = _load(files, str(BUILTIN_CATALOG), calls)
    restored = _load(files, str(BUILTIN_CATALOG), calls)
    assert calls == [str(BUILTIN_CATALOG)]                   # built once, then read back
    assert restored is not fresh and restored.version == fresh.version
    assert len(list(cache.glob("catalog-*.pickle"))) == 1
    assert len(SAMPLES) >= 5
    for sample in SAMPLES:
        a = analyze_bundle(open_bundle(sample), catalog=fresh).diagnosis.to_json()
        b = analyze_bundle(open_bundle(sample), catalog=restored).diagnosis.to_json()
        assert a == b, sample.name


def test_restored_regexes_compile_at_their_first_match_and_match_alike():
    rx = LinearRegex(r"NVRM: Xid \(PCI:(?P<pci>[0-9a-f:.]+)\): (?P<xid>\d+)", ignore_case=True)
    back = pickle.loads(pickle.dumps(rx))
    assert isinstance(back._rx, _Pending)
    line = "NVRM: xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
    assert back.search(line).groupdict() == rx.search(line).groupdict() == {"pci": "0000:3b:00", "xid": "79"}
    assert not isinstance(back._rx, _Pending)               # compiled, and in place for the next line
    assert back.search("nothing here") is None
    assert (back.digit_blind, back.groupindex) == (rx.digit_blind, rx.groupindex)


def test_the_restored_anchor_index_scans_as_the_built_one(cache):
    files = catalog_files(BUILTIN_CATALOG)
    calls: list[str] = []
    _load(files, str(BUILTIN_CATALOG), calls)
    restored = _load(files, str(BUILTIN_CATALOG), calls)
    pre, by_anchor = anchor_index(restored)                 # the one kept with it, not built again
    built, built_by_anchor = build_anchor_index(restored)
    assert [[p.id for p in ps] for ps in by_anchor] == [[p.id for p in ps] for ps in built_by_anchor]
    chunk = b"".join(ex.line.encode() + b"\n" for p in restored.patterns for ex in p.match_examples)
    assert pre.scan(chunk) == built.scan(chunk) and pre.scan(chunk)


def test_a_changed_overlay_is_another_key(cache, tmp_path):
    overlay = tmp_path / "overlay" / "extract"
    overlay.mkdir(parents=True)
    rule = (BUILTIN_CATALOG / "extract").glob("*.yaml").__next__()
    (overlay / rule.name).write_bytes(rule.read_bytes())
    calls: list[str] = []
    root = str(tmp_path / "overlay")
    _load(catalog_files(BUILTIN_CATALOG, tmp_path / "overlay"), root, calls)
    _load(catalog_files(BUILTIN_CATALOG, tmp_path / "overlay"), root, calls)
    assert len(calls) == 1
    (overlay / rule.name).write_bytes(rule.read_bytes() + b"\n# an edit\n")
    _load(catalog_files(BUILTIN_CATALOG, tmp_path / "overlay"), root, calls)
    assert len(calls) == 2
    assert len(list(cache.glob("catalog-*.pickle"))) == 2


def test_a_corrupt_foreign_writable_or_disabled_cache_means_a_build(cache, monkeypatch):
    files = catalog_files(BUILTIN_CATALOG)
    root = str(BUILTIN_CATALOG)
    calls: list[str] = []
    _load(files, root, calls)
    (entry,) = cache.glob("catalog-*.pickle")
    entry.write_bytes(b"not a pickle")
    _load(files, root, calls)
    assert len(calls) == 2                                  # corrupt: built, and written again
    os.chmod(entry, 0o666)                                  # anyone may write it: never unpickled
    _load(files, root, calls)
    assert len(calls) == 3
    os.chmod(entry, 0o600)
    os.chmod(cache, 0o777)                                  # nor from a directory anyone may write
    _load(files, root, calls)
    assert len(calls) == 4
    os.chmod(cache, 0o700)
    _load(files, root, calls)
    assert len(calls) == 4
    monkeypatch.setenv("FIRSTFAULT_CACHE_DIR", "off")
    _load(files, root, calls)
    assert len(calls) == 5


def test_analyze_prints_the_same_with_a_cold_and_a_warm_cache(tmp_path):
    env = {**os.environ, "FIRSTFAULT_CACHE_DIR": str(tmp_path / "cache")}
    sample = ROOT / "samples" / "worked-example"
    runs = [subprocess.run([sys.executable, "-m", "firstfault", "analyze", str(sample), "--json"],
                           capture_output=True, text=True, env=env, check=True).stdout for _ in range(2)]
    assert runs[0] == runs[1] and '"root_cause"' in runs[0]
    assert len(list((tmp_path / "cache").glob("catalog-*.pickle"))) == 1


def test_analyze_loads_neither_the_stream_stack_nor_yaml_once_the_catalog_is_kept(tmp_path):
    """Start-up: `analyze` imports only the engine. The stream, service and connector stacks (and the
    YAML parser, once the built catalog is on disk) stay unloaded, whatever the machine's speed."""
    log = tmp_path / "job.log"
    log.write_text("2024-05-01T10:00:00 rank 0: step 1 loss 2.31\n")
    probe = ("import sys, io, contextlib\n"
             "from firstfault.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             f"    code = main(['analyze', {str(log)!r}])\n"
             "print(code, ' '.join(sorted(sys.modules)))\n")
    env = {**os.environ, "FIRSTFAULT_CACHE_DIR": str(tmp_path / "cache")}
    for run in ("cold", "warm"):
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True).stdout
        code, loaded = out.split(" ", 1)
        modules = set(loaded.split())
        assert code == "0"
        assert "firstfault.rules.engine" in modules
        heavy = {m for m in modules if m.split(".")[0] in ("confluent_kafka", "faust", "fastapi", "starlette", "redis",
                                                          "uvicorn", "fastavro")
                 or m.startswith(("firstfault.streams.", "firstfault.connectors."))}
        assert not heavy, f"{run}: analyze imported {sorted(heavy)}"
    assert "yaml" not in modules                          # warm: the catalog came from the cache


def test_a_wrong_argument_is_reported_with_the_whole_command_line(capsys):
    """The command line built for one command (start-up) leaves its errors to the whole one:
    the usage still names every command."""
    from firstfault.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["ship", "bundle", "--bogus"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --bogus" in err
    assert "up,topology,diagnoses,replay,nodes,rules" in err
