"""streams/health.py: /metrics, /healthz and /readyz on one port, over real HTTP."""
from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.parser import text_string_to_metric_families

from firstfault.connectors import metrics_names as M
from firstfault.streams.health import Health, LagSeries, port_from_env


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def get(url: str, method: str = "GET") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def served():
    made: list[Health] = []

    def serve(health: Health) -> str:
        made.append(health)
        return f"http://127.0.0.1:{health.start(0, '127.0.0.1')}"

    yield serve
    for h in made:
        h.close()


def test_liveness_follows_the_heartbeat(served):
    clock = Clock()
    h = Health(None, "w", stale_after_s=10, startup_s=30, clock=clock)
    url = served(h)
    status, body = get(url + "/healthz")
    assert status == 200 and body.startswith("starting")            # no beat yet, within the startup allowance
    clock.t += 31
    status, body = get(url + "/healthz")
    assert status == 503 and "no heartbeat" in body                 # never beat: stuck starting
    h.beat()
    assert get(url + "/healthz")[0] == 200
    clock.t += 9.5
    assert get(url + "/healthz")[0] == 200
    clock.t += 1.0                                                  # 10.5 s since the beat: stale
    status, body = get(url + "/healthz")
    assert status == 503 and body.startswith("stale") and "10s" in body
    h.beat()
    assert get(url + "/healthz")[0] == 200
    assert get(url + "/healthz", method="HEAD") == (200, "")


def test_readiness_gives_its_reason(served):
    clock = Clock()
    h = Health(None, "w", stale_after_s=10, clock=clock)
    url = served(h)
    assert get(url + "/readyz") == (503, "starting\n")               # not ready until told
    h.not_ready("waiting for the consumer group to assign partitions")
    h.beat()
    assert get(url + "/readyz") == (503, "waiting for the consumer group to assign partitions\n")
    h.ready()
    assert get(url + "/readyz") == (200, "ready\n")
    clock.t += 11                                                   # a stuck loop is not ready either
    status, body = get(url + "/readyz")
    assert status == 503 and body.startswith("stale")
    h.beat()
    h.not_ready("")
    assert get(url + "/readyz") == (503, "not ready\n")


def test_metrics_are_the_given_registry_and_other_paths_404(served):
    reg = CollectorRegistry()
    g = Gauge(M.WORKLOADS_OPEN, "open", registry=reg)
    g.set(7)
    url = served(Health(reg, "w"))
    status, body = get(url + "/metrics")
    assert status == 200
    samples = {s.name: s.value for f in text_string_to_metric_families(body) for s in f.samples}
    assert samples == {M.WORKLOADS_OPEN: 7.0}
    req = urllib.request.Request(url + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        assert resp.read().decode().endswith("# EOF\n")
    assert get(url + "/nope")[0] == 404
    assert get(url + "/metrics?x=1")[0] == 200


def test_port_zero_is_off_and_a_taken_port_fails_only_when_asked_for():
    h = Health(None, "w")
    assert h.serve(0) is None and h.port is None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        with pytest.raises(OSError, match="FIRSTFAULT_METRICS_PORT"):
            Health(None, "w").serve(taken, addr="127.0.0.1")
        assert Health(None, "w").serve(taken, addr="127.0.0.1", required=False) is None


def test_port_from_env():
    assert port_from_env({}) == (M.METRICS_PORT, False)
    assert port_from_env({"FIRSTFAULT_METRICS_PORT": " "}) == (M.METRICS_PORT, False)
    assert port_from_env({"FIRSTFAULT_METRICS_PORT": "0"}) == (0, True)
    assert port_from_env({"FIRSTFAULT_METRICS_PORT": "9500"}) == (9500, True)
    for bad in ("x", "-1", "70000"):
        with pytest.raises(ValueError, match="FIRSTFAULT_METRICS_PORT"):
            port_from_env({"FIRSTFAULT_METRICS_PORT": bad})


def test_lag_series_drop_revoked_partitions():
    reg = CollectorRegistry()
    g = Gauge(M.CONSUMER_LAG, "lag", ["worker", "topic", "partition"], registry=reg)
    lag = LagSeries(g, "extractor", {"p.raw": "raw"})

    def shown():
        return {tuple(s.labels[k] for k in ("topic", "partition")): s.value for s in next(iter(reg.collect())).samples}

    lag.show({("p.raw", 0): 5, ("p.raw", 1): 0})
    assert shown() == {("raw", "0"): 5, ("raw", "1"): 0}
    lag.show({("p.raw", 1): 2, ("other", 3): 1})
    assert shown() == {("raw", "1"): 2, ("other", "3"): 1}


def test_up_workers_serve_their_probes_on_loopback_unless_told(tmp_path, monkeypatch):
    """Issue 22, item 7: `up`'s workers served /metrics, /healthz, /readyz on 0.0.0.0, unauthenticated,
    while `serve` keeps to loopback. Now 127.0.0.1 unless FIRSTFAULT_METRICS_HOST says otherwise."""
    from firstfault.streams.config import StreamConfig
    from firstfault.streams.up import make_workers

    cfg = StreamConfig(bootstrap="127.0.0.1:9", redis_url="redis://127.0.0.1:6379/0", prefix="t.")
    monkeypatch.delenv("FIRSTFAULT_METRICS_HOST", raising=False)
    monkeypatch.delenv("FIRSTFAULT_METRICS_PORT", raising=False)
    workers = [w for w in make_workers(cfg, 1, str(tmp_path), slurm=True) if w.health_port]
    assert {w.name for w in workers} >= {"extractor-1", "correlator", "slurm", "slurm-tail"}
    for w in workers:
        assert w.env["FIRSTFAULT_METRICS_HOST"] == "127.0.0.1", w.name
        monkeypatch.setenv("FIRSTFAULT_METRICS_HOST", w.env["FIRSTFAULT_METRICS_HOST"])
        h = Health(None, w.name)
        try:
            assert h.serve(w.health_port) == w.health_port
            assert h._server.server_address[0] == "127.0.0.1"
            assert get(f"http://127.0.0.1:{w.health_port}/healthz")[0] == 200
        finally:
            h.close()
    monkeypatch.setenv("FIRSTFAULT_METRICS_HOST", "0.0.0.0")        # asked for: every interface
    assert {w.env["FIRSTFAULT_METRICS_HOST"] for w in make_workers(cfg, 1, str(tmp_path)) if w.health_port} == {
        "0.0.0.0"}
    monkeypatch.delenv("FIRSTFAULT_METRICS_HOST")
    h = Health(None, "standalone")                                  # a container's worker: its probes reach it
    try:
        h.serve(_free_port())
        assert h._server.server_address[0] == "0.0.0.0"
    finally:
        h.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
