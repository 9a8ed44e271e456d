"""The extractor's batch decoder (codecs.raw_lines) says exactly what decode_raw says, record by record.

raw_lines decodes Avro RawLines in one pass and hands anything else back (None) for
decode_raw to decide: the same record, or the same refusal, either way.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone

from hypothesis import given, settings, strategies as st

from firstfault.rules.errors import RecordError
from firstfault.schemas import RawLine, SchedulerEvent, WorkloadRecord
from firstfault.schemas.avro import encode
from firstfault.streams.codecs import decode_raw, raw_lines

names = st.one_of(st.none(), st.text(min_size=1, max_size=40))
lines = st.builds(
    RawLine,
    host=names,
    path=st.text(min_size=1, max_size=80),
    line=st.one_of(st.integers(1, 200), st.integers(1, 2 ** 63 - 1)),
    text=st.binary(max_size=300).map(lambda b: b.decode("utf-8", "surrogateescape")),
    source=st.sampled_from([None, "app", "syslog", "fabricmanager", "scheduler", "metrics"]),
    workload_id=names,
    ingest_ts=st.one_of(st.none(), st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1),
                                                timezones=st.just(timezone.utc))),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(lines, min_size=1, max_size=20))
def test_same_records_as_decode_raw(recs):
    values = [encode(r) for r in recs]
    got, texts = raw_lines(values)
    for rec, value, one, text in zip(recs, values, got, texts):
        assert one is not None
        assert one == decode_raw(value, None) == rec
        assert text == rec.raw()


def test_varint_widths_and_long_texts():
    for n in (1, 63, 64, 127, 128, 8191, 8192, 1 << 20, 2 ** 62, 2 ** 63 - 1):
        rec = RawLine(host="h", path="logs/app/h.log", line=n, text="é\udcff" * (n % 5000))
        (one,), (text,) = raw_lines([encode(rec)])
        assert one == rec and text == rec.raw()


def _reason(value: bytes, key: bytes | None = b"node-1") -> str:
    try:
        decode_raw(value, key)
    except RecordError as exc:
        return str(exc)
    return ""


def test_anything_else_is_left_to_decode_raw():
    good = encode(RawLine(host="h", path="logs/app/h.log", line=3, text="x"))
    wl = WorkloadRecord.model_validate({"workload_id": "w", "state": "RUNNING", "start_time": "2026-01-01T00:00:00Z"})
    others = [
        json.dumps({"log": "hello", "host": "n1"}).encode(),        # a JSON shipper
        b"plain text line",                                         # kcat
        good[:-1],                                                  # truncated
        good + b"\x00",                                             # trailing bytes
        good[:2] + b"\x00" * 8 + good[10:],                         # unknown fingerprint
        encode(RawLine(host="h", path="logs/app/h.log", line=1, text="x"))[:10] + b"\x04",   # bad union branch
        encode(SchedulerEvent(type="start", workload=wl, ts=wl.start_time)),   # another record type
        b"",
        None,
    ]
    got, texts = raw_lines(others + [good])
    assert got[:-1] == [None] * len(others) and texts[:-1] == [None] * len(others)
    assert got[-1] == decode_raw(good, None)
    # Those the slow path refuses, it refuses with a reason (what the dead letter says).
    for value in others[2:7]:
        assert _reason(value)
