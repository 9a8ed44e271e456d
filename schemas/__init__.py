"""The data contract: pydantic models for every record that crosses a boundary.

Models here are the single source of truth; the Avro schemas in ``avro/`` are kept
in step with them by a test (``tests/test_schemas.py``).
"""
from .workload import WorkloadRecord, normalize_terminal_state
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


# The records the shippers and the stream exchange (records.py) are imported at their first use:
# `firstfault analyze` reads none of them.
_RECORDS = frozenset({"DeadLetter", "RawLine", "SchedulerEvent", "SourceKind"})


def __getattr__(name: str) -> object:
    if name in _RECORDS:
        from . import records

        return getattr(records, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
