"""Slurm connector against stand-in sacct/squeue executables printing recorded data_parser JSON."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from firstfault.connectors import slurm
from firstfault.connectors.hostlist import HostlistError, expand
from firstfault.connectors.publish import PublishError, SchedulerPublisher
from firstfault.connectors.slurm import (
    ExitCode, SacctOutput, SlurmConnector, SlurmError, base_state, gpus_in_tres, gpus_in_tres_str, scheduler_events,
    state_word,
)
from firstfault.schemas import SchedulerEvent
from firstfault.schemas.avro import decode
from firstfault.schemas.workload import normalize_terminal_state
from firstfault.streams import kafka
from firstfault.streams.config import StreamConfig

pytest_plugins = ["conftest_kafka"]

FIX = Path(__file__).parent / "fixtures" / "slurm"
T1 = 1793614200.0          # 2026-11-02T10:10:00Z, phase1 was recorded then
T2 = 1793615400.0          # 2026-11-02T10:30:00Z, phase2


def load(phase: str, name: str = "sacct") -> dict:
    return json.loads((FIX / phase / f"{name}.json").read_text())


# ---------------------------------------------------------------- hostlists

@pytest.mark.parametrize("expr, hosts", [
    ("node-[01-04,07]", ["node-01", "node-02", "node-03", "node-04", "node-07"]),
    ("node-[8-10]", ["node-8", "node-9", "node-10"]),
    ("gpu[008-010]", ["gpu008", "gpu009", "gpu010"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("rack[1-2]-node[01,03]-ib", ["rack1-node01-ib", "rack1-node03-ib", "rack2-node01-ib", "rack2-node03-ib"]),
    ("a[1-2],b[5],c", ["a1", "a2", "b5", "c"]),
    ("node-01,node-[03-04] node-09", ["node-01", "node-03", "node-04", "node-09"]),
    ("nid[00001-00002,00010]", ["nid00001", "nid00002", "nid00010"]),
    ("ia1", ["ia1"]),
    ("", []),
    ("None assigned", []),
    (None, []),
])
def test_hostlist_expansion(expr, hosts):
    assert expand(expr) == hosts


@pytest.mark.parametrize("bad", ["node-[04-01]", "node-[1-2", "node-]1[", "node-[a-b]", "node-[-1]", "n[1-[2-3]]"])
def test_hostlist_rejects_what_slurm_rejects(bad):
    with pytest.raises(HostlistError):
        expand(bad)


# ---------------------------------------------------------------- mapping

def test_state_and_exit_code_mapping_from_recorded_output():
    events = scheduler_events([load("phase2")], load("phase2", "squeue"))
    ends = {(e.workload.workload_id, e.workload.attempt): e.workload for e in events if e.type == "end"}
    got = {k: (w.state, w.exit_code, w.terminal_state) for k, w in ends.items()}
    assert got == {
        ("slurm-4471823", 0): ("FAILED", "1:0", "failed"),             # srun attempt 0 exited 1
        ("slurm-4471823", 1): ("FAILED", "1:0", "failed"),             # its retry, same fate
        ("slurm-4471830", 0): ("COMPLETED", "0:0", "completed"),
        ("slurm-4471841", 0): ("CANCELLED by jdoe", "0:15", "cancelled"),
        ("slurm-4471850", 0): ("NODE_FAIL", "0:9", "node_fail"),       # step says CANCELLED; the job, NODE_FAIL
        ("slurm-4471862", 0): ("OUT_OF_MEMORY", "0:125", "out_of_memory"),
        ("slurm-4471870", 0): ("NODE_FAIL", "0:9", "node_fail"),       # first incarnation of a requeued job
        ("slurm-4471880", 0): ("TIMEOUT", "0:15", "timeout"),          # killed with SIGTERM at the limit
    }
    assert ends[("slurm-4471850", 0)].model_extra["failed_node"] == "node-11"


def test_cancelled_by_uid_text_form_and_flags():
    # sacct's text output prints the uid; JSON names the user. Both normalize to cancelled.
    assert state_word("CANCELLED", "1234") == "CANCELLED by 1234"
    assert normalize_terminal_state("CANCELLED by 1234") == "cancelled"
    assert state_word("CANCELLED", "") == "CANCELLED"
    assert state_word("FAILED", "jdoe") == "FAILED"
    assert base_state(["COMPLETING", "CANCELLED"]) == "CANCELLED"
    assert base_state(["RUNNING", "REQUEUED"]) == "RUNNING"


def test_exit_codes_as_sacct_prints_them():
    assert ExitCode.model_validate({"status": ["SIGNALED"], "return_code": {"set": False, "number": 0},
                                    "signal": {"id": {"set": True, "number": 9}, "name": "KILL"}}).text() == "0:9"
    assert ExitCode.model_validate({"status": ["ERROR"], "return_code": {"set": True, "number": 2},
                                    "signal": {"id": {"set": False, "number": 0}, "name": ""}}).text() == "2:0"
    assert ExitCode.model_validate({"status": ["PENDING"]}).text() is None
    # data_parser v0.0.40 (Slurm 23.11) wrote a plain status word and numbers
    assert ExitCode.model_validate({"status": "ERROR", "return_code": 1}).text() == "1:0"


def test_gpus_per_node_from_tres_and_gres():
    tres = [{"type": "gres", "name": "gpu", "count": 32}, {"type": "gres", "name": "gpu:h100", "count": 32},
            {"type": "node", "name": "", "count": 4}]
    assert gpus_in_tres(tres) == 32                  # the untyped total, not typed + untyped
    assert gpus_in_tres([{"type": "gres", "name": "gpu:h100", "count": 4},
                         {"type": "gres", "name": "gpu:h200", "count": 8}]) == 12
    assert gpus_in_tres([{"type": "cpu", "name": "", "count": 8}]) is None
    assert gpus_in_tres_str("cpu=224,mem=3600000M,node=2,billing=224,gres/gpu=16,gres/gpu:h100=16") == 16
    assert slurm.per_node(12, 4) == 3 and slurm.per_node(10, 4) is None


def test_attempts_are_srun_steps_and_requeues_continue_the_count():
    events = scheduler_events([load("phase2")])
    starts = {(e.workload.workload_id, e.workload.attempt): e.workload for e in events if e.type == "start"}
    assert starts[("slurm-4471823", 0)].model_extra["slurm_step"] == "4471823.0"
    assert starts[("slurm-4471823", 1)].model_extra["slurm_step"] == "4471823.1"
    # no srun step: the allocation is the attempt
    assert starts[("slurm-4471830", 0)].model_extra["slurm_step"] is None
    # requeued after NODE_FAIL on node-14: the second incarnation's step 0 is attempt 1
    g1 = starts[("slurm-4471870", 1)]
    assert g1.nodes == ["node-15", "node-16"] and g1.model_extra["restart_cnt"] == 1
    assert ("slurm-4471845", 0) not in starts                     # pending: never ran
    wl = starts[("slurm-4471823", 1)]
    assert wl.state == "RUNNING" and wl.end_time is None and wl.exit_code is None
    assert wl.nodes == ["node-01", "node-02", "node-03", "node-04"] and wl.gpus_per_node == 8
    assert wl.time_limit_s == 240 * 60
    assert (wl.model_extra["user"], wl.model_extra["job_name"], wl.model_extra["partition"]) == \
        ("mchen", "llama-pretrain", "gpu")


def test_the_same_input_gives_the_same_events():
    a = [e.model_dump_json() for e in scheduler_events([load("phase2")], load("phase2", "squeue"))]
    b = [e.model_dump_json() for e in scheduler_events([load("phase2")], load("phase2", "squeue"))]
    assert a == b and len(a) == len(set(a))
    assert SacctOutput.model_validate(load("phase2")).meta["plugin"]["data_parser"] == "data_parser/v0.0.42"


def test_squeue_reports_a_start_slurmdbd_has_not_seen():
    events = scheduler_events([load("phase1")], load("phase1", "squeue"))
    e = next(e for e in events if e.workload.workload_id == "slurm-4471850")
    assert e.type == "start" and e.workload.nodes == ["node-10", "node-11"] and e.workload.gpus_per_node == 8


# ---------------------------------------------------------------- the poller, stand-ins on PATH

@pytest.fixture
def standin(tmp_path, monkeypatch):
    """Put the stand-in sacct/squeue first on PATH; ``phase(name)`` switches what they print."""
    monkeypatch.setenv("PATH", f"{FIX / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_STANDIN_LOG", str(tmp_path / "calls.log"))
    cluster = tmp_path / "cluster"

    def phase(name: str) -> None:
        shutil.rmtree(cluster, ignore_errors=True)
        shutil.copytree(FIX / name, cluster)
        monkeypatch.setenv("SLURM_STANDIN_DIR", str(cluster))

    phase("phase1")
    return phase


def calls(tmp_path: Path) -> list[list[str]]:
    return [json.loads(line) for line in (tmp_path / "calls.log").read_text().splitlines()]


def read_topic(cfg: StreamConfig, expect: int, timeout_s: float = 20.0) -> list[tuple[str, SchedulerEvent]]:
    c = Consumer({"bootstrap.servers": cfg.bootstrap, "group.id": f"{cfg.prefix}check", "enable.auto.commit": False})
    topic = cfg.topic("scheduler")
    meta = c.list_topics(topic, timeout=10).topics[topic]
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions])
    out: list[tuple[str, SchedulerEvent]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and len(out) < expect:
        for m in c.consume(num_messages=100, timeout=0.5) or []:
            if m.error() is None:
                out.append((m.key().decode(), decode(m.value())))
    extra = c.consume(num_messages=10, timeout=1.0) or []       # nothing beyond what we expected
    out += [(m.key().decode(), decode(m.value())) for m in extra if m.error() is None]
    c.close()
    return out


def test_restart_neither_misses_nor_repeats(standin, stream_cfg, tmp_path):
    kafka.ensure_topics(stream_cfg, [stream_cfg.topic("scheduler")])
    state = tmp_path / "slurm-state.json"
    pub = SchedulerPublisher(stream_cfg)

    first = SlurmConnector(state, pub, overlap_s=900).poll(now=T1)
    assert {slurm.event_key(e) for e in first} >= {"slurm-4471823|0|end", "slurm-4471823|1|start",
                                                     "slurm-4471850|0|start"}
    standin("phase2")
    second = SlurmConnector(state, pub, overlap_s=900).poll(now=T2)       # a restarted process
    third = SlurmConnector(state, pub, overlap_s=900).poll(now=T2 + 30)   # and again: nothing new
    assert third == []

    # What the cluster did, read completely (every job by id, whole history) ...
    everything = scheduler_events([load("phase2")], load("phase1", "squeue"))
    expected = {slurm.event_key(e) for e in everything}
    # ... is exactly what reached the topic, each once.
    got = read_topic(stream_cfg, len(first) + len(second))
    keys = [slurm.event_key(ev) for _, ev in got]
    assert len(keys) == len(set(keys)), "an event was published twice"
    assert set(keys) == expected
    assert all(k == ev.workload.workload_id for k, ev in got)

    # The requeued job's first incarnation ended before the second poll's window: it came from
    # the by-id history query, not the window, and still got attempt 0.
    assert ["sacct", "--json", "--allusers", "--duplicates", "--jobs", "4471870"] in calls(tmp_path)
    window = [c for c in calls(tmp_path) if "--starttime" in c]
    assert window[1][window[1].index("--starttime") + 1] == time.strftime(
        "%Y-%m-%dT%H:%M:%S", time.localtime(T1 - 900))
    assert json.loads(state.read_text())["open_jobs"] == [4471870]


def test_a_failed_sacct_or_publish_does_not_advance(standin, tmp_path, monkeypatch):
    state = tmp_path / "slurm-state.json"
    monkeypatch.setenv("SLURM_STANDIN_FAIL", "1")
    with pytest.raises(SlurmError, match="Connection refused"):
        SlurmConnector(state, publisher=None).poll(now=T1)
    assert not state.exists()
    monkeypatch.delenv("SLURM_STANDIN_FAIL")
    # a broker nobody listens on: nothing confirmed, so the position must not move
    dead = StreamConfig(bootstrap="127.0.0.1:9", prefix="dead.")
    pub = SchedulerPublisher(dead, timeout_s=1.5, producer=kafka.producer(dead, **{"message.timeout.ms": 1000}))
    with pytest.raises(PublishError):
        SlurmConnector(state, pub).poll(now=T1)
    assert not state.exists()


def test_command_line_dry_run_prints_events(standin, capsys):
    assert slurm.main(["--dry-run", "--lookback", str(10 ** 9)]) == 0
    lines = [SchedulerEvent.model_validate_json(line) for line in capsys.readouterr().out.splitlines()]
    assert {(e.type, e.workload.workload_id, e.workload.attempt) for e in lines} >= {
        ("end", "slurm-4471841", 0), ("start", "slurm-4471823", 1)}


@pytest.mark.parametrize("module,name,command", [("slurm", "slurm", "sacct"), ("slurm_tail", "slurm-tail", "squeue")])
def test_both_slurm_workers_start_alike(module, name, command, monkeypatch, capsys):
    """The connector and the output tailer share their start (slurm.slurm_start): the same selection
    of the site for their Slurm commands, from the environment or flags, and the same refusal."""
    import importlib

    mod = importlib.import_module(f"firstfault.connectors.{module}")
    monkeypatch.setenv("FIRSTFAULT_SLURM_CLUSTERS", "alpha,beta")
    monkeypatch.delenv("FIRSTFAULT_SLURM_PARTITION", raising=False)
    monkeypatch.setenv("PATH", str(FIX / "bin"))              # holds a sacct and a squeue
    args, extra = slurm.slurm_start(mod.build_parser(), [], name, command)
    assert extra == ["--clusters", "alpha,beta"] and args.metrics_port == slurm.METRICS_PORT
    _, extra = slurm.slurm_start(mod.build_parser(), ["--partition", "gpu", "--clusters", "c"], name, command)
    assert extra == ["--clusters", "c", "--partition", "gpu"]
    monkeypatch.setenv("PATH", "/nonexistent")
    assert mod.main([]) == 2
    assert capsys.readouterr().err == f"firstfault {name}: {command} is not on PATH\n"


# ---------------------------------------------------------------- Slurm 22.05, as its real commands print

def test_slurm_22_05_output_with_exit_codes_from_the_text_form():
    # Recorded from the real cluster of test_slurm_real.py (Debian 12's Slurm 22.05.8): a job
    # exiting 1, a time limit, a requeue (attempt 1 then cancelled), n3 set DOWN under a 2-node job.
    doc = load("22.05")
    assert slurm.exit_codes_unreliable(doc) and not slurm.exit_codes_unreliable(load("phase2"))
    assert {j["exit_code"]["status"] for j in doc["jobs"]} == {"SUCCESS"}       # what 22.05's JSON claims
    codes = slurm.parse_exit_codes((FIX / "22.05" / "sacct-exit-codes.txt").read_text())
    events = scheduler_events([slurm.patch_exit_codes(doc, codes)], load("22.05", "squeue"))
    ends = {(e.workload.workload_id, e.workload.attempt): e.workload for e in events if e.type == "end"}
    got = {k: (w.state, w.exit_code, w.nodes, w.model_extra["slurm_step"], w.model_extra["restart_cnt"])
           for k, w in ends.items()}
    assert got == {
        ("slurm-3", 0): ("FAILED", "1:0", ["n1"], None, 0),                   # no srun: the allocation
        ("slurm-4", 0): ("TIMEOUT", "0:15", ["n1"], "4.0", 0),                # the step got SIGTERM
        ("slurm-5", 0): ("REQUEUED", "0:15", ["n1"], "5.0", 0),               # scontrol requeue
        ("slurm-5", 1): ("CANCELLED by root", "0:15", ["n1"], "5.0", 1),
        ("slurm-6", 0): ("NODE_FAIL", "0:15", ["n2", "n3"], "6.0", 0),
    }
    # the controller's reason for jobs it still holds (squeue was read while job 4 still ran)
    assert {k: w.model_extra.get("reason") for k, w in ends.items() if w.model_extra.get("reason")} == {
        ("slurm-3", 0): "NonZeroExitCode", ("slurm-6", 0): "NodeDown"}


def test_slurm_22_05_nothing_found_is_an_empty_answer(tmp_path):
    conn = SlurmConnector(tmp_path / "state.json", publisher=None)
    nothing = (FIX / "22.05" / "sacct-nothing-found.json").read_text()
    conn._text = lambda argv, env=None: nothing                          # type: ignore[method-assign]
    assert conn._run(["sacct", "--json"])["jobs"] == []
    conn._text = lambda argv, env=None: nothing.replace("9003", "1")      # type: ignore[method-assign]
    with pytest.raises(SlurmError, match="Nothing found"):
        conn._run(["sacct", "--json"])
