"""The whole pipeline on a real broker: ship -> extractor -> correlator -> diagnoses topic.

Parity with `firstfault analyze --json` for every sample (stream-only fields aside),
and late evidence: inside the grace period it still counts; after the diagnosis it
produces revision 1 with the right answer. Then every kind of evidence (issue 11): the
catalog's FINAL scenarios, scheduler logs of Slurm and Kubernetes, metrics, Fabric Manager
logs, bytes that are not UTF-8, node-scoped files the timeline cannot place by itself and a
generated bundle, all through one pipeline, each compared with `analyze` on its own.
"""
import json
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from firstfault.connectors.shipper import ship, ship_many
from firstfault.rules.engine import analyze_path

from conftest import sample_dirs
from stream_pipeline import drain, pipeline_cfg, read_finals, running_pipeline

pytest_plugins = ["conftest_kafka"]
STREAM_ONLY = ("revision", "provisional")


@pytest.fixture
def running(kafka_bootstrap, unique_name, tmp_path):
    """A pipeline whose grace is long enough for late lines to arrive inside it (30 s)."""
    with running_pipeline(pipeline_cfg(kafka_bootstrap, unique_name("pipe")), tmp_path) as cfg:
        yield cfg


@pytest.fixture
def running_short(kafka_bootstrap, unique_name, tmp_path):
    """A pipeline with a short grace (4 s): a final waits for the extractors' progress, not for the grace."""
    cfg = pipeline_cfg(kafka_bootstrap, unique_name("pipe")).model_copy(update={"grace_cap_s": 4.0})
    with running_pipeline(cfg, tmp_path) as cfg:
        yield cfg


def _bare(d) -> dict:
    return {k: v for k, v in d.to_dict().items() if k not in STREAM_ONLY}


METRICS = "\n".join([
    '{"ts": "2026-11-02T09:55:00Z", "host": "node-02", "gpu": 3, "name": "DCGM_FI_DEV_XID_ERRORS", "value": 0}',
    '{"ts": "2026-11-02T10:03:30Z", "host": "node-02", "gpu": 3, "name": "DCGM_FI_DEV_XID_ERRORS", "value": 149}',
    '{"ts": "2026-11-02T09:55:00Z", "host": "node-04", "gpu": 1, "name": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "value": 0}',
    '{"ts": "2026-11-02T10:02:00Z", "host": "node-04", "gpu": 1, "name": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "value": 500}',
    "not a sample",
    '{"ts": "2026-11-02T10:00:00Z", "host": "node-01", "gpu": 0, "name": "DCGM_FI_DEV_GPU_TEMP", "value": 61}',
    "",
    '{"ts": "2026-11-02T10:10:00Z", "host": "node-01", "gpu": 0, "name": "DCGM_FI_DEV_GPU_TEMP", "value": "hot"}',
]) + "\n"


def _with_metrics(tmp_path: Path) -> Path:
    """The worked example with DCGM samples: a crossing the kernel line explains, a weak
    NVLink counter, unreadable lines and a host (node-03) with no samples."""
    dst = tmp_path / "worked-example-metrics"
    shutil.copytree(next(p for p in sample_dirs() if p.name == "worked-example"), dst)
    (dst / "metrics").mkdir()
    (dst / "metrics" / "dcgm.jsonl").write_text(METRICS)
    return dst


def test_every_sample_through_the_pipeline_matches_analyze(running_short, tmp_path):
    running = running_short
    # The worked example goes with metrics samples (its hosts and times are its own: a second
    # copy would share node-scoped lines with it).
    samples = [_with_metrics(tmp_path) if p.name == "worked-example" else p for p in sample_dirs()]
    for s in samples:
        ship(s, running)
    expected = {json.loads((s / "workload.json").read_text())["workload_id"]: analyze_path(s).diagnosis for s in samples}
    got = read_finals(running, lambda out: set(out) >= set(expected))
    assert set(got) - {"warmup"} == set(expected)
    for wid, d in expected.items():
        assert got[wid][0].revision == 0
        assert _bare(got[wid][0]) == json.loads(d.to_json()), wid


def _renamed_worked_example(tmp_path, wid) -> Path:
    src = next(p for p in sample_dirs() if p.name == "worked-example")
    dst = tmp_path / wid
    shutil.copytree(src, dst)
    wl = json.loads((dst / "workload.json").read_text())
    wl["workload_id"] = wid
    (dst / "workload.json").write_text(json.dumps(wl))
    return dst


LATE = "logs/syslog/node-02.log"


def test_late_root_cause_inside_the_grace_still_counts(running, tmp_path):
    # node-02's syslog arrives after the scheduler's end event, inside the grace period.
    bundle = _renamed_worked_example(tmp_path, "late-inside-grace")
    ship(bundle, running, only=lambda p: p != LATE)
    ship(bundle, running, only=lambda p: p == LATE, start=False, end=False)
    got = read_finals(running, lambda out: "late-inside-grace" in out)["late-inside-grace"]
    assert [d.revision for d in got] == [0]
    assert (got[0].status, got[0].sub_domain, got[0].responsible_nodes) == \
        ("attributed", "nvlink_signal_integrity", ["node-02"])
    assert _bare(got[0]) == json.loads(analyze_path(bundle).diagnosis.to_json())


def test_late_root_cause_after_the_diagnosis_gives_revision_1(running_short, tmp_path):
    running = running_short
    # node-02's syslog arrives after the diagnosis was published (separate workload ids and
    # topics: the two cases share hosts and times, so their node-scoped lines would mix).
    bundle = _renamed_worked_example(tmp_path, "late-after-final")
    ship(bundle, running, only=lambda p: p != LATE)
    first = read_finals(running, lambda out: "late-after-final" in out)["late-after-final"]
    assert first[0].revision == 0 and first[0].responsible_nodes != ["node-02"]
    ship(bundle, running, only=lambda p: p == LATE, start=False, end=False)
    got = read_finals(running, lambda out: len(out.get("late-after-final", [])) >= 2)["late-after-final"]
    assert [d.revision for d in got] == [0, 1]
    assert got[1].sub_domain == "nvlink_signal_integrity" and got[1].responsible_nodes == ["node-02"]
    assert _bare(got[1]) == json.loads(analyze_path(bundle).diagnosis.to_json())


# ----------------------------------------------------------------- every kind of evidence (issue 11)
#
# Bundles of every kind the tests make: the catalog's FINAL scenarios (one or two per kind of
# failure), the samples, a generated bundle, and one per kind of evidence (scheduler logs of
# Slurm and of Kubernetes, metrics, a Fabric Manager log, bytes that are not UTF-8), shipped
# through one pipeline. Node-scoped lines belong to every workload on a node at a time, so each
# bundle gets hosts of its own (and its own workload id) before it is shipped: the comparison is
# between ``analyze`` and the stream on that same isolated bundle.

_HOST = rb"(?<![A-Za-z0-9_.-])%s(?![A-Za-z0-9_-])"


def _hosts_of(root: Path) -> set[str]:
    wl = json.loads((root / "workload.json").read_text())
    hosts = set(wl.get("nodes") or []) | {v for v in (wl.get("pods") or {}).values() if isinstance(v, str)}
    for sub in ("syslog", "fabricmanager"):
        hosts |= {p.stem for p in (root / "logs" / sub).glob("*") if p.is_file()}
    return {h for h in hosts if h}


def isolated(src: Path, dst: Path, tag: str) -> Path:
    """A copy of the bundle ``src`` whose hosts (in file names, lines and the record) are renamed
    ``<tag>-<host>`` and whose workload id is ``<tag>-<id>``: its node-scoped lines cannot reach
    another bundle's workload in a shared pipeline."""
    hosts = sorted(_hosts_of(src), key=len, reverse=True)
    pattern = re.compile(b"|".join(_HOST % re.escape(h.encode()) for h in hosts)) if hosts else None

    def swap(data: bytes) -> bytes:
        return pattern.sub(lambda m: tag.encode() + b"-" + m.group(0), data) if pattern else data

    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        rel = f.relative_to(src).as_posix()
        if rel != "workload.json" and not rel.startswith(("logs/", "metrics/")):
            continue
        out = dst / swap(rel.encode()).decode()
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(swap(f.read_bytes()))
    wl = json.loads((dst / "workload.json").read_text())
    wl["workload_id"] = f"{tag}-{wl['workload_id']}"
    (dst / "workload.json").write_text(json.dumps(wl))
    return dst


def write_bundle(root: Path, workload: dict, files: dict[str, str | bytes]) -> Path:
    root.mkdir(parents=True)
    (root / "workload.json").write_text(json.dumps(workload))
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogateescape"))
    return root


def scenario_bundles(tmp: Path) -> dict[str, Path]:
    """Every FINAL rule's fires and quiet scenarios, as ``firstfault rules test`` runs them."""
    from firstfault.rules.catalog import load_catalog
    from firstfault.rules.python import ordered
    from firstfault.rules.ruletest import _WL

    cat = load_catalog()
    found = [(r.id, s) for r in cat.explains for s in r.scenarios]
    found += [(r.id, {"expect": k, **s}) for r in ordered() for k in ("fires", "quiet") for s in r.examples.get(k, [])]
    out = {}
    for i, (rid, sc) in enumerate(found):
        label = f"{rid}:{sc['expect']}:{i}"
        out[label] = write_bundle(tmp / f"scenario-{i}", {**_WL, **(sc.get("workload") or {})}, sc.get("files") or {})
    return out


def _app(rank_host: dict[int, str], lines: list[str]) -> dict[str, str]:
    files: dict[str, list[str]] = {}
    for text in lines:
        rank = int(text.split(":", 1)[0])
        files.setdefault(f"logs/app/{rank_host[rank]}.log", []).append(text)
    return {k: "\n".join(v) + "\n" for k, v in files.items()}


WATCHDOG = ("{r}: [rank{r}]:[E1103 04:22:10.512043 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=5120, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, "
            "Timeout(ms)=600000) ran for 600031 milliseconds before timing out.")


def evidence_bundles(tmp: Path) -> dict[str, Path]:
    """One bundle per kind of evidence that has no sample of its own."""
    out = {}
    nodes = [f"gpu{n:03d}" for n in range(7, 11)]
    ranks = {r: nodes[r // 8] for r in range(32)}
    # Slurm NODE_FAIL: slurmctld's own lines name the node it lost (node_mgr.c, job_mgr.c).
    out["slurmctld-node-fail"] = write_bundle(tmp / "slurmctld-node-fail", {
        "workload_id": "slurm-4473001", "scheduler": "slurm", "state": "NODE_FAIL", "exit_code": "0:0",
        "start_time": "2026-11-03T02:00:00Z", "end_time": "2026-11-03T04:12:10Z", "nodes": nodes,
        "gpus_per_node": 8}, {
        "logs/scheduler/slurmctld.log": (
            "[2026-11-03T02:00:00.114] sched: Allocate JobId=4473001 NodeList=gpu[007-010] #CPUs=256 Partition=train\n"
            "[2026-11-03T04:12:09.018] error: Nodes gpu009 not responding, setting DOWN\n"
            "[2026-11-03T04:12:09.020] Killing JobId=4473001 on failed node gpu009\n"),
        **_app(ranks, [f"{r}: [2026-11-03 04:10:00,000] INFO step 5119 loss 1.8842" for r in (0, 8, 24)]),
    })
    # Kubernetes OOMKilled: `kubectl get events` and `kubectl describe pod` output.
    pods = {"llm-ft-worker-0": "a100-pool-01", "llm-ft-worker-1": "a100-pool-02"}
    out["kubectl-oomkilled"] = write_bundle(tmp / "kubectl-oomkilled", {
        "workload_id": "k8s-ml.llm-ft", "scheduler": "kubernetes", "state": "Failed/OOMKilled", "exit_code": "137",
        "start_time": "2026-11-04T08:00:00Z", "end_time": "2026-11-04T08:47:31Z", "nodes": sorted(pods.values()),
        "pods": pods, "gpus_per_node": 8, "ranks": {"0": "a100-pool-01", "8": "a100-pool-02"}}, {
        "logs/scheduler/events.log": (
            "LAST SEEN   TYPE      REASON       OBJECT                MESSAGE\n"
            "12m         Warning   OOMKilling   node/a100-pool-02     Memory cgroup out of memory: Killed process "
            "48213 (python3) total-vm:412847232kB, anon-rss:251658240kB, file-rss:0kB, shmem-rss:0kB\n"
            "12m         Normal    Killing      pod/llm-ft-worker-1   Stopping container pytorch\n"),
        "logs/scheduler/describe-llm-ft-worker-1.log": (
            "Containers:\n  pytorch:\n    State:          Terminated\n      Reason:       OOMKilled\n"
            "      Exit Code:    137\n"),
        "logs/app/llm-ft-worker-0.log": "[2026-11-04 08:40:00,000] INFO step 900 loss 1.2210\n",
    })
    # Fabric Manager: an NVSwitch fatal error on node-02's switch tray, then NCCL time-outs.
    fm_nodes = ["hgx-01", "hgx-02"]
    out["fabricmanager-fatal"] = write_bundle(tmp / "fabricmanager-fatal", {
        "workload_id": "slurm-4473100", "scheduler": "slurm", "state": "FAILED", "exit_code": "1:0",
        "start_time": "2026-11-03T02:00:00Z", "end_time": "2026-11-03T04:30:00Z", "nodes": fm_nodes,
        "gpus_per_node": 8}, {
        "logs/fabricmanager/hgx-02.log": (
            "[Nov 03 2026 01:58:01] [INFO] [tid 811] Fabric Manager version 535.104.05 is running with the "
            "following configuration options\n"
            "[Nov 03 2026 04:12:04] [ERROR] [tid 841] detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci "
            "bus id 00000000:86:00.0 physical id 3 port 33\n"),
        "logs/syslog/hgx-01.log": "Nov  3 02:00:01 hgx-01 systemd[1]: Started Session 4 of user train.\n",
        **_app({r: fm_nodes[r // 8] for r in range(16)}, [WATCHDOG.format(r=r) for r in (0, 3, 8, 9)]),
    })
    # Bytes that are not UTF-8: in the root-cause line, in noise and in an application file.
    out["invalid-utf8"] = write_bundle(tmp / "invalid-utf8", {
        "workload_id": "slurm-4473200", "scheduler": "slurm", "state": "FAILED", "exit_code": "1:0",
        "start_time": "2026-11-05T02:00:00Z", "end_time": "2026-11-05T03:00:00Z", "nodes": ["dgx-01", "dgx-02"],
        "gpus_per_node": 8}, {
        "logs/syslog/dgx-02.log": (
            b"Nov  5 02:30:00 dgx-02 systemd[1]: Started caf\xe9 \xff\xfe session.\n"
            b"Nov  5 02:41:07 dgx-02 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=\xc3\x28py, "
            b"GPU has fallen off the bus.\n"),
        "logs/app/dgx-01.log": (
            b"0: [2026-11-05 02:40:00,000] INFO step 10 loss 2.\xe90\n"
            + WATCHDOG.format(r=0).replace("E1103 04:22", "E1105 02:51").encode() + b"\n"),
    })
    # Node-scoped files the allocation timeline cannot place by itself: a host the job never
    # held, a line with no stamp, year-less stamps of a job long before the shipping day.
    xid = "NVRM: Xid (PCI:0000:05:00): 79, pid=1173, GPU has fallen off the bus."
    out["syslog-other-host"] = write_bundle(tmp / "syslog-other-host", {
        "workload_id": "slurm-4473300", "state": "FAILED", "start_time": "2026-11-06T09:58:00Z",
        "end_time": "2026-11-06T10:21:14Z", "nodes": ["rack3-01", "rack3-02"], "gpus_per_node": 8}, {
        "logs/syslog/rack3-09.log": f"Nov  6 10:03:11 rack3-09 kernel: {xid}\n",
        **_app({r: "rack3-01" for r in range(8)}, [WATCHDOG.format(r=r).replace("E1103 04:22", "E1106 10:13")
                                                    for r in (0, 1)]),
    })
    out["syslog-unstamped"] = write_bundle(tmp / "syslog-unstamped", {
        "workload_id": "slurm-4473400", "state": "FAILED", "start_time": "2026-11-06T12:00:00Z",
        "end_time": "2026-11-06T12:30:00Z", "nodes": ["rack4-01"]}, {"logs/syslog/rack4-01.log": xid + "\n"})
    out["syslog-other-year"] = write_bundle(tmp / "syslog-other-year", {
        "workload_id": "slurm-1203", "state": "FAILED", "start_time": "2024-01-15T12:00:00Z",
        "end_time": "2024-01-17T12:00:00Z", "nodes": ["pyrite"], "gpus_per_node": 4}, {
        "logs/syslog/pyrite.log": (f"Jan 16 14:04:39 pyrite kernel: [44643.002804] {xid}\n"
                                   "Jan 16 14:04:39 pyrite kernel: [44643.002806] NVRM: GPU 0000:05:00.0: GPU has "
                                   "fallen off the bus.\n")})
    return out


def generated_bundle(tmp: Path) -> Path:
    dst = tmp / "generated"
    subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "bench" / "gen_bundle.py"), str(dst),
                    "--nodes", "4", "--lines", "10000", "--seed", "1"], check=True, stdout=subprocess.DEVNULL)
    (dst / "expected.json").unlink()
    return dst


def parity_corpus(tmp: Path) -> dict[str, Path]:
    """label -> bundle: the samples (the worked example with metrics), the FINAL scenarios, one
    bundle per kind of evidence and a generated one."""
    out = {f"sample:{p.name}": p for p in sample_dirs() if p.name != "worked-example"}
    out["sample:worked-example+metrics"] = _with_metrics(tmp)
    out.update({f"scenario:{k}": v for k, v in scenario_bundles(tmp / "scenarios").items()})
    out.update({f"evidence:{k}": v for k, v in evidence_bundles(tmp / "evidence").items()})
    out["generated:gen_bundle-4n"] = generated_bundle(tmp)
    return out


def _labels() -> list[str]:
    import tempfile

    with tempfile.TemporaryDirectory() as d:        # cheap: small files, and gen_bundle is not run
        tmp = Path(d)
        return (sorted(f"sample:{p.name}" for p in sample_dirs() if p.name != "worked-example")
                + ["sample:worked-example+metrics"]
                + [f"scenario:{k}" for k in scenario_bundles(tmp / "s")]
                + [f"evidence:{k}" for k in evidence_bundles(tmp / "e")] + ["generated:gen_bundle-4n"])


@pytest.fixture(scope="module")
def parity_run(kafka_bootstrap, tmp_path_factory) -> dict[str, tuple[dict, list]]:
    """Every bundle of the corpus, isolated, shipped in one go through one pipeline:
    label -> (analyze --json, the final diagnoses published for it)."""
    tmp = tmp_path_factory.mktemp("parity")
    corpus = parity_corpus(tmp / "src")
    bundles = {label: isolated(src, tmp / "iso" / f"b{i:03d}", f"b{i:03d}")
               for i, (label, src) in enumerate(corpus.items())}
    expected = {json.loads((b / "workload.json").read_text())["workload_id"]:
                (label, json.loads(analyze_path(b).diagnosis.to_json())) for label, b in bundles.items()}
    (tmp / "workers").mkdir()
    cfg = pipeline_cfg(kafka_bootstrap, f"parity-{uuid.uuid4().hex[:8]}").model_copy(update={"grace_cap_s": 4.0})
    with running_pipeline(cfg, tmp / "workers") as cfg:
        ship_many(list(bundles.values()), cfg)
        got = read_finals(cfg, lambda out: set(out) >= set(expected), timeout=180)
    return {label: (want, got.get(wid, []), cfg, wid, bundles[label]) for wid, (label, want) in expected.items()}


def _events_apart(cfg, workload_id: str, bundle: Path) -> str:
    """Where the stream's evidence for ``workload_id`` (its EventBatches on the events topic, merged as
    the correlator merges them) differs from analyze's events: what a differing diagnosis_id hashed."""
    from firstfault.rules.catalog import load_catalog
    from firstfault.rules.engine import analyze_bundle
    from firstfault.rules.intake import open_input
    from firstfault.rules.model import Ev
    from firstfault.schemas.avro import decode
    from firstfault.streams.workload_state import merge_events

    events: dict = {}
    versions: dict = {}
    ledger: dict = {}
    paths: set[str] = set()
    for m in drain(cfg, cfg.topic("events"), lambda got: False, timeout=8):
        batch = decode(m.value())
        if getattr(batch, "workload_id", None) == workload_id:
            merge_events(events, versions, batch.events, ledger, batch.line_files, batch.lines)
            paths |= set(batch.paths)
    stream = {sig: Ev.from_schema(e).canonical() for sig, e in events.items()}
    intake = open_input(bundle)
    kept = analyze_bundle(intake.bundle, load_catalog(), intake=intake, keep_events=True).events
    offline = {e.signature: e.canonical() for e in kept}
    out = [f"only in the stream: {sorted(set(stream) - set(offline))[:5]}",
           f"only offline: {sorted(set(offline) - set(stream))[:5]}", f"stream paths: {sorted(paths)}"]
    for sig in sorted(set(stream) & set(offline)):
        if stream[sig] != offline[sig]:
            out.append(f"{sig!r}: stream {stream[sig]} offline {offline[sig]}")
    return "\n".join(out[:20])


@pytest.mark.parametrize("label", _labels())
def test_every_kind_of_evidence_travels(parity_run, label):
    want, finals, cfg, workload_id, bundle = parity_run[label]
    assert finals, f"{label}: no final diagnosis on the topic"
    assert finals[0].revision == 0
    got = _bare(finals[0])
    differ = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
    assert not differ, (f"{label}: the stream's diagnosis differs from analyze in {differ}\n"
                        + _events_apart(cfg, workload_id, bundle))


# ----------------------------------------------------------------- bare files (issue 25)

BARE = ["corpus/real/ho-gsp-xid119-rpc-timeouts-a100-ogkm-446/input/dmesg.txt",      # a kernel log
        "corpus/real/ho-hostoom-slurm-cgroup-oomkill-batch-arjuna-52/input/error_191.err"]   # a job's stderr


def test_a_bare_file_ships_as_analyze_reads_it(running_short, tmp_path):
    """`ship` takes what `analyze` takes: a log file with no workload.json is published with the
    workload record `analyze` infers for it, and the stream's final diagnosis is analyze's."""
    root = Path(__file__).resolve().parents[1]
    expected = {}
    for rel in BARE:
        want = analyze_path(root / rel).diagnosis
        expected[want.workload_id] = want
        ship(root / rel, running_short)
    got = read_finals(running_short, lambda out: set(out) >= set(expected))
    for wid, want in expected.items():
        assert wid in got, (wid, sorted(got))
        assert _bare(got[wid][0]) == json.loads(want.to_json()), wid
