"""The parsed-YAML cache: the same documents as parsing, whatever state the cache is in."""
from __future__ import annotations

import yaml

from firstfault.rules import yaml_cache
from firstfault.rules.catalog import BUILTIN_CATALOG


def parse(text: str):
    return yaml.safe_load(text)


def test_cached_documents_equal_parsed_ones_and_a_changed_file_is_a_new_key(tmp_path):
    files = sorted(BUILTIN_CATALOG.rglob("*.yaml"))
    assert len(files) > 20
    for f in files:
        text = f.read_bytes()
        first = yaml_cache.load(text, parse, tmp_path)
        assert first == parse(text.decode()) == yaml_cache.load(text, parse, tmp_path)
    assert len(list(tmp_path.glob("*.marshal"))) == len({f.read_bytes() for f in files})
    calls = []
    assert yaml_cache.load(b"a: 1\n", lambda t: calls.append(t) or parse(t), tmp_path) == {"a": 1}
    assert yaml_cache.load(b"a: 1\n", lambda t: calls.append(t) or parse(t), tmp_path) == {"a": 1}
    assert yaml_cache.load(b"a: 2\n", lambda t: calls.append(t) or parse(t), tmp_path) == {"a": 2}
    assert calls == ["a: 1\n", "a: 2\n"]                   # parsed once per distinct text


def test_a_corrupt_or_unwritable_cache_falls_back_to_parsing(tmp_path):
    text = b"k: [1, 2]\n"
    yaml_cache.load(text, parse, tmp_path)
    (entry,) = tmp_path.glob("*.marshal")
    entry.write_bytes(b"garbage")
    assert yaml_cache.load(text, parse, tmp_path) == {"k": [1, 2]}
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    assert yaml_cache.load(text, parse, blocked / "sub") == {"k": [1, 2]}
    assert yaml_cache.load(b"d: 2026-01-01\n", parse, tmp_path) == parse("d: 2026-01-01\n")   # marshal cannot hold a date
    try:
        yaml_cache.load(b"a: [\n", parse, tmp_path)
    except yaml.YAMLError:
        pass
    else:
        raise AssertionError("a parse error must reach the caller")


def test_off_and_where(tmp_path):
    assert yaml_cache.cache_dir({"FIRSTFAULT_CACHE_DIR": "off"}) is None
    assert yaml_cache.cache_dir({"FIRSTFAULT_CACHE_DIR": str(tmp_path)}) == tmp_path / "yaml"
    assert yaml_cache.cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "firstfault" / "yaml"
