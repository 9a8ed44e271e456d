"""Response models of the read routes. Diagnoses inside them are the contract object itself."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from firstfault.schemas import Diagnosis


class DiagnosisRecord(BaseModel):
    """GET /v1/diagnoses/{workload_id}: one attempt's latest diagnosis and its history."""

    workload_id: str
    attempt: int
    attempts: list[int] = Field(description="every stored attempt of the workload, highest first")
    diagnosis: Diagnosis = Field(description="the attempt's latest diagnosis")
    revisions: list[Diagnosis] = Field(description="the superseded diagnoses of the attempt, oldest first")


class DroppedBy(BaseModel):
    count: int = Field(description="dropped because more than max_diagnoses were stored")
    bytes: int = Field(description="dropped because the store held more than max_bytes")
    ttl: int = Field(description="dropped because their last write was more than ttl_days ago")


class RetentionStatus(BaseModel):
    """What the store keeps (FIRSTFAULT_STORE_MAX_DIAGNOSES, _MAX_BYTES, _TTL_DAYS) and what it dropped
    to keep to it, the oldest write first."""

    max_diagnoses: int
    max_bytes: int = Field(description="documents and kept lines, all attempts together")
    ttl_days: float = Field(description="0: no age limit")
    kept: int = Field(description="attempts stored now")
    bytes: int = Field(description="their documents and kept lines")
    oldest_kept_stored_at: str | None = Field(description="the last write of the oldest attempt kept")
    dropped: int = Field(description="attempts dropped so far")
    dropped_bytes: int
    dropped_by: DroppedBy
    last_dropped_at: str | None
    newest_dropped_stored_at: str | None = Field(description="the last write of the newest attempt dropped: "
                                                             "nothing stored after it was dropped")


class DiagnosisPage(BaseModel):
    items: list[Diagnosis] = Field(description="newest first")
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null on the last")
    retention: RetentionStatus = Field(description="what the store keeps, and what it dropped to keep to it")


class NodeDiagnosis(BaseModel):
    role: Literal["responsible", "suspect"] = Field(
        description="responsible: the diagnosis blamed the host; suspect: it implicated it without proof")
    diagnosis: Diagnosis


class NodeDiagnosisPage(BaseModel):
    host: str
    items: list[NodeDiagnosis] = Field(description="newest first")
    next_cursor: str | None


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ready", "not_ready"]
    checks: dict[str, bool] = Field(description="store (Redis, or the in-process fallback) and, when "
                                                "configured, kafka")
    store_backend: Literal["redis", "memory"]
    rules_version: str
