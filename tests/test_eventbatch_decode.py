"""The C EventBatch reader (schemas/_eventbatch.c) and fastavro agree, body for body.

``avro.decode`` reads EventBatch bodies in C when the extension is built and reads today's
schema, with fastavro otherwise (or with ``FIRSTFAULT_PURE_PYTHON=1``). For every body both
must give the same dict (same types, same key order), or both refuse it: the bodies come
from a Kafka topic, so hostile ones included.
"""
from __future__ import annotations

import io
import random
import struct
from datetime import datetime, timedelta, timezone

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from firstfault.schemas.avro import _native_eventbatch, _parsed, decode, encode
from firstfault.schemas.events import Event, EventBatch, GpuRef, Ref

try:
    from firstfault.schemas import _eventbatch
except ImportError:          # not built: no compiler, or not installed with pip install -e .
    _eventbatch = None

pytestmark = pytest.mark.skipif(_eventbatch is None, reason="the C EventBatch reader is not built (pip install -e .)")

PARSED, FP = _parsed("EventBatch")
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
US = timedelta(microseconds=1)
MIN_TS = (datetime(1, 1, 1, tzinfo=timezone.utc) - EPOCH) // US
MAX_TS = (datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc) - EPOCH) // US


def fast(body: bytes):
    """fastavro's dict, or the exception it raises."""
    try:
        return fastavro.schemaless_reader(io.BytesIO(body), PARSED)
    except Exception as exc:          # any type counts as refused
        return exc


def identical(a, b) -> bool:
    """Equal with the same types and key order; floats bit for bit (NaN payloads too)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(identical(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, datetime):
        return a == b and a.tzinfo is b.tzinfo is timezone.utc and a.fold == b.fold == 0
    return a == b


def same(body: bytes):
    """The C reader and fastavro on one body: both refuse, or identical dicts. The C result."""
    expected = fast(body)
    try:
        got = _eventbatch.read(body)
    except ValueError as exc:
        assert isinstance(expected, Exception), f"C refused ({exc}) what fastavro read: {body[:120]!r}"
        return None
    assert not isinstance(expected, Exception), f"C read what fastavro refused ({expected!r}): {body[:120]!r}"
    assert identical(got, expected), body[:120]
    return got


# ---------------------------------------------------------------- a hand-made Avro writer
def varint(n: int) -> bytes:
    u = 2 * n if n >= 0 else -2 * n - 1
    out = bytearray()
    while True:
        out.append(u & 0x7F)
        u >>= 7
        if not u:
            return bytes(out)
        out[-1] |= 0x80


def groups(gs: list[int]) -> bytes:
    """A varint of these 7-bit groups, as given (overlong ones too)."""
    return bytes(g | 0x80 for g in gs[:-1]) + bytes(gs[-1:])


def s(b: bytes) -> bytes:
    return varint(len(b)) + b


NULL = b"\x00"


def event(host=NULL, gpu=NULL, rank=NULL, stamp=NULL, last=NULL, onset=NULL, fields=NULL, ranks=NULL,
          kind=b"xid", text=b"t") -> bytes:
    return (s(kind) + s(b"nvidia-xid") + s(b"syslog") + host + gpu + rank + stamp + last + onset + s(b"exact")
            + fields + s(b"logs/a.log") + varint(3) + s(text) + varint(1) + ranks + s(b"sig"))


def batch(*events: bytes, paths=NULL, hosts=NULL, wid=b"w-1", files=NULL, lines=NULL) -> bytes:
    evs = (varint(len(events)) + b"".join(events) + NULL) if events else NULL
    return s(wid) + varint(2) + evs + paths + hosts + files + lines


def opt(value: bytes) -> bytes:
    return b"\x02" + value


# ---------------------------------------------------------------- real batches
def _events(rng: random.Random, n: int) -> list[Event]:
    out = []
    for i in range(n):
        fields = {"s": "é—漢字 ok", "i": rng.choice([0, -1, 7, 2 ** 63 - 1, -(2 ** 63), -123456789]),
                  "f": rng.choice([0.0, -0.0, 1.5, -2.25e300, 1e-310, float("inf")]), "t": True, "b": False,
                  "n": None, "e": "", f"k{i}": i}
        stamp = EPOCH + rng.randint(MIN_TS, MAX_TS) * US if i % 3 else None
        out.append(Event(
            kind=rng.choice(["xid", "nccl_timeout", "oom"]), pattern=f"p{i % 4}",
            source=rng.choice(["app", "syslog", "fabricmanager", "scheduler", "metrics"]),
            host=None if i % 4 == 0 else f"node-{i:02d}",
            gpu=[None, GpuRef(), GpuRef(pci="0000:3b:00.0"), GpuRef(index=3), GpuRef(pci="0000:af:00.0", index=-1)][i % 5],
            rank=None if i % 2 else rng.randint(-(2 ** 63), 2 ** 63 - 1), stamp=stamp,
            last_stamp=stamp and stamp + rng.randint(0, 10 ** 12) * US if stamp and stamp.year < 9999 else None,
            onset=EPOCH - rng.randint(0, 10 ** 15) * US if i % 5 == 1 else None,
            stamp_quality="exact", fields=dict(list(fields.items())[: i % 9]),
            ref=Ref(path=f"logs/app/rank{i}.log", line=rng.randint(1, 2 ** 63 - 1)),
            text="ünïcödé 🙂 " * (i % 3) + "x" * rng.randint(0, 300), count=rng.randint(1, 10 ** 6),
            ranks=sorted(rng.sample(range(-5, 5000), i % 7)), signature=f"sig-{i}"))
    return out


def real_batches() -> list[EventBatch]:
    rng = random.Random(11)
    return [
        EventBatch(workload_id="slurm-1", events=[]),
        EventBatch(workload_id="", attempt=-(2 ** 63), events=_events(rng, 1), paths=[], metric_hosts=["m"]),
        EventBatch(workload_id="wł-2", attempt=2 ** 63 - 1, events=_events(rng, 12), paths=["a", "ü/b", ""],
                   metric_hosts=["node-01", "node-02"]),
        EventBatch(workload_id="big", attempt=3, events=_events(rng, 400), paths=[f"logs/{i}" for i in range(50)]),
        EventBatch(workload_id="lines", events=_events(rng, 3), line_files=["n1\x1flogs/a.log", "ü"],
                   lines=[[0, 1, 1, 1, 7, 2 ** 62], [], [1, 3, 3]]),
    ]


def test_the_fingerprint_is_todays_eventbatch_schema():
    assert _eventbatch.FINGERPRINT == FP
    assert _native_eventbatch() is _eventbatch.read


def test_real_batches_read_as_fastavro_reads_them(monkeypatch):
    for b in real_batches():
        value = encode(b)
        got = same(value[10:])
        assert got is not None
        monkeypatch.delenv("FIRSTFAULT_PURE_PYTHON", raising=False)
        native = decode(value)
        monkeypatch.setenv("FIRSTFAULT_PURE_PYTHON", "1")
        python = decode(value)
        assert native == python == b
        assert native.model_dump() == python.model_dump()


def test_decode_uses_the_c_reader_unless_told_not_to(monkeypatch):
    value = encode(real_batches()[2])
    calls = []
    import firstfault.schemas.avro as avro
    monkeypatch.setattr(avro, "_native_eventbatch", lambda: lambda body: calls.append(body) or _eventbatch.read(body))
    monkeypatch.delenv("FIRSTFAULT_PURE_PYTHON", raising=False)
    decode(value)
    assert calls == [value[10:]]
    monkeypatch.setenv("FIRSTFAULT_PURE_PYTHON", "1")
    decode(value)
    assert len(calls) == 1


def test_without_the_extension_decode_uses_fastavro(monkeypatch):
    import sys

    import firstfault.schemas

    monkeypatch.setitem(sys.modules, "firstfault.schemas._eventbatch", None)     # import fails, as unbuilt
    monkeypatch.delattr(firstfault.schemas, "_eventbatch", raising=False)
    _native_eventbatch.cache_clear()
    try:
        assert _native_eventbatch() is None
        b = real_batches()[2]
        assert decode(encode(b)) == b
    finally:
        _native_eventbatch.cache_clear()


def test_corrupt_bodies_are_the_same_error_either_way(monkeypatch):
    value = encode(real_batches()[2])
    for bad in (value[:-40], value[:10] + s(b"\xff") + value[13:]):
        monkeypatch.delenv("FIRSTFAULT_PURE_PYTHON", raising=False)
        with pytest.raises(ValueError, match="corrupt EventBatch body"):
            decode(bad)
        monkeypatch.setenv("FIRSTFAULT_PURE_PYTHON", "1")
        with pytest.raises(ValueError, match="corrupt EventBatch body"):
            decode(bad)


# ---------------------------------------------------------------- fastavro's edges, one by one
def test_trailing_bytes_are_ignored():
    for tail in (b"", b"\x00", b"garbage", b"\xff" * 20):
        assert same(batch(event()) + tail) is not None


def test_union_indexes_are_python_list_indexes():
    """-1 is the last branch, -n the first; past that, or n and up, refused."""
    read = [same(batch(event(host=varint(i) + s(b"h")))) for i in (-1, 1, -3, 2, 5, 2 ** 62, -(2 ** 63))]
    assert [r["events"][0]["host"] for r in read[:2]] == ["h", "h"]
    assert read[2:] == [None] * 5
    assert same(batch(event(host=varint(-2))))["events"][0]["host"] is None
    for i in range(-7, 7):     # the fields map's five branches; each followed by a string-ish payload
        same(batch(event(fields=varint(1) + s(b"k") + varint(i) + s(b"v") + b"\x01" * 8 + NULL)))
        same(batch(event(gpu=varint(i) + varint(-1) + s(b"pci") + b"\x02" + varint(4))))
        same(batch(event(stamp=varint(i) + varint(5))))


def test_field_values_of_every_branch():
    def one(value: bytes):
        got = same(batch(event(fields=varint(1) + s(b"k") + value + NULL)))
        return got and got["events"][0]["fields"]["k"]
    assert one(varint(0)) is None
    assert one(varint(1) + s("ü".encode())) == "ü"
    assert one(varint(2) + varint(-(2 ** 63))) == -(2 ** 63)
    assert one(varint(3) + struct.pack("<d", -1.5)) == -1.5
    for bits in (0x7FF8000000000001, 0xFFF0000000000000, 1):       # a NaN payload, -inf, a denormal
        one(varint(3) + struct.pack("<Q", bits))
    assert one(varint(3) + b"\x00" * 7) is None                     # truncated double
    assert [one(varint(4) + bytes([b])) for b in (0, 1, 2, 0x80, 0xFF)] == [False, True, True, True, True]
    assert one(varint(4)) is None


def test_duplicate_map_keys_last_wins_in_first_place():
    got = same(batch(event(fields=varint(3) + s(b"a") + varint(1) + s(b"1") + s(b"b") + NULL + s(b"a") + varint(2)
                           + varint(7) + NULL)))
    assert list(got["events"][0]["fields"].items()) == [("a", 7), ("b", None)]


def test_timestamps_at_the_edges_of_datetime():
    stamps = [MIN_TS - 1, MIN_TS, -1, 0, 1, 1_793_613_791_123_456, MAX_TS, MAX_TS + 1, -(2 ** 63), 2 ** 63 - 1]
    got = [same(batch(event(stamp=opt(varint(n)), last=opt(varint(0)), onset=opt(varint(-5))))) for n in stamps]
    assert [g and g["events"][0]["stamp"] for g in got] == [None] + [EPOCH + n * US for n in stamps[1:7]] + [None] * 3


def test_timestamps_across_the_calendar():
    days = [datetime(y, m, d, tzinfo=timezone.utc) for y in (1, 4, 100, 400, 1600, 1900, 1969, 1970, 2000, 2024,
                                                           2100, 2400, 9999) for m, d in ((1, 1), (2, 28), (3, 1))]
    stamps = [(day - EPOCH) // US + k for day in days for k in (-1, 0, 1)]
    rng = random.Random(3)
    stamps += [rng.randint(MIN_TS, MAX_TS) for _ in range(2000)]
    evs = [event(stamp=opt(varint(n))) for n in stamps]
    got = same(batch(*evs))
    assert got is None        # the first stamp is a microsecond before year 1
    got = same(batch(*evs[1:]))
    assert [e["stamp"] for e in got["events"]] == [EPOCH + n * US for n in stamps[1:]]


def test_lengths_and_counts():
    ok = batch(event())
    cases = [
        varint(-1) + b"w" + ok[2:],                                  # negative string length
        varint(2 ** 62) + b"w" + ok[2:],                             # a length past the end
        s(b"w") + varint(2) + varint(2 ** 62) + event() + NULL + NULL + NULL,   # a count past what follows
        s(b"w") + varint(2) + varint(-(2 ** 62)) + varint(1) + event(),
        s(b"w") + varint(2) + NULL + varint(2 ** 62) + s(b"a"),
        s(b"w") + varint(2) + NULL + varint(-2) + varint(999) + s(b"a") + s(b"b") + NULL + NULL,   # size unused
        s(b"w") + varint(2) + NULL + varint(-2) + varint(-(2 ** 63)) + s(b"a") + s(b"b") + NULL + NULL,
        s(b"w") + varint(2) + varint(-(2 ** 63)) + varint(5) + NULL + NULL + NULL,      # INT64_MIN: no items
        s(b"w") + varint(2) + NULL + varint(-(2 ** 63)) + varint(5) + varint(1) + s(b"x") + NULL + NULL,
        s(b"w") + varint(2) + varint(1) + event() + varint(1) + event(kind=b"k2") + NULL + NULL + NULL,   # 2 blocks
        batch(event(ranks=varint(3) + varint(1) + varint(-2) + varint(2 ** 62) + varint(-1) + varint(9) + varint(-5) + NULL)),
        batch(event(ranks=varint(2 ** 62) + varint(1))),
        batch(event(fields=varint(2 ** 62) + s(b"k") + NULL)),
        batch(event(fields=varint(-1) + varint(3) + s(b"k") + NULL + NULL)),
    ]
    tail = NULL + NULL                   # line_files and lines, empty (what follows a body is ignored)
    got = [same(c + tail) for c in cases]
    assert [g is None for g in got] == [True] * 5 + [False] * 6 + [True, True, False]
    assert got[5]["paths"] == ["a", "b"] and got[8]["paths"] == ["x"] and len(got[9]["events"]) == 2


def test_strings_that_are_not_utf8_are_refused():
    for bad in (b"\xff", b"caf\xe9", b"\xed\xa0\x80", b"\xc3", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"ok\x80"):
        assert same(batch(event(kind=bad))) is None
        assert same(batch(event(text=bad))) is None
        assert same(batch(event(fields=varint(1) + s(bad) + NULL + NULL))) is None
        assert same(batch(wid=bad)) is None
    assert same(batch(event(kind="\x00é🙂".encode()))) is not None


def test_overlong_varints_wrap_as_fastavro_reads_them():
    """fastavro's read_long has no length limit: group k lands at bit 7k modulo 64."""
    for gs in ([2] + [0] * 9, [2] + [0] * 10, [0] * 9 + [1], [0] * 9 + [2], [0] * 9 + [0x7F], [0] * 10 + [1],
               [0] * 11 + [1], [0] * 19 + [1], [0x7F] * 30 + [3], [1] + [0x80 - 1] * 100 + [0]):
        got = same(s(b"w") + groups(gs) + NULL * 5)
        assert got is not None
        same(s(b"w") + groups(gs)[:-1])          # cut short: refused
    rng = random.Random(5)
    for _ in range(2000):
        gs = [rng.randrange(128) for _ in range(rng.randint(1, 25))]
        same(s(b"w") + groups(gs) + NULL * 5)
        same(batch(event(stamp=opt(groups(gs)), rank=opt(groups(gs)))))


def test_every_truncation_of_real_bodies():
    for b in real_batches()[:3]:
        body = encode(b)[10:]
        for k in range(len(body)):
            same(body[:k])


def test_random_byte_flips_of_real_bodies():
    rng = random.Random(17)
    bodies = [encode(b)[10:] for b in real_batches()[1:3]]
    read = 0
    for _ in range(4000):
        v = bytearray(rng.choice(bodies))
        for _ in range(rng.randint(1, 3)):
            k = rng.randrange(len(v))
            if rng.random() < 0.5:
                v[k] ^= 1 << rng.randrange(8)
            else:
                v[k] = rng.randrange(256)
        read += same(bytes(v)) is not None
    assert read > 100           # the comparison covered accepted bodies, not only refusals


def test_empty_and_tiny_bodies():
    for body in (b"", b"\x00", b"\x02", b"\x02w", b"\x02w\x02", b"\x00\x00\x00\x00\x00"):
        same(body)
    with pytest.raises(TypeError):
        _eventbatch.read("not bytes")
    assert _eventbatch.read(memoryview(batch(event()))) == fast(batch(event()))


# ---------------------------------------------------------------- fuzz
longs = st.one_of(st.integers(-3, 300), st.integers(-(2 ** 63), 2 ** 63 - 1), st.sampled_from([MIN_TS, MAX_TS]))
raw_long = st.one_of(longs.map(varint), st.lists(st.integers(0, 127), min_size=1, max_size=14).map(groups))
text = st.one_of(st.text(max_size=8).map(lambda t: t.encode("utf-8", "surrogatepass")), st.binary(max_size=6))
string = st.one_of(text.map(s), st.tuples(longs, text).map(lambda t: varint(t[0]) + t[1]))
branch = st.one_of(st.sampled_from([0, 1]), st.integers(-6, 6)).map(varint)
optional = st.one_of(st.just(NULL), st.tuples(branch, raw_long).map(b"".join), st.tuples(branch, string).map(b"".join))
value = st.tuples(branch, st.one_of(string, raw_long, st.binary(min_size=8, max_size=8), st.binary(max_size=2))
                  ).map(b"".join)
count = st.one_of(st.integers(-3, 3).map(varint), st.sampled_from([varint(2 ** 62), varint(-(2 ** 63))]))
fields_map = st.one_of(st.just(NULL), st.tuples(count, st.binary(max_size=4), st.lists(st.tuples(string, value)
                       .map(b"".join), max_size=4).map(b"".join), st.sampled_from([NULL, b""])).map(b"".join))
ranks_arr = st.one_of(st.just(NULL), st.tuples(count, st.lists(raw_long, max_size=4).map(b"".join),
                                               st.sampled_from([NULL, b""])).map(b"".join))
gpu = st.one_of(st.just(NULL), st.tuples(branch, optional, optional).map(b"".join))
events = st.builds(event, optional, gpu, optional, optional, optional, optional, fields_map, ranks_arr,
                   text, text)
lines_arr = st.one_of(st.just(NULL), st.tuples(count, st.lists(ranks_arr, max_size=3).map(b"".join),
                                               st.sampled_from([NULL, b""])).map(b"".join))
strings_arr = st.one_of(st.just(NULL), st.lists(string, max_size=3).map(lambda xs: varint(len(xs)) + b"".join(xs)
                                                                      + (NULL if xs else b"")))
bodies = st.one_of(
    st.builds(lambda evs, paths, hosts, wid, files, lines: batch(*evs, paths=paths, hosts=hosts, wid=wid,
                                                                 files=files, lines=lines),
              st.lists(events, max_size=3), st.one_of(st.just(NULL), ranks_arr), strings_arr, text,
              strings_arr, lines_arr),
    st.builds(lambda b: encode(b)[10:], st.sampled_from(real_batches())),
)


@st.composite
def mutated(draw):
    v = draw(bodies)
    k = draw(st.integers(0, len(v)))
    how = draw(st.sampled_from(["keep", "truncate", "flip", "insert", "overwrite", "extend"]))
    if how == "truncate":
        return v[:k]
    if how == "flip" and k < len(v):
        return v[:k] + bytes([v[k] ^ (1 << draw(st.integers(0, 7)))]) + v[k + 1:]
    if how == "insert":
        return v[:k] + draw(st.binary(min_size=1, max_size=10)) + v[k:]
    if how == "overwrite" and k < len(v):
        return v[:k] + bytes([draw(st.integers(0, 255))]) + v[k + 1:]
    if how == "extend":
        return v + draw(st.binary(min_size=1, max_size=10))
    return v


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.one_of(mutated(), st.binary(max_size=200)))
def test_fuzz_c_and_fastavro_agree(body):
    same(body)


def test_no_leaks_on_any_path():
    import gc
    import tracemalloc

    good = [encode(b)[10:] for b in real_batches()[1:3]]
    bad = [g[:k] for g in good for k in range(0, len(g), 37)] + [batch(event(kind=b"\xff")),
                                                                  batch(event(stamp=opt(varint(2 ** 62))))]

    def once() -> None:
        for body in good + bad:
            try:
                _eventbatch.read(body)
            except ValueError:
                pass

    for _ in range(5):
        once()
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for _ in range(50):
            once()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, f"{grown} bytes kept after 50 rounds"
