"""kubectl output handed to `firstfault analyze` as a bare file (issue 25): a report places its lines.

`kubectl describe pod` is a report, not a log: no line has a stamp, and what places them is said
once: "Node:\\t<node>/<hostIP>" above them, "Finished:\\t<RFC1123Z>" right after a container's
terminated state. Shapes from kubectl's source (kubernetes/kubectl pkg/describe/describe.go:
describePod, describeStatus, DescribeEvents; pkg/cmd/events/event_printer.go; kubernetes/kubernetes
pkg/printers/internalversion/printers.go printEvent and its -o wide columns). The lines themselves
are as users pasted them: the header of flyteorg/flyte#5417 (a PyTorchJob worker's describe), the
state block of gimlet-io/gimlet#649 (OOMKilled, exit code 137, its Started/Finished), the Killing
rows of substratus (corpus ho6-sched-k8s-ephemeral-storage-evicted-substratus-92); pod and node
names changed to one job's.
"""
from __future__ import annotations

import json
import subprocess
import sys

from firstfault.rules.engine import analyze_path
from firstfault.rules.intake import open_input

DESCRIBE_WORKER_1 = """\
$ kubectl describe pod llama-ft-worker-1 -n ml-team
Name:             llama-ft-worker-1
Namespace:        ml-team
Priority:         0
Service Account:  default
Node:             gpu-node-7/10.0.0.7
Start Time:       Fri, 15 Sep 2023 09:40:02 +0200
Labels:           training.kubeflow.org/job-name=llama-ft
                  training.kubeflow.org/operator-name=pytorchjob-controller
                  training.kubeflow.org/replica-index=1
                  training.kubeflow.org/replica-type=worker
Annotations:      <none>
Status:           Failed
IP:               10.42.0.15
IPs:
  IP:           10.42.0.15
Controlled By:  PyTorchJob/llama-ft
Containers:
  pytorch:
    Container ID:  containerd://8f5cdc0d84ded4e3a22a62a85ef98981e9
    Image:         nvcr.io/nvidia/pytorch:24.01-py3
    Port:          23456/TCP
    Host Port:     0/TCP
    State:          Terminated
      Reason:       OOMKilled
      Exit Code:    137
      Started:      Fri, 15 Sep 2023 09:56:14 +0200
      Finished:     Fri, 15 Sep 2023 09:56:17 +0200
    Ready:          False
    Restart Count:  0
    Limits:
      memory:          64Gi
      nvidia.com/gpu:  8
Conditions:
  Type              Status
  Initialized       True
  Ready             False
QoS Class:                   Guaranteed
Node-Selectors:              <none>
Events:
  Type    Reason     Age   From               Message
  ----    ------     ----  ----               -------
  Normal  Scheduled  17m   default-scheduler  Successfully assigned ml-team/llama-ft-worker-1 to gpu-node-7
  Normal  Killing    2m    kubelet            Stopping container pytorch
"""

# The same job's other worker, healthy, on another node: its report must not lend its node.
DESCRIBE_WORKER_0 = (DESCRIBE_WORKER_1.replace("llama-ft-worker-1", "llama-ft-worker-0")
                     .replace("gpu-node-7/10.0.0.7", "gpu-node-3/10.0.0.3").replace("replica-index=1", "replica-index=0")
                     .replace("State:          Terminated\n      Reason:       OOMKilled\n      Exit Code:    137\n"
                              "      Started:      Fri, 15 Sep 2023 09:56:14 +0200\n"
                              "      Finished:     Fri, 15 Sep 2023 09:56:17 +0200\n",
                              "State:          Running\n      Started:      Fri, 15 Sep 2023 09:41:10 +0200\n")
                     .replace("  Normal  Killing    2m    kubelet            Stopping container pytorch\n", ""))

GET_EVENTS = """\
$ kubectl get events -n ml-team
LAST SEEN   TYPE      REASON       OBJECT                    MESSAGE
17m         Normal    Scheduled    pod/llama-ft-worker-1     Successfully assigned ml-team/llama-ft-worker-1 to gpu-node-7
2m          Warning   OOMKilling   node/gpu-node-7           Memory cgroup out of memory: Killed process 4711 (python) total-vm:81234567kB, anon-rss:66954321kB, file-rss:0kB, shmem-rss:0kB
2m          Normal    Killing      pod/llama-ft-worker-1     Stopping container pytorch
2m          Warning   BackOff      pod/llama-ft-worker-0     Back-off restarting failed container pytorch in pod llama-ft-worker-0_ml-team(5f1c)
2m          Warning   BackOff      pod/elsewhere-0           Back-off restarting failed container main in pod elsewhere-0_ml-team(9a2e)
"""

LOGS_PREVIOUS = """\
$ kubectl logs llama-ft-worker-1 --previous
[2023-09-15 07:56:02,118] INFO step 1200 loss 1.93 tokens/s 40120
[2023-09-15 07:56:12,421] INFO step 1210 loss 1.91 tokens/s 40211
ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 0 (pid: 4711) of binary: /usr/bin/python
"""


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "firstfault", *args], capture_output=True, text=True, timeout=300)


def _events(path):
    from firstfault.rules.engine import analyze_bundle

    intake = open_input(path)
    return intake, analyze_bundle(intake.bundle, keep_events=True, intake=intake).events


def test_describe_pod_names_the_node_the_pod_and_the_time_it_died(tmp_path):
    """The trial's file: one OOMKilled PyTorchJob worker's `kubectl describe pod`. Its Node: line is
    the host (not "unknown host"), its Finished: the termination's time, its Name: the pod."""
    p = tmp_path / "worker-1-describe.txt"
    p.write_text(DESCRIBE_WORKER_1)
    run = _cli("analyze", str(p), "--json")
    assert run.returncode == 0, run.stderr
    d = json.loads(run.stdout)
    rc = d["root_cause"]
    assert (d["status"], d["sub_domain"]) == ("attributed", "host_oom")
    assert rc["host"] == "gpu-node-7"
    assert rc["timestamp"] == "2023-09-15T07:56:17.000000Z" and rc["time_basis"] == "stamped"   # +0200 read
    assert rc["fields"]["object"] == "llama-ft-worker-1" and rc["ref"]["line"] == 25     # "Reason:       OOMKilled"
    assert rc["message"] == "Kubernetes OOMKilled (llama-ft-worker-1)"
    [inferred] = [m for m in d["missing_evidence"] if m["kind"] == "workload"]
    assert inferred["hosts"] == ["gpu-node-7"] and "kubectl describe pod's Node: line" in inferred["detail"]
    assert "one unnamed node" not in inferred["detail"]
    assert any(e["rule_id"] == "final.record_time" for e in d["evidence"])
    text = _cli("analyze", str(p))
    assert text.returncode == 0, text.stderr
    assert "host gpu-node-7; logged 2023-09-15 07:56:17.000" in text.stdout
    assert "(?)" not in text.stdout and "unknown host" not in text.stdout


def test_a_pasted_session_places_each_report_events_table_and_log_on_its_own(tmp_path):
    """Two describes, `kubectl get events` and `kubectl logs --previous` in one file: each report's
    lines are on its pod's node, each event row on its object's node (a pod the file describes, a
    node), and the log below its command on that pod's node. A pod the file does not describe is no
    host: its name is never taken for one."""
    p = tmp_path / "session.txt"
    p.write_text(DESCRIBE_WORKER_0 + "\n" + DESCRIBE_WORKER_1 + "\n" + GET_EVENTS + "\n" + LOGS_PREVIOUS)
    intake, events = _events(p)
    wl = intake.bundle.workload
    assert wl.nodes == ["gpu-node-3", "gpu-node-7"]
    assert wl.pods == {"llama-ft-worker-0": "gpu-node-3", "llama-ft-worker-1": "gpu-node-7"}
    by = {(e.pattern, e.fields.get("reason"), e.fields.get("object") if e.kind == "k8s_event" else e.fields.get("pod")): e
          for e in events}
    oom = by[("k8s.status_reason", "OOMKilled", "llama-ft-worker-1")]
    assert oom.host == "gpu-node-7" and oom.stamp is None        # dated in the FINAL stage (final.record_time)
    # In the describe: each report's Killing row on its own node (worker-0's report has none).
    assert by[("k8s.event_row", "Killing", "llama-ft-worker-1")].host == "gpu-node-7"
    # The events table: the node object, the described pods, and a pod it does not know.
    assert by[("k8s.event_row", "OOMKilling", "node/gpu-node-7")].host == "gpu-node-7"
    assert by[("k8s.event_row", "Killing", "pod/llama-ft-worker-1")].host == "gpu-node-7"
    # BackOff rows are sched.k8s.container_failed's: the pod in kubelet's message places them.
    assert by[("sched.k8s.container_failed", None, "llama-ft-worker-0")].host == "gpu-node-3"
    assert by[("sched.k8s.container_failed", None, "elsewhere-0")].host is None
    # `kubectl logs llama-ft-worker-1 --previous`: its output is that pod's, on its node (torchrun's
    # line as torch/distributed/elastic/multiprocessing/api.py logs it, the exit code of a SIGKILL).
    [died] = [e for e in events if e.line == p.read_text().splitlines().index(LOGS_PREVIOUS.splitlines()[3]) + 1]
    assert died.host == "gpu-node-7" and died.fields.get("object") == "llama-ft-worker-1"
    assert died.stamp.isoformat() == "2023-09-15T07:56:12.421000+00:00" and died.quality == "inherited"
    d = analyze_path(p).diagnosis
    assert d.root_cause.host == "gpu-node-7" and d.root_cause.timestamp == "2023-09-15T07:56:17.000000Z"
    assert "gpu-node-3" not in d.responsible_nodes


def test_the_wide_and_kubectl_events_tables_give_the_source_host():
    """`kubectl get events -o wide` (SOURCE "component, host"; printers.go formatEventSource) and
    `kubectl events -A` (NAMESPACE first, the kind as the API spells it, event_printer.go)."""
    from firstfault.rules.catalog import load_catalog

    pat = {p.id: p for p in load_catalog().patterns}["k8s.event_row"]
    wide = ("5m          Normal    Killing      pod/llama-ft-worker-1     spec.containers{pytorch}     "
            "kubelet, gpu-node-7          Stopping container pytorch                  5m           1       "
            "llama-ft-worker-1.17a2b3c4d5e6f790")
    m = pat.search(wide).groupdict()
    assert (m["from_host"], m["subobject"], m["message"], m["event_count"]) == \
        ("gpu-node-7", "spec.containers{pytorch}", "Stopping container pytorch", "1")
    m = pat.search("ml-team     2m (x5 over 9m)    Warning   Evicted     Pod/llama-ft-worker-3    "
                   "The node was low on resource: memory. Threshold quantity: 100Mi, available: 90Mi.").groupdict()
    assert (m["namespace"], m["last_seen"], m["target"]) == ("ml-team", "2m (x5 over 9m)", "llama-ft-worker-3")
    # Not rows: the tables' headers, a describe row of a reason that says nothing here.
    assert pat.search("LAST SEEN   TYPE      REASON       OBJECT            MESSAGE") is None
    assert pat.search("  Normal  Scheduled  17m   default-scheduler  Successfully assigned ml-team/x to gpu-node-7") is None


def test_what_must_not_place_a_line(tmp_path):
    """A pod never scheduled ("Node: <none>") names no host; a "Finished:" that is not kubectl's
    RFC1123Z stamps nothing; a report's time is not a stamp the lines below it inherit (a report
    is not a log); a describe of another object is not its node."""
    never = DESCRIBE_WORKER_1.replace("gpu-node-7/10.0.0.7", "<none>")
    p = tmp_path / "pending.txt"
    p.write_text(never)
    intake, events = _events(p)
    assert intake.bundle.workload.nodes == [] and all(e.host is None for e in events)

    other = DESCRIBE_WORKER_1.replace("      Finished:     Fri, 15 Sep 2023 09:56:17 +0200",
                                      "      Finished:     2023-09-15 09:56:17")
    p = tmp_path / "other-finished.txt"
    p.write_text(other)
    d = analyze_path(p).diagnosis
    assert d.root_cause.host == "gpu-node-7" and (d.root_cause.timestamp, d.root_cause.time_basis) == (None, "line_order")

    # Below the report, a pasted line with no stamp inherits nothing from its Finished: time.
    p = tmp_path / "below.txt"
    p.write_text(DESCRIBE_WORKER_1.replace("  Normal  Killing    2m    kubelet            Stopping container pytorch\n",
                                           "  Warning  OOMKilling  2m    kernel-monitor     Memory cgroup out of memory\n"))
    _, events = _events(p)
    [row] = [e for e in events if e.pattern == "k8s.event_row"]
    assert row.stamp is None and row.host == "gpu-node-7"


def test_bare_file_folder_and_bundle_agree_on_a_report(tmp_path):
    """Bare = folder = bundle: the same report gives the same host, time and cause however it comes."""
    bare = tmp_path / "describe.txt"
    bare.write_text(DESCRIBE_WORKER_1)
    folder = tmp_path / "folder" / "k8s"
    folder.mkdir(parents=True)
    (folder / "worker.txt").write_text(DESCRIBE_WORKER_1)
    got = []
    for path in (bare, folder.parent):
        d = analyze_path(path).diagnosis
        got.append((d.sub_domain, d.root_cause.host, d.root_cause.timestamp, d.responsible_nodes))
    assert got[0] == got[1] == ("host_oom", "gpu-node-7", "2023-09-15T07:56:17.000000Z", ["gpu-node-7"])


def test_the_page_names_the_pod_s_node_not_unknown_host(tmp_path):
    """The diagnosis page of the describe file (headless Chromium, DOM after the page's script)."""
    from test_time_bounds import serve_pages

    p = tmp_path / "worker-1-describe.txt"
    p.write_text(DESCRIBE_WORKER_1)
    with serve_pages(tmp_path, [analyze_path(p).diagnosis]) as pages:
        dom, _ = pages("worker-1-describe")
    assert dom.by_id["root-host"]["text"] == "gpu-node-7"
    root = dom.by_id["ev-root"]["text"]
    assert "07:56:17" in root and "≥" not in root
    assert "unknown host" not in dom.by_id["root-cause"]["text"]
