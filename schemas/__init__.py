"""The data contract: pydantic models for every record that crosses a boundary.

Models here are the single source of truth; the Avro schemas in ``avro/`` are kept
in step with them by a test (``tests/test_schemas.py``).
"""
from .workload import WorkloadRecord, normalize_terminal_state
from .records import DeadLetter, RawLine, SchedulerEvent, SourceKind
from .events import Event, EventBatch, GpuRef, Ref
from .diagnosis import (
    Candidate,
    Diagnosis,
    EvidenceStep,
    ExplainsEdge,
    MissingEvidence,
    Recovery,
    RootCause,
    Symptom,
)

__all__ = [
    "Candidate", "DeadLetter", "Diagnosis", "Event", "EventBatch", "EvidenceStep", "ExplainsEdge", "GpuRef",
    "MissingEvidence", "RawLine", "Recovery", "Ref", "RootCause", "SchedulerEvent",
    "SourceKind", "Symptom", "WorkloadRecord", "normalize_terminal_state",
]
