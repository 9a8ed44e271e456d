"""The diagnosis object (contract section 2)."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .events import FieldValue, Ref

Status = Literal["attributed", "ambiguous", "unattributed", "no_failure"]
TerminalState = Literal[
    "completed", "failed", "timeout", "cancelled", "node_fail", "preempted",
    "out_of_memory", "boot_fail", "deadline", "unknown",
]
RecoveryAction = Literal["none", "retry", "retry_excluding_nodes", "drain_nodes", "notify_owner"]

_STRICT = ConfigDict(extra="forbid")


class RootCause(BaseModel):
    model_config = _STRICT

    kind: str
    domain: str
    sub_domain: str
    host: str | None
    gpu: str | int | None = Field(description="GPU index where known, else its PCI bus id")
    rank: int | None
    timestamp: str | None = Field(description="UTC ISO-8601 stamp of the line, null when unknown")
    onset: str | None = Field(description="estimated UTC onset, corrected for the host's clock offset")
    time_basis: str = Field(default="stamped", description="stamped | uptime | inherited (a lower bound: the "
                            "stamped line above) | line_order (no time: placed by its place in its file)")
    fields: dict[str, FieldValue]
    ref: Ref
    text: str
    message: str = Field(description="one human sentence from the rule's output template")


class Symptom(BaseModel):
    model_config = _STRICT

    kind: str
    count: int
    hosts: list[str]
    ranks: list[int]
    first: str | None
    last: str | None
    sample: Ref
    explained: bool = Field(description="a causal edge from the root cause covers it")
    first_basis: str | None = Field(default=None, description="how first is known: stamped | uptime | inherited (a "
                                    "lower bound: its line has no stamp, the stamped line above); null when first is")


class EvidenceStep(BaseModel):
    model_config = _STRICT

    rule_id: str
    stage: Literal["early", "final"]
    action: str
    count: int = Field(description="how many events the step touched")
    events: list[Ref] = Field(description="up to ten of them, in line order")
    detail: dict[str, Any] = Field(default_factory=dict)


class ExplainsEdge(BaseModel):
    model_config = _STRICT

    rule_id: str
    join: str
    source: Ref
    target: str = Field(description="the symptom group (kind) the root explains")
    count: int


class Candidate(BaseModel):
    model_config = _STRICT

    domain: str
    sub_domain: str
    nodes: list[str]
    coverage: float
    evidence: list[Ref]
    message: str
    onset: str | None = Field(default=None, description="UTC stamp of the candidate's first event, when it has one")


class MissingEvidence(BaseModel):
    model_config = _STRICT

    kind: str = Field(description="syslog | app_log | boot_time | metrics | scheduler")
    detail: str
    hosts: list[str] = Field(default_factory=list)
    ranks: list[int] = Field(default_factory=list)


class Recovery(BaseModel):
    model_config = _STRICT

    action: RecoveryAction
    nodes: list[str]
    reason: str = Field(default="", description="why this action: the cause, the vendor's resolution, the guard that applied")
    next_step: str = Field(default="", description="one sentence: what a person should do next")


class Diagnosis(BaseModel):
    """One workload attempt's diagnosis. Serialize with :func:`to_json` for byte-stable output."""

    model_config = _STRICT

    workload_id: str
    attempt: int
    terminal_state: TerminalState
    status: Status
    domain: str
    sub_domain: str
    root_cause: RootCause | None
    responsible_nodes: list[str]
    suspect_nodes: list[str]
    candidates: list[Candidate]
    symptoms: list[Symptom]
    evidence: list[EvidenceStep]
    explains: list[ExplainsEdge]
    symptom_coverage: float
    missing_evidence: list[MissingEvidence]
    recovery: Recovery
    rules_version: str
    diagnosis_id: str
    summary: str = Field(default="", description="one or two sentences a person reads first")
    revision: int | None = Field(default=None, description="stream only")
    provisional: bool | None = Field(default=None, description="stream only")

    def to_dict(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        for key in ("revision", "provisional"):
            if data[key] is None:
                del data[key]
        return data

    def to_json(self) -> str:
        """``json.dumps(self.to_dict(), sort_keys=True, ensure_ascii=False, indent=2)``."""
        from .pretty_json import dumps_sorted_indented

        return dumps_sorted_indented(self.to_dict())
