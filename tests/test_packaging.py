"""The package layout pyproject.toml declares: every folder of shipped data is a package of its own.

setuptools sees a data folder under a package as an importable (namespace) package; one left
out of ``packages`` costs a page of "Package would be ignored" warnings per folder on every
install (about 340 lines in a fresh clone's `scripts/test.sh`), and may stop being installed.
"""
from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _package_folders() -> dict[str, Path]:
    """Dotted name -> folder, for every folder under a declared package root."""
    out = {}
    for name, rel in _setuptools()["package-dir"].items():
        root = ROOT / rel
        for folder in [root, *(p for p in root.rglob("*") if p.is_dir() and "__pycache__" not in p.parts)]:
            out[".".join([name, *folder.relative_to(root).parts])] = folder
    return out


def test_every_shipped_data_file_lies_in_a_declared_package():
    conf = _setuptools()
    folders = _package_folders()
    shipped: dict[Path, str] = {}
    for name, globs in conf["package-data"].items():
        for g in globs:
            for f in folders[name].glob(g):
                shipped[f] = name
    assert {f.suffix for f in shipped} >= {".avsc", ".yaml", ".html", ".css", ".js"}
    by_folder = {folder: name for name, folder in folders.items()}
    undeclared = sorted({by_folder[f.parent] for f in shipped} - set(conf["packages"]))
    assert not undeclared, undeclared
    # ... and nothing the engine, the schemas or the pages read at run time is left out.
    for rel, pattern in (("schemas/avro", "*.avsc"), ("schemas/avro/compat", "*.avsc"), ("rules/catalog", "*/*.yaml"),
                         ("connectors/api/templates", "*.html"), ("connectors/api/static", "*")):
        assert set((ROOT / rel).glob(pattern)) <= set(shipped), rel
