"""Recovery sink: a diagnosis's ``recovery`` hint -> scheduler actions, dry-run by default, guarded.

One diagnosis, printed (dry-run) or executed with ``--execute``::

    firstfault analyze samples/worked-example --json > d.json
    python -m firstfault.connectors.sinks.recovery --fleet-size 512 d.json

Against the diagnoses topic::

    FIRSTFAULT_KAFKA_BOOTSTRAP=kafka:9092 FIRSTFAULT_RECOVERY_FLEET_SIZE=512 \
        python -m firstfault.connectors.sinks.recovery --follow

Actions: Slurm ``scontrol update NodeName=<node> State=DRAIN Reason="firstfault:
<sub_domain> <diagnosis_id>"``; Kubernetes ``kubectl cordon <node>``. Only a
``drain_nodes`` hint leads to an action, and only when every guard passes:

1. the status is ``attributed`` (never ``ambiguous`` or ``unattributed``) and the
   diagnosis is final (not ``provisional``);
2. the sub_domain is on the allow-list (hardware and host faults by default);
3. at most ``max_nodes_per_hour`` nodes in any sliding hour, counted after expanding
   Slurm hostlists (``gpu[001-512]`` is 512 nodes, and each gets its own command); a
   name that cannot be expanded, expands past ``max_expanded_nodes`` or is not a plain
   node name is refused with no command;
4. never more than ``max_fleet_fraction`` of ``fleet_size`` nodes drained by
   firstfault within ``fraction_window_s`` (it cannot see an operator resume a node);
5. each diagnosis once, each node once per ``fraction_window_s``;
6. (Slurm) a node slurmctld already has drained, down or failed is left alone, its reason
   kept (``slurm_nodes.py``; asked with ``scontrol show node`` once the other guards passed,
   in a dry run too). A node Slurm does not know reaches ``scontrol update``, which fails:
   the audit says ``failed`` with scontrol's message.

With a Redis (``--redis-url``): before deciding, an attempt that fails like its stored
previous attempt escalates (``rules/attempts.py``: retry -> retry_excluding_nodes ->
drain_nodes), and a weaker hint (retry, retry excluding the node, or unattributed
suspects) drains the nodes the fleet memory's policy recommends to ``avoid``: a first weak
episode never drains, a repeat offender does, within the same guards. The policy is judged
for the diagnosis' nodes only, from a fleet state kept current from the record's changelog,
at the end of the diagnosis' cycle (now, if that is earlier).

Every decision, acted or refused and why, is appended to the audit log (JSON lines,
opened in append mode, fsynced). On start the log is read back, so the limits and the
once-only rule hold across restarts. Dry-run decisions count against the limits too,
so a dry run shows exactly what ``--execute`` would have done.
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, TextIO

from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel, ConfigDict, Field

from firstfault.rules.attempts import escalate
from firstfault.rules.fleet import Policy, episodes_from
from firstfault.schemas import Diagnosis

from .. import metrics_names as M
from ..hostlist import HostlistError, expand
from .fleet_memory import FleetMemory
from .node_health import NodeHealthStore
from .redis_store import DiagnosisStore
from .slurm_nodes import node_states

log = logging.getLogger("firstfault.recovery")

DEFAULT_ALLOW = (
    "gpu_fell_off_bus", "gpu_memory_ecc", "gpu_hardware_fault", "nvlink_signal_integrity", "nvlink_error",
    "nvswitch_fatal", "ib_link_error", "pcie_error", "host_kernel_error", "node_failure", "driver_library_mismatch",
)
Decision = Literal["acted", "dry_run", "refused", "failed"]
# What one command may name: a Slurm NodeName or a Kubernetes node (DNS-1123 subdomain).
# Anything else (brackets left over, commas, spaces, '=') would reach the scheduler as
# something other than one node.
_NODE_NAME = {"slurm": re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}"),
              "kubernetes": re.compile(r"[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?")}


class RecoveryConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scheduler: Literal["slurm", "kubernetes"] = "slurm"
    execute: bool = Field(default=False, description="False: print the commands, run nothing")
    allow_sub_domains: list[str] = Field(default_factory=lambda: list(DEFAULT_ALLOW))
    max_nodes_per_hour: int = Field(default=4, ge=0)
    max_fleet_fraction: float = Field(default=0.02, ge=0, le=1)
    fleet_size: int | None = Field(default=None, ge=1, description="nodes in the fleet; unknown: refuse everything")
    fraction_window_s: float = Field(default=86400.0, gt=0)
    max_expanded_nodes: int = Field(default=1024, ge=1, description="a hint naming more nodes is refused whole")
    audit_log: Path = Path("firstfault-recovery-audit.jsonl")
    scontrol: str = "scontrol"
    kubectl: str = "kubectl"
    timeout_s: float = Field(default=30.0, gt=0)


class AuditRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ts: str
    decision: Decision
    reason: str
    workload_id: str
    attempt: int
    diagnosis_id: str
    status: str
    sub_domain: str
    recovery_action: str
    nodes: list[str]
    commands: list[str] = Field(default_factory=list)
    scheduler: str
    dry_run: bool
    detail: dict[str, Any] = Field(default_factory=dict)


def command_for(cfg: RecoveryConfig, node: str, d: Diagnosis) -> list[str]:
    if cfg.scheduler == "slurm":
        return [cfg.scontrol, "update", f"NodeName={node}", "State=DRAIN",
                f"Reason=firstfault: {d.sub_domain} {d.diagnosis_id}"]
    return [cfg.kubectl, "cordon", node]


@dataclass
class _Result:
    returncode: int
    stderr: str = ""


def cordon_via_api(argv: Sequence[str], **_: Any) -> _Result:
    """``kubectl cordon <node>`` without kubectl: the same patch through the API (in-cluster)."""
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    try:
        client.CoreV1Api().patch_node(argv[-1], {"spec": {"unschedulable": True}})
    except ApiException as exc:
        return _Result(1, f"{exc.status} {exc.reason}")
    return _Result(0)


def render(argv: Sequence[str]) -> str:
    """The command as a person would type it: ``Reason="firstfault: ..."`` keeps its quotes."""
    out = []
    for a in argv:
        key, eq, value = a.partition("=")
        if eq and (" " in value or '"' in value):
            out.append(f'{key}="{value}"' if '"' not in value else f"{key}={shlex.quote(value)}")
        else:
            out.append(shlex.quote(a))
    return " ".join(out)


class RecoverySink:
    def __init__(self, cfg: RecoveryConfig, out: TextIO | None = None, clock: Callable[[], float] = time.time,
                 runner: Callable[..., Any] | None = None, registry: CollectorRegistry | None = None,
                 fleet: NodeHealthStore | None = None, history: DiagnosisStore | None = None,
                 policy: Policy | None = None) -> None:
        self.cfg, self.out, self.clock = cfg, out or sys.stdout, clock
        # The fleet memory (repeat offenders) and the diagnoses store (the previous attempt); both optional.
        self.fleet, self.history, self.policy = fleet, history, policy or Policy()
        self.memory = FleetMemory(fleet, clock=clock) if fleet is not None else None
        if runner is None:
            k8s_api = cfg.scheduler == "kubernetes" and shutil.which(cfg.kubectl) is None
            runner = cordon_via_api if k8s_api else subprocess.run
        self.runner = runner
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.decisions = Counter(M.base_name(M.RECOVERY_DECISIONS), "recovery decisions", ["decision"],
                                 registry=self.registry)
        self.lock = threading.Lock()
        self.handled: set[str] = set()
        self.actions: list[tuple[float, str]] = []        # (when, node) for acted / dry_run
        self._replay_audit()

    # ------------------------------------------------------------ the audit log

    def _replay_audit(self) -> None:
        path = self.cfg.audit_log
        if not path.exists():
            return
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rec = AuditRecord.model_validate_json(line)
            except ValueError:
                continue                 # a torn last line from a crash: ignore it, keep appending
            if rec.decision != "refused" or rec.reason != "duplicate":
                self.handled.add(rec.diagnosis_id)
            if rec.decision in ("acted", "dry_run"):
                when = datetime.fromisoformat(rec.ts.replace("Z", "+00:00")).timestamp()
                self.actions += [(when, n) for n in rec.nodes]

    def _audit(self, rec: AuditRecord) -> None:
        self.cfg.audit_log.parent.mkdir(parents=True, exist_ok=True)
        with self.cfg.audit_log.open("a", encoding="utf-8") as fh:
            fh.write(rec.model_dump_json() + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.decisions.labels(rec.decision).inc()

    # ------------------------------------------------------------ deciding

    def _refuse_reason(self, d: Diagnosis) -> str | None:
        if d.status != "attributed":
            return f"status {d.status}: firstfault acts only on an attributed diagnosis"
        if d.provisional:
            return "provisional: waiting for the final diagnosis"
        if d.recovery.action != "drain_nodes":
            return f"recovery action {d.recovery.action} asks for no node action"
        if d.sub_domain not in self.cfg.allow_sub_domains:
            return f"sub_domain {d.sub_domain} is not on the allow-list"
        if not d.recovery.nodes:
            return "the recovery hint names no node"
        return None

    def _hint(self, d: Diagnosis) -> tuple[list[str], str | None, dict[str, Any]]:
        """The nodes a drain would name, or the reason for none, and what the fleet record said.

        A ``drain_nodes`` hint passes as before. With a fleet record, a weaker hint (retry,
        retry excluding the node, or weak evidence naming suspects) drains only the nodes the
        policy recommends to avoid: a first weak episode never drains, a repeat offender does.
        """
        why = self._refuse_reason(d)
        if why is None:
            return list(d.recovery.nodes), None, {}
        weak_ok = d.status == "unattributed" or (d.status == "attributed" and d.recovery.action in (
            "retry", "retry_excluding_nodes"))
        if self.fleet is None or d.provisional or not weak_ok:
            return [], why, {}
        mine = episodes_from(d)
        if not mine or self.memory is None:
            return [], why, {}
        # This diagnosis counts, whether or not it is recorded yet; only its nodes are judged.
        views = self.memory.what_if(self.policy, d)
        hosts = sorted({e.host for e in mine})
        avoid = [h for h in hosts if h in views and views[h].recommendation == "avoid"]
        detail = {"fleet": {h: {"recommendation": views[h].recommendation, "why": views[h].why}
                            for h in hosts if h in views}}
        if not avoid:
            return [], (f"{why}; fleet record: not a repeat offender ({'; '.join(f'{h}: {views[h].why}' for h in hosts if h in views)}): "
                        "a first weak episode never drains"), detail
        subs = {e.sub_domain for h in avoid for e in views[h].episodes} & set(self.cfg.allow_sub_domains)
        if not subs:
            return [], f"{why}; fleet record: {', '.join(avoid)} repeat, but no episode sub_domain is on the allow-list", \
                detail
        detail["escalated"] = f"repeat offender: {'; '.join(f'{h}: {views[h].why}' for h in avoid)}"
        return avoid, None, detail

    def _previous(self, d: Diagnosis) -> Diagnosis | None:
        if self.history is None or d.attempt < 1:
            return None
        try:
            return self.history.latest(d.workload_id, d.attempt - 1)
        except Exception as exc:           # no history: decide on this attempt alone, as before
            log.warning("previous attempt of %s unavailable: %s", d.workload_id, exc)
            return None

    def _real_nodes(self, hint: Sequence[str]) -> tuple[list[str], str | None]:
        """The node names a hint stands for (Slurm hostlists expanded), or a reason to refuse it."""
        cap = self.cfg.max_expanded_nodes
        names: list[str] = []
        for entry in hint:
            try:
                names += expand(entry, limit=cap) if self.cfg.scheduler == "slurm" else [entry]
            except HostlistError as exc:
                return [], f"cannot expand the node list {entry[:200]!r}: {exc}"
            if len(names) > cap:
                return [], f"the node list names more than {cap} nodes (max_expanded_nodes)"
        bad = [n for n in names if not _NODE_NAME[self.cfg.scheduler].fullmatch(n)]
        if bad:
            return [], f"not a {self.cfg.scheduler} node name: {bad[0][:200]!r}"
        return sorted(set(names)), None

    def handle(self, d: Diagnosis) -> AuditRecord:
        with self.lock:
            return self._handle(d)

    def _handle(self, d: Diagnosis) -> AuditRecord:
        now = self.clock()
        d = escalate(d, self._previous(d))          # attempt N failing like N-1: the ladder climbs
        base = dict(ts=datetime.fromtimestamp(now, timezone.utc).isoformat().replace("+00:00", "Z"),
                    workload_id=d.workload_id, attempt=d.attempt, diagnosis_id=d.diagnosis_id, status=d.status,
                    sub_domain=d.sub_domain, recovery_action=d.recovery.action, scheduler=self.cfg.scheduler,
                    dry_run=not self.cfg.execute)

        def refuse(reason: str, nodes: list[str] | None = None, **detail: Any) -> AuditRecord:
            rec = AuditRecord(decision="refused", reason=reason, nodes=nodes if nodes is not None else [], detail=detail,
                              **base)
            # A provisional diagnosis may share its id with the final one that follows:
            # refusing it must not make the final one a duplicate.
            if reason != "duplicate" and not d.provisional:
                self.handled.add(d.diagnosis_id)
            self._audit(rec)
            return rec

        if d.diagnosis_id in self.handled:
            return refuse("duplicate")
        hint, why, fleet = self._hint(d)
        if why:
            return refuse(why, list(d.recovery.nodes), **fleet)
        real, why = self._real_nodes(hint)
        if why:
            return refuse(why, list(hint), hint=list(hint)[:50])
        recent = [(t, n) for t, n in self.actions if now - t < self.cfg.fraction_window_s]
        already = {n for _, n in recent}
        nodes = [n for n in real if n not in already]
        if not nodes:
            return refuse("every node was already drained by firstfault", list(d.recovery.nodes))
        last_hour = len({n for t, n in recent if now - t < 3600.0})
        if last_hour + len(nodes) > self.cfg.max_nodes_per_hour:
            return refuse(f"rate limit: {last_hour} node(s) in the last hour, at most {self.cfg.max_nodes_per_hour}",
                          nodes, last_hour=last_hour)
        if not self.cfg.fleet_size:
            return refuse("fleet size unknown: set fleet_size so the fraction guard can work", nodes)
        drained = len(already) + len(nodes)
        if drained > self.cfg.max_fleet_fraction * self.cfg.fleet_size:
            return refuse(f"fleet fraction: {drained} of {self.cfg.fleet_size} nodes would exceed "
                          f"{self.cfg.max_fleet_fraction:.1%}", nodes, drained=drained)
        if self.cfg.scheduler == "slurm":
            # Asked only now, when the guards passed: a few nodes, one query. A drain would
            # overwrite the reason an operator (or slurmctld) gave for taking a node out.
            states = node_states(nodes, self.cfg.scontrol, self.runner, self.cfg.timeout_s)
            out = {n: states[n].audit() for n in nodes if n in states and states[n].out_of_service}
            if out:
                fleet = {**fleet, "out_of_service": out}
                nodes = [n for n in nodes if n not in out]
                if not nodes:
                    return refuse("every node is already drained or down in Slurm: its reason is kept",
                                  sorted(out), **fleet)
        commands = [command_for(self.cfg, n, d) for n in nodes]
        rendered = [render(c) for c in commands]
        if not self.cfg.execute:
            for line in rendered:
                self.out.write(f"DRY-RUN {line}\n")
            self.out.flush()
            self.actions += [(now, n) for n in nodes]
            self.handled.add(d.diagnosis_id)
            rec = AuditRecord(decision="dry_run", reason="all guards passed", nodes=nodes, commands=rendered,
                              detail=fleet, **base)
            self._audit(rec)
            return rec
        done, failures = [], {}
        for node, argv in zip(nodes, commands):
            try:
                res = self.runner(argv, capture_output=True, text=True, timeout=self.cfg.timeout_s, check=False)
                ok, err = res.returncode == 0, (res.stderr or "").strip()[:300]
            except (OSError, subprocess.TimeoutExpired) as exc:
                ok, err = False, str(exc)[:300]
            if ok:
                done.append(node)
            else:
                failures[node] = err
        self.actions += [(now, n) for n in done]
        self.handled.add(d.diagnosis_id)
        rec = AuditRecord(decision="acted" if not failures else "failed",
                          reason="all guards passed" if not failures else "a command failed",
                          nodes=done if not failures else nodes, commands=rendered,
                          detail={**fleet, "failed": failures} if failures else fleet, **base)
        self._audit(rec)
        return rec


def _follow(sink: RecoverySink, group: str, stop: threading.Event, health: Any | None = None) -> None:
    """Decide on every diagnosis of the topic until ``stop``; ``health`` is beaten every turn,
    ready once the group assigned this sink its partitions."""
    from firstfault.schemas.avro import decode
    from firstfault.streams import kafka
    from firstfault.streams.config import StreamConfig

    cfg = StreamConfig.from_env()
    consumer = kafka.consumer(cfg, group)
    if health is not None:
        health.not_ready("waiting for the consumer group to assign the diagnoses partitions")
        consumer.subscribe([cfg.topic("diagnoses")], on_assign=lambda _c, _p: health.ready(),
                           on_revoke=lambda _c, _p: health.not_ready("rebalancing"))
    else:
        consumer.subscribe([cfg.topic("diagnoses")])
    try:
        while not stop.is_set():
            if health is not None:
                health.beat()
            msgs = consumer.consume(num_messages=100, timeout=0.5) or []
            for msg in msgs:
                if msg.error() is None and msg.value():
                    try:
                        d = decode(msg.value())
                    except ValueError as exc:
                        log.warning("undecodable diagnoses record: %s", exc)
                        continue
                    if isinstance(d, Diagnosis):
                        sink.handle(d)
            if msgs:
                consumer.commit(asynchronous=False)      # the audit log already holds each decision
    finally:
        consumer.close()


def main(argv: Sequence[str] | None = None) -> int:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m firstfault.connectors.sinks.recovery",
                                description=__doc__.split("\n")[0])
    p.add_argument("diagnoses", nargs="*", help="diagnosis JSON files (firstfault analyze --json); none: --follow")
    p.add_argument("--follow", action="store_true", help="read the diagnoses topic (FIRSTFAULT_KAFKA_BOOTSTRAP)")
    p.add_argument("--scheduler", choices=("slurm", "kubernetes"), default=env("FIRSTFAULT_RECOVERY_SCHEDULER", "slurm"))
    p.add_argument("--execute", action="store_true", default=env("FIRSTFAULT_RECOVERY_EXECUTE") == "1",
                   help="run the commands (default: dry-run, print them)")
    p.add_argument("--fleet-size", type=int, default=int(env("FIRSTFAULT_RECOVERY_FLEET_SIZE", "0")) or None)
    p.add_argument("--max-nodes-per-hour", type=int, default=int(env("FIRSTFAULT_RECOVERY_MAX_NODES_PER_HOUR", "4")))
    p.add_argument("--max-fleet-fraction", type=float,
                   default=float(env("FIRSTFAULT_RECOVERY_MAX_FLEET_FRACTION", "0.02")))
    p.add_argument("--max-expanded-nodes", type=int,
                   default=int(env("FIRSTFAULT_RECOVERY_MAX_EXPANDED_NODES", "1024")),
                   help="refuse a hint whose Slurm hostlists name more nodes than this")
    p.add_argument("--allow", default=env("FIRSTFAULT_RECOVERY_ALLOW"), help="comma-separated sub_domains")
    p.add_argument("--audit-log", default=env("FIRSTFAULT_RECOVERY_AUDIT_LOG", "firstfault-recovery-audit.jsonl"))
    p.add_argument("--group", default=env("FIRSTFAULT_RECOVERY_GROUP", "firstfault-recovery"))
    p.add_argument("--metrics-port", type=int, default=int(env("FIRSTFAULT_METRICS_PORT", str(M.METRICS_PORT))))
    p.add_argument("--redis-url", default=env("FIRSTFAULT_REDIS_URL"),
                   help="the diagnoses store and fleet memory: previous attempts escalate, repeat offenders drain")
    p.add_argument("--redis-prefix", default=env("FIRSTFAULT_REDIS_PREFIX", "firstfault:"))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = RecoveryConfig(scheduler=args.scheduler, execute=args.execute, fleet_size=args.fleet_size,
                             max_nodes_per_hour=args.max_nodes_per_hour, max_fleet_fraction=args.max_fleet_fraction,
                             max_expanded_nodes=args.max_expanded_nodes, audit_log=Path(args.audit_log),
                             **({"allow_sub_domains": [s.strip() for s in args.allow.split(",") if s.strip()]}
                                if args.allow else {}))
        policy = Policy.from_env(os.environ)
    except ValueError as exc:
        print(f"firstfault recovery: {exc}", file=sys.stderr)
        return 2
    url = args.redis_url or None
    sink = RecoverySink(cfg, policy=policy, fleet=NodeHealthStore(url, args.redis_prefix) if url else None,
                        history=DiagnosisStore(url, args.redis_prefix) if url else None)
    if args.diagnoses:
        for path in args.diagnoses:
            try:
                d = Diagnosis.model_validate_json(Path(path).read_text())
            except (OSError, ValueError) as exc:
                print(f"firstfault recovery: {path}: {exc}", file=sys.stderr)
                return 2
            rec = sink.handle(d)
            if rec.decision == "refused":
                print(f"REFUSED {d.workload_id}#{d.attempt}: {rec.reason}", file=sys.stderr)
        return 0
    if not args.follow:
        p.error("give diagnosis files or --follow")
    from firstfault.streams.health import Health

    health = Health(sink.registry, "recovery", stale_after_s=300.0)      # a decision may run commands
    health.serve(args.metrics_port)              # /metrics, /healthz, /readyz
    stop = threading.Event()
    try:
        _follow(sink, args.group, stop, health=health)
    except KeyboardInterrupt:
        return 130
    finally:
        health.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
