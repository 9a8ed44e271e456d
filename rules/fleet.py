"""Fleet memory, the pure part: episodes from diagnoses, the node-avoid policy, shared causes.

No I/O and no clock: every function takes what it needs and returns the same answer for
the same input, so the record rebuilt from the diagnoses topic gives the same verdicts.

* An **episode** is one node's part in one workload attempt's failure: ``attributed``
  (the node was blamed) or ``suspect`` (implicated without proof), in one infrastructure
  *family* (gpu, interconnect, network, host, storage: the diagnosis' domain; application
  and scheduler faults are not the node's and make no episode).
* The **policy** (NVIDIA FACT's numbers by default): a node is recommended ``avoid`` after
  ``min_episodes`` (2) episodes of one family within ``window_days`` (14); at most
  ``max_new_per_cycle`` (1) new avoid per ``cycle_s`` (1 h) cycle; a cycle with more than
  ``broad_threshold`` (16) suspect nodes is a *broad event*: no node is avoided for it and
  its episodes count against no node. No data, no avoid (it fails open).
* A **shared cause** names the leaf switch or rack that a broad event's nodes, or repeated
  network episodes on several nodes, hang off, given a :class:`Topology`.

:func:`evaluate` replays a whole record and is the reference; ``fleet_state.FleetState`` keeps
the same verdicts incrementally (each diagnosis touches its nodes and its cycle) for a fleet.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from firstfault.schemas import Diagnosis

Family = Literal["gpu", "interconnect", "network", "host", "storage"]
FAMILIES: tuple[str, ...] = ("gpu", "interconnect", "network", "host", "storage")
Role = Literal["attributed", "suspect"]
Recommendation = Literal["avoid", "watch", "ok"]

# Sub-domain -> domain for the v1 taxonomy (contract section 3): an unattributed diagnosis
# names its weak evidence by sub_domain only (evidence step final.choose, detail "weak").
SUB_DOMAIN_FAMILY: dict[str, str] = {
    "gpu_fell_off_bus": "gpu", "gpu_memory_ecc": "gpu", "gpu_hardware_fault": "gpu",
    "nvlink_signal_integrity": "interconnect", "nvlink_error": "interconnect", "nvswitch_fatal": "interconnect",
    "ib_link_error": "network", "network_error": "network",
    "storage_io_error": "storage",
    "host_oom": "host", "host_kernel_error": "host", "pcie_error": "host", "node_failure": "host",
    "shm_exhausted": "host", "driver_library_mismatch": "host", "evicted": "host",
}
# Host-domain faults that the workload itself causes (its memory use, its /dev/shm size, its
# requests): recorded as episodes, never counted against the node.
WORKLOAD_CAUSED = ("host_oom", "shm_exhausted", "evicted")


def family_of(domain: str) -> str | None:
    """The failure family of a diagnosis domain; None for application, scheduler, unknown..."""
    return domain if domain in FAMILIES else None


def _parse(stamp: str | None) -> datetime | None:
    if not stamp:
        return None
    try:
        t = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def failed_at(d: Diagnosis) -> str | None:
    """When the attempt went wrong: the root cause's onset (or stamp), else the earliest
    candidate onset, else the first symptom. None when the diagnosis carries no time."""
    if d.root_cause is not None and (d.root_cause.onset or d.root_cause.timestamp):
        t = _parse(d.root_cause.onset or d.root_cause.timestamp)
        if t is not None:
            return iso(t)
    stamps = [t for t in (_parse(c.onset) for c in d.candidates) if t] or \
             [t for t in (_parse(s.first) for s in d.symptoms) if t]
    return iso(min(stamps)) if stamps else None


class Episode(BaseModel):
    """One node's part in one workload attempt's failure."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str
    family: Family
    sub_domain: str
    role: Role
    workload_id: str
    attempt: int
    at: str = Field(description="UTC ISO-8601: the root onset or failed-at time of the diagnosis")
    diagnosis_id: str
    revision: int | None = None
    summary: str = ""

    @property
    def when(self) -> datetime:
        t = _parse(self.at)
        assert t is not None
        return t

    @property
    def key(self) -> str:
        return f"{self.attempt}:{self.workload_id}"


def episodes_from(d: Diagnosis, fallback_at: str | None = None) -> list[Episode]:
    """The episodes a diagnosis makes, one per (node, family), sorted.

    ``fallback_at`` (e.g. the topic record's timestamp) is used only when the diagnosis
    has no time of its own; with neither, there is no episode (no time, no window).
    Provisional diagnoses make none: the final one follows.
    """
    if d.provisional or d.status == "no_failure":
        return []
    fallback = _parse(fallback_at)
    at = failed_at(d) or (iso(fallback) if fallback else None)
    if at is None:
        return []
    rows: dict[tuple[str, str], tuple[str, str]] = {}    # (host, family) -> (role, sub_domain)

    def add(host: str | None, family: str | None, sub: str, role: str) -> None:
        if not host or family is None:
            return
        have = rows.get((host, family))
        if have is None or (have[0] == "suspect" and role == "attributed"):
            rows[(host, family)] = (role, sub)

    if d.status == "attributed":
        fam = family_of(d.domain)
        blamed = set(d.responsible_nodes) | ({d.root_cause.host} if d.root_cause and d.root_cause.host else set())
        for h in blamed:
            add(h, fam, d.sub_domain, "attributed")
        for h in d.suspect_nodes:
            add(h, fam, d.sub_domain, "suspect")
    elif d.status == "ambiguous":
        for c in d.candidates:
            for h in c.nodes:
                add(h, family_of(c.domain), c.sub_domain, "suspect")
    else:                                   # unattributed: the weak evidence names the family
        weak = [s for e in d.evidence if e.action == "unattributed" for s in e.detail.get("weak", [])
                if isinstance(s, str)]
        fams = sorted({(SUB_DOMAIN_FAMILY[s], s) for s in weak if s in SUB_DOMAIN_FAMILY})
        for h in d.suspect_nodes:
            for fam, sub in fams:
                add(h, fam, sub, "suspect")
    return sorted((Episode(host=h, family=f, sub_domain=sub, role=role, workload_id=d.workload_id,  # type: ignore[arg-type]
                           attempt=d.attempt, at=at, diagnosis_id=d.diagnosis_id, revision=d.revision,
                           summary=d.summary[:300])
                   for (h, f), (role, sub) in rows.items()), key=lambda e: (e.host, e.family))


# ---------------------------------------------------------------- policy

class Policy(BaseModel):
    """The node-avoid policy; defaults are NVIDIA FACT's numbers."""

    model_config = ConfigDict(extra="forbid")

    min_episodes: int = Field(default=2, ge=1, description="episodes of one family that make a node `avoid`")
    window_days: float = Field(default=14.0, gt=0, description="...within this many days")
    max_new_per_cycle: int = Field(default=1, ge=0, description="new avoids per cycle at most")
    cycle_s: float = Field(default=3600.0, gt=0, description="a cycle; also the 'at once' window of a broad event")
    broad_threshold: int = Field(default=16, ge=1, description="more suspect nodes than this in one cycle: broad event")
    count_suspects: bool = Field(default=True, description="suspect episodes count toward avoid (FACT counts suspects)")
    shared_min_nodes: int = Field(default=2, ge=2, description="network episodes on this many nodes under one "
                                                               "switch or rack in one cycle name it")
    retain_margin_days: float = Field(default=2.0, ge=0, description="episodes are kept window_days plus this "
                                                                     "long, and may arrive this late and still "
                                                                     "replay exactly")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Policy":
        """From ``FIRSTFAULT_AVOID_*`` variables (a ValueError names a bad one)."""
        values = {k: env[f"FIRSTFAULT_{v}"] for k, v in POLICY_ENV.items() if env.get(f"FIRSTFAULT_{v}", "") != ""}
        return cls.model_validate(values)


POLICY_ENV = {"min_episodes": "AVOID_MIN_EPISODES", "window_days": "AVOID_WINDOW_DAYS",
              "max_new_per_cycle": "AVOID_MAX_NEW_PER_CYCLE", "cycle_s": "AVOID_CYCLE_S",
              "broad_threshold": "AVOID_BROAD_THRESHOLD", "count_suspects": "AVOID_COUNT_SUSPECTS",
              "shared_min_nodes": "AVOID_SHARED_MIN_NODES", "retain_margin_days": "AVOID_RETAIN_MARGIN_DAYS"}


class SharedCause(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: str = Field(description="switch | rack | block | zone ... as the topology names it")
    name: str
    level: int = Field(description="0: leaf (nodes hang off it directly)")
    nodes: list[str] = Field(description="the affected nodes under it")
    of: int = Field(description="affected nodes in the event")
    under: int = Field(description="nodes under it in the topology")
    episodes: list[str] = Field(description="the episodes, as 'host workload#attempt sub_domain'")
    why: str


class BroadEvent(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cycle_start: str
    cycle_end: str
    nodes: list[str]
    families: list[str]
    shared_causes: list[SharedCause] = Field(default_factory=list)
    note: str = ""


class NodeView(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str
    recommendation: Recommendation
    why: str
    since: str | None = Field(default=None, description="when the avoid was recommended (its cycle's end)")
    counts: dict[str, int] = Field(default_factory=dict, description="counted episodes per family in the window")
    episodes: list[Episode] = Field(default_factory=list)


class FleetReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    at: str | None = Field(description="the time the policy was evaluated at")
    policy: Policy
    nodes: list[NodeView]
    broad_events: list[BroadEvent]
    shared_causes: list[SharedCause] = Field(description="repeated network episodes under one switch or rack")
    topology: str | None = Field(description="where the topology came from; None: none given")
    notes: list[str] = Field(default_factory=list)


class Group(BaseModel):
    """One switch, rack or zone and every node under it (sub-switches included)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    name: str
    level: int = 0
    nodes: frozenset[str]


class Topology(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str
    groups: list[Group]


def episode_ref(host: str, workload_id: str, attempt: int, sub_domain: str, role: str, at: str) -> str:
    return f"{host} {workload_id}#{attempt} {sub_domain} ({role}, {at})"


def _episode_ref(e: Episode) -> str:
    return episode_ref(e.host, e.workload_id, e.attempt, e.sub_domain, e.role, e.at)


def shared_causes(episodes: Sequence[Episode], topology: Topology | None, min_nodes: int) -> list[SharedCause]:
    """The switches or racks the episodes' nodes share: the smallest group holding them all,
    else every lowest-level group holding at least ``min_nodes`` of them (most first)."""
    hosts = sorted({e.host for e in episodes})
    if topology is None or len(hosts) < min_nodes:
        return []
    holding = [(g, sorted(g.nodes.intersection(hosts))) for g in topology.groups]
    holding = [(g, hs) for g, hs in holding if len(hs) >= min_nodes]
    if not holding:
        return []
    # The smallest group holding every node names the cause when most of its nodes are hit (a
    # spine over the whole cluster is no news when a few nodes of one leaf fail); else each
    # lowest-level group holding several of them; else that smallest group after all.
    whole = [(g, hs) for g, hs in holding if len(hs) == len(hosts)]
    best = min(whole, key=lambda it: (it[0].level, len(it[0].nodes), it[0].name)) if whole else None
    low = min(g.level for g, _ in holding)
    lowest = sorted(((g, hs) for g, hs in holding if g.level == low), key=lambda it: (-len(it[1]), it[0].name))
    if best is not None and (2 * len(hosts) >= len(best[0].nodes) or best[0].level == low):
        picked = [best]
    else:
        picked = lowest or ([best] if best else [])
    out = []
    for g, hs in picked:
        evs = [e for e in episodes if e.host in g.nodes]
        subs = sorted({e.sub_domain for e in evs})
        tier = "leaf " if g.level == 0 and g.kind == "switch" else ""
        share = f"all {len(hosts)}" if len(hs) == len(hosts) else f"{len(hs)} of {len(hosts)}"
        out.append(SharedCause(
            kind=g.kind, name=g.name, level=g.level, nodes=hs, of=len(hosts), under=len(g.nodes),
            episodes=[_episode_ref(e) for e in sorted(evs, key=lambda e: (e.at, e.host))],
            why=f"{share} affected nodes ({', '.join(subs)}) hang off {tier}{g.kind} {g.name} "
                f"({len(g.nodes)} nodes under it): suspect the {g.kind} before the nodes"))
    return out


def cycle_start(t: datetime, cycle_s: float) -> datetime:
    epoch = t.timestamp()
    return datetime.fromtimestamp(epoch - epoch % cycle_s, timezone.utc)


def node_view(policy: Policy, host: str, episodes: Sequence[Episode], counted: Mapping[str, Sequence[str]],
              recent: bool, ignored: Sequence[str], broad_n: int, since: str | None, pending: bool) -> NodeView:
    """One node's recommendation and why, at the evaluation instant.

    ``episodes``: all of the node's (newest first); ``counted``: per family, the episodes that
    count in the window (oldest first, as :func:`episode_ref` writes them); ``recent``: it has
    episodes in the window; ``ignored``: their sub_domains that are the workload's doing;
    ``broad_n``: how many of them were in a broad event; ``since``: when it was avoided, if it
    is; ``pending``: it qualified at the last cycle but another node was avoided first. Shared
    by :func:`evaluate` and the incremental fleet state, so the words are the same.
    """
    counts = {f: len(v) for f, v in sorted(counted.items())}
    best_f = max(sorted(counted), key=lambda f: len(counted[f]), default=None)
    if since is not None and best_f is not None:
        why = (f"{len(counted[best_f])} {best_f} episodes within {policy.window_days:g} days "
               f"(policy: {policy.min_episodes}): " + "; ".join(counted[best_f][-4:]))
        rec: Recommendation = "avoid"
    elif pending:
        rec, why = "watch", (f"qualifies for avoid ({counts}), but at most {policy.max_new_per_cycle} new avoid "
                             f"per cycle: another node was avoided first")
    elif recent:
        rec = "watch"
        parts = [f"{n} {f} episode{'s' if n != 1 else ''}" for f, n in counts.items()]
        why = (", ".join(parts) or "no counted episode") + \
            f" within {policy.window_days:g} days, fewer than {policy.min_episodes} of one family"
        if broad_n:
            why += f"; {broad_n} in a broad event, counted against no node"
        if ignored:
            why += f"; {', '.join(ignored)} is the workload's doing, not the node's"
    else:
        rec, why = "ok", f"no episode within {policy.window_days:g} days"
    return NodeView(host=host, recommendation=rec, why=why, since=since, counts=counts, episodes=list(episodes))


def broad_note(n_hosts: int, policy: Policy, topology: Topology | None) -> str:
    return (f"{n_hosts} nodes suspect in one cycle (more than {policy.broad_threshold}): a broad event; "
            f"no node is avoided for it"
            + ("" if topology else "; a topology would name the switch or rack they share"))


NO_TOPOLOGY_NOTE = ("no topology given: a Slurm topology.conf, a switch/rack YAML or the Kubernetes nodes' labels "
                    "(--topology, FIRSTFAULT_TOPOLOGY) would name the switch or rack shared by broad events and "
                    "repeated network episodes")
NO_EPISODES_NOTE = "no episodes recorded: no node is avoided (the policy fails open)"
NETWORK_NOTE = "network episodes on several nodes in one cycle: a topology would tell whether they share a leaf switch"


def evaluate(records: Mapping[str, Iterable[Episode]], policy: Policy, topology: Topology | None = None,
             at: datetime | None = None) -> FleetReport:
    """Replay the fleet's episodes cycle by cycle and say, at ``at``, what each node deserves.

    ``at`` defaults to the end of the newest episode's cycle: the fleet's own clock, so the
    verdict depends on the record only (an old record replayed gives the verdict of then).
    """
    by_host = {h: sorted(eps, key=lambda e: (e.at, e.key, e.family)) for h, eps in records.items()}
    every = sorted((e for eps in by_host.values() for e in eps), key=lambda e: (e.at, e.host, e.key, e.family))
    notes: list[str] = []
    if topology is None:
        notes.append(NO_TOPOLOGY_NOTE)
    if not every:
        return FleetReport(at=iso(at) if at else None, policy=policy, nodes=[], broad_events=[], shared_causes=[],
                           topology=topology.source if topology else None, notes=notes + [NO_EPISODES_NOTE])
    cycle = timedelta(seconds=policy.cycle_s)
    window = timedelta(days=policy.window_days)
    if at is None:
        at = cycle_start(every[-1].when, policy.cycle_s) + cycle
    every = [e for e in every if e.when < at]

    # Cycles that hold episodes, in order; the evaluation instant closes the last one.
    cycles: dict[datetime, list[Episode]] = defaultdict(list)
    for e in every:
        cycles[cycle_start(e.when, policy.cycle_s)].append(e)
    broad: list[BroadEvent] = []
    in_broad: set[tuple[str, str, str]] = set()      # (host, attempt key, family) of broad-event episodes
    avoided: dict[str, str] = {}                     # host -> since (cycle end)
    pending: list[str] = []
    ends = sorted({start + cycle for start in cycles} | {at})

    def counted(host: str, until: datetime) -> dict[str, list[Episode]]:
        fams: dict[str, list[Episode]] = defaultdict(list)
        for e in by_host.get(host, []):
            if not (until - window <= e.when < until) or (e.host, e.key, e.family) in in_broad:
                continue
            if e.sub_domain in WORKLOAD_CAUSED or (e.role == "suspect" and not policy.count_suspects):
                continue
            fams[e.family].append(e)
        return fams

    for end in ends:
        if end > at:
            break
        # The cycle that ``end`` closes (for ``at`` inside a cycle: that cycle so far).
        this = cycles.get(cycle_start(end - timedelta(microseconds=1), policy.cycle_s), [])
        hosts = sorted({e.host for e in this})
        if len(hosts) > policy.broad_threshold:
            in_broad.update((e.host, e.key, e.family) for e in this)
            start = cycle_start(end - timedelta(microseconds=1), policy.cycle_s)
            broad.append(BroadEvent(
                cycle_start=iso(start), cycle_end=iso(start + cycle), nodes=hosts,
                families=sorted({e.family for e in this}),
                shared_causes=shared_causes(this, topology, policy.shared_min_nodes),
                note=broad_note(len(hosts), policy, topology)))
            continue
        # Avoids lapse when the node no longer qualifies (its episodes left the window).
        for h in list(avoided):
            if not any(len(v) >= policy.min_episodes for v in counted(h, end).values()):
                del avoided[h]
        qualifying = []
        for h in by_host:
            if h in avoided:
                continue
            fams = counted(h, end)
            best = max((len(v) for v in fams.values()), default=0)
            if best >= policy.min_episodes:
                latest = max(e.at for v in fams.values() for e in v)
                qualifying.append((best, latest, h))
        # Most episodes first, then the newest, then by name: stable sorts, least significant first.
        qualifying.sort(key=lambda q: q[2])
        qualifying.sort(key=lambda q: q[1], reverse=True)
        qualifying.sort(key=lambda q: q[0], reverse=True)
        for _, _, h in qualifying[:policy.max_new_per_cycle]:
            avoided[h] = iso(end)
        pending = [h for _, _, h in qualifying[policy.max_new_per_cycle:]]

    views = []
    for h, eps in sorted(by_host.items()):
        recent = [e for e in eps if at - window <= e.when < at]
        ignored = sorted({e.sub_domain for e in recent if e.sub_domain in WORKLOAD_CAUSED})
        views.append(node_view(policy, h, sorted(eps, key=lambda e: (e.at, e.key, e.family), reverse=True),
                               {f: [_episode_ref(e) for e in v] for f, v in counted(h, at).items()}, bool(recent),
                               ignored, sum((e.host, e.key, e.family) in in_broad for e in recent), avoided.get(h),
                               h in pending))

    # Repeated network episodes on several nodes in one cycle: the switch or rack they share.
    shared: list[SharedCause] = []
    for start, eps in sorted(cycles.items()):
        net = [e for e in eps if e.family == "network" and (e.host, e.key, e.family) not in in_broad
               and at - window <= e.when]
        shared += shared_causes(net, topology, policy.shared_min_nodes)
    if topology is None and any(len({e.host for e in eps if e.family == "network"}) >= policy.shared_min_nodes
                                for eps in cycles.values()):
        notes.append(NETWORK_NOTE)
    return FleetReport(at=iso(at), policy=policy, nodes=views, broad_events=broad, shared_causes=shared,
                       topology=topology.source if topology else None, notes=notes)


def node_verdict(report: FleetReport, host: str) -> NodeView | None:
    return next((n for n in report.nodes if n.host == host), None)
