"""The fleet memory on the stream: ``firstfault nodes`` and the node-health worker.

    firstfault nodes [NODE] [--json] [--rebuild] [--topology FILE] [--at ISO]

reads each node's record from Redis (``{FIRSTFAULT_REDIS_PREFIX}node:{host}``) and prints its
recommendation (``avoid`` / ``watch`` / ``ok``) and why, then any broad event and shared cause.
``--rebuild`` first clears the record and rebuilds it from the diagnoses topic, read from
the beginning, and publishes each node's record to the compacted ``node-health`` topic
(key: the host). With no Redis at all, the record is built in this process from the topic.

    python -m firstfault.streams.node_health --follow

keeps the record current: a consumer group on the diagnoses topic records each final
diagnosis' episodes and publishes the nodes it touched to ``node-health``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from .config import StreamConfig

if TYPE_CHECKING:
    from confluent_kafka import Producer

    from firstfault.connectors.sinks.node_health import NodeHealthStore
    from firstfault.rules.fleet import FleetReport

log = logging.getLogger("firstfault.node_health")
TOPIC = "node-health"


def ensure_node_health_topic(cfg: StreamConfig) -> None:
    """``node-health`` is compacted: the latest record per host is all a rebuild needs."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic

    from . import kafka
    from .kafka import AdminClient

    admin = AdminClient(kafka.client_conf(cfg.bootstrap))
    name = cfg.topic(TOPIC)
    if name in admin.list_topics(timeout=15).topics:
        return
    fut = admin.create_topics([NewTopic(name, num_partitions=cfg.partitions, replication_factor=1,
                                        config={"cleanup.policy": "compact"})], operation_timeout=15)[name]
    try:
        fut.result(15)
    except KafkaException as exc:
        if "TOPIC_ALREADY_EXISTS" not in str(exc):
            raise


def node_record(store: NodeHealthStore, host: str) -> dict:
    """What ``node-health`` carries for one host: its episodes, oldest first."""
    return {"host": host, "episodes": [e.model_dump(mode="json") for e in store.episodes(host)]}


def publish(producer: Producer, cfg: StreamConfig, store: NodeHealthStore, hosts: Iterable[str]) -> int:
    n = 0
    for host in sorted(set(hosts)):
        value = json.dumps(node_record(store, host), sort_keys=True, separators=(",", ":"))
        producer.produce(cfg.topic(TOPIC), key=host.encode(), value=value.encode())
        n += 1
    producer.flush(15)
    return n


def rebuild(cfg: StreamConfig, store: NodeHealthStore, publish_topic: bool = True, idle_s: float = 2.0) -> dict:
    """Clear the record, then record every diagnosis on the diagnoses topic from the beginning."""
    from .follow import TopicReader, decode_diagnosis, iso_ms

    cleared = store.clear()
    reader = TopicReader(cfg, cfg.topic("diagnoses"), idle_s=idle_s)
    diagnoses = episodes = 0
    for m in reader:
        d = decode_diagnosis(m.value())
        if d is None:
            continue
        ts_type, ts = m.timestamp()
        diagnoses += 1
        episodes += len(store.record(d, fallback_at=iso_ms(ts) if ts_type and ts else None))
    published = 0
    if publish_topic:
        from . import kafka

        ensure_node_health_topic(cfg)
        producer = kafka.producer(cfg)
        published = publish(producer, cfg, store, store.hosts())
    return {"cleared_keys": cleared, "diagnoses": diagnoses, "episodes": episodes, "published": published}


# ---------------------------------------------------------------- the command

def _table(report: FleetReport, only: str | None) -> list[str]:
    rows = [(n.host, n.recommendation, ",".join(f"{f}:{c}" for f, c in n.counts.items()) or "-", n.why)
            for n in report.nodes if only is None or n.host == only]
    out = []
    if rows:
        header = ("NODE", "RECOMMENDATION", "COUNTED", "WHY")
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
        for r in [header, *rows]:
            out.append("  ".join(v.ljust(w) for v, w in zip(r[:3], widths)) + "  " + r[3])
    if only is not None:
        for n in report.nodes:
            if n.host == only:
                out.append("")
                out += [f"  {e.at}  {e.family:<12} {e.sub_domain:<24} {e.role:<10} {e.workload_id}#{e.attempt}"
                        for e in n.episodes]
    for b in report.broad_events:
        out.append(f"BROAD EVENT {b.cycle_start} .. {b.cycle_end}: {len(b.nodes)} nodes ({', '.join(b.families)}): "
                   f"{b.note}")
        out += [f"  shared cause: {c.kind} {c.name}: {c.why}" for c in b.shared_causes]
    for c in report.shared_causes:
        out.append(f"SHARED CAUSE {c.kind} {c.name}: {c.why}")
        out += [f"  {e}" for e in c.episodes]
    return out


def _store(args: argparse.Namespace, cfg: StreamConfig) -> NodeHealthStore:
    from firstfault.connectors.sinks.node_health import NodeHealthStore

    return NodeHealthStore(cfg.redis_url, cfg.redis_prefix)


def cmd_nodes(args: argparse.Namespace) -> int:
    from firstfault.connectors.sinks.node_health import fleet_report, topology_from_env
    from firstfault.rules.errors import FirstfaultError
    from pydantic import ValidationError

    from firstfault.rules.fleet import POLICY_ENV, Policy

    from . import reach, runfile

    try:
        policy = Policy.from_env(os.environ)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = "FIRSTFAULT_" + POLICY_ENV.get(str(err["loc"][0]), str(err["loc"][0])) if err["loc"] else "FIRSTFAULT_AVOID_*"
        raise FirstfaultError(f"{name}: {err['msg']}; fix or unset it") from None
    try:
        topology = topology_from_env(args.topology)
    except ValueError as exc:
        raise FirstfaultError(f"{exc}; fix the file or drop --topology / FIRSTFAULT_TOPOLOGY") from None
    redis_url = runfile.stored_redis(args.redis_url)
    need_topic = args.rebuild or not redis_url
    bootstrap, prefix = args.bootstrap, args.prefix
    if need_topic:
        where = runfile.resolve(args.bootstrap, redis_url, args.prefix)
        bootstrap, prefix, redis_url = where.bootstrap, where.prefix, redis_url or where.redis_url
        reach.check_broker(bootstrap, "check FIRSTFAULT_KAFKA_BOOTSTRAP or --bootstrap, or start `firstfault up`")
    if redis_url:
        reach.check_redis(redis_url, "check FIRSTFAULT_REDIS_URL or --redis-url")
    cfg = StreamConfig.from_env(bootstrap=bootstrap, redis_url=redis_url, prefix=prefix)
    store = _store(args, cfg)
    if need_topic:
        stats = rebuild(cfg, store, publish_topic=True)
        where_kept = f"Redis ({cfg.redis_prefix}node:*)" if redis_url else "this process only (no Redis)"
        print(f"firstfault: node record rebuilt from {cfg.topic('diagnoses')}: {stats['diagnoses']} diagnoses, "
              f"{stats['episodes']} episodes on {len(store.hosts())} nodes, kept in {where_kept}; "
              f"{stats['published']} node records published to {cfg.topic(TOPIC)}", file=sys.stderr)
    report = fleet_report(store, policy, topology, args.at)
    if args.node and not any(n.host == args.node for n in report.nodes):
        print(f"firstfault: no episode recorded for node {args.node!r} (its recommendation: ok)", file=sys.stderr)
    if args.json:
        data = report.model_dump(mode="json")
        if args.node:
            data["nodes"] = [n for n in data["nodes"] if n["host"] == args.node]
        json.dump(data, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
        return 0
    lines = _table(report, args.node)
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")
    elif not report.nodes:
        print("no node has an episode recorded: nothing to avoid", file=sys.stderr)
    for note in report.notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


def _at(text: str) -> datetime:
    from .follow import parse_time

    return datetime.fromtimestamp(parse_time(text) / 1000, timezone.utc)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "nodes", help="the fleet memory: each node's failure episodes, its recommendation (avoid, watch, ok) and why",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  firstfault nodes                          every node with an episode, its recommendation and why\n"
               "  firstfault nodes node-07                  one node's episodes\n"
               "  firstfault nodes --rebuild                rebuild the record from the diagnoses topic first\n"
               "  firstfault nodes --topology topology.conf name the switch or rack shared by a broad event\n"
               "policy: FIRSTFAULT_AVOID_MIN_EPISODES=2, _WINDOW_DAYS=14, _MAX_NEW_PER_CYCLE=1, _CYCLE_S=3600,\n"
               "        _BROAD_THRESHOLD=16, _COUNT_SUSPECTS=1, _SHARED_MIN_NODES=2, _RETAIN_MARGIN_DAYS=2")
    p.add_argument("node", nargs="?", help="show only this node, with its episodes")
    p.add_argument("--json", action="store_true", help="the fleet report as one JSON object")
    p.add_argument("--rebuild", action="store_true",
                   help="clear the record and rebuild it from the diagnoses topic, then publish it to node-health")
    p.add_argument("--topology", default=None,
                   help="Slurm topology.conf, a switch/rack YAML or `kubectl get nodes -o json` (FIRSTFAULT_TOPOLOGY)")
    p.add_argument("--at", type=_at, default=None,
                   help="evaluate the policy at this time (ISO-8601, now, or an age: 2d); default: now")
    p.add_argument("--bootstrap", default=None, help="Kafka bootstrap servers (FIRSTFAULT_KAFKA_BOOTSTRAP)")
    p.add_argument("--redis-url", default=None, help="Redis URL (FIRSTFAULT_REDIS_URL)")
    p.add_argument("--prefix", default=None, help="topic prefix (FIRSTFAULT_TOPIC_PREFIX, default 'firstfault.')")
    p.set_defaults(fn=cmd_nodes)


# ---------------------------------------------------------------- the worker

STORE_RETRY_FIRST_S = 1.0       # Redis down: the first retry of a batch after this long ...
STORE_RETRY_MAX_S = 30.0        # ... doubling up to this


def _record_batch(store: NodeHealthStore, msgs: list) -> set[str]:
    """Record a batch's diagnoses; the hosts they touched. Idempotent: a retried batch records the same."""
    from .follow import decode_diagnosis, iso_ms

    touched: set[str] = set()
    for m in msgs:
        if m.error() is not None:
            continue
        d = decode_diagnosis(m.value())
        if d is None:
            continue
        ts_type, ts = m.timestamp()
        touched.update(e.host for e in store.record(d, fallback_at=iso_ms(ts) if ts_type and ts else None))
    return touched


def follow(cfg: StreamConfig, store: NodeHealthStore, stop: threading.Event,
           group: str = "firstfault-node-health", retry_first_s: float = STORE_RETRY_FIRST_S,
           retry_max_s: float = STORE_RETRY_MAX_S) -> None:
    """Record every diagnosis of the topic and publish the nodes it touched, until ``stop``.

    While Redis is down the worker keeps its batch (nothing is committed) and retries it with
    backoff, saying so in one log line per attempt and once when Redis is back: it does not
    exit, so ``up`` has nothing to restart and no traceback to show."""
    from firstfault.connectors.sinks.redis_store import StoreUnavailable

    from . import kafka

    ensure_node_health_topic(cfg)
    consumer = kafka.consumer(cfg, group)
    producer = kafka.producer(cfg)
    consumer.subscribe([cfg.topic("diagnoses")])
    try:
        while not stop.is_set():
            msgs = consumer.consume(num_messages=200, timeout=0.5) or []
            delay, down_since = retry_first_s, None
            while True:
                try:
                    touched = _record_batch(store, msgs)
                    if touched:
                        publish(producer, cfg, store, touched)
                    break
                except StoreUnavailable as exc:
                    if down_since is None:
                        down_since = time.monotonic()
                    log.warning("node-health: the record's store is unavailable (%s); %d diagnoses wait, "
                                "retrying in %.0fs", " ".join(str(exc).split())[:200], len(msgs), delay)
                    if stop.wait(delay):
                        return
                    delay = min(retry_max_s, delay * 2)
            if down_since is not None:
                log.warning("node-health: the store is back after %.0fs; recorded the waiting diagnoses",
                            time.monotonic() - down_since)
            if msgs:
                consumer.commit(asynchronous=False)
    finally:
        consumer.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m firstfault.streams.node_health", description=__doc__.split("\n")[0])
    p.add_argument("--follow", action="store_true", help="keep the record current from the diagnoses topic")
    p.add_argument("--group", default=os.environ.get("FIRSTFAULT_NODE_HEALTH_GROUP", "firstfault-node-health"))
    args = p.parse_args(argv)
    if not args.follow:
        p.error("--follow is the worker; `firstfault nodes` reads the record")
    cfg = StreamConfig.from_env()
    if not cfg.bootstrap or not cfg.redis_url:
        print("firstfault node-health: set FIRSTFAULT_KAFKA_BOOTSTRAP and FIRSTFAULT_REDIS_URL", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from firstfault.connectors.sinks.node_health import NodeHealthStore

    stop = threading.Event()
    try:
        follow(cfg, NodeHealthStore(cfg.redis_url, cfg.redis_prefix), stop, args.group)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
