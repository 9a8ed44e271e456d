"""Kubernetes connector: a watch on training pods -> SchedulerEvent start and end records.

Run it in the cluster (service account allowed to ``list`` and ``watch`` pods)::

    FIRSTFAULT_KAFKA_BOOTSTRAP=kafka:9092 python -m firstfault.connectors.kubernetes \
        --namespace ml-team --selector training.kubeflow.org/job-name

**Workload.** Pods are grouped by the first of these labels they carry (so a JobSet's
pods group by JobSet, not by its child Jobs): ``training.kubeflow.org/job-name``
(PyTorchJob and the other Kubeflow training jobs), ``jobset.sigs.k8s.io/jobset-name``,
``batch.kubernetes.io/job-name``, ``job-name``. ``workload_id`` is
``k8s-<namespace>.<name>`` (a namespace has no dots, so it parses back). ``attempt``
is the JobSet ``jobset.sigs.k8s.io/restart-attempt`` label, else 0: pods that a Job
or an operator re-creates inside one run stay in the same attempt.

**Start** is published when the first pod runs, and again whenever the set of
pods and nodes grows (the correlator takes the latest start record). **End** is
published once every pod of the group is finished (Succeeded, Failed or deleted)
and stayed so for ``settle_s`` (a Job may be about to create a replacement pod).
``state`` is ``Succeeded`` when the last pod of every slot (replica, completion
index) succeeded, else ``Failed/<reason>`` of the earliest failure: the pod's own
reason (``Evicted``, ``DeadlineExceeded``...) or its container's (``OOMKilled``,
``Error``...), ``Deleted`` for a pod deleted while it ran. ``exit_code`` is that
container's exit code. ``nodes`` are the pods' nodes, ``pods`` maps pod -> node,
and where the pods carry a node rank (Kubeflow replica index, Job completion
index) ``ranks`` maps each node's first global rank to it.

The live path and the tests share one code path: :func:`watch_events` yields the
API server's watch events as parsed JSON (``{"type", "object"}``, the object being
the client's ``raw_object``) and :class:`PodTracker` consumes any such iterator.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from firstfault.schemas import SchedulerEvent, WorkloadRecord
from firstfault.streams.config import StreamConfig

from .metrics_names import METRICS_PORT
from .publish import ConnectorMetrics, PrintPublisher, PublishedLog, SchedulerPublisher

log = logging.getLogger("firstfault.connectors.kubernetes")

GROUP_LABELS: tuple[tuple[str, str], ...] = (
    ("training.kubeflow.org/job-name", "kubeflow"),
    ("jobset.sigs.k8s.io/jobset-name", "jobset"),
    ("batch.kubernetes.io/job-name", "job"),
    ("job-name", "job"),
)
ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
GPU_RESOURCES = ("nvidia.com/gpu",)
TERMINAL = frozenset({"Succeeded", "Failed"})


def _ts(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(timezone.utc)


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


@dataclass
class PodView:
    """What firstfault needs of one pod, read from its latest watch object."""

    name: str
    namespace: str
    created: datetime | None
    node: str | None
    phase: str
    started: datetime | None
    gpus: int
    slot: str
    replica: tuple[str, int] | None = None          # Kubeflow (replica type, index)
    index: int | None = None                        # Job completion index, first replicated Job only
    deleted: bool = False
    failure_reason: str | None = None
    failure_at: datetime | None = None
    exit_code: int | None = None
    finished_at: datetime | None = None

    @property
    def ran(self) -> bool:
        return self.node is not None and self.phase in ("Running", "Succeeded", "Failed")

    @property
    def done(self) -> bool:
        return self.phase in TERMINAL or self.deleted

    @property
    def succeeded(self) -> bool:
        return self.phase == "Succeeded"


def group_of(labels: Mapping[str, str]) -> tuple[str, str] | None:
    """(kind, name) of the training job a pod belongs to, or None."""
    for label, kind in GROUP_LABELS:
        if labels.get(label):
            return kind, labels[label]
    return None


def _slot(labels: Mapping[str, str], name: str, kind: str) -> tuple[str, tuple[str, int] | None, int | None]:
    """(slot, Kubeflow replica, completion index): a slot is what a re-created pod stands in for."""
    rtype = (labels.get("training.kubeflow.org/replica-type") or "").lower()
    ridx = _int(labels.get("training.kubeflow.org/replica-index"))
    if kind == "kubeflow" and rtype and ridx is not None:
        return f"{rtype}-{ridx}", (rtype, ridx), None
    cidx = _int(labels.get("batch.kubernetes.io/job-completion-index"))
    jidx = labels.get("jobset.sigs.k8s.io/job-index", "0")
    if cidx is not None:
        # Only the first replicated Job's index is a node rank without knowing its parallelism.
        return f"{jidx}-{cidx}", None, cidx if jidx == "0" else None
    return name, None, None


def node_rank(v: "PodView", has_master: bool) -> int | None:
    """PyTorchJob: master is node rank 0, worker i is i+1 (i without a master); Jobs: the index."""
    if v.replica is not None:
        rtype, idx = v.replica
        if rtype == "master":
            return 0
        return idx + (1 if has_master else 0) if rtype == "worker" else None
    return v.index


def pod_view(obj: Mapping[str, Any], kind: str, deleted: bool = False) -> PodView:
    meta, spec, status = obj.get("metadata", {}), obj.get("spec", {}), obj.get("status", {})
    labels = meta.get("labels") or {}
    gpus = 0
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        for r in GPU_RESOURCES:
            gpus += _int((res.get("limits") or {}).get(r)) or _int((res.get("requests") or {}).get(r)) or 0
    slot, replica, index = _slot(labels, meta.get("name", ""), kind)
    view = PodView(name=meta.get("name", ""), namespace=meta.get("namespace", ""), created=_ts(meta.get("creationTimestamp")),
                   node=spec.get("nodeName") or None, phase=status.get("phase") or "Pending",
                   started=_ts(status.get("startTime")), gpus=gpus, slot=slot, replica=replica, index=index,
                   deleted=deleted)
    finished: list[datetime] = []
    failures: list[tuple[datetime | None, str, int | None]] = []
    for cs in status.get("containerStatuses") or []:
        # lastState: a container restarted in place (restartPolicy OnFailure) keeps its previous death there.
        for which in ("state", "lastState"):
            term = (cs.get(which) or {}).get("terminated")
            if not term:
                continue
            at = _ts(term.get("finishedAt"))
            if at and which == "state":
                finished.append(at)
            if term.get("exitCode", 0) != 0:
                failures.append((at, term.get("reason") or "Error", term.get("exitCode")))
    cond_times = [_ts(c.get("lastTransitionTime")) for c in status.get("conditions") or []
                  if c.get("type") == "DisruptionTarget"]
    view.finished_at = max(finished + [t for t in cond_times if t], default=None)
    failures.sort(key=lambda f: (f[0] is None, f[0] or datetime.max.replace(tzinfo=timezone.utc)))
    if view.phase == "Failed":
        first = failures[0] if failures else (None, "Error", None)
        # The pod's own reason (Evicted, DeadlineExceeded) says more than its killed container's.
        view.failure_reason = status.get("reason") or first[1]
        view.exit_code = first[2]
        view.failure_at = next((t for t in cond_times if t), None) if status.get("reason") else first[0]
        view.failure_at = view.failure_at or view.finished_at
    elif deleted and view.phase != "Succeeded":
        view.failure_reason = failures[0][1] if failures else "Deleted"
        view.exit_code = failures[0][2] if failures else None
        view.failure_at = (failures[0][0] if failures else None) or view.finished_at
    return view


@dataclass
class Group:
    namespace: str
    name: str
    kind: str
    attempt: int
    pods: dict[str, PodView] = field(default_factory=dict)     # pod name -> its latest view
    last_start: str | None = None
    done_since: float | None = None
    ended: bool = False

    @property
    def workload_id(self) -> str:
        return f"k8s-{self.namespace}.{self.name}"

    def views(self) -> list[PodView]:
        return list(self.pods.values())


def _uniform(values: Iterable[int]) -> int | None:
    vals = {v for v in values if v}
    return vals.pop() if len(vals) == 1 else None


def workload_record(group: Group, views: Sequence[PodView], ended: bool) -> WorkloadRecord:
    has_master = any(v.replica is not None and v.replica[0] == "master" for v in views)
    rank = {v.name: node_rank(v, has_master) for v in views}
    placed = sorted((v for v in views if v.node), key=lambda v: (rank[v.name] is None, rank[v.name] or 0, v.name))
    nodes = list(dict.fromkeys(v.node for v in placed))
    per_node: dict[str, int] = {}
    for v in placed:
        per_node[v.node] = per_node.get(v.node, 0) + v.gpus
    gpn = _uniform(per_node.values())
    ranks: dict[int, str] = {}
    if gpn:
        for v in placed:
            if rank[v.name] is not None:
                ranks[rank[v.name] * gpn] = v.node
    starts = [v.started for v in views if v.ran and v.started]
    data: dict[str, Any] = {
        "workload_id": group.workload_id, "attempt": group.attempt, "scheduler": "kubernetes",
        "state": "Running", "start_time": min(starts) if starts else min(v.created for v in views if v.created),
        "nodes": nodes, "gpus_per_node": gpn, "ranks": ranks, "pods": {v.name: v.node for v in placed},
        "namespace": group.namespace, "job_name": group.name, "job_kind": group.kind,
    }
    if ended:
        state, code = outcome(views)
        ends = [t for v in views for t in (v.finished_at, v.failure_at) if t]
        data.update(state=state, exit_code=code, end_time=max(ends) if ends else None)
    return WorkloadRecord.model_validate(data)


def outcome(views: Sequence[PodView]) -> tuple[str, int | None]:
    """``("Succeeded", 0)`` or ``("Failed/<reason>", exit code)`` of the earliest failure."""
    latest: dict[str, PodView] = {}
    for v in sorted(views, key=lambda v: (v.created or datetime.min.replace(tzinfo=timezone.utc), v.name)):
        latest[v.slot] = v               # a re-created pod replaces the one it stands in for
    if all(v.succeeded for v in latest.values()):
        return "Succeeded", 0
    failed = [v for v in views if v.failure_reason]
    if not failed:
        return "Failed", None
    first = min(failed, key=lambda v: (v.failure_at is None, v.failure_at or datetime.max.replace(tzinfo=timezone.utc),
                                       v.name))
    return f"Failed/{first.failure_reason}", first.exit_code


class PodTracker:
    """Watch events in, SchedulerEvents out. Not thread-safe: one watch feeds one tracker."""

    def __init__(self, settle_s: float = 5.0, clock: Callable[[], float] = time.time) -> None:
        self.settle_s, self.clock = settle_s, clock
        self.groups: dict[tuple[str, str, str, int], Group] = {}
        self.resource_version: str | None = None

    def apply(self, event: Mapping[str, Any]) -> list[SchedulerEvent]:
        etype, obj = event.get("type"), event.get("object") or {}
        meta = obj.get("metadata") or {}
        if meta.get("resourceVersion"):
            self.resource_version = meta["resourceVersion"]
        if etype not in ("ADDED", "MODIFIED", "DELETED") or obj.get("kind", "Pod") != "Pod":
            return []                    # BOOKMARK carries only a resourceVersion
        labels = meta.get("labels") or {}
        found = group_of(labels)
        if found is None:
            return []
        kind, name = found
        attempt = _int(labels.get(ATTEMPT_LABEL)) or 0
        key = (meta.get("namespace", ""), kind, name, attempt)
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = Group(namespace=key[0], name=name, kind=kind, attempt=attempt)
        if group.ended:
            return []
        group.pods[meta.get("name", "")] = pod_view(obj, kind, deleted=etype == "DELETED")
        return self._step(group)

    def tick(self) -> list[SchedulerEvent]:
        """Ends whose settle time has passed (call it between events)."""
        out: list[SchedulerEvent] = []
        for group in list(self.groups.values()):
            if not group.ended and group.done_since is not None:
                out += self._step(group)
        return out

    def _step(self, group: Group) -> list[SchedulerEvent]:
        views = group.views()
        out: list[SchedulerEvent] = []
        if not any(v.ran for v in views):
            return out
        signature = json.dumps(sorted((v.name, v.node) for v in views if v.node))
        if signature != group.last_start:
            group.last_start = signature
            rec = workload_record(group, views, ended=False)
            out.append(SchedulerEvent(type="start", workload=rec, ts=rec.start_time))
        if all(v.done for v in views):
            now = self.clock()
            group.done_since = group.done_since if group.done_since is not None else now
            if now - group.done_since >= self.settle_s:
                end = workload_record(group, views, ended=True)
                group.ended = True
                group.pods.clear()       # an ended attempt keeps only its key
                out.append(SchedulerEvent(type="end", workload=end, ts=end.end_time or end.start_time))
        else:
            group.done_since = None
        return out


def event_key(ev: SchedulerEvent) -> str:
    wl = ev.workload
    if ev.type == "end":
        return f"{wl.workload_id}|{wl.attempt}|end"
    digest = hashlib.sha256(json.dumps(wl.pods, sort_keys=True).encode()).hexdigest()[:16]
    return f"{wl.workload_id}|{wl.attempt}|start|{digest}"


def replay(lines: Iterable[str | bytes], tracker: PodTracker) -> list[SchedulerEvent]:
    """Recorded watch output (JSON lines) through the tracker, as the live watch feeds it."""
    out: list[SchedulerEvent] = []
    for line in lines:
        if isinstance(line, bytes):
            line = line.decode("utf-8", "replace")
        if line.strip():
            out += tracker.apply(json.loads(line))
    return out + tracker.tick()


def watch_events(core_api: Any, namespace: str | None, selector: str | None, tracker: PodTracker,
                 stop: threading.Event, timeout_s: int = 60, reconnect: bool = True,
                 on_watch: Callable[[], None] | None = None) -> Iterator[dict[str, Any]]:
    """The API server's pod watch events as JSON, resuming from the last resourceVersion.

    ``timeout_s`` bounds each watch request so settled ends are published between
    events; an expired resourceVersion (410 Gone) restarts from a fresh list (the
    tracker then sees ADDED for every pod, and published keys filter repeats).
    ``on_watch`` is called after each watch request that ended normally (at least every
    ``timeout_s`` with no events: the connector's heartbeat and last success).
    """
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException

    while not stop.is_set():
        w = watch.Watch()
        # deserialize stays on: with it off the client cannot read an ERROR event (410 Gone).
        kwargs: dict[str, Any] = {"timeout_seconds": timeout_s, "allow_watch_bookmarks": True}
        if selector:
            kwargs["label_selector"] = selector
        if tracker.resource_version:
            kwargs["resource_version"] = tracker.resource_version
        func, args = ((core_api.list_namespaced_pod, (namespace,)) if namespace
                      else (core_api.list_pod_for_all_namespaces, ()))
        try:
            for event in w.stream(func, *args, **kwargs):
                yield {"type": event["type"], "object": event["raw_object"]}
                if stop.is_set():
                    w.stop()
                    break
        except ApiException as exc:
            if exc.status == 410:
                tracker.resource_version = None
                log.info("resourceVersion expired; listing again")
            else:
                raise
        else:
            if on_watch is not None:
                on_watch()
        if not reconnect:
            return


def run(events: Iterable[Mapping[str, Any]], tracker: PodTracker, publisher: Any, published: PublishedLog,
        metrics: ConnectorMetrics | None = None, backlog: list[SchedulerEvent] | None = None) -> int:
    """Feed events to the tracker and publish what is new; returns how many were published.

    ``backlog`` (owned by the caller, kept across calls) holds what the tracker already
    emitted but the broker has not confirmed: a failed publish raises and loses nothing.
    """
    backlog = [] if backlog is None else backlog
    sent = 0

    def flush(evs: list[SchedulerEvent]) -> None:
        nonlocal sent
        backlog.extend(published.new(evs, event_key))
        if backlog:
            publisher.publish(list(backlog))
            published.mark(backlog, event_key)
            sent += len(backlog)
            backlog.clear()

    for event in events:
        flush(tracker.apply(event) + tracker.tick())
        if metrics is not None:
            metrics.ok()
    flush(tracker.tick())
    return sent


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m firstfault.connectors.kubernetes",
                                description=__doc__.split("\n")[0])
    p.add_argument("--kafka-bootstrap", default=env("FIRSTFAULT_KAFKA_BOOTSTRAP"))
    p.add_argument("--namespace", default=env("FIRSTFAULT_K8S_NAMESPACE"), help="default: all namespaces")
    p.add_argument("--selector", default=env("FIRSTFAULT_K8S_SELECTOR"),
                   help="label selector of the training pods (FIRSTFAULT_K8S_SELECTOR)")
    p.add_argument("--state", default=env("FIRSTFAULT_K8S_STATE"), help="file of published keys (restart without repeats)")
    p.add_argument("--settle", type=float, default=float(env("FIRSTFAULT_K8S_SETTLE_S", "5")))
    p.add_argument("--replay", help="a file of recorded watch events (JSON lines) instead of the API server")
    p.add_argument("--dry-run", action="store_true", help="print events as JSON lines instead of publishing")
    p.add_argument("--metrics-port", type=int, default=int(env("FIRSTFAULT_METRICS_PORT", str(METRICS_PORT))))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    metrics = ConnectorMetrics("kubernetes", stale_after_s=300.0)     # a watch request ends every 60 s
    if args.dry_run:
        publisher: Any = PrintPublisher()
    else:
        cfg = StreamConfig.from_env(bootstrap=args.kafka_bootstrap)
        if not cfg.bootstrap:
            print("firstfault kubernetes: set FIRSTFAULT_KAFKA_BOOTSTRAP or --kafka-bootstrap (or use --dry-run)",
                  file=sys.stderr)
            return 2
        publisher = SchedulerPublisher(cfg, metrics)
    published = PublishedLog(Path(args.state) if args.state else None)
    if args.replay:
        tracker = PodTracker(settle_s=0.0)
        with open(args.replay, encoding="utf-8") as fh:
            run((json.loads(line) for line in fh if line.strip()), tracker, publisher, published, metrics)
        return 0
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    metrics.serve(args.metrics_port)
    stop = threading.Event()
    tracker = PodTracker(settle_s=args.settle)
    backlog: list[SchedulerEvent] = []
    while not stop.is_set():
        try:
            run(watch_events(client.CoreV1Api(), args.namespace, args.selector, tracker, stop, on_watch=metrics.ok),
                tracker, publisher, published, metrics, backlog)
        except KeyboardInterrupt:
            return 130
        except Exception as exc:         # API server or broker down: keep the tracker, try again
            metrics.failed(str(exc))
            log.warning("kubernetes watch failed, retrying in 5 s: %s", exc)
            stop.wait(5.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
