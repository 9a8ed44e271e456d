"""Enrichment: what the scheduler knows and where the blamed nodes sit, around a diagnosis.

The contract's diagnosis object stays as it is; sinks get an :class:`EnrichedDiagnosis`
wrapper ``{diagnosis, workload, topology, correlated}``.

**Inventory file** (YAML), validated by :class:`Inventory`::

    version: 1
    hosts:                       # one host at a time ...
      node-01: {rack: r12, leaf_switch: leaf-12a, nvlink_domain: nvl72-03}
    groups:                      # ... or many, with a Slurm hostlist expression
      - hosts: "node-[02-18]"
        rack: r12
        leaf_switch: leaf-12a
        nvlink_domain: nvl72-03

Every field is optional; a host may appear once (in ``hosts`` or in one group), so a
typo cannot silently give a node two racks. Unknown keys are errors.

**Correlation.** Among failed diagnoses (any status but ``no_failure``) whose
workloads ended within ``window_s`` of each other, those whose responsible, suspect
or candidate nodes share a rack, leaf switch or NVLink domain name each other in
``correlated``: one entry per shared place, naming the other workloads.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from firstfault.schemas import Diagnosis, WorkloadRecord

from .hostlist import expand

DIMENSIONS: tuple[str, ...] = ("rack", "leaf_switch", "nvlink_domain")


class Placement(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rack: str | None = None
    leaf_switch: str | None = None
    nvlink_domain: str | None = None


class HostGroup(Placement):
    hosts: str = Field(min_length=1, description="a Slurm hostlist expression, e.g. node-[01-18]")


class Inventory(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    hosts: dict[str, Placement] = Field(default_factory=dict)
    groups: list[HostGroup] = Field(default_factory=list)

    @model_validator(mode="after")
    def _each_host_once(self) -> "Inventory":
        seen: dict[str, str] = {name: "hosts" for name in self.hosts}
        for i, g in enumerate(self.groups):
            for name in expand(g.hosts):
                if name in seen:
                    raise ValueError(f"host {name!r} is listed twice (groups[{i}] and {seen[name]})")
                seen[name] = f"groups[{i}]"
        return self

    def table(self) -> dict[str, Placement]:
        out = dict(self.hosts)
        for g in self.groups:
            place = Placement(rack=g.rack, leaf_switch=g.leaf_switch, nvlink_domain=g.nvlink_domain)
            for name in expand(g.hosts):
                out[name] = place
        return out

    @classmethod
    def load(cls, path: str | Path) -> "Inventory":
        return cls.model_validate(yaml.safe_load(Path(path).read_text()) or {})


class WorkloadInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scheduler: str | None = None
    user: str | None = None
    job_name: str | None = None
    partition: str | None = None
    namespace: str | None = None
    account: str | None = None
    nodes: int = 0
    gpus_per_node: int | None = None
    gpu_count: int | None = None
    end_time: datetime | None = None


class HostPlace(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str
    role: Literal["responsible", "suspect", "candidate"]
    rack: str | None = None
    leaf_switch: str | None = None
    nvlink_domain: str | None = None
    known: bool = Field(description="the inventory lists this host")


class Topology(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hosts: list[HostPlace] = Field(default_factory=list)
    racks: list[str] = Field(default_factory=list)
    leaf_switches: list[str] = Field(default_factory=list)
    nvlink_domains: list[str] = Field(default_factory=list)


class Peer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workload_id: str
    attempt: int
    diagnosis_id: str
    status: str
    sub_domain: str
    hosts: list[str]


class Correlation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dimension: Literal["rack", "leaf_switch", "nvlink_domain"]
    value: str
    others: list[Peer]
    message: str


class EnrichedDiagnosis(BaseModel):
    """What the sinks publish: the untouched diagnosis plus scheduler and topology context."""

    model_config = ConfigDict(extra="forbid")

    diagnosis: Diagnosis
    workload: WorkloadInfo
    topology: Topology
    correlated: list[Correlation] = Field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        data["diagnosis"] = self.diagnosis.to_dict()
        return data


def workload_info(wl: WorkloadRecord | None) -> WorkloadInfo:
    if wl is None:
        return WorkloadInfo()
    extra = wl.model_extra or {}
    pick = (lambda k: extra.get(k) if isinstance(extra.get(k), str) and extra.get(k) else None)
    gpn = wl.gpus_per_node
    return WorkloadInfo(scheduler=wl.scheduler, user=pick("user"), job_name=pick("job_name"),
                        partition=pick("partition"), namespace=pick("namespace"), account=pick("account"),
                        nodes=len(wl.nodes), gpus_per_node=gpn, gpu_count=gpn * len(wl.nodes) if gpn else None,
                        end_time=wl.end_time)


def blamed_hosts(d: Diagnosis) -> list[tuple[str, str]]:
    """(host, role) of the nodes a diagnosis points at, responsible first."""
    out: dict[str, str] = {}
    for h in d.responsible_nodes:
        out.setdefault(h, "responsible")
    for h in d.suspect_nodes:
        out.setdefault(h, "suspect")
    for c in d.candidates:
        for h in c.nodes:
            out.setdefault(h, "candidate")
    return list(out.items())


def topology(d: Diagnosis, places: dict[str, Placement] | None) -> Topology:
    places = places or {}
    hosts = []
    for host, role in blamed_hosts(d):
        p = places.get(host)
        hosts.append(HostPlace(host=host, role=role, rack=p.rack if p else None, leaf_switch=p.leaf_switch if p else None,
                               nvlink_domain=p.nvlink_domain if p else None, known=p is not None))
    uniq = (lambda attr: sorted({getattr(h, attr) for h in hosts if getattr(h, attr)}))
    return Topology(hosts=hosts, racks=uniq("rack"), leaf_switches=uniq("leaf_switch"),
                    nvlink_domains=uniq("nvlink_domain"))


def enrich(d: Diagnosis, wl: WorkloadRecord | None = None, inventory: Inventory | dict[str, Placement] | None = None
           ) -> EnrichedDiagnosis:
    """Pure: the diagnosis, what the scheduler said of its workload, where its blamed nodes are."""
    places = inventory.table() if isinstance(inventory, Inventory) else inventory
    return EnrichedDiagnosis(diagnosis=d, workload=workload_info(wl), topology=topology(d, places))


_LABEL = {"rack": "rack", "leaf_switch": "leaf switch", "nvlink_domain": "NVLink domain"}


def correlate(items: Sequence[EnrichedDiagnosis], window_s: float = 3600.0) -> list[EnrichedDiagnosis]:
    """Each item with ``correlated`` set from the *other* failed items of the batch (pure, order-free)."""
    failed = [e for e in items if e.diagnosis.status != "no_failure" and e.workload.end_time is not None]
    failed_ids = {id(e) for e in failed}
    out = []
    for e in items:
        found: list[Correlation] = []
        if id(e) in failed_ids:
            for dim in DIMENSIONS:
                mine: dict[str, list[str]] = {}
                for h in e.topology.hosts:
                    if getattr(h, dim):
                        mine.setdefault(getattr(h, dim), []).append(h.host)
                for value in sorted(mine):
                    peers = []
                    for o in failed:
                        if (o.diagnosis.workload_id, o.diagnosis.attempt) == (e.diagnosis.workload_id, e.diagnosis.attempt):
                            continue
                        if abs((o.workload.end_time - e.workload.end_time).total_seconds()) > window_s:
                            continue
                        shared = sorted(h.host for h in o.topology.hosts if getattr(h, dim) == value)
                        if shared:
                            od = o.diagnosis
                            peers.append(Peer(workload_id=od.workload_id, attempt=od.attempt,
                                              diagnosis_id=od.diagnosis_id, status=od.status,
                                              sub_domain=od.sub_domain, hosts=shared))
                    if peers:
                        peers.sort(key=lambda p: (p.workload_id, p.attempt))
                        names = ", ".join(f"{p.workload_id}#{p.attempt}" for p in peers)
                        found.append(Correlation(
                            dimension=dim, value=value, others=peers,
                            message=f"{len(peers) + 1} failed workloads within {window_s / 60:g} min share "
                                    f"{_LABEL[dim]} {value}: this one and {names}"))
        out.append(e.model_copy(update={"correlated": found}))
    return out


def recent_failed(items: Iterable[EnrichedDiagnosis], now: datetime, window_s: float) -> list[EnrichedDiagnosis]:
    """The items that can still correlate with something ending at ``now``."""
    return [e for e in items if e.workload.end_time is not None
            and abs((now - e.workload.end_time).total_seconds()) <= window_s]
