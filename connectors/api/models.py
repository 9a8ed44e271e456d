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


class DiagnosisPage(BaseModel):
    items: list[Diagnosis] = Field(description="newest first")
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null on the last")


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
