"""confluent-kafka clients configured the way firstfault needs them.

Producers use murmur2 partitioning so keys land where Faust (aiokafka) expects
them (stack.md §1), and allow large messages. Topics are created with their final
partition count (Tansu cannot add partitions later).

librdkafka's own log (connection retries, every few hundred ms) goes to the
``firstfault.librdkafka`` logger, not straight to stderr: a worker that configures
logging shows it, a command line does not (it checks the broker first, reach.py).
"""
from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from .config import StreamConfig

LIBRDKAFKA_LOG = logging.getLogger("firstfault.librdkafka")
LIBRDKAFKA_LOG.addHandler(logging.NullHandler())      # unconfigured: silent, not Python's last-resort stderr

PRODUCER_DEFAULTS: dict[str, Any] = {
    "partitioner": "murmur2_random",
    "linger.ms": 5,
    "message.max.bytes": 10 * 1024 * 1024,
    "enable.idempotence": True,
}
CONSUMER_DEFAULTS: dict[str, Any] = {
    "auto.offset.reset": "earliest",
    "enable.auto.commit": False,
    "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 1000,
}


def client_conf(bootstrap: str | None, **extra: Any) -> dict[str, Any]:
    """What every client gets: the bootstrap, and librdkafka's log through ``LIBRDKAFKA_LOG``."""
    return {"bootstrap.servers": bootstrap, "logger": LIBRDKAFKA_LOG, **extra}


def producer(cfg: StreamConfig, **extra: Any) -> Producer:
    return Producer(client_conf(cfg.bootstrap, **{**PRODUCER_DEFAULTS, **extra}))


def consumer(cfg: StreamConfig, group: str | None = None, **extra: Any) -> Consumer:
    conf = client_conf(cfg.bootstrap, **{**CONSUMER_DEFAULTS, **extra})
    conf["group.id"] = group or f"{cfg.prefix}reader"
    return Consumer(conf)


def ensure_topics(cfg: StreamConfig, names: list[str] | None = None, timeout: float = 15.0) -> list[str]:
    """Create the topics that do not exist yet; returns the ones created."""
    admin = AdminClient(client_conf(cfg.bootstrap))
    wanted = names or list(cfg.topics.values())
    existing = set(admin.list_topics(timeout=timeout).topics)
    # Progress keeps one record per raw partition that matters: the latest (compacted).
    # Rules keeps the latest record per key (a catalog version, the live and shadow pointers), on
    # one partition so a pointer is never read before the version it names (streams/rules_feed.py).
    compact = {cfg.topic("progress"), cfg.topic("rules"), cfg.topic("node-health")}
    new = [NewTopic(t, num_partitions=1 if t == cfg.topic("rules") else cfg.partitions, replication_factor=1,
                    config={"cleanup.policy": "compact"} if t in compact else {})
           for t in wanted if t not in existing]
    created = []
    if new:
        futures = admin.create_topics(new, operation_timeout=timeout)
        for topic, fut in futures.items():
            try:
                fut.result(timeout)
                created.append(topic)
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise
    return created


def consumer_lag(consumer: Consumer, start: int | None = None, timeout: float = 2.0) -> dict[tuple[str, int], int]:
    """Records behind, per assigned (topic, partition): the high watermark minus the consumer's position.

    The high watermark is the one the last fetch reported (``cached=True``): no broker
    round trip, and right on Tansu, whose ListOffsets answer is not (stack.md §1). A
    partition nothing was read from since its assignment counts from ``start`` (a
    consumer that ``assign()``ed from a fixed offset) or else from its committed offset
    (one request, only for those partitions); one whose watermark no fetch reported yet,
    or with neither, is left out rather than guessed.
    """
    parts = consumer.assignment()
    if not parts:
        return {}
    out: dict[tuple[str, int], int] = {}
    unread: list[tuple[TopicPartition, int]] = []
    for tp in consumer.position(parts):
        try:
            _, high = consumer.get_watermark_offsets(tp, cached=True)
        except KafkaException:
            continue
        if high is None or high < 0:
            continue
        if tp.offset >= 0:
            out[(tp.topic, tp.partition)] = max(0, high - tp.offset)
        else:
            unread.append((tp, high))
    if unread:
        if start is not None:
            known = {(tp.topic, tp.partition): start for tp, _ in unread}
        else:
            try:
                committed = consumer.committed([TopicPartition(tp.topic, tp.partition) for tp, _ in unread],
                                               timeout=timeout)
            except KafkaException:
                committed = []
            known = {(c.topic, c.partition): c.offset for c in committed if c.offset >= 0}
        for tp, high in unread:
            pos = known.get((tp.topic, tp.partition))
            if pos is not None:
                out[(tp.topic, tp.partition)] = max(0, high - pos)
            elif high == 0:                      # an empty partition: nothing to be behind on
                out[(tp.topic, tp.partition)] = 0
    return out
