"""The fleet memory over HTTP: GET /v1/nodes and GET /v1/nodes/{node}, and what the page shares.

The record is the one the stream's node-health worker, ``firstfault nodes --rebuild`` and this
service's own POST /v1/analyze keep in Redis; the policy is FIRSTFAULT_AVOID_*, the topology
FIRSTFAULT_TOPOLOGY (read on each request, so an edited file counts without a restart).
"""
from __future__ import annotations

import os
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Path
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from firstfault.connectors.sinks.node_health import NodeHealthStore, fleet_report, topology_from_env
from firstfault.rules.fleet import BroadEvent, FleetReport, NodeView, Policy, SharedCause

from .context import ServiceContext
from .errors import ApiError, responses


class NodeReport(BaseModel):
    """GET /v1/nodes/{node}: one node's record and recommendation, and the broad events and
    shared causes it is part of."""

    at: str | None
    node: NodeView
    broad_events: list[BroadEvent]
    shared_causes: list[SharedCause]
    policy: Policy
    notes: list[str] = Field(default_factory=list)


def build_report(ctx: ServiceContext, at: datetime | None = None) -> FleetReport:
    """The fleet report (blocking: call it in a thread). A bad policy variable is a 500 with
    its name; a topology file that cannot be read is a note, and the report goes on without it."""
    store = ctx.nodes or NodeHealthStore(None)
    try:
        policy = Policy.from_env(os.environ)
    except ValueError as exc:
        raise ApiError(500, "bad_policy", f"FIRSTFAULT_AVOID_* is invalid: {' '.join(str(exc).split())[:300]}") from None
    notes = []
    try:
        topology = topology_from_env()
    except ValueError as exc:
        topology, notes = None, [f"topology not used: {exc}"]
    report = fleet_report(store, policy, topology, at)
    report.notes = notes + report.notes
    return report


def node_report(report: FleetReport, host: str) -> NodeReport:
    view = next((n for n in report.nodes if n.host == host), None) or NodeView(
        host=host, recommendation="ok", why="no episode recorded for this node")
    return NodeReport(at=report.at, node=view, policy=report.policy, notes=report.notes,
                      broad_events=[b for b in report.broad_events if host in b.nodes],
                      shared_causes=[c for c in report.shared_causes if host in c.nodes])


def build_fleet_router(ctx: ServiceContext) -> APIRouter:
    router = APIRouter()
    read = Depends(ctx.auth.dependency("read"))

    @router.get("/v1/nodes", tags=["nodes"], dependencies=[read], response_model=FleetReport,
                summary="Every node's failure episodes, recommendation (avoid, watch, ok) and why",
                description="The node-avoid policy (FIRSTFAULT_AVOID_*, NVIDIA FACT's numbers by default) over "
                            "the fleet memory, with broad events and the switches or racks they share.",
                responses=responses(401, 403, 422, 503))
    async def nodes() -> JSONResponse:
        report = await ctx.in_thread(build_report, ctx)
        return JSONResponse(report.model_dump(mode="json"))

    @router.get("/v1/nodes/{node}", tags=["nodes"], dependencies=[read], response_model=NodeReport,
                summary="One node's episodes, recommendation and why (ok when nothing is recorded)",
                responses=responses(401, 403, 422, 503))
    async def node(node: Annotated[str, Path(min_length=1, max_length=256)]) -> JSONResponse:
        report = await ctx.in_thread(build_report, ctx)
        return JSONResponse(node_report(report, node).model_dump(mode="json"))

    return router

