"""Alerting sink against real HTTP receivers on local ports (stdlib http.server in a thread)."""
from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest
import yaml

from firstfault.connectors import metrics_names as M
from firstfault.connectors.enrich import Inventory
from firstfault.connectors.sinks import alerts
from firstfault.connectors.sinks.alerts import AlertConfig, AlertSink, WebhookConfig
from firstfault.rules.engine import analyze_path
from firstfault.schemas import SchedulerEvent, WorkloadRecord
from firstfault.schemas.avro import encode
from firstfault.streams import kafka

from webhook_receiver import Receiver

pytest_plugins = ["conftest_kafka"]

SAMPLES = Path(__file__).resolve().parents[1] / "samples"


@pytest.fixture
def receivers():
    made: list[Receiver] = []

    def make(**kw) -> Receiver:
        r = Receiver(**kw)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


@pytest.fixture
def sinks():
    made: list[AlertSink] = []

    def make(webhooks: list[dict], **kw) -> AlertSink:
        cfg = AlertConfig(webhooks=[WebhookConfig(**w) for w in webhooks], backoff_initial_s=0.05,
                          backoff_max_s=0.4, jitter=0, **kw)
        s = AlertSink(cfg, inventory=kw.pop("inventory", None))
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


@pytest.fixture(scope="module")
def diag():
    return {name: analyze_path(SAMPLES / name).diagnosis
            for name in ("worked-example", "ambiguous-two-faults", "clean-completion", "gpu-fell-off-bus-32node",
                         "unattributed-straggler")}


def variant(d, i: int):
    return d.model_copy(update={"workload_id": f"slurm-{9000 + i}", "diagnosis_id": f"sha256:{i:032x}"})


def value(sink: AlertSink, name: str, **labels) -> float:
    return sink.metrics.registry.get_sample_value(name, labels) or 0.0


def wait_for(pred, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def test_generic_slack_and_pagerduty_bodies(receivers, sinks, diag):
    plain, slack, pd = receivers(), receivers(), receivers()
    inv = Inventory.model_validate({"groups": [{"hosts": "node-[01-04]", "rack": "r12", "leaf_switch": "leaf-12a"}]})
    sink = AlertSink(AlertConfig(webhooks=[
        WebhookConfig(name="plain", url=plain.url),
        WebhookConfig(name="slack", format="slack", url=slack.url),
        WebhookConfig(name="pd", format="pagerduty", url=pd.url, routing_key="R0UT1NGKEY"),
    ], link_base_url="https://firstfault.example"), inventory=inv)
    try:
        d = diag["worked-example"]
        wl = WorkloadRecord.model_validate_json((SAMPLES / "worked-example" / "workload.json").read_text())
        wl = WorkloadRecord.model_validate({**wl.model_dump(), "user": "mchen", "job_name": "llama-pretrain",
                                            "partition": "gpu"})
        assert sink.submit(d, wl) == 3
        assert sink.drain(10)
    finally:
        sink.close()
    body = plain.requests[0]["body"]
    assert plain.requests[0]["type"] == "application/json"
    assert body["diagnosis"] == json.loads(d.to_json())
    assert body["workload"]["user"] == "mchen" and body["workload"]["gpu_count"] == 32
    assert body["topology"]["hosts"][0] == {"host": "node-02", "role": "responsible", "rack": "r12",
                                            "leaf_switch": "leaf-12a", "nvlink_domain": None, "known": True}
    s = slack.requests[0]["body"]
    assert set(s) == {"text", "blocks"} and "nvlink_signal_integrity on node-02" in s["text"]
    assert [b["type"] for b in s["blocks"]] == ["section", "section", "context"]
    p = pd.requests[0]["body"]
    assert p["routing_key"] == "R0UT1NGKEY" and p["event_action"] == "trigger"
    assert p["dedup_key"] == "firstfault/slurm-4471823/0"
    assert set(p["payload"]) >= {"summary", "source", "severity", "timestamp", "class", "custom_details"}
    assert p["payload"]["source"] == "node-02" and p["payload"]["severity"] == "critical"
    assert len(p["payload"]["summary"]) <= 1024
    assert p["payload"]["custom_details"]["diagnosis_id"] == d.diagnosis_id
    assert p["links"] == [{"href": "https://firstfault.example/ui/diagnoses/slurm-4471823?attempt=0",
                           "text": "firstfault diagnosis"}]


def test_statuses_domains_provisional_and_duplicates(receivers, sinks, diag):
    everything, gpu_only = receivers(), receivers()
    sink = sinks([{"name": "all", "url": everything.url},
                  {"name": "gpu", "url": gpu_only.url, "domains": ["gpu", "host"], "statuses": ["attributed", "ambiguous"]}])
    sink.submit(diag["worked-example"])                        # interconnect: "all" only
    sink.submit(diag["gpu-fell-off-bus-32node"])               # host (pcie_error): both
    sink.submit(diag["ambiguous-two-faults"])                  # candidates network + gpu: both
    sink.submit(diag["unattributed-straggler"])                # "all" only (status)
    sink.submit(diag["clean-completion"])                      # no_failure: nobody
    sink.submit(variant(diag["worked-example"], 1).model_copy(update={"provisional": True, "revision": 0}))
    sink.submit(diag["worked-example"])                        # the same diagnosis_id again
    assert sink.drain(10)
    ids = lambda r: [q["body"]["diagnosis"]["workload_id"] for q in r.requests]  # noqa: E731
    assert ids(everything) == ["slurm-4471823", "slurm-4472001", "slurm-4472230", "slurm-4472345"]
    assert {q["body"]["diagnosis"]["sub_domain"] for q in gpu_only.requests} == {"pcie_error", "ambiguous"}
    assert value(sink, "firstfault_alerts_skipped_total", reason="duplicate") == 1
    assert value(sink, "firstfault_alerts_skipped_total", reason="filtered") == 2
    assert value(sink, "firstfault_alerts_sent_total", webhook="all") == 4


def test_retries_with_exponential_backoff(receivers, sinks, diag):
    flaky = receivers(fail_first=3, status=503)
    sink = sinks([{"name": "flaky", "url": flaky.url}])
    sink.submit(diag["worked-example"])
    assert wait_for(lambda: value(sink, "firstfault_alerts_sent_total", webhook="flaky") == 1)
    t = [r["t"] for r in flaky.requests]
    gaps = [b - a for a, b in zip(t, t[1:])]
    assert len(t) == 4 and value(sink, "firstfault_alert_attempt_failures_total", webhook="flaky") == 3
    assert gaps[0] >= 0.05 and gaps[1] >= 0.1 and gaps[2] >= 0.2          # 0.05 * 2^n
    assert len({json.dumps(r["body"], sort_keys=True) for r in flaky.requests}) == 1   # the same alert each time


def test_retry_after_is_honoured(receivers, sinks, diag):
    slow = receivers(fail_first=1, status=429, retry_after="1")
    sink = AlertSink(AlertConfig(webhooks=[WebhookConfig(name="slow", url=slow.url)], backoff_initial_s=0.05,
                                 backoff_max_s=5, jitter=0))
    try:
        sink.submit(diag["worked-example"])
        assert wait_for(lambda: len(slow.requests) == 2)
        assert slow.requests[1]["t"] - slow.requests[0]["t"] >= 1.0
    finally:
        sink.close()


def test_a_refused_body_is_dropped_not_retried(receivers, sinks, diag):
    picky = receivers(fail_first=10, status=400)
    sink = sinks([{"name": "picky", "url": picky.url}])
    sink.submit(diag["worked-example"])
    assert wait_for(lambda: value(sink, "firstfault_alerts_dropped_total", webhook="picky", reason="rejected") == 1)
    time.sleep(0.3)
    assert len(picky.requests) == 1 and sink.depth() == 0


def test_a_dead_webhook_keeps_alerts_bounded_and_counted(receivers, sinks, diag):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]                              # nobody listens here yet
    sink = sinks([{"name": "dead", "url": f"http://127.0.0.1:{port}/hook", "timeout_s": 5}], queue_max=3)
    t0 = time.monotonic()
    for i in range(5):
        sink.submit(variant(diag["worked-example"], i))
    # submit never waits for the network: five submits take less than the one timeout_s (a bound with
    # room for a busy machine, not a speed)
    assert time.monotonic() - t0 < 5.0
    assert wait_for(lambda: value(sink, "firstfault_alert_attempt_failures_total", webhook="dead") >= 2)
    assert sink.depth() == 3
    assert value(sink, "firstfault_alerts_dropped_total", webhook="dead", reason="queue_full") == 2
    assert value(sink, M.ALERT_QUEUE_DEPTH, webhook="dead") == 3
    assert value(sink, M.ALERT_OLDEST_AGE, webhook="dead") > 0
    back = receivers(port=port)                                 # the webhook comes back
    assert sink.drain(10)
    assert [r["body"]["diagnosis"]["workload_id"] for r in back.requests] == ["slurm-9002", "slurm-9003", "slurm-9004"]
    assert value(sink, "firstfault_alerts_sent_total", webhook="dead") == 3


def test_config_file_and_secrets_by_variable(tmp_path, monkeypatch, receivers):
    r = receivers()
    cfg = tmp_path / "alerts.yaml"
    cfg.write_text(yaml.safe_dump({"webhooks": [
        {"name": "slack", "format": "slack", "url_env": "FIRSTFAULT_ALERT_SLACK_URL"},
        {"name": "pd", "format": "pagerduty", "url": r.url, "routing_key_env": "FIRSTFAULT_ALERT_PAGERDUTY_ROUTING_KEY"}]}))
    loaded = AlertConfig.load(str(cfg))
    with pytest.raises(ValueError, match="FIRSTFAULT_ALERT_SLACK_URL is not set"):
        AlertSink(loaded)
    monkeypatch.setenv("FIRSTFAULT_ALERT_SLACK_URL", r.url)
    monkeypatch.setenv("FIRSTFAULT_ALERT_PAGERDUTY_ROUTING_KEY", "K3Y")
    AlertSink(loaded).close()
    with pytest.raises(ValueError):
        AlertConfig.model_validate({"webhooks": [{"name": "x", "url_env": "SLACK_URL"}]})     # not FIRSTFAULT_
    with pytest.raises(ValueError):
        AlertConfig.model_validate({"webhooks": [{"name": "pd", "format": "pagerduty", "url": r.url}]})


def test_runner_alerts_from_the_diagnoses_topic(stream_cfg, receivers, diag):
    kafka.ensure_topics(stream_cfg, [stream_cfg.topic("diagnoses"), stream_cfg.topic("scheduler")])
    hook = receivers(fail_first=2, status=502)
    d = diag["worked-example"]
    wl = WorkloadRecord.model_validate_json((SAMPLES / "worked-example" / "workload.json").read_text())
    wl = WorkloadRecord.model_validate({**wl.model_dump(), "user": "mchen", "job_name": "llama-pretrain"})
    prod = kafka.producer(stream_cfg)
    prod.produce(stream_cfg.topic("scheduler"), key=wl.workload_id.encode(),
                 value=encode(SchedulerEvent(type="end", workload=wl, ts=wl.end_time)))
    prod.flush(10)
    time.sleep(0.3)
    prod.produce(stream_cfg.topic("diagnoses"), key=d.workload_id.encode(), value=encode(d))
    prod.produce(stream_cfg.topic("diagnoses"), key=d.workload_id.encode(), value=encode(d))   # a redelivery
    prod.flush(10)
    sink = AlertSink(AlertConfig(webhooks=[WebhookConfig(name="hook", url=hook.url)], backoff_initial_s=0.05,
                                 backoff_max_s=0.2, jitter=0))
    stop = threading.Event()
    group = f"{stream_cfg.prefix}alerts"
    t = threading.Thread(target=alerts.run, args=(stream_cfg, sink, group, stop), daemon=True)
    t.start()
    try:
        assert wait_for(lambda: value(sink, "firstfault_alerts_sent_total", webhook="hook") == 1, 20)
        assert wait_for(lambda: not sink.pending_origins(), 5)
        time.sleep(1.0)                                         # a loop or two: commits catch up
    finally:
        stop.set()
        t.join(10)
        sink.close()
    assert len(hook.requests) == 3                              # two 502s, then delivered; the copy skipped
    assert hook.requests[-1]["body"]["workload"]["user"] == "mchen"
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": stream_cfg.bootstrap, "group.id": group})
    topic = stream_cfg.topic("diagnoses")
    parts = c.list_topics(topic, timeout=10).topics[topic].partitions
    committed = c.committed([TopicPartition(topic, p) for p in parts], timeout=10)
    c.close()
    assert sum(tp.offset for tp in committed if tp.offset >= 0) == 2


def test_only_declared_metric_names_are_exported(receivers, diag):
    r = receivers()
    sink = AlertSink(AlertConfig(webhooks=[WebhookConfig(name="x", url=r.url)]))
    try:
        sink.submit(diag["worked-example"])
        sink.drain(5)
        names = {s.name for fam in sink.metrics.registry.collect() for s in fam.samples}
    finally:
        sink.close()
    exported = {n for n in names if not n.endswith("_created")}
    assert exported and all(M.is_declared(n) for n in exported), exported - M.DECLARED
