"""The fleet memory over HTTP: GET /v1/nodes (a page of nodes) and GET /v1/nodes/{node}, and what the pages share.

The record is the one the stream's node-health worker, ``firstfault nodes --rebuild`` and this
service's own POST /v1/analyze keep in Redis; the service holds a fleet state kept current
from its changelog (``FleetMemory``), judged at the clock's now. The policy is
FIRSTFAULT_AVOID_*, the topology FIRSTFAULT_TOPOLOGY (parsed once, and again when the file
changes, so an edited file counts without a restart; a file that cannot be read is a note).
"""
from __future__ import annotations

import os
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from firstfault.connectors.sinks.node_health import topology_from_env
from firstfault.rules.fleet import BroadEvent, FleetReport, NodeView, Policy, SharedCause, Topology

from .context import ServiceContext
from .errors import ApiError, responses

PAGE = 100                  # nodes per page unless asked otherwise
NodeLimit = Annotated[int, Query(ge=1, le=1000, description="nodes per page")]
NodeCursor = Annotated[str | None, Query(max_length=256, description="next_cursor of the previous page")]


class NodeReport(BaseModel):
    """GET /v1/nodes/{node}: one node's record and recommendation, and the broad events and
    shared causes it is part of."""

    at: str | None
    node: NodeView
    broad_events: list[BroadEvent]
    shared_causes: list[SharedCause]
    policy: Policy
    notes: list[str] = Field(default_factory=list)


class NodesPage(FleetReport):
    """GET /v1/nodes: a page of nodes (by name), with every broad event and shared cause."""

    next_cursor: str | None = Field(default=None, description="pass as cursor for the next page; null: the last")


def _settings(ctx: ServiceContext) -> tuple[Policy, Topology | None, list[str]]:
    """A bad policy variable is a 500 with its name; a topology file that cannot be read is a
    note, and the report goes on without it."""
    try:
        policy = Policy.from_env(os.environ)
    except ValueError as exc:
        raise ApiError(500, "bad_policy", f"FIRSTFAULT_AVOID_* is invalid: {' '.join(str(exc).split())[:300]}") from None
    try:
        return policy, topology_from_env(), []
    except ValueError as exc:
        return policy, None, [f"topology not used: {exc}"]


def build_report(ctx: ServiceContext, cursor: str | None = None, limit: int = PAGE) -> tuple[dict[str, Any], str | None]:
    """A page of the fleet report (JSON-ready: a FleetReport's fields) and the next page's
    cursor (blocking: call it in a thread)."""
    policy, topology, notes = _settings(ctx)
    report, nxt = ctx.fleet.report_data(policy, topology, after=cursor, limit=limit)
    report["notes"] = notes + report["notes"]
    return report, nxt


def node_report(ctx: ServiceContext, host: str) -> NodeReport:
    """One node (blocking: call it in a thread)."""
    policy, topology, notes = _settings(ctx)
    report, view = ctx.fleet.node(policy, host, topology)
    return NodeReport(at=report.at, node=view, policy=report.policy, notes=notes + report.notes,
                      broad_events=[b for b in report.broad_events if host in b.nodes],
                      shared_causes=[c for c in report.shared_causes if host in c.nodes])


def build_fleet_router(ctx: ServiceContext) -> APIRouter:
    router = APIRouter()
    read = Depends(ctx.auth.dependency("read"))

    @router.get("/v1/nodes", tags=["nodes"], dependencies=[read], response_model=NodesPage,
                summary="Nodes' failure episodes, recommendation (avoid, watch, ok) and why, a page at a time",
                description="The node-avoid policy (FIRSTFAULT_AVOID_*, NVIDIA FACT's numbers by default) over "
                            "the fleet memory, judged now: a page of nodes by name (`limit`, then `cursor` = the "
                            "previous page's `next_cursor`), with the broad events and the switches or racks they "
                            "share.",
                responses=responses(401, 403, 422, 503))
    async def nodes(limit: NodeLimit = PAGE, cursor: NodeCursor = None) -> JSONResponse:
        report, nxt = await ctx.in_thread(build_report, ctx, cursor or None, limit)
        return JSONResponse({**report, "next_cursor": nxt})

    @router.get("/v1/nodes/{node}", tags=["nodes"], dependencies=[read], response_model=NodeReport,
                summary="One node's episodes, recommendation and why (ok when nothing is recorded)",
                responses=responses(401, 403, 422, 503))
    async def node(node: Annotated[str, Path(min_length=1, max_length=256)]) -> JSONResponse:
        one = await ctx.in_thread(node_report, ctx, node)
        return JSONResponse(one.model_dump(mode="json"))

    return router
