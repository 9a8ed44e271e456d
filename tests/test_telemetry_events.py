"""DCGM threshold crossings in a bundle's metrics/*.jsonl become events the rules use."""
from __future__ import annotations

import json
import random

from firstfault.rules.catalog import load_catalog
from firstfault.rules.engine import analyze_path
from firstfault.rules.ruletest import run_rule_tests
from firstfault.rules.telemetry import Threshold, first_crossing, kept_indices, load_thresholds

from conftest import BASE_WORKLOAD

XID79 = "Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
XID48 = ("Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:1b:00): 48, pid=89695, name=python3, An uncorrectable "
         "double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.")
WD = ("{rank}: [rank{rank}]:[E1102 10:13:12.044871 ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective "
      "operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) "
      "ran for 600054 milliseconds before timing out.")
REMOTE = ("{rank}: {host}:4711:4790 [0] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer "
          "node-02<55693>")
NODES = ["node-01", "node-02", "node-03", "node-04"]
T0, T1 = "2026-11-02T09:53:00Z", "2026-11-02T10:22:14Z"


def sample(ts: str, host: str, gpu: int | None, name: str, value: float) -> str:
    return json.dumps({"ts": ts, "host": host, "gpu": gpu, "name": name, "value": value}, sort_keys=True)


def app_logs() -> dict[str, str]:
    """NCCL errors on the ranks of node-01, node-03 and node-04 (the ranks of node-02 say nothing)."""
    files = {}
    for i, host in enumerate(NODES):
        if host == "node-02":
            continue
        ranks = range(8 * i, 8 * i + 8)
        lines = [f"{r}: [2026-11-02 10:03:40,000] INFO step 1200 loss 2.3411" for r in ranks[:1]]
        lines += [REMOTE.format(rank=r, host=host) for r in ranks]
        lines += [WD.format(rank=r) for r in ranks]
        files[f"logs/app/{host}.log"] = "\n".join(lines) + "\n"
    return files


def dcgm(extra: list[str] | None = None, xid79: bool = True) -> str:
    """The connector's compact file: every series' first and last sample, plus crossings."""
    lines = []
    for host in NODES:
        for gpu in range(8):
            for name, v in (("DCGM_FI_DEV_XID_ERRORS", 0.0), ("DCGM_FI_DEV_GPU_TEMP", 61.0),
                            ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 12.0)):
                last = 79.0 if (xid79 and name == "DCGM_FI_DEV_XID_ERRORS" and (host, gpu) == ("node-02", 3)) else v
                lines += [sample(T0, host, gpu, name, v), sample(T1, host, gpu, name, last)]
    if xid79:
        lines.append(sample("2026-11-02T10:03:15Z", "node-02", 3, "DCGM_FI_DEV_XID_ERRORS", 79.0))
    lines += extra or []
    lines.sort()
    return "\n".join(lines) + "\n"


def run(make_bundle, files: dict[str, str | bytes], name: str = "bundle", **wl):
    return analyze_path(make_bundle({**BASE_WORKLOAD, **wl}, files, name))


def line_of(bundle_files: dict[str, str], ref) -> str:
    return bundle_files[ref.path].splitlines()[ref.line - 1]


# ---------------------------------------------------------------- the engine

def test_dcgm_xid_alone_is_the_root(make_bundle):
    files = {**app_logs(), "metrics/dcgm.jsonl": dcgm()}
    d = run(make_bundle, files).diagnosis
    assert (d.status, d.domain, d.sub_domain) == ("attributed", "gpu", "gpu_fell_off_bus")
    assert d.responsible_nodes == ["node-02"]
    root = d.root_cause
    assert root.kind == "dcgm_threshold" and root.host == "node-02" and root.gpu == 3
    assert root.ref.path == "metrics/dcgm.jsonl"
    assert json.loads(line_of(files, root.ref)) == {"ts": "2026-11-02T10:03:15Z", "host": "node-02", "gpu": 3,
                                                    "name": "DCGM_FI_DEV_XID_ERRORS", "value": 79.0}
    assert root.text == line_of(files, root.ref)
    assert root.timestamp == "2026-11-02T10:03:15.000000Z"
    assert root.fields["xid"] == 79 and root.fields["metric"] == "DCGM_FI_DEV_XID_ERRORS"
    assert root.fields["rule"] == "changed" and root.fields["mnemonic"]      # decoded from the Xid table
    assert d.recovery.action == "drain_nodes" and d.recovery.nodes == ["node-02"]
    assert d.symptom_coverage == 1.0
    assert any(s.rule_id == "early.telemetry.xid.decode" for s in d.evidence)
    assert not [m for m in d.missing_evidence if m.kind == "metrics"]


def test_kernel_xid_is_the_root_and_the_dcgm_copy_is_explained(make_bundle):
    files = {**app_logs(), "metrics/dcgm.jsonl": dcgm(), "logs/syslog/node-02.log": XID79 + "\n"}
    d = run(make_bundle, files).diagnosis
    assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_fell_off_bus", ["node-02"])
    assert d.root_cause.kind == "xid"
    assert (d.root_cause.ref.path, d.root_cause.ref.line) == ("logs/syslog/node-02.log", 1)
    assert d.candidates == []
    step = next(s for s in d.evidence if s.rule_id == "final.explain.kernel_xid_is_the_dcgm_xid")
    assert [(r.path, json.loads(line_of(files, r))["value"]) for r in step.events] == [("metrics/dcgm.jsonl", 79.0)]
    dcgm_sym = next(s for s in d.symptoms if s.kind == "dcgm_threshold")
    assert dcgm_sym.explained and dcgm_sym.hosts == ["node-02"]
    edge = next(e for e in d.explains if e.target == "dcgm_threshold")
    assert edge.rule_id == "final.explain.kernel_xid_is_the_dcgm_xid" and edge.source.path == "logs/syslog/node-02.log"


def test_different_xid_from_dcgm_is_not_the_kernel_one(make_bundle):
    # DCGM says Xid 79 on node-02, the kernel an Xid 79 on node-01: two GPUs, no copy explained.
    files = {**app_logs(), "metrics/dcgm.jsonl": dcgm(),
             "logs/syslog/node-01.log": XID79.replace("node-02", "node-01") + "\n"}
    d = run(make_bundle, files).diagnosis
    assert not any(s.rule_id == "final.explain.kernel_xid_is_the_dcgm_xid" for s in d.evidence)
    # one sub_domain, two hosts: both roots fit
    assert d.status == "attributed" and d.responsible_nodes == ["node-01", "node-02"]


def test_kernel_ecc_xid_explains_the_dcgm_ecc_counter(make_bundle):
    dbe = [sample(T0, "node-02", 3, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 0.0),
           sample("2026-11-02T10:03:30Z", "node-02", 3, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1.0),
           sample(T1, "node-02", 3, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1.0)]
    only_dcgm = run(make_bundle, {**app_logs(), "metrics/dcgm.jsonl": dcgm(dbe, xid79=False)}, "a").diagnosis
    assert (only_dcgm.status, only_dcgm.sub_domain, only_dcgm.root_cause.kind) == (
        "attributed", "gpu_memory_ecc", "dcgm_threshold")
    assert only_dcgm.root_cause.fields["delta"] == 1
    both = run(make_bundle, {**app_logs(), "metrics/dcgm.jsonl": dcgm(dbe, xid79=False),
                             "logs/syslog/node-02.log": XID48 + "\n"}, "b").diagnosis
    assert (both.status, both.sub_domain, both.root_cause.kind) == ("attributed", "gpu_memory_ecc", "xid")
    assert any(s.rule_id == "final.explain.kernel_ecc_is_the_dcgm_ecc" for s in both.evidence)


def test_nvlink_crc_increase_does_not_outrank_a_strong_root(make_bundle):
    for ts in ("2026-11-02T09:59:00Z", "2026-11-02T10:05:00Z"):          # before and after the Xid
        crc = [sample(ts, "node-04", 0, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 900.0)]
        files = {**app_logs(), "metrics/dcgm.jsonl": dcgm(crc, xid79=False), "logs/syslog/node-02.log": XID79 + "\n"}
        d = run(make_bundle, files, name="b" + ts[11:13] + ts[14:16]).diagnosis
        assert (d.status, d.sub_domain, d.responsible_nodes) == ("attributed", "gpu_fell_off_bus", ["node-02"])
        assert next(s for s in d.symptoms if s.kind == "dcgm_threshold").explained


def test_nvlink_crc_alone_is_weak_and_drains_nothing(make_bundle):
    crc = [sample("2026-11-02T10:03:00Z", "node-04", 0, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 900.0)]
    d = run(make_bundle, {**app_logs(), "metrics/dcgm.jsonl": dcgm(crc, xid79=False)}).diagnosis
    assert (d.domain, d.sub_domain) == ("interconnect", "nvlink_error")
    assert d.recovery.action != "drain_nodes"


def test_temperature_alone_gives_no_root(make_bundle):
    hot = [sample("2026-11-02T10:02:00Z", "node-03", 1, "DCGM_FI_DEV_GPU_TEMP", 93.0)]
    d = run(make_bundle, {**app_logs(), "metrics/dcgm.jsonl": dcgm(hot, xid79=False)}).diagnosis
    assert d.status == "unattributed" and d.root_cause is None and d.responsible_nodes == []
    step = next(s for s in d.evidence if s.rule_id == "early.telemetry.temperature")
    assert step.action == "tag" and step.events[0].path == "metrics/dcgm.jsonl"
    assert d.recovery.action == "notify_owner"


def test_malformed_metrics_lines_are_unparsed_evidence(make_bundle):
    good = dcgm().encode()
    bad = (b"not json at all\n"
           b'{"ts": "yesterday", "host": "node-02", "gpu": 3, "name": "DCGM_FI_DEV_XID_ERRORS", "value": 79}\n'
           b'{"ts": "2026-11-02T10:04:00Z", "host": "node-02", "gpu": true, "name": "DCGM_FI_DEV_GPU_TEMP", "value": 99}\n'
           b'{"ts": "2026-11-02T10:04:00Z", "host": "node-02", "gpu": 1, "name": "DCGM_FI_DEV_GPU_TEMP", "value": "hot"}\n'
           b'[1, 2, 3]\n'
           b'{"ts": "2026-11-02T10:04:00Z", "host": "node-\xff\xfe", "gpu": 1, "name": "x", "value": 1}\n'
           b'\n')
    a = run(make_bundle, {**app_logs(), "metrics/dcgm.jsonl": good + bad + b'{"ts": "2026-11-02T10:'})
    d = a.diagnosis
    assert (d.status, d.sub_domain) == ("attributed", "gpu_fell_off_bus")           # the good lines still count
    n_good = good.count(b"\n")
    assert a.stats.unparsed == 7
    step = next(s for s in d.evidence if s.rule_id == "final.unparsed")
    assert step.count == 7 and step.events[0].path == "metrics/dcgm.jsonl" and step.events[0].line == n_good + 1
    assert a.stats.unparsed_refs[0] == ("metrics/dcgm.jsonl", n_good + 1)


def test_only_garbage_in_metrics_does_not_crash(make_bundle):
    a = run(make_bundle, {**app_logs(), "metrics/dcgm.jsonl": b"\x00\x01\x02\xff" * 1000})
    assert a.diagnosis.status == "unattributed" and a.stats.unparsed == 1


def _normalized(files: dict[str, str], diagnosis) -> str:
    """The diagnosis with each metrics line reference replaced by that line's content."""
    doc = json.loads(diagnosis.model_dump_json())
    doc.pop("diagnosis_id")

    def walk(x):
        if isinstance(x, dict):
            if set(x) == {"path", "line"} and str(x["path"]).startswith("metrics/"):
                return {"metrics_line": json.loads(files[x["path"]].splitlines()[x["line"] - 1])}
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        return x

    return json.dumps(walk(doc), sort_keys=True)


def test_deterministic_whatever_the_metrics_line_order(make_bundle):
    extra = [sample("2026-11-02T10:05:00Z", "node-04", 0, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 900.0),
             sample("2026-11-02T10:02:00Z", "node-03", 1, "DCGM_FI_DEV_GPU_TEMP", 93.0)]
    text = dcgm(extra)
    files = {**app_logs(), "metrics/dcgm.jsonl": text, "logs/syslog/node-02.log": XID79 + "\n"}
    first = run(make_bundle, files, "a").diagnosis
    again = run(make_bundle, files, "b").diagnosis
    assert first.model_dump_json() == again.model_dump_json()                      # byte-identical
    lines = text.splitlines()
    for seed in range(3):
        random.Random(seed).shuffle(lines)
        shuffled = {**files, "metrics/dcgm.jsonl": "\n".join(lines) + "\n"}
        d = run(make_bundle, shuffled, f"s{seed}").diagnosis
        # identical apart from line numbers into the shuffled file, which name the same lines
        assert _normalized(shuffled, d) == _normalized(files, first)
    # the same samples split over two files in either order: the same crossings
    half = len(lines) // 2
    split = {**files, "metrics/a.jsonl": "\n".join(lines[:half]) + "\n", "metrics/b.jsonl": "\n".join(lines[half:]) + "\n"}
    del split["metrics/dcgm.jsonl"]
    swapped = {**split, "metrics/a.jsonl": split["metrics/b.jsonl"], "metrics/b.jsonl": split["metrics/a.jsonl"]}
    d1, d2 = run(make_bundle, split, "p1").diagnosis, run(make_bundle, swapped, "p2").diagnosis
    assert (d1.status, d1.sub_domain, d1.root_cause.ref) == (d2.status, d2.sub_domain, d2.root_cause.ref)


def test_crossing_after_the_job_or_before_the_horizon_is_not_blamed(make_bundle):
    late = [sample("2026-11-02T09:00:00Z", "node-02", 3, "DCGM_FI_DEV_XID_ERRORS", 0.0),
            sample("2026-11-02T10:40:00Z", "node-02", 3, "DCGM_FI_DEV_XID_ERRORS", 79.0)]
    d = run(make_bundle, {**app_logs(), "metrics/dcgm.jsonl": "\n".join(late) + "\n"}, "a").diagnosis
    assert d.status == "unattributed" and d.responsible_nodes == []
    # an Xid 79 recorded two hours before the job, still there: no change inside the horizon
    old = [sample("2026-11-02T07:00:00Z", "node-02", 3, "DCGM_FI_DEV_XID_ERRORS", 0.0),
           sample("2026-11-02T07:10:00Z", "node-02", 3, "DCGM_FI_DEV_XID_ERRORS", 79.0),
           sample("2026-11-02T09:55:00Z", "node-02", 3, "DCGM_FI_DEV_XID_ERRORS", 79.0),
           sample("2026-11-02T10:20:00Z", "node-02", 3, "DCGM_FI_DEV_XID_ERRORS", 79.0)]
    d = run(make_bundle, {**app_logs(), "metrics/dcgm.jsonl": "\n".join(old) + "\n"}, "b").diagnosis
    assert d.status == "unattributed"


def test_fqdn_hosts_map_to_workload_nodes(make_bundle):
    text = dcgm().replace('"host": "node-02"', '"host": "node-02.cluster.example"')
    d = run(make_bundle, {**app_logs(), "metrics/dcgm.jsonl": text}).diagnosis
    assert d.responsible_nodes == ["node-02"]


# ---------------------------------------------------------------- crossing semantics

def test_compact_file_gives_the_full_series_crossing():
    rng = random.Random(7)
    table = load_thresholds() + [Threshold(metric="c", kind="increase", value=5)]
    checked = 0
    for _ in range(3000):
        th = rng.choice(table)
        n = rng.randint(1, 30)
        if th.kind == "increase":
            values, v = [], float(rng.randint(0, 50))
            for _ in range(n):
                v = 0.0 if rng.random() < 0.1 else v + rng.choice([0, 0, 0, 1, 3, 40])   # resets
                values.append(v)
        elif th.kind == "changed":
            values = [float(rng.choice([0, 0, 0, 31, 79, 48])) for _ in range(n)]
        else:
            values = [float(rng.randint(50, 100)) for _ in range(n)]
        full = first_crossing(th, values)
        keep = kept_indices(th, values, full)
        compact = first_crossing(th, [values[i] for i in keep])
        if full is None:
            # first and last alone never cross where the full series did not
            assert compact is None
            continue
        assert compact is not None, (th.metric, values, keep)
        assert keep[compact.index] == full.index and compact.rise == full.rise
        checked += 1
    assert checked > 500


def test_crossing_kinds():
    inc = Threshold(metric="c", kind="increase", value=5)
    assert first_crossing(inc, [10, 12, 1, 4]).index == 3                    # 2 + 1 (reset) + 3 = 6
    assert first_crossing(inc, [10, 12, 1, 4]).rise == 6
    changed = Threshold(metric="x", kind="changed", value=0)
    assert first_crossing(changed, [31, 31]) is None                          # an old Xid stays put
    assert first_crossing(changed, [31, 0, 79]).index == 2
    assert first_crossing(changed, [0, 0]) is None
    assert first_crossing(changed, [79], born_late=True).index == 0
    above = Threshold(metric="g", kind="above", value=90)
    assert first_crossing(above, [80, float("nan"), 90]).index == 2


def test_rule_examples_feed_metrics_samples():
    results = run_rule_tests(load_catalog(), only="early.telemetry")
    assert len(results) >= 6 and all(r.passed >= 2 and not r.failures for r in results)
