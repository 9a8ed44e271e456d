"""Parsed catalog YAML kept on disk, keyed by each file's bytes: start-up without the YAML constructor.

Loading the catalog spent most of a small ``analyze``'s time building Python objects from YAML
(libyaml parses fast; the constructor is Python). A file's parse is a pure function of its bytes,
so it is stored as ``marshal`` data under the SHA-256 of those bytes in
``${FIRSTFAULT_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/firstfault}/yaml/``: a changed file is a new
key, an unchanged one is read back. Anything wrong with the cache (unwritable, corrupt, data marshal
cannot hold) falls back to parsing; ``FIRSTFAULT_CACHE_DIR=off`` turns it off.
"""
from __future__ import annotations

import hashlib
import marshal
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

_MAGIC = b"ffyaml1\n"


def cache_root(env: os._Environ | dict | None = None) -> Path | None:
    """firstfault's cache directory (this module's and rules/catalog_cache.py's), or None when off."""
    env = os.environ if env is None else env
    chosen = env.get("FIRSTFAULT_CACHE_DIR", "")
    if chosen.lower() == "off":
        return None
    if chosen:
        return Path(chosen)
    base = env.get("XDG_CACHE_HOME", "") or str(Path.home() / ".cache")
    return Path(base) / "firstfault"


def cache_dir(env: os._Environ | dict | None = None) -> Path | None:
    root = cache_root(env)
    return None if root is None else root / "yaml"


def load(text: bytes, parse: Callable[[str], Any], where: Path | None = None) -> Any:
    """``parse(text)``, from the cache when this exact text was parsed before (raises what parse raises)."""
    where = cache_dir() if where is None else where
    if where is None:
        return parse(text.decode("utf-8"))
    path = where / (hashlib.sha256(text).hexdigest() + ".marshal")
    try:
        blob = path.read_bytes()
        if blob.startswith(_MAGIC):
            return marshal.loads(blob[len(_MAGIC):])
    except (OSError, ValueError, EOFError, TypeError):
        pass
    doc = parse(text.decode("utf-8"))
    try:
        data = _MAGIC + marshal.dumps(doc)
        where.mkdir(parents=True, exist_ok=True)
        import tempfile     # only to write: not at start-up

        fd, tmp = tempfile.mkstemp(dir=where, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)                # atomic: a concurrent reader sees all of it or nothing
    except (OSError, ValueError):            # unwritable, or a value marshal cannot hold: parsed every time
        pass
    return doc
