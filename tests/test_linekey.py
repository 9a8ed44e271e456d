"""rules/_linekey.c against the pure-Python code it stands in for: the same answers, and every
reference it hands out its own (a reference lost or kept crashes the interpreter later, or leaks)."""
import gc
import random
import sys
from datetime import datetime, timezone

import pytest

from firstfault.rules import extract, prefixes
from firstfault.rules.prefixes import Head, StampContext, read_head, read_head_keyed

CTX = StampContext(zone=timezone.utc, anchor=datetime(2026, 11, 2, 10, tzinfo=timezone.utc))
NCCL = "2488: gpu-312:122947:123263 [0] proxy.cc:1143 NCCL WARN Socket recv failed for opId=0x7f018ec0a720"


def _compiled():
    if extract._newlines_c is None or prefixes._head_hit is None:
        pytest.fail("firstfault.rules._linekey is not built: pip install -e . compiles it")


def test_newlines_is_bytes_count():
    _compiled()
    rng = random.Random(11)
    blocks = [b"", b"\n", b"a", b"\n\n\n", b"x" * 5000, b"\n" * 5000, (b"line\n" * 1000) + b"tail"]
    blocks += [bytes(rng.choice(b"\nab\r\x00\xff") for _ in range(rng.randint(0, 9000))) for _ in range(200)]
    for data in blocks:
        n = len(data)
        bounds = [(0, n), (0, 0), (n, n), (-3, n), (2, -1), (5, 3), (-10 ** 9, 10 ** 9), (n + 5, n + 9)]
        bounds += [tuple(sorted((rng.randint(0, n), rng.randint(0, n)))) for _ in range(5)]
        for start, end in bounds:
            assert extract._newlines_c(data, start, end) == data.count(b"\n", start, end), (start, end)
            assert extract._newlines(data, start, end) == data.count(b"\n", start, end)


def test_newlines_refuses_what_is_not_bytes():
    _compiled()
    for args in [("a\n", 0, 1), (bytearray(b"\n"), 0, 1), (b"\n", 0), (b"\n", "0", 1)]:
        with pytest.raises(TypeError):
            extract._newlines_c(*args)


def test_newlines_keeps_its_references():
    _compiled()
    data = b"a\nb\n" * 100
    start, end = 10 ** 6, 10 ** 6 + 1           # not small ints: their counts move
    gc.collect()
    before = sys.getrefcount(data), sys.getrefcount(start), sys.getrefcount(end)
    for _ in range(20_000):
        extract._newlines_c(data, 0, len(data))
        extract._newlines_c(data, start, end)
    gc.collect()
    assert (sys.getrefcount(data), sys.getrefcount(start), sys.getrefcount(end)) == before


def test_a_remembered_head_gives_its_message_keys():
    """head_hit's remembered head and its message's UTF-8 and key: what the Python path gives."""
    _compiled()
    read_head(NCCL, CTX)
    read_head(NCCL, CTX)                        # its chain and its head remembered
    hit = prefixes._head_hit(NCCL, CTX, prefixes._CHAINS, Head, 1024)
    assert len(hit) == 3
    head, data, zeroed = hit
    assert head.message == "proxy.cc:1143 NCCL WARN Socket recv failed for opId=0x7f018ec0a720"
    assert data == head.message.encode() and zeroed == prefixes._line_keys(data)[0]
    line = NCCL.encode()
    assert prefixes._line_keys(line)[0].endswith(zeroed)
    # the Python path (no C): the same head, message bytes and key
    saved = prefixes._head_hit
    try:
        prefixes._head_hit = None
        assert read_head_keyed(NCCL, CTX) == hit
    finally:
        prefixes._head_hit = saved
    assert read_head_keyed(NCCL, CTX) == hit
    assert read_head_keyed("caf\u00e9 NCCL WARN x", CTX)[1:] == (None, None)     # not ASCII: no keys


def test_head_hit_keeps_its_references():
    _compiled()
    read_head(NCCL, CTX)
    read_head(NCCL, CTX)
    chains = dict(prefixes._CHAINS)
    other = "2488: gpu-999:122947:123263 [0] proxy.cc:1143 NCCL WARN Socket recv failed for opId=0x7f018ec0a720"
    lines = [NCCL, other, "a line no chain was learnt for 0x7f00ec0a720", "no digits at all"]
    for line in lines:
        prefixes._head_hit(line, CTX, chains, Head, 1024)
    watched = [CTX, None, chains, *lines, *chains.values()]
    gc.collect()
    before = [sys.getrefcount(x) for x in watched]
    for _ in range(5_000):
        for line in lines:
            prefixes._head_hit(line, CTX, chains, Head, 1024)
    gc.collect()
    after = [sys.getrefcount(x) for x in watched]
    assert all(abs(a - b) <= 2 for a, b in zip(after, before)), (before, after)


def test_group_bytes_is_the_python_slices():
    """group_bytes: each indexed span's bytes (None for an unset group), as extract._group_bytes slices them."""
    if extract._group_bytes_c is None:
        pytest.fail("firstfault.rules._linekey is not built: pip install -e . compiles it")
    rng = random.Random(24)
    for _ in range(2000):
        data = bytes(rng.choice(b"ab0x \xc3\xa9") for _ in range(rng.randint(0, 60)))
        n = len(data)
        spans = [(rng.randint(-1, n + 3), rng.randint(-1, n + 3)) for _ in range(rng.randint(1, 8))]
        spans += [(-1, -1)]
        for container in (list, tuple):
            indices = tuple(rng.randrange(len(spans)) for _ in range(rng.randint(0, 5)))
            got = extract._group_bytes_c(data, container(spans), indices)
            assert got == extract._group_bytes(data, spans, indices), (data, spans, indices)
            assert type(got) is tuple
    # a real match's spans: the looked-up groups a plan keys its lines' facts by
    data = b"Got completion from peer 10.0.49.1<41925> with error 12"
    spans = [(0, len(data)), (25, 34), (35, 40), (-1, -1), (53, 55)]
    assert extract._group_bytes_c(data, spans, (1, 3, 4)) == (b"10.0.49.1", None, b"12")
    assert extract._group_bytes_c(data, spans, ()) == ()


def test_group_bytes_refuses_what_it_cannot_read():
    if extract._group_bytes_c is None:
        pytest.fail("firstfault.rules._linekey is not built: pip install -e . compiles it")
    bad = [("ab", [(0, 1)], (0,)), (b"ab", [(0, 1)], [0]), (b"ab", {0: (0, 1)}, (0,)), (b"ab", [(0, 1)], (5,)),
           (b"ab", [(0, 1, 2)], (0,)), (b"ab", [[0, 1]], (0,)), (b"ab", [(0, 1)], ("0",)), (b"ab", [("0", 1)], (0,)),
           (b"ab", [(0, 1)])]
    for args in bad:
        with pytest.raises((TypeError, IndexError)):
            extract._group_bytes_c(*args)


def test_group_bytes_keeps_its_references():
    if extract._group_bytes_c is None:
        pytest.fail("firstfault.rules._linekey is not built: pip install -e . compiles it")
    data = b"x" * 50
    big = 10 ** 6                                   # not small ints: their counts move
    spans = [(0, 50), (3, big), (-1, -1), (big, big + 1)]
    indices = (0, 1, 2, 3, 1)
    gc.collect()
    watched = [data, spans, indices, *spans, big, None]
    before = [sys.getrefcount(x) for x in watched]
    for _ in range(20_000):
        extract._group_bytes_c(data, spans, indices)
        try:
            extract._group_bytes_c(data, spans, (0, 9))
        except IndexError:
            pass
    gc.collect()
    after = [sys.getrefcount(x) for x in watched]
    assert all(abs(a - b) <= 2 for a, b in zip(after, before)), (before, after)


def test_head_hit_builds_the_head_its_type_would():
    """A remembered head goes straight into Head's slots (no __init__ a line): equal to Head(...), its
    values the remembered ones (shared, their counts kept); any other callable is called as before."""
    _compiled()
    read_head(NCCL, CTX)
    read_head(NCCL, CTX)
    chains = dict(prefixes._CHAINS)
    head, _, _ = prefixes._head_hit(NCCL, CTX, chains, Head, 1024)
    assert type(head) is Head and head == Head("proxy.cc:1143 NCCL WARN Socket recv failed for opId=0x7f018ec0a720",
                                               None, "none", "gpu-312", 2488, None, 122947, 0, None)
    seen = next(v for _, heads in chains.values() for v in heads.values() if v[3] == "gpu-312")
    gc.collect()
    before = [sys.getrefcount(x) for x in seen]
    made = [prefixes._head_hit(NCCL, CTX, chains, Head, 1024)[0] for _ in range(1000)]
    during = [sys.getrefcount(x) for x in seen]
    assert all(m.host is seen[3] and m.pid is seen[6] for m in made)
    del made
    gc.collect()
    after = [sys.getrefcount(x) for x in seen]
    assert all(abs(a - b) <= 2 for a, b in zip(after, before)), (before, after)
    assert during[3] >= before[3] + 1000            # each head holds its own reference to the host

    calls = []

    def not_slotted(*args):
        calls.append(args)
        return Head(*args)
    assert prefixes._head_hit(NCCL, CTX, chains, not_slotted, 1024)[0] == head
    assert len(calls) == 1 and calls[0][3] == "gpu-312"
    # and Head again after another callable (the layout is learnt again)
    assert prefixes._head_hit(NCCL, CTX, chains, Head, 1024)[0] == head
