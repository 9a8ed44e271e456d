"""The C RawLine decoder (schemas/_rawline.c) and the pure-Python one agree, record for record.

``codecs.raw_lines`` decodes the raw topic in C when the extension is built, in Python
otherwise (or with ``FIRSTFAULT_PURE_PYTHON=1``). Both must give the same RawLine, or both
None, and the same bytes for every value, hostile ones included: they come from a Kafka topic.
"""
from __future__ import annotations

import gc
import random
import shutil
import sys
import sysconfig
import tracemalloc
from datetime import datetime, timedelta, timezone
from itertools import product
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import SAMPLES
from firstfault.connectors.shipper import bundle_records
from firstfault.rules.errors import RecordError
from firstfault.schemas import RawLine
from firstfault.schemas.avro import encode
from firstfault.streams import codecs
from firstfault.streams.codecs import decode_raw

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
US = timedelta(microseconds=1)
MIN_TS = (datetime(1, 1, 1, tzinfo=timezone.utc) - EPOCH) // US        # datetime's first microsecond
MAX_TS = (datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc) - EPOCH) // US
HEAD = codecs._raw_head()


def _cannot_build() -> str | None:
    """Why this interpreter cannot compile the extension, or None when it can."""
    cc = (sysconfig.get_config_var("CC") or "").split()
    if not cc or shutil.which(cc[0]) is None:
        return f"no C compiler (sysconfig CC={sysconfig.get_config_var('CC')!r} is not on PATH)"
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").is_file():
        return f"no Python headers ({include / 'Python.h'} is missing)"
    return None


def _native():
    native = codecs._native_decoder()
    if native is None:
        pytest.skip("the C decoder is not built (test_the_extension_is_built_where_it_can_be says why)")
    return native


def same(values: list[bytes | None]) -> list[RawLine | None]:
    """Both decoders on one batch: equal records (or both None) and equal bytes; the records."""
    py_recs, py_texts = codecs._raw_lines_py(values)
    c_recs, c_texts = _native()(values, HEAD, RawLine)
    assert len(c_recs) == len(c_texts) == len(values)
    assert c_texts == py_texts
    for value, p, c in zip(values, py_recs, c_recs):
        if p is None:
            assert c is None, value
            continue
        assert type(c) is RawLine, value
        assert list(c.__dict__.items()) == list(p.__dict__.items()), value
        assert type(c.__pydantic_fields_set__) is set and c.__pydantic_fields_set__ == p.__pydantic_fields_set__
        assert c.__pydantic_extra__ is None and c.__pydantic_private__ is None
        assert c == p
        if c.ingest_ts is not None:
            assert c.ingest_ts.tzinfo is timezone.utc and c.ingest_ts.fold == 0
    return c_recs


# ---------------------------------------------------------------- a hand-made Avro writer
def varint(n: int, pad: int = 0) -> bytes:
    """Zig-zag varint of any int (past 64 bits too), with ``pad`` redundant zero groups."""
    u = 2 * n if n >= 0 else -2 * n - 1
    groups = []
    while True:
        groups.append(u & 0x7F)
        u >>= 7
        if not u:
            break
    groups += [0] * pad
    return bytes(g | 0x80 for g in groups[:-1]) + bytes(groups[-1:])


def blob(b: bytes, pad: int = 0) -> bytes:
    return varint(len(b), pad) + b


def opt(b: bytes | None) -> bytes:
    return b"\x00" if b is None else b"\x02" + blob(b)


def body(host: bytes | None, path: bytes, line: int, text: bytes, source: bytes | None = None,
         workload: bytes | None = None, ts: int | None = None) -> bytes:
    """A RawLine value with the fields as given, legal or not."""
    return (HEAD + opt(host) + blob(path) + varint(line) + blob(text) + opt(source) + opt(workload)
            + (b"\x00" if ts is None else b"\x02" + varint(ts)))


# ---------------------------------------------------------------- cases
def test_the_records_of_a_real_bundle():
    _, pairs = bundle_records(SAMPLES / "worked-example")
    values = [encode(r) for _, r in pairs]
    recs = same(values)
    assert recs == [r for _, r in pairs]
    assert any(r.ingest_ts for r in recs) and any(r.workload_id for r in recs)


def test_every_truncation_and_bit_flip_of_real_records():
    _, pairs = bundle_records(SAMPLES / "worked-example")
    picks = [r for _, r in pairs if r.ingest_ts is not None][:2] + [r for _, r in pairs if r.workload_id][:2]
    values = []
    for rec in picks:
        v = encode(rec)
        values += [v[:k] for k in range(len(v))]
        values += [v[:k] + bytes([v[k] ^ (1 << b)]) + v[k + 1:] for k in range(len(v)) for b in range(8)]
        values += [v + b"\x00", v + v]
    recs = same(values)
    assert any(r is None for r in recs) and any(r is not None for r in recs)


def test_every_null_combination():
    values = [body(host, b"logs/app/h.log", 7, b"x", source, wid, ts)
              for host, source, wid, ts in product((None, b"h"), (None, b"app"), (None, b"slurm-1"), (None, 10 ** 15))]
    assert all(same(values))


def test_text_bytes_that_are_not_utf8_survive():
    texts = [b"\xff\xfe", b"caf\xe9", b"\xed\xa0\x80", b"\xc3", b"ok \xe2\x98\x83", b"\x00\x80\xc0\xf8" * 50, b""]
    recs = same([body(b"h", b"logs/app/h.log", 1, t) for t in texts])
    assert [r.raw() for r in recs] == texts


def test_names_that_are_not_utf8_are_refused():
    bad = b"node-\xff"
    values = [body(bad, b"p", 1, b"x"), body(b"h", bad, 1, b"x"), body(b"h", b"p", 1, b"x", bad),
              body(b"h", b"p", 1, b"x", None, b"\xed\xa0\x80"), body("nœud".encode(), "chemin/é".encode(), 1, b"x")]
    assert [r is None for r in same(values)] == [True, True, True, True, False]


def test_line_numbers_at_the_edges_of_a_long():
    lines = [-(2 ** 63), -1, 0, 1, 63, 64, 8191, 8192, 2 ** 31, 2 ** 62, 2 ** 63 - 1]
    recs = same([body(None, b"p", n, b"x") for n in lines])
    assert [r and r.line for r in recs] == [None, None, None] + lines[3:]


def test_varints_past_ten_bytes_or_64_bits_are_refused():
    ok = HEAD + b"\x00" + blob(b"p") + varint(5, pad=9) + blob(b"x", pad=3) + b"\x00\x00\x00"   # 10 bytes: legal
    too_long = HEAD + b"\x00" + blob(b"p") + varint(5, pad=10) + blob(b"x") + b"\x00\x00\x00"
    past_64 = [body(None, b"p", n, b"x") for n in (2 ** 63, -(2 ** 63) - 1, 2 ** 70)]
    huge_len = HEAD + b"\x00" + varint(2 ** 62) + b"p" + varint(1) + blob(b"x") + b"\x00\x00\x00"
    neg_len = HEAD + b"\x00" + varint(-1) + b"p" + varint(1) + blob(b"x") + b"\x00\x00\x00"
    recs = same([ok, too_long, *past_64, huge_len, neg_len])
    assert recs[0] is not None and recs[0].line == 5 and recs[1:] == [None] * 6
    # A tenth byte past bit 63 would wrap to line 1 in 64-bit arithmetic: refused, every one of them.
    wraps = [HEAD + b"\x00" + blob(b"p") + b"\x82" + b"\x80" * 8 + bytes([b]) + blob(b"x") + b"\x00\x00\x00"
             for b in range(0x80)]
    assert [r and r.line for r in same(wraps)] == [1, 2 ** 62 + 1] + [None] * 126


def test_timestamps_at_the_edges_of_datetime():
    stamps = [MIN_TS - 1, MIN_TS, -1, 0, 1, 1_793_613_791_123_456, MAX_TS, MAX_TS + 1, -(2 ** 63), 2 ** 63 - 1]
    recs = same([body(b"h", b"p", 1, b"x", ts=n) for n in stamps])
    assert [r and r.ingest_ts for r in recs] == [None] + [EPOCH + n * US for n in stamps[1:7]] + [None] * 3


def test_decode_raw_refuses_longs_and_stamps_past_their_range_with_a_reason():
    """Both decoders read a long as 64 bits and a stamp as a datetime; past that it is a RecordError
    (dead letter), not an OverflowError, nor a line number no Avro writer can send on."""
    for value in (body(None, b"p", 2 ** 63 + 1, b"x"), body(None, b"p", 1, b"x", ts=MAX_TS + 1),
                  body(None, b"p", 1, b"x", ts=-(2 ** 63))):
        with pytest.raises(RecordError, match="corrupt RawLine"):
            decode_raw(value, None)


def test_timestamps_across_the_calendar():
    """Leap days, century years and year ends, a microsecond either side, and a spread of others."""
    days = [datetime(y, m, d, tzinfo=timezone.utc) for y in (1, 4, 100, 400, 1600, 1700, 1900, 1969, 1970, 2000,
                                                           2024, 2100, 2400, 9999) for m, d in ((1, 1), (2, 28), (3, 1))]
    stamps = [(day - EPOCH) // US + k for day in days for k in (-1, 0, 1)]
    rng = random.Random(7)
    stamps += [rng.randint(MIN_TS, MAX_TS) for _ in range(5000)]
    recs = same([body(None, b"p", 1, b"", ts=n) for n in stamps])
    assert [r and r.ingest_ts for r in recs] == [None] + [EPOCH + n * US for n in stamps[1:]]


def test_what_is_not_a_rawline_is_left_to_decode_raw():
    good = body(b"h", b"p", 1, b"x")
    values = [None, b"", HEAD, HEAD[:-1], b"{}", b"plain", good[:2] + b"\x00" * 8 + good[10:],
              good[:10] + b"\x04" + good[11:], good[:10] + b"\x01" + good[11:], good[:10] + b"\x80\x00" + good[11:],
              body(b"h", b"", 1, b"x"), good + b"\x00", good[:-1], good]
    assert [r is None for r in same(values)] == [True] * 13 + [False]


def test_repeated_names_in_a_batch():
    """Hosts and paths repeat from record to record: equal bytes, equal str; other bytes, another str."""
    names = [b"a", b"a", b"b", b"a", "é".encode(), "é".encode(), b"\xc3", b"\xc3\xa9", b"ab", b"a", b"", b"a"]
    values = [body(n, n or b"p", i + 1, n, n, n) for i, n in enumerate(names)]
    recs = same(values)
    assert [r and r.host for r in recs] == [n.decode() if n != b"\xc3" else None for n in names]


def test_the_values_must_be_bytes_or_none():
    with pytest.raises(TypeError, match="bytes or None"):
        _native()([body(b"h", b"p", 1, b"x"), "a str"], HEAD, RawLine)


def test_the_environment_can_force_the_python_decoder(monkeypatch):
    _native()
    monkeypatch.delenv("FIRSTFAULT_PURE_PYTHON", raising=False)
    calls = []
    python = codecs._raw_lines_py
    monkeypatch.setattr(codecs, "_raw_lines_py", lambda values: calls.append(values) or python(values))
    value = body(b"h", b"p", 1, b"x")
    codecs.raw_lines([value])
    assert calls == []
    monkeypatch.setenv("FIRSTFAULT_PURE_PYTHON", "1")
    assert codecs.raw_lines([value]) == python([value])
    assert calls == [[value]]


def test_without_the_extension_raw_lines_is_the_python_decoder(monkeypatch):
    import firstfault.schemas

    monkeypatch.setitem(sys.modules, "firstfault.schemas._rawline", None)      # import fails, as unbuilt
    monkeypatch.delattr(firstfault.schemas, "_rawline", raising=False)
    codecs._native_decoder.cache_clear()
    try:
        assert codecs._native_decoder() is None
        values = [body(b"h", b"p", 1, b"x"), None]
        assert codecs.raw_lines(values) == codecs._raw_lines_py(values)
    finally:
        codecs._native_decoder.cache_clear()


# ---------------------------------------------------------------- fuzz
# Mostly well-formed fields, so that most built records are RawLines until a mutation says otherwise.
names = st.text(max_size=12).map(lambda t: t.encode("utf-8", "surrogatepass"))
fields = st.one_of(st.none(), names, st.sampled_from([b"node-01", b"node-02", "nœud".encode(), b"", b"\xff"]),
                   st.binary(max_size=12))
longs = st.one_of(st.integers(-3, 300), st.integers(1, 2 ** 63 - 1), st.integers(-(2 ** 63), 2 ** 63 - 1),
                  st.integers(2 ** 63, 2 ** 65), st.integers(-(2 ** 65), 2 ** 65),
                  st.sampled_from([MIN_TS - 1, MIN_TS, MAX_TS, MAX_TS + 1]))
built = st.builds(body, fields, names, longs, st.binary(max_size=40), fields, fields, st.one_of(st.none(), longs))
lines = st.builds(
    RawLine, host=st.one_of(st.none(), st.text(min_size=1, max_size=12)), path=st.text(min_size=1, max_size=30),
    line=st.integers(1, 2 ** 63 - 1), text=st.binary(max_size=60).map(lambda b: b.decode("utf-8", "surrogateescape")),
    source=st.sampled_from([None, "app", "syslog"]), workload_id=st.one_of(st.none(), st.text(max_size=8)),
    ingest_ts=st.one_of(st.none(), st.datetimes(timezones=st.just(timezone.utc)))).map(encode)


@st.composite
def mutated(draw, values=st.one_of(built, lines)):
    v = draw(values)
    k = draw(st.integers(0, len(v)))
    how = draw(st.sampled_from(["keep", "truncate", "flip", "extend", "insert", "overwrite"]))
    if how == "truncate":
        return v[:k]
    if how == "flip" and k < len(v):
        return v[:k] + bytes([v[k] ^ (1 << draw(st.integers(0, 7)))]) + v[k + 1:]
    if how == "extend":
        return v + draw(st.binary(min_size=1, max_size=12))
    if how == "insert":
        return v[:k] + draw(st.binary(min_size=1, max_size=12)) + v[k:]
    if how == "overwrite" and k < len(v):
        return v[:k] + bytes([draw(st.integers(0, 255))]) + v[k + 1:]
    return v


batches = st.lists(st.one_of(mutated(), st.binary(max_size=40), st.binary(max_size=40).map(HEAD.__add__),
                             st.none()), min_size=1, max_size=8)


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches)
def test_fuzz_both_decoders_agree(values):
    same(values)


# ---------------------------------------------------------------- the build
def test_the_extension_is_built_where_it_can_be():
    """CI has a compiler: a decoder that silently fell back to Python must fail here."""
    why = _cannot_build()
    if why:
        pytest.skip(f"{why}: the optional C decoder cannot be built, the pure-Python one is in use")
    try:
        from firstfault.schemas import _rawline
    except ImportError as exc:
        pytest.fail(f"firstfault.schemas._rawline is not built ({exc}): pip install -e . compiles it")
    assert codecs._native_decoder() is _rawline.decode_many, \
        f"built but not used: its PLAN {_rawline.PLAN} is not schemas/avro/RawLine.avsc"
    so, src = Path(_rawline.__file__), Path(codecs.__file__).parents[1] / "schemas" / "_rawline.c"
    if so.parent == src.parent and (src.parents[1] / "pyproject.toml").is_file():   # built in the source tree
        assert so.stat().st_mtime >= src.stat().st_mtime, f"{so.name} is older than {src.name}: pip install -e ."


def test_the_eventbatch_reader_is_built_where_it_can_be():
    """The correlator's C reader (schemas/_eventbatch.c, tested in test_eventbatch_decode.py) builds
    with this one: where a compiler is, a silent fall back to fastavro must fail here too."""
    why = _cannot_build()
    if why:
        pytest.skip(f"{why}: the optional C reader cannot be built, fastavro is in use")
    from firstfault.schemas.avro import _native_eventbatch
    try:
        from firstfault.schemas import _eventbatch
    except ImportError as exc:
        pytest.fail(f"firstfault.schemas._eventbatch is not built ({exc}): pip install -e . compiles it")
    assert _native_eventbatch() is _eventbatch.read, "built but not used: its FINGERPRINT is not today's EventBatch"


def test_no_leaks_on_any_path():
    native = _native()

    class Refuses:                      # __new__ fails: the error path after a record was parsed
        def __new__(cls):
            raise RuntimeError("no")

    class NoDict:                       # setting __dict__ fails: the error path with the object built
        __slots__ = ()

    good = [body(b"h", b"p", n, b"x" * n, b"app", b"w", 10 ** 15 * n) for n in range(1, 40)]
    bad = [None, b"", good[0][:-1], good[0] + b"\x00", body(b"\xff", b"p", 1, b"x"), body(b"h", b"p", 1, b"x", ts=2 ** 62)]

    def once() -> None:
        native(good + bad + good, HEAD, RawLine)
        for cls, exc in ((Refuses, RuntimeError), (NoDict, (AttributeError, TypeError))):
            with pytest.raises(exc):
                native(bad + good, HEAD, cls)
        with pytest.raises(TypeError):
            native(good + [1], HEAD, RawLine)

    for _ in range(20):
        once()
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for _ in range(300):
            once()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, f"{grown} bytes kept after 300 rounds"

