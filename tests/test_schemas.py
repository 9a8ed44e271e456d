"""The data contract: models, Avro schemas kept in step, validation errors that name the field."""
import json

import pytest

from firstfault.rules.bundle import parse_workload
from firstfault.rules.errors import BundleError
from firstfault.schemas import RawLine, WorkloadRecord, normalize_terminal_state
from firstfault.schemas.avro import AVRO_DIR, TOPIC_MODELS, avro_schema, decode, encode


@pytest.mark.parametrize("name", sorted(TOPIC_MODELS))
def test_committed_avsc_matches_the_model(name):
    committed = json.loads((AVRO_DIR / f"{name}.avsc").read_text())
    assert committed == avro_schema(TOPIC_MODELS[name]), (
        f"{name}.avsc drifted from the model: run python -m firstfault.schemas.avro")


def test_single_object_encoding_round_trip():
    line = RawLine(host="node-02", path="logs/syslog/node-02.log", line=118, text="Nov  2 10:03:11 node-02 kernel: x")
    blob = encode(line)
    assert blob[:2] == b"\xc3\x01" and len(blob) > 10
    assert decode(blob) == line


def test_decode_rejects_garbage_with_a_reason():
    with pytest.raises(ValueError, match="single-object"):
        decode(b"not avro at all")
    with pytest.raises(ValueError, match="fingerprint"):
        decode(b"\xc3\x01" + b"\x00" * 8 + b"x")


def test_workload_extra_keys_are_kept():
    wl = WorkloadRecord.model_validate({"workload_id": "a", "state": "FAILED", "start_time": "2026-11-02T09:58:00Z",
                                        "partition": "gpu", "user": "alice"})
    assert wl.model_extra == {"partition": "gpu", "user": "alice"}


@pytest.mark.parametrize("doc, field", [
    ({"state": "FAILED", "start_time": "2026-11-02T09:58:00Z"}, "workload_id"),
    ({"workload_id": "a", "state": "FAILED", "start_time": "yesterday"}, "start_time"),
    ({"workload_id": "a", "state": "FAILED", "start_time": "2026-11-02T09:58:00Z", "attempt": -1}, "attempt"),
    ({"workload_id": "a", "state": "FAILED", "start_time": "2026-11-02T09:58:00Z", "timezone": "Mars/Base"}, "timezone"),
])
def test_invalid_workload_names_the_field(doc, field):
    with pytest.raises(BundleError, match=f"field '{field}'"):
        parse_workload(json.dumps(doc))


@pytest.mark.parametrize("state, terminal", [
    ("COMPLETED", "completed"), ("FAILED", "failed"), ("TIMEOUT", "timeout"), ("CANCELLED by 1234", "cancelled"),
    ("NODE_FAIL", "node_fail"), ("PREEMPTED", "preempted"), ("OUT_OF_MEMORY", "out_of_memory"),
    ("BOOT_FAIL", "boot_fail"), ("DEADLINE", "deadline"), ("Failed/OOMKilled", "out_of_memory"),
    ("Succeeded", "completed"), ("Failed/Evicted", "failed"), ("Failed/DeadlineExceeded", "deadline"),
    ("weird", "unknown"),
])
def test_terminal_state_follows_the_scheduler(state, terminal):
    assert normalize_terminal_state(state) == terminal


def test_fast_rawline_decoder_agrees_with_fastavro():
    import io

    import fastavro

    from firstfault.schemas.avro import _flat, _parsed

    lines = [RawLine(host=None, path="logs/app/rank-3.log", line=1, text=""),
             RawLine(host="node-02", path="logs/syslog/node-02.log", line=123456789, text="é\u2603 " * 50,
                     source="syslog", workload_id="slurm-1", ingest_ts="2026-11-02T10:03:11.123456Z")]
    for line in lines:
        body = encode(line)[10:]
        assert _flat("RawLine")(body) == fastavro.schemaless_reader(io.BytesIO(body), _parsed("RawLine")[0], None)
        assert decode(encode(line)) == line
    with pytest.raises(ValueError, match="corrupt RawLine"):
        decode(encode(lines[1])[:-3])


def test_an_event_batch_an_older_extractor_wrote_still_decodes():
    """EventBatch gained metric_hosts; a batch an older extractor wrote (schema kept in
    avro/compat/) reads into today's model with the field empty, not into the dead-letter topic."""
    import io

    import fastavro
    from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

    from firstfault.schemas import EventBatch

    old = parse_schema(json.loads((AVRO_DIR / "compat" / "EventBatch.1.avsc").read_text()), _write_hint=False)
    fp = int(fingerprint(to_parsing_canonical_form(old), "CRC-64-AVRO"), 16).to_bytes(8, "little")
    now = encode(EventBatch(workload_id="w", attempt=1, events=[], paths=["logs/app/node-01.log"]))
    assert fp != now[2:10]                          # a different schema, not merely other defaults
    body = io.BytesIO()
    fastavro.schemaless_writer(body, old, {"workload_id": "w", "attempt": 1, "events": [],
                                           "paths": ["logs/app/node-01.log"]})
    got = decode(b"\xc3\x01" + fp + body.getvalue())
    assert got == EventBatch(workload_id="w", attempt=1, events=[], paths=["logs/app/node-01.log"], metric_hosts=[])
    assert decode(now).metric_hosts == []


def test_an_event_batch_written_before_batches_named_their_lines_still_decodes():
    """EventBatch gained line_files and lines (issue 26: a batch read twice adds nothing); one an
    older extractor wrote (avro/compat/EventBatch.2.avsc) reads with both empty: counted as delivered."""
    import io

    import fastavro
    from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

    from firstfault.schemas import EventBatch

    old = parse_schema(json.loads((AVRO_DIR / "compat" / "EventBatch.2.avsc").read_text()), _write_hint=False)
    fp = int(fingerprint(to_parsing_canonical_form(old), "CRC-64-AVRO"), 16).to_bytes(8, "little")
    now = EventBatch(workload_id="w", attempt=1, events=[], paths=["a.log"], metric_hosts=["n1"])
    assert fp != encode(now)[2:10]
    body = io.BytesIO()
    fastavro.schemaless_writer(body, old, {"workload_id": "w", "attempt": 1, "events": [], "paths": ["a.log"],
                                           "metric_hosts": ["n1"]})
    got = decode(b"\xc3\x01" + fp + body.getvalue())
    assert got == now and got.lines == [] and got.line_files == []


def test_a_batch_whose_lines_do_not_fit_its_events_is_refused():
    from pydantic import ValidationError

    from firstfault.schemas import Event, EventBatch, Ref

    ev = Event(kind="x", pattern="p", source="app", ref=Ref(path="a", line=1))
    assert EventBatch(workload_id="w", events=[ev], line_files=["a"], lines=[[0, 1, 3]]).lines == [[0, 1, 3]]
    for events, lines in (([], [[0, 1, 1]]), ([ev, ev], [[0, 1, 1]]), ([ev], [[0, 2, 1]]), ([ev], [[1, 1, 1]]),
                          ([ev], [[0, 1]]), ([ev], [[0, 0, 1]])):
        with pytest.raises(ValidationError):
            EventBatch(workload_id="w", events=events, line_files=["a"], lines=lines)


def test_a_diagnosis_written_before_candidates_had_an_onset_still_decodes():
    """Candidate gained ``onset`` (issue 13: candidates on the page's timeline); a diagnosis
    published with the schema before it (avro/compat/Diagnosis.2.avsc) reads with onset null."""
    import io

    import fastavro
    from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

    from firstfault.rules.engine import analyze_path

    d = analyze_path(AVRO_DIR.parent.parent / "samples" / "ambiguous-two-faults").diagnosis
    assert d.candidates and all(c.onset for c in d.candidates)
    old = parse_schema(json.loads((AVRO_DIR / "compat" / "Diagnosis.2.avsc").read_text()), _write_hint=False)
    fp = int(fingerprint(to_parsing_canonical_form(old), "CRC-64-AVRO"), 16).to_bytes(8, "little")
    blob = encode(d)
    assert fp != blob[2:10]
    now = parse_schema(json.loads((AVRO_DIR / "Diagnosis.avsc").read_text()), _write_hint=False)
    record = fastavro.schemaless_reader(io.BytesIO(blob[10:]), now)
    for c in record["candidates"]:
        del c["onset"]
    for s in record["symptoms"]:
        del s["first_basis"]            # Diagnosis.2 predates it too (Diagnosis.3)
    body = io.BytesIO()
    fastavro.schemaless_writer(body, old, record)
    got = decode(b"\xc3\x01" + fp + body.getvalue())
    assert got == d.model_copy(update={"candidates": [c.model_copy(update={"onset": None}) for c in d.candidates],
                                       "symptoms": [s.model_copy(update={"first_basis": None}) for s in d.symptoms]})


def test_a_diagnosis_written_before_symptoms_had_a_time_basis_still_decodes():
    """Symptom gained ``first_basis`` (issue 25: an inherited time is a lower bound, marked everywhere);
    a diagnosis published with the schema before it (avro/compat/Diagnosis.3.avsc) reads with it null."""
    import io

    import fastavro
    from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

    from firstfault.rules.engine import analyze_path

    d = analyze_path(AVRO_DIR.parent.parent / "samples" / "gpu-fell-off-bus-32node").diagnosis
    assert {s.first_basis for s in d.symptoms} == {"stamped", "inherited"}
    old = parse_schema(json.loads((AVRO_DIR / "compat" / "Diagnosis.3.avsc").read_text()), _write_hint=False)
    fp = int(fingerprint(to_parsing_canonical_form(old), "CRC-64-AVRO"), 16).to_bytes(8, "little")
    blob = encode(d)
    now = parse_schema(json.loads((AVRO_DIR / "Diagnosis.avsc").read_text()), _write_hint=False)
    record = fastavro.schemaless_reader(io.BytesIO(blob[10:]), now)
    for s in record["symptoms"]:
        del s["first_basis"]
    body = io.BytesIO()
    fastavro.schemaless_writer(body, old, record)
    got = decode(b"\xc3\x01" + fp + body.getvalue())
    assert got == d.model_copy(update={"symptoms": [s.model_copy(update={"first_basis": None}) for s in d.symptoms]})
