"""confluent-kafka clients configured the way firstfault needs them.

Producers use murmur2 partitioning so keys land where Faust (aiokafka) expects
them (stack.md §1), and allow large messages. Topics are created with their final
partition count (Tansu cannot add partitions later).
"""
from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from .config import StreamConfig

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


def producer(cfg: StreamConfig, **extra: Any) -> Producer:
    return Producer({"bootstrap.servers": cfg.bootstrap, **PRODUCER_DEFAULTS, **extra})


def consumer(cfg: StreamConfig, group: str | None = None, **extra: Any) -> Consumer:
    conf = {"bootstrap.servers": cfg.bootstrap, **CONSUMER_DEFAULTS, **extra}
    conf["group.id"] = group or f"{cfg.prefix}reader"
    return Consumer(conf)


def ensure_topics(cfg: StreamConfig, names: list[str] | None = None, timeout: float = 15.0) -> list[str]:
    """Create the topics that do not exist yet; returns the ones created."""
    admin = AdminClient({"bootstrap.servers": cfg.bootstrap})
    wanted = names or list(cfg.topics.values())
    existing = set(admin.list_topics(timeout=timeout).topics)
    new = [NewTopic(t, num_partitions=cfg.partitions, replication_factor=1) for t in wanted if t not in existing]
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
