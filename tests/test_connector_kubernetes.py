"""Kubernetes connector: recorded pod watch streams, through the tracker and through the real client."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from firstfault.connectors import kubernetes as k8s
from firstfault.connectors.kubernetes import PodTracker, replay, watch_events
from firstfault.connectors.publish import PublishedLog, SchedulerPublisher
from firstfault.schemas.avro import decode
from firstfault.streams import kafka

pytest_plugins = ["conftest_kafka"]

FIX = Path(__file__).parent / "fixtures" / "kubernetes"


def lines(name: str) -> list[str]:
    return (FIX / name).read_text().splitlines()


def test_pytorchjob_with_an_oomkilled_worker():
    events = replay(lines("pytorchjob-oomkilled.jsonl"), PodTracker(settle_s=0))
    assert [e.type for e in events] == ["start", "end"]
    start, end = events[0].workload, events[1].workload
    assert start.workload_id == "k8s-ml-team.llama-ft" and start.attempt == 0 and start.scheduler == "kubernetes"
    assert start.state == "Running" and start.end_time is None
    assert end.state == "Failed/OOMKilled" and end.exit_code == 137 and end.terminal_state == "out_of_memory"
    assert end.nodes == ["gpu-a01", "gpu-a02", "gpu-a03"]
    assert end.pods == {"llama-ft-master-0": "gpu-a01", "llama-ft-worker-0": "gpu-a02", "llama-ft-worker-1": "gpu-a03"}
    assert end.gpus_per_node == 8 and end.ranks == {0: "gpu-a01", 8: "gpu-a02", 16: "gpu-a03"}
    assert end.start_time.isoformat() == "2026-11-03T14:00:03+00:00"
    assert end.end_time.isoformat() == "2026-11-03T14:47:18+00:00"
    assert end.model_extra["namespace"] == "ml-team" and end.model_extra["job_kind"] == "kubeflow"


def test_jobset_pod_evicted_under_memory_pressure():
    events = replay(lines("jobset-evicted.jsonl"), PodTracker(settle_s=0))
    end = events[-1].workload
    assert events[-1].type == "end"
    # grouped by JobSet, not by its child Job; the restart-attempt label is the attempt
    assert end.workload_id == "k8s-vision.vit-pretrain" and end.attempt == 1
    # the evicted pod failed first (02:52:31), its peer's exit 143 came after
    assert end.state == "Failed/Evicted" and end.exit_code == 137 and end.terminal_state == "failed"
    assert end.ranks == {0: "gpu-b11", 8: "gpu-b12"}


def test_indexed_job_that_succeeds():
    events = replay(lines("job-succeeded.jsonl"), PodTracker(settle_s=0))
    end = events[-1].workload
    assert end.state == "Succeeded" and end.exit_code == 0 and end.terminal_state == "completed"
    assert end.nodes == ["gpu-c01", "gpu-c02"] and end.gpus_per_node == 4


def test_end_waits_for_the_settle_time():
    now = [1000.0]
    tracker = PodTracker(settle_s=10, clock=lambda: now[0])
    events = replay(lines("pytorchjob-oomkilled.jsonl"), tracker)
    assert [e.type for e in events] == ["start"]           # every pod failed, but a Job may replace one
    now[0] += 9.9
    assert tracker.tick() == []
    now[0] += 0.2
    assert [e.type for e in tracker.tick()] == ["end"]


def test_a_pod_deleted_while_running_and_bookmarks():
    raw = [json.loads(x) for x in lines("job-succeeded.jsonl")]
    running = [ev for ev in raw if ev["object"]["status"].get("phase") == "Running"]
    tracker = PodTracker(settle_s=0)
    for ev in raw[:-2]:                                    # both pods running, neither finished
        tracker.apply(ev)
    assert tracker.apply({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
                                                          "metadata": {"resourceVersion": "999999"}}}) == []
    assert tracker.resource_version == "999999"
    out = []
    for ev in running:
        out += tracker.apply({"type": "DELETED", "object": ev["object"]})
    assert out[-1].type == "end" and out[-1].workload.state == "Failed/Deleted"


def test_a_container_restarted_in_place_keeps_its_first_death():
    """restartPolicy OnFailure: worker-1 was OOMKilled and restarted; the job later failed with exit 1."""
    raw = [json.loads(x) for x in lines("pytorchjob-oomkilled.jsonl")]
    tracker = PodTracker(settle_s=0)
    out = []
    for ev in raw:
        obj = ev["object"]
        cs = (obj["status"].get("containerStatuses") or [{}])[0]
        term = cs.get("state", {}).get("terminated")
        if obj["metadata"]["name"] == "llama-ft-worker-1" and term and term["reason"] == "OOMKilled":
            # what the kubelet reports after the restart, and then when the restarted container dies
            restarted = json.loads(json.dumps(ev))
            rcs = restarted["object"]["status"]["containerStatuses"][0]
            rcs.update(lastState={"terminated": term}, restartCount=1,
                       state={"running": {"startedAt": "2026-11-03T14:37:17Z"}})
            restarted["object"]["status"]["phase"] = "Running"
            out += tracker.apply(restarted)
            rcs["state"] = {"terminated": {**term, "exitCode": 1, "reason": "Error",
                                           "startedAt": "2026-11-03T14:37:17Z", "finishedAt": "2026-11-03T14:47:17Z"}}
            restarted["object"]["status"]["phase"] = "Failed"
            out += tracker.apply(restarted)
            continue
        out += tracker.apply(ev)
    assert out[-1].type == "end" and out[-1].workload.state == "Failed/OOMKilled" and out[-1].workload.exit_code == 137


# ---------------------------------------------------------------- the real client against a recorded API

class _WatchServer(ThreadingHTTPServer):
    daemon_threads = True


def serve_watch(*bodies: bytes):
    """Answer the n-th watch request with the n-th body (the last one repeats)."""
    requests: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):                       # noqa: N802 (http.server's name)
            requests.append(self.path)
            body = bodies[min(len(requests), len(bodies)) - 1]
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for line in body.splitlines(keepends=True):     # one watch event per chunk, as the API server
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")

        def log_message(self, *args):
            pass

    server = _WatchServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server, requests


def test_live_watch_path_with_the_kubernetes_client():
    from kubernetes import client

    body = (FIX / "pytorchjob-oomkilled.jsonl").read_bytes()
    server, requests = serve_watch(body)
    try:
        conf = client.Configuration()
        conf.host = f"http://127.0.0.1:{server.server_address[1]}"
        api = client.CoreV1Api(client.ApiClient(conf))
        tracker = PodTracker(settle_s=0)
        stop = threading.Event()
        got = []
        for ev in watch_events(api, "ml-team", "training.kubeflow.org/job-name", tracker, stop, timeout_s=5,
                               reconnect=False):
            got += tracker.apply(ev)
    finally:
        server.shutdown()
    url = urlparse(requests[0])
    q = parse_qs(url.query)
    assert url.path == "/api/v1/namespaces/ml-team/pods"
    assert q["watch"] == ["true"] and q["labelSelector"] == ["training.kubeflow.org/job-name"]
    expected = replay(body.decode().splitlines(), PodTracker(settle_s=0))
    assert [e.model_dump_json() for e in got] == [e.model_dump_json() for e in expected]
    assert tracker.resource_version == json.loads(body.decode().splitlines()[-1])["object"]["metadata"]["resourceVersion"]


# The API server's answer to a watch from a compacted resourceVersion (a Status object, code 410).
EXPIRED = (b'{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
           b'"message":"too old resource version: 411000 (412098)","reason":"Expired","code":410}}\n')


def test_expired_resource_version_lists_again():
    from kubernetes import client

    body = (FIX / "job-succeeded.jsonl").read_bytes()
    server, requests = serve_watch(EXPIRED, body)
    try:
        conf = client.Configuration()
        conf.host = f"http://127.0.0.1:{server.server_address[1]}"
        api = client.CoreV1Api(client.ApiClient(conf))
        tracker = PodTracker(settle_s=0)
        tracker.resource_version = "411000"                  # where a previous run stopped
        stop = threading.Event()
        got = []
        for ev in watch_events(api, "ml-team", None, tracker, stop, timeout_s=5):
            got += tracker.apply(ev)
            if got and got[-1].type == "end":
                stop.set()
    finally:
        server.shutdown()
    assert parse_qs(urlparse(requests[0]).query)["resourceVersion"] == ["411000"]
    assert "resourceVersion" not in parse_qs(urlparse(requests[1]).query)       # a fresh list
    assert [e.type for e in got] == ["start", "end"]


def test_restart_publishes_nothing_twice(stream_cfg, tmp_path):
    kafka.ensure_topics(stream_cfg, [stream_cfg.topic("scheduler")])
    pub = SchedulerPublisher(stream_cfg)
    state = tmp_path / "published.json"
    stream = [json.loads(x) for name in ("pytorchjob-oomkilled.jsonl", "job-succeeded.jsonl") for x in lines(name)]
    first = k8s.run(stream, PodTracker(settle_s=0), pub, PublishedLog(state))
    # a restarted connector lists again: the API server re-sends every pod as ADDED
    again = [{"type": "ADDED", "object": ev["object"]} for ev in stream]
    second = k8s.run(again, PodTracker(settle_s=0), pub, PublishedLog(state))
    assert first == 4 and second == 0
    c = Consumer({"bootstrap.servers": stream_cfg.bootstrap, "group.id": f"{stream_cfg.prefix}chk"})
    topic = stream_cfg.topic("scheduler")
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING)
              for p in c.list_topics(topic, timeout=10).topics[topic].partitions])
    got, deadline = [], time.monotonic() + 15
    while time.monotonic() < deadline and len(got) < 4:
        got += [decode(m.value()) for m in c.consume(num_messages=50, timeout=0.5) or [] if m.error() is None]
    got += [decode(m.value()) for m in c.consume(num_messages=10, timeout=1.0) or [] if m.error() is None]
    c.close()
    assert sorted((e.workload.workload_id, e.type) for e in got) == [
        ("k8s-ml-team.bert-eval", "end"), ("k8s-ml-team.bert-eval", "start"),
        ("k8s-ml-team.llama-ft", "end"), ("k8s-ml-team.llama-ft", "start")]


def test_command_line_replays_a_recording(capsys):
    assert k8s.main(["--dry-run", "--replay", str(FIX / "jobset-evicted.jsonl")]) == 0
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [o["type"] for o in out] == ["start", "end"] and out[1]["workload"]["state"] == "Failed/Evicted"
