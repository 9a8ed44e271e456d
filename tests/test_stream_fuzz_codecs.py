"""Property tests of the stream codecs (issue 10): arbitrary bytes in, a record or a RecordError out.

Never another exception: a codec that raises anything else would cost a worker more than
the one record. Whatever a codec accepts must also encode again (a RawLine the extractor
took but the Avro writer refuses was the ``firstfault ship`` crash). Time-bounded: each
property runs at most 200 examples, no deadline per example.
"""
from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings, strategies as st

from firstfault.rules.errors import RecordError
from firstfault.schemas import RawLine
from firstfault.schemas.avro import MAGIC, _parsed, decode, encode
from firstfault.streams.codecs import decode_batch, decode_raw, decode_scheduler

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FINGERPRINTS = {name: _parsed(name)[1] for name in ("RawLine", "SchedulerEvent", "EventBatch", "Event", "Diagnosis")}

header = st.tuples(st.sampled_from(["host", "path", "source", "line", "workload_id", "other"]),
                   st.one_of(st.none(), st.binary(max_size=40)))
# Bodies behind a real fingerprint: random bytes, and bytes that start like a plausible record.
avro_value = st.builds(lambda name, body: MAGIC + FINGERPRINTS[name] + body,
                       st.sampled_from(sorted(FINGERPRINTS)), st.binary(max_size=300))
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
                        st.floats(allow_nan=False), st.text(max_size=40))
json_doc = st.dictionaries(st.sampled_from(["log", "message", "msg", "host", "hostname", "path", "file", "line",
                                            "lineno", "source", "workload_id", "x"]),
                           json_scalar, max_size=8)
any_value = st.one_of(st.binary(max_size=400), avro_value,
                      json_doc.map(lambda d: json.dumps(d).encode()),
                      st.builds(lambda b: b"{" + b, st.binary(max_size=100)))


def _usable(rec: RawLine) -> None:
    """What the extractor does with a line must not raise either."""
    assert isinstance(rec, RawLine) and rec.line >= 1 and rec.path
    assert decode(encode(rec)).raw() == rec.raw()


@FAST
@given(any_value, st.one_of(st.none(), st.binary(max_size=30)), st.lists(header, max_size=4),
       st.one_of(st.none(), st.integers(min_value=-5, max_value=2 ** 64)))
def test_decode_raw_gives_a_line_or_a_record_error(value, key, headers, offset):
    try:
        rec = decode_raw(value, key, headers, offset)
    except RecordError as exc:
        assert str(exc)
        return
    _usable(rec)


@FAST
@given(st.binary(max_size=2000))
def test_any_bytes_in_a_line_travel_exactly(raw):
    rec = RawLine(host="n", path="logs/app/n.log", line=1, text=raw.decode("utf-8", "surrogateescape"))
    assert rec.raw() == raw
    got = decode(encode(rec))
    assert got == rec and got.raw() == raw
    plain = decode_raw(b"x" + raw, b"n", offset=0)             # the same bytes as a plain-text record
    assert plain.raw() == (b"x" + raw).rstrip(b"\r\n")


@FAST
@given(st.text(max_size=200))
def test_any_text_a_json_shipper_sends_becomes_a_line_that_encodes(text):
    # Lone surrogates too: JSON's "\\ud800" escapes decode to them.
    rec = decode_raw(json.dumps({"log": text, "host": "n"}).encode(), None, offset=3)
    _usable(rec)


@FAST
@given(st.one_of(st.binary(max_size=400), avro_value, json_doc.map(lambda d: json.dumps(d).encode())))
def test_decode_scheduler_and_batch_give_a_record_or_a_record_error(value):
    for codec in (decode_scheduler, decode_batch):
        try:
            codec(value)
        except RecordError as exc:
            assert str(exc)


@FAST
@given(st.one_of(st.binary(max_size=400), avro_value))
def test_avro_decode_gives_a_model_or_a_value_error(value):
    try:
        decode(value)
    except ValueError as exc:                 # pydantic's ValidationError is one
        assert str(exc)
