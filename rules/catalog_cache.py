"""The built catalog kept on disk between runs, keyed by what it was built from.

Building the catalog (YAML parsed, every rule checked, every regex compiled, the anchors'
Hyperscan database compiled) is most of what `firstfault analyze` of a small file costs.
A successful build is pickled to the user's cache directory under a key made of the catalog's
content hash (``rules_version``: every rule file, overlay included, and the Python rule
sources), the engine's own source and the interpreter; a change to any of them is another key,
so a stale build is never read. Restored regexes compile at their first use.

Where: ``FIRSTFAULT_CACHE_DIR``, else ``$XDG_CACHE_HOME/firstfault``, else ``~/.cache/firstfault``
(rules/yaml_cache.py's ``cache_root``); ``FIRSTFAULT_CACHE_DIR=off`` turns it off. A file is read only if this user owns it and nobody
else may write it or its directory (a pickle runs code when read). Anything wrong with the cache
(unwritable, corrupt, from another version) means a build, never an error.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .prefilter import AnchorIndex, build_anchor_index, keep_anchor_index
from .yaml_cache import cache_root

if TYPE_CHECKING:
    from .catalog import Catalog

ENGINE_DIR = Path(__file__).resolve().parent
KEEP = 8                 # newest cache files kept: a few catalogs (overlays, versions) side by side
FORMAT = 1


def _engine_digest() -> bytes:
    """The engine's source (what the pickled classes are and how a build reads the YAML)."""
    digest = hashlib.sha256()
    for path in sorted(ENGINE_DIR.glob("*.py")) + sorted((ENGINE_DIR / "decoders").glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.digest()


def cache_key(rules_version: str, root: str) -> str:
    digest = hashlib.sha256(f"{FORMAT}\0{rules_version}\0{root}\0{sys.version}\0".encode())
    digest.update(_engine_digest())
    return digest.hexdigest()[:32]


def _trusted_dir(directory: Path) -> bool:
    st = os.lstat(directory)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _trusted(path: Path) -> bool:
    """Ours and writable by nobody else: the file and the directory it is in."""
    st = os.lstat(path)
    return (_trusted_dir(path.parent) and stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _read(path: Path) -> tuple[Catalog, AnchorIndex] | None:
    try:
        if not _trusted(path):
            return None
        with open(path, "rb") as fh:
            got = pickle.load(fh)
    except Exception:        # absent, unreadable, truncated, from another version: build instead
        return None
    if not (isinstance(got, tuple) and len(got) == 3 and got[0] == FORMAT):
        return None
    return got[1], got[2]


def _write(directory: Path, path: Path, catalog: Catalog, index: AnchorIndex) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not _trusted_dir(directory):
            return
        import tempfile     # only to write: not at start-up

        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".catalog-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                pickle.dump((FORMAT, catalog, index), fh, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)            # readers see the old file or the whole new one
        except BaseException:
            os.unlink(tmp)
            raise
        olds = sorted(directory.glob("catalog-*.pickle"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in olds[KEEP:]:
            old.unlink(missing_ok=True)
    except Exception:        # a read-only home, a full disk: the next run builds again
        return


def load(rules_version: str, root: str, build: Callable[[], Catalog]) -> Catalog:
    """The catalog ``build`` makes, from the cache when an identical build was kept there."""
    directory = cache_root()
    if directory is None:
        return build()
    path = directory / f"catalog-{cache_key(rules_version, root)}.pickle"
    got = _read(path)
    if got is not None:
        catalog, index = got
        keep_anchor_index(catalog, index)
        return catalog
    catalog = build()
    index = build_anchor_index(catalog)
    keep_anchor_index(catalog, index)
    _write(directory, path, catalog, index)
    return catalog
