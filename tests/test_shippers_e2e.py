"""End to end with the real shippers: rsyslog (omkafka) and kcat feed the pipeline.

Four rsyslogd processes, one per node as on a cluster, tail their node's syslog with
the shipped recipe (connectors/shippers/rsyslog-firstfault.conf); kcat-tail.sh ships
each node's training output; the Slurm connector reports the job from recorded
``sacct --json`` (tests/fixtures/slurm) through a stand-in ``sacct`` on PATH. The
diagnosis must appear on the diagnoses topic and at a webhook receiver, and the
recovery sink, in dry-run, must print the drain for node-02 and nothing for an
ambiguous diagnosis shipped beside it.

Debian 12's librdkafka (2.0.2) cannot read the ApiVersions reply of the embedded broker
(Tansu); against it the programs load the newer librdkafka that confluent-kafka's
wheel carries (``LD_LIBRARY_PATH``). Against Apache Kafka (``KAFKA_BOOTSTRAP``) they
use their own.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from firstfault.connectors.shipper import ship
from firstfault.rules.prefixes import StampContext, read_head
from firstfault.streams import kafka
from firstfault.streams.codecs import decode_raw

from stream_pipeline import pipeline_cfg, read_finals, running_pipeline, stop_all, worker_env
from webhook_receiver import Receiver

pytest_plugins = ["conftest_kafka"]

ROOT = Path(__file__).resolve().parents[1]
SHIPPERS = ROOT / "connectors" / "shippers"
SLURM = Path(__file__).resolve().parent / "fixtures" / "slurm"
WORKED = ROOT / "samples" / "worked-example"
NODES = ("node-01", "node-02", "node-03", "node-04")

RSYSLOGD = shutil.which("rsyslogd") or shutil.which("rsyslogd", path="/usr/sbin")
OMKAFKA = glob.glob("/usr/lib/*/rsyslog/omkafka.so") + glob.glob("/usr/lib/rsyslog/omkafka.so")
KCAT = shutil.which("kcat")
needs_shippers = pytest.mark.skipif(not (RSYSLOGD and OMKAFKA and KCAT),
                                    reason="needs rsyslog with omkafka and kcat (apt install rsyslog-kafka kcat)")


@pytest.fixture(scope="module")
def rdkafka_env(tmp_path_factory) -> dict[str, str]:
    """Environment for librdkafka programs: the wheel's librdkafka when the broker is Tansu."""
    if os.environ.get("KAFKA_BOOTSTRAP"):
        return {}
    import confluent_kafka

    libs = glob.glob(str(Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs" / "librdkafka*.so.1"))
    if not libs:
        pytest.skip("confluent-kafka wheel without a bundled librdkafka; set KAFKA_BOOTSTRAP to a real Kafka")
    d = tmp_path_factory.mktemp("rdkafka")
    (d / "librdkafka.so.1").symlink_to(libs[0])
    return {"LD_LIBRARY_PATH": str(d)}


def rsyslog_config(recipe: str, cfg, node: str, root: Path, work: Path, inputs: str) -> str:
    """The recipe as an operator installs it, with this test's broker, topic and paths."""
    swaps = {'broker=["kafka-1.example:9092"]': f'broker=["{cfg.bootstrap}"]',
             'topic="firstfault.raw"': f'topic="{cfg.topic("raw")}"',
             "/var/lib/rsyslog/": f"{work}/",
             'File="/var/log/fabricmanager.log"': f'File="{root}/var/log/fabricmanager.log"'}
    for old, new in swaps.items():
        assert old in recipe, f"the recipe no longer holds {old}"
        recipe = recipe.replace(old, new)
    return f'global(localHostname="{node}" workDirectory="{work}")\n{recipe}\n{inputs}\n'


def start_rsyslog(cfg, node: str, tmp: Path, env: dict, inputs: str) -> subprocess.Popen:
    root, work = tmp / node, tmp / node / "rsyslog"
    work.mkdir(parents=True, exist_ok=True)
    conf = work / "rsyslog.conf"
    conf.write_text(rsyslog_config((SHIPPERS / "rsyslog-firstfault.conf").read_text(), cfg, node, root, work,
                                   inputs.format(root=root)))
    check = subprocess.run([RSYSLOGD, "-N1", "-f", str(conf)], capture_output=True, text=True, env=env)
    assert check.returncode == 0, check.stderr
    log = open(work / "rsyslogd.log", "wb")
    return subprocess.Popen([RSYSLOGD, "-n", "-f", str(conf), "-i", str(work / "rsyslogd.pid")],
                            env=env, stdout=log, stderr=subprocess.STDOUT)


def raw_records(cfg, want: int, timeout: float = 60.0) -> list:
    """Every message on the raw topic, once at least ``want`` arrived (or the timeout passed)."""
    c = kafka.consumer(cfg, group=f"{cfg.prefix}count-{time.monotonic_ns()}")
    c.assign([TopicPartition(cfg.topic("raw"), p, 0) for p in range(cfg.partitions)])
    got: list = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < want and time.monotonic() < deadline:
            got += [m for m in c.consume(num_messages=500, timeout=0.5) if m.error() is None]
    finally:
        c.close()
    return got


def slurm_poll(cfg, tmp: Path, phase: str) -> None:
    env = worker_env(cfg, tmp, PATH=f"{SLURM / 'bin'}{os.pathsep}{os.environ['PATH']}",
                     SLURM_STANDIN_DIR=str(SLURM / phase), TZ="UTC")
    # The recorded jobs ran on 2026-11-02: look back far enough on the first poll.
    run = subprocess.run([sys.executable, "-m", "firstfault.connectors.slurm", "--once", "--state",
                          str(tmp / "slurm-state.json"), "--lookback", str(400 * 86400), "--metrics-port", "0"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


@needs_shippers
def test_rsyslog_and_kcat_to_diagnosis_alert_and_dry_run_drain(kafka_bootstrap, unique_name, tmp_path, rdkafka_env):
    cfg = pipeline_cfg(kafka_bootstrap, unique_name("ship"))
    env = {**os.environ, **rdkafka_env}
    # Each node's files where a node keeps them.
    lines = 0
    for node in NODES:
        (tmp_path / node / "var" / "log").mkdir(parents=True)
        shutil.copy(WORKED / "logs" / "syslog" / f"{node}.log", tmp_path / node / "var" / "log" / "syslog")
        (tmp_path / node / "scratch").mkdir()
        shutil.copy(WORKED / "logs" / "app" / f"{node}.log", tmp_path / node / "scratch" / "train.log")
        for name in ("syslog/", "app/"):
            lines += len((WORKED / "logs" / name / f"{node}.log").read_text().splitlines())

    receiver = Receiver()
    (tmp_path / "alerts.yaml").write_text(json.dumps({"webhooks": [{"name": "oncall", "url": receiver.url}],
                                                      "backoff_initial_s": 0.2}))
    audit = tmp_path / "recovery-audit.jsonl"
    sinks: list[subprocess.Popen] = []
    shippers: list[subprocess.Popen] = []
    with running_pipeline(cfg, tmp_path):
        try:
            sinks.append(subprocess.Popen(
                [sys.executable, "-m", "firstfault.connectors.sinks.alerts", "--config", str(tmp_path / "alerts.yaml"),
                 "--group", f"{cfg.prefix}alerts", "--metrics-port", "0"],
                env=worker_env(cfg, tmp_path), stdout=open(tmp_path / "alerts.log", "wb"), stderr=subprocess.STDOUT))
            recovery_out = open(tmp_path / "recovery.out", "wb")
            sinks.append(subprocess.Popen(
                [sys.executable, "-m", "firstfault.connectors.sinks.recovery", "--follow", "--fleet-size", "512",
                 "--audit-log", str(audit), "--group", f"{cfg.prefix}recovery", "--metrics-port", "0"],
                env=worker_env(cfg, tmp_path), stdout=recovery_out, stderr=open(tmp_path / "recovery.err", "wb")))

            # 10:10 UTC: the job runs its second srun; the first has ended.
            slurm_poll(cfg, tmp_path, "phase1")
            for node in NODES:
                shippers.append(start_rsyslog(cfg, node, tmp_path, env, (
                    'input(type="imfile" File="{root}/var/log/syslog" Tag="syslog" addMetadata="on" '
                    'ruleset="firstfault_files")')))
                kcat = subprocess.run([str(SHIPPERS / "kcat-tail.sh"), "--once", str(tmp_path / node / "scratch" /
                                       "train.log"), "slurm-4471823"],
                                      env={**env, **worker_env(cfg, tmp_path), "FIRSTFAULT_HOST": node, **rdkafka_env},
                                      capture_output=True, text=True, timeout=60)
                assert kcat.returncode == 0, kcat.stderr
            shipped = raw_records(cfg, lines)
            assert len(shipped) >= lines, f"{len(shipped)} of {lines} lines reached the raw topic"
            xid = [decode_raw(m.value(), m.key(), m.headers(), m.offset()) for m in shipped if b"Xid" in m.value()]
            assert {(r.host, r.path, r.source) for r in xid} == {("node-02", "logs/syslog/node-02.log", "syslog")}

            # 10:30 UTC: the job failed.
            slurm_poll(cfg, tmp_path, "phase2")
            ship(ROOT / "samples" / "ambiguous-two-faults", cfg)

            finals = read_finals(cfg, lambda out: any(d.attempt == 1 for d in out.get("slurm-4471823", []))
                                 and "slurm-4472230" in out, timeout=150)
            d1 = next(d for d in finals["slurm-4471823"] if d.attempt == 1)
            assert (d1.status, d1.domain, d1.sub_domain, d1.responsible_nodes) == \
                ("attributed", "interconnect", "nvlink_signal_integrity", ["node-02"])
            assert d1.root_cause.ref.path == "logs/syslog/node-02.log"
            assert d1.recovery.action == "drain_nodes" and d1.recovery.nodes == ["node-02"]
            # The first srun ended 31 s before node-02's fault: not its cause.
            d0 = next(d for d in finals["slurm-4471823"] if d.attempt == 0)
            assert d0.status == "unattributed" and "node-02" not in d0.responsible_nodes
            amb = finals["slurm-4472230"][0]
            assert amb.status == "ambiguous"

            alerts = wait_for(lambda: [r["body"]["diagnosis"] for r in receiver.requests
                                       if r["body"]["diagnosis"]["diagnosis_id"] == d1.diagnosis_id],
                              60, "the alert for attempt 1")
            assert alerts[0]["responsible_nodes"] == ["node-02"] and alerts[0]["status"] == "attributed"

            def decided():
                if not audit.exists():
                    return None
                recs = [json.loads(x) for x in audit.read_text().splitlines() if x.strip()]
                ids = {r["diagnosis_id"] for r in recs}
                return recs if {d1.diagnosis_id, amb.diagnosis_id} <= ids else None

            recs = wait_for(decided, 60, "the recovery sink's decisions")
        finally:
            stop_all(shippers + sinks)
            receiver.close()
    drains = [x for x in (tmp_path / "recovery.out").read_text().splitlines() if x.startswith("DRY-RUN")]
    assert drains == ['DRY-RUN scontrol update NodeName=node-02 State=DRAIN Reason="firstfault: '
                      f'nvlink_signal_integrity {d1.diagnosis_id}"']
    assert not any(amb.diagnosis_id in x for x in drains)
    by_id = {r["diagnosis_id"]: r for r in recs}
    assert by_id[amb.diagnosis_id]["decision"] == "refused" and by_id[amb.diagnosis_id]["commands"] == []
    assert by_id[d1.diagnosis_id]["decision"] == "dry_run"


@needs_shippers
def test_rsyslog_syslog_template_writes_the_line_syslog_would(kafka_bootstrap, unique_name, tmp_path, rdkafka_env):
    """The recipe's first part: a message rsyslog receives (here from logger, as a kernel
    line would arrive from imklog) reaches the raw topic as the /var/log/syslog line."""
    cfg = pipeline_cfg(kafka_bootstrap, unique_name("rsys"))
    kafka.ensure_topics(cfg)
    env = {**os.environ, **rdkafka_env}
    sock = tmp_path / "node-07" / "log.sock"
    proc = start_rsyslog(cfg, "node-07", tmp_path, env, (
        'module(load="imuxsock" SysSock.Use="off")\n'
        f'input(type="imuxsock" Socket="{sock}" CreatePath="on")'))
    try:
        wait_for(sock.exists, 20, "rsyslog's socket")
        text = "NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
        subprocess.run(["logger", "-u", str(sock), "-t", "kernel", text], check=True)
        [msg] = raw_records(cfg, 1, timeout=30)
    finally:
        stop_all([proc])
    rec = decode_raw(msg.value(), msg.key(), msg.headers(), msg.offset())
    assert (rec.host, rec.path, rec.source, msg.key()) == ("node-07", "logs/syslog/node-07.log", "syslog", b"node-07")
    assert rec.text.endswith(f" node-07 kernel: {text}")
    head = read_head(rec.text, StampContext(zone=timezone.utc, anchor=datetime.now(timezone.utc)))
    assert head.stamp is not None and abs(time.time() - head.stamp.timestamp()) < 120
