"""Is the broker, or Redis, there? Asked once, before a command works, with a short timeout.

An unreachable address must come out as one line that names it and says what to
try, within seconds: not librdkafka's retry log for 15 s and a traceback. A TCP
connect answers "refused" or "unknown host" at once; a port that accepts but does
not answer Kafka's metadata request in time is not a broker.
"""
from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit, urlunsplit

from firstfault.rules.errors import FirstfaultError

BROKER_TIMEOUT_S = 5.0
REDIS_TIMEOUT_S = 3.0


class Unreachable(FirstfaultError):
    """A broker or Redis that does not answer; the message is the whole story, in one line."""


def addresses(bootstrap: str) -> list[tuple[str, int]]:
    """``host:port[,host:port]`` (an optional ``scheme://`` each, IPv6 in brackets) -> (host, port)s."""
    out = []
    for part in bootstrap.split(","):
        part = part.strip()
        if "://" in part:
            part = part.split("://", 1)[1]
        host, sep, port = part.rpartition(":")
        if not sep or not port.isdigit():
            continue
        out.append((host.strip("[]") or "localhost", int(port)))
    return out


def _connect_error(host: str, port: int, timeout: float) -> str | None:
    """None if a TCP connection opens, else why not, in a few words."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except socket.gaierror:
        return f"unknown host {host}"
    except TimeoutError:
        return f"no answer from {host}:{port} in {timeout:g} s"
    except OSError as exc:
        return (exc.strerror or str(exc)).lower()


def check_broker(bootstrap: str, hint: str, timeout: float = BROKER_TIMEOUT_S) -> None:
    """Raise :class:`Unreachable` unless some bootstrap address answers a metadata request in ``timeout``.

    ``hint``: what to try, e.g. "check FIRSTFAULT_KAFKA_BOOTSTRAP or --bootstrap".
    """
    deadline = time.monotonic() + timeout
    addrs = addresses(bootstrap)
    if addrs:
        why = [_connect_error(h, p, min(2.0, timeout)) for h, p in addrs]
        if all(why):
            raise Unreachable(f"cannot reach the Kafka broker at {bootstrap} ({why[0]}); {hint}")
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from .kafka import client_conf

    admin = AdminClient(client_conf(bootstrap, **{"socket.connection.setup.timeout.ms": int(timeout * 1000)}))
    try:
        admin.list_topics(timeout=max(0.5, deadline - time.monotonic()))
    except KafkaException as exc:
        err = exc.args[0] if exc.args else exc
        what = err.str() if hasattr(err, "str") else str(err)
        raise Unreachable(f"no Kafka broker answered at {bootstrap} in {timeout:g} s ({what}); {hint}") from None


def redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        netloc = f"{parts.username or ''}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def check_redis(url: str, hint: str, timeout: float = REDIS_TIMEOUT_S) -> None:
    """Raise :class:`Unreachable` unless Redis at ``url`` answers PING within ``timeout``."""
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    except ValueError as exc:
        raise Unreachable(f"not a Redis URL: {redact(url)} ({exc}); {hint}") from None
    try:
        client.ping()
    except redis.exceptions.RedisError as exc:
        why = str(exc).strip().rstrip(".") or type(exc).__name__
        raise Unreachable(f"cannot reach Redis at {redact(url)} ({why}); {hint}") from None
    finally:
        client.close()
