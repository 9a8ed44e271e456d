"""Telemetry connector against a local HTTP server answering like Prometheus's query API.

The server evaluates the range query the way Prometheus does for a plain selector: at
start, start+step, ... end, each point the newest raw sample at or before that instant
and within the 5-minute lookback; values as strings; the real success and error
envelopes. Series carry dcgm-exporter's labels (gpu, UUID, pci_bus_id, device,
modelName, Hostname, DCGM_FI_DRIVER_VERSION) plus the instance and job Prometheus adds.
"""
from __future__ import annotations

import json
import re
import shutil
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from firstfault.connectors import telemetry
from firstfault.connectors.telemetry import (
    PrometheusClient, PrometheusError, Threshold, collect, crossing, load_thresholds, step_for,
)
from firstfault.rules.engine import analyze_path
from firstfault.schemas import WorkloadRecord

ROOT = Path(__file__).resolve().parents[1]
WORKED = ROOT / "samples" / "worked-example"
START = datetime(2026, 11, 2, 9, 58, tzinfo=timezone.utc).timestamp()
END = datetime(2026, 11, 2, 10, 13, 19, tzinfo=timezone.utc).timestamp()
LOOKBACK = 300.0


def labels(name: str, host: str, gpu: int, **extra: str) -> dict[str, str]:
    n = int(host[-2:])
    return {"__name__": name, "gpu": str(gpu), "UUID": f"GPU-{n:02d}{gpu:02d}a1b2-c3d4-e5f6-0718-293a4b5c6d7e",
            "pci_bus_id": f"00000000:{0x18 + 0x10 * gpu:02X}:00.0", "device": f"nvidia{gpu}",
            "modelName": "NVIDIA H100 80GB HBM3", "Hostname": host, "DCGM_FI_DRIVER_VERSION": "570.124.06",
            "instance": f"10.1.0.{n}:9400", "job": "dcgm-exporter", **extra}


def dataset() -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
    """Raw samples every 15 s from 20 min before the job to 10 min after it."""
    t0, t1 = START - 1200, END + 600
    times = [t0 + 15 * i for i in range(int((t1 - t0) / 15) + 1)]
    out = []
    for host in ("node-01", "node-02", "node-03", "node-04"):
        for gpu in range(8):
            temp = [(t, 62.0 + (gpu % 3)) for t in times]
            if host == "node-03" and gpu == 1:            # heats up past 90 C at 10:05
                temp = [(t, 62.0 if t < START + 420 else 91.0) for t in times]
            out.append((labels("DCGM_FI_DEV_GPU_TEMP", host, gpu), temp))
            dbe = [(t, 0.0) for t in times]
            if host == "node-02" and gpu == 3:            # two uncorrectable errors at 10:03:00
                dbe = [(t, 0.0 if t < START + 300 else 2.0) for t in times]
            out.append((labels("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", host, gpu), dbe))
            flit = [(t, 10.0 + (t - t0) / 60) for t in times]   # slow CRC growth: under the threshold
            if host == "node-04" and gpu == 0:            # counter reset (driver reload) then a burst
                flit = [(t, 5000.0 if t < START else (t - START) * 2) for t in times]
            out.append((labels("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", host, gpu), flit))
            # dcgm-exporter: a clean GPU reports Xid 0 ("No Error") ...
            xid = [(t, 0.0) for t in times]
            if host == "node-01" and gpu == 5:            # ... an old Xid 31 from before the job stays put
                xid = [(t, 31.0) for t in times]
            out.append((labels("DCGM_FI_DEV_XID_ERRORS", host, gpu, err_code="0", err_msg="No Error"), xid))
    # ... and a GPU with an Xid gets a series labelled with it, born at the error (10:03:11)
    born = START + 311
    out.append((labels("DCGM_FI_DEV_XID_ERRORS", "node-02", 3, err_code="149", err_msg="NVLink: link down"),
                [(t, 149.0) for t in [born + 15 * i for i in range(80)]]))
    # a host outside the job must not be asked for (and is ignored if returned)
    out.append((labels("DCGM_FI_DEV_GPU_TEMP", "node-99", 0), [(t, 99.0) for t in times]))
    return out


SELECTOR = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<label>[a-zA-Z_]+)=~"(?P<re>(?:[^"\\]|\\.)*)"\}$')


class PromLike(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, data, fail: bool = False):
        super().__init__(("127.0.0.1", 0), Handler)
        self.data, self.fail, self.queries = data, fail, []


class Handler(BaseHTTPRequestHandler):
    server: PromLike

    def _params(self) -> dict[str, str]:
        url = urlparse(self.path)
        q = parse_qs(url.query)
        if self.command == "POST":
            q.update(parse_qs(self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()))
        return {k: v[0] for k, v in q.items()}

    def _send(self, code: int, doc: dict) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, code: int, etype: str, msg: str) -> None:
        self._send(code, {"status": "error", "errorType": etype, "error": msg})

    def do_GET(self):                               # noqa: N802
        self._answer()

    def do_POST(self):                              # noqa: N802
        self._answer()

    def _answer(self) -> None:
        if urlparse(self.path).path != "/api/v1/query_range":
            self._send(404, {"status": "error", "errorType": "not_found", "error": "not found"})
            return
        p = self._params()
        self.server.queries.append(p)
        if self.server.fail:
            self._error(503, "timeout", "query timed out in expression evaluation")
            return
        m = SELECTOR.match(p.get("query", ""))
        if not m:
            self._error(400, "bad_data", f'invalid parameter "query": 1:1: parse error: {p.get("query")!r}')
            return
        start, end, step = float(p["start"]), float(p["end"]), float(p["step"])
        if (end - start) / step > 11000:
            self._error(400, "bad_data", "exceeded maximum resolution of 11,000 points per timeseries. "
                                         "Try decreasing the query resolution (?step=XX)")
            return
        wanted = re.compile(m["re"])
        result = []
        for lbl, samples in self.server.data:
            if lbl["__name__"] != m["name"] or not wanted.fullmatch(lbl.get(m["label"], "")):
                continue
            values, t, i = [], start, 0
            while t <= end + 1e-9:
                while i + 1 < len(samples) and samples[i + 1][0] <= t:
                    i += 1
                ts, v = samples[i]
                if ts <= t and t - ts <= LOOKBACK:
                    values.append([round(t, 3), f"{v:g}"])
                t += step
            if values:
                result.append({"metric": lbl, "values": values})
        self._send(200, {"status": "success", "data": {"resultType": "matrix", "result": result}})

    def log_message(self, *args):
        pass


@pytest.fixture
def prom():
    servers = []

    def start(fail: bool = False) -> PromLike:
        s = PromLike(dataset(), fail)
        threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.shutdown()


def url(s: PromLike) -> str:
    return f"http://127.0.0.1:{s.server_address[1]}"


def workload() -> WorkloadRecord:
    return WorkloadRecord.model_validate_json((WORKED / "workload.json").read_text())


def test_threshold_crossings_become_events(prom):
    s = prom()
    res = collect(PrometheusClient(url(s)), workload(), load_thresholds())
    got = [(e.name, e.host, e.gpu, e.first_crossing, e.value) for e in res.events]
    assert got == [
        # reset to 0 at 09:58:00, then +30 per 15 s: the rise passes 100 at 09:59:00
        ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "node-04", 0, "2026-11-02T09:59:00Z", 120.0),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "node-02", 3, "2026-11-02T10:03:00Z", 2.0),
        # the Xid series is born at 10:03:11; the first evaluation after it is 10:03:15
        ("DCGM_FI_DEV_XID_ERRORS", "node-02", 3, "2026-11-02T10:03:15Z", 149.0),
        ("DCGM_FI_DEV_GPU_TEMP", "node-03", 1, "2026-11-02T10:05:00Z", 91.0),
    ]
    flit = res.events[0]
    assert flit.delta == 120.0 and flit.kind == "increase"   # counted across the reset, not 120 - 5000
    # not: the pre-existing Xid 31 on node-01 GPU 5, the slow CRC growth, node-99
    assert res.hosts_with_data == ["node-01", "node-02", "node-03", "node-04"]
    assert res.series == 4 * 8 * 4 + 1
    # one POST per metric, the selector names exactly the job's nodes, the window and step as asked
    q = s.queries[0]
    assert q["query"] == 'DCGM_FI_DEV_XID_ERRORS{Hostname=~"node\\-01|node\\-02|node\\-03|node\\-04"}'
    assert float(q["start"]) == START - 300 and float(q["end"]) == END + 60 and q["step"] == "15"


def test_samples_are_bundle_metrics_lines(prom, tmp_path):
    s = prom()
    res = collect(PrometheusClient(url(s)), workload(), load_thresholds())
    line = json.loads(json.dumps(res.samples[0].model_dump()))
    assert set(line) == {"ts", "host", "gpu", "name", "value"}
    crossing_line = {"ts": "2026-11-02T10:05:00Z", "host": "node-03", "gpu": 1, "name": "DCGM_FI_DEV_GPU_TEMP",
                     "value": 91.0}
    assert crossing_line in [m.model_dump() for m in res.samples]
    # written into a bundle, the engine sees metrics for every job host: no "metrics gap"
    bundle = tmp_path / "bundle"
    shutil.copytree(WORKED, bundle)
    assert telemetry.main([str(bundle), "--prometheus", url(s)]) == 0
    assert (bundle / "metrics" / "dcgm.jsonl").read_text().count("\n") == len(res.samples)
    d = analyze_path(bundle).diagnosis
    assert not [m for m in d.missing_evidence if m.kind == "metrics"]
    assert d.sub_domain == analyze_path(WORKED).diagnosis.sub_domain


def test_prometheus_errors_are_reported(prom):
    s = prom(fail=True)
    with pytest.raises(PrometheusError, match="timeout: query timed out"):
        collect(PrometheusClient(url(s)), workload(), load_thresholds())
    ok = prom()
    with pytest.raises(PrometheusError, match="bad_data: invalid parameter"):
        PrometheusClient(url(ok)).query_range("rate(x[5m]", START, END, 15)
    with pytest.raises(PrometheusError, match="127.0.0.1:9"):
        PrometheusClient("http://127.0.0.1:9", timeout_s=2).query_range("up", START, END, 15)


def test_step_keeps_long_windows_under_the_point_limit(prom):
    s = prom()
    assert step_for(0, 3600, 15) == 15
    assert step_for(0, 7 * 86400, 15) == 55                # 604800 / 10999, rounded up
    wl = workload().model_copy(update={"start_time": datetime(2026, 10, 20, tzinfo=timezone.utc)})
    collect(PrometheusClient(url(s)), wl, load_thresholds()[:1])   # the server refuses > 11,000 points


def test_crossing_kinds():
    inc = Threshold(metric="c", kind="increase", value=5)
    assert crossing(inc, [(0, 10), (15, 12), (30, 1), (45, 4)], 0, 15) == ((45, 4), 6)     # 2 + 1 (reset) + 3
    above = Threshold(metric="g", kind="above", value=90)
    assert crossing(above, [(0, 80), (15, float("nan")), (30, 90)], 0, 15) == ((30, 90), None)
    changed = Threshold(metric="x", kind="changed", value=0)
    assert crossing(changed, [(0, 31), (15, 31)], 0, 15) is None                          # old Xid
    assert crossing(changed, [(0, 31), (15, 79)], 0, 15) == ((15, 79), None)              # a new one
    assert crossing(changed, [(0, 79), (15, 79)], 0, 15) is None                           # there already
    assert crossing(changed, [(600, 79)], 0, 15) == ((600, 79), None)                      # series born late


def test_threshold_table_is_validated(tmp_path):
    bad = tmp_path / "t.yaml"
    bad.write_text("- {metric: DCGM_FI_DEV_GPU_TEMP, kind: over, value: 90}\n")
    with pytest.raises(ValueError):
        load_thresholds(bad)
    names = {t.metric for t in load_thresholds()}
    assert {"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_GPU_TEMP",
            "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"} <= names
