"""Telemetry connector: DCGM series from a Prometheus-compatible API -> metric samples and threshold events.

Run it for one workload (its ``workload.json``, or a bundle directory holding one)::

    python -m firstfault.connectors.telemetry --prometheus http://prometheus:9090 samples/worked-example

It asks ``/api/v1/query_range`` (POST, so a 512-node selector fits) for each metric
of the threshold table over the workload's nodes and time window (from
``pre_s`` before the start to ``post_s`` after the end), and writes the bundle's
``metrics/dcgm.jsonl`` lines (``{"ts", "host", "gpu", "name", "value"}``, contract
section 1): for every series its first and last sample in the window and, when it
crossed its threshold, the first sample that did (for a counter also the samples on
both sides of each reset before it, so the engine, which reads the file with the same
:mod:`firstfault.rules.telemetry` crossing logic, finds the same crossing in it and
turns it into a ``dcgm_threshold`` event). Every host with data thus shows
in the bundle (so the engine does not report a metrics gap for it), and the
change is there to read. Threshold events (metric, host, gpu, first crossing,
value) are printed as JSON.

Threshold kinds:

* ``increase``: a counter rose by more than ``value`` since the window began
  (resets are summed across, like PromQL ``increase``);
* ``above``: a gauge reached ``value`` (temperatures, the row-remap-failure flag);
* ``changed``: a "last value" gauge (``DCGM_FI_DEV_XID_ERRORS`` holds the last Xid)
  took a non-zero value other than its first one in the window (or the series was born
  inside the window with a non-zero value); the value is then the Xid.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from firstfault.schemas import WorkloadRecord

from firstfault.rules.telemetry import (  # noqa: F401  (re-exported: the connector's public names)
    DEFAULT_THRESHOLDS_YAML, THRESHOLDS_ADAPTER, Threshold, first_crossing, kept_indices, load_thresholds,
)

MAX_POINTS = 11_000          # Prometheus refuses more points per series in one range query


class MetricSample(BaseModel):
    """One line of a bundle's ``metrics/*.jsonl``."""

    model_config = ConfigDict(extra="forbid")

    ts: str
    host: str
    gpu: int | None
    name: str
    value: float


class ThresholdEvent(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    host: str
    gpu: int | None
    first_crossing: str
    value: float = Field(description="the sample's value at the crossing (the Xid for DCGM_FI_DEV_XID_ERRORS)")
    delta: float | None = Field(default=None, description="for increase: the rise by then")
    threshold: float
    kind: str
    why: str = ""


class TelemetryResult(BaseModel):
    samples: list[MetricSample]
    events: list[ThresholdEvent]
    series: int = Field(description="series read")
    hosts_with_data: list[str]


class PrometheusError(RuntimeError):
    pass


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat().replace("+00:00", "Z")


def _float(v: str) -> float:
    return float(v)                      # Prometheus sends "NaN", "+Inf" as strings; float() reads them


class PrometheusClient:
    """``/api/v1/query_range`` over HTTP, response envelope checked."""

    def __init__(self, base_url: str, timeout_s: float = 30.0, headers: dict[str, str] | None = None) -> None:
        self.base = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.headers = headers or {}

    def query_range(self, query: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        body = urllib.parse.urlencode({"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                       "step": f"{step:g}"}).encode()
        req = urllib.request.Request(self.base + "/api/v1/query_range", data=body, method="POST",
                                     headers={"Content-Type": "application/x-www-form-urlencoded", **self.headers})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                doc = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            # Prometheus answers 400/422/503 with the same JSON envelope, saying why.
            try:
                doc = json.loads(exc.read())
            except ValueError:
                raise PrometheusError(f"HTTP {exc.code} from {self.base}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise PrometheusError(f"{self.base}: {exc}") from None
        if doc.get("status") != "success":
            raise PrometheusError(f"{doc.get('errorType', 'error')}: {doc.get('error', doc)}")
        data = doc.get("data") or {}
        if data.get("resultType") != "matrix":
            raise PrometheusError(f"expected a matrix, got {data.get('resultType')!r}")
        return data.get("result") or []


def host_selector(metric: str, host_label: str, hosts: Sequence[str]) -> str:
    alternatives = "|".join(re.escape(h) for h in hosts)
    return f'{metric}{{{host_label}=~"{alternatives}"}}'


def step_for(start: float, end: float, scrape_s: float) -> float:
    return float(max(scrape_s, math.ceil((end - start) / (MAX_POINTS - 1))))


def crossing(th: Threshold, values: list[tuple[float, float]], window_start: float,
             step: float) -> tuple[tuple[float, float], float | None] | None:
    """The first (ts, value) past the threshold, and the counter rise by then; None if none.

    The crossing itself is :func:`firstfault.rules.telemetry.first_crossing` (the engine reads
    bundle metrics with the same function); a "last value" series born inside the window
    (more than two steps after its start) was born by its first value.
    """
    pts, hit = _first(th, values, window_start, step)
    return None if hit is None else (pts[hit.index], hit.rise)


def _first(th: Threshold, values: list[tuple[float, float]], window_start: float, step: float):
    """(the samples that are numbers, their first crossing or None)."""
    pts = [(t, v) for t, v in values if not math.isnan(v)]
    if not pts:
        return pts, None
    return pts, first_crossing(th, [v for _, v in pts], born_late=pts[0][0] > window_start + 2 * step)


def collect(client: PrometheusClient, workload: WorkloadRecord, thresholds: Sequence[Threshold],
            host_label: str = "Hostname", gpu_label: str = "gpu", pre_s: float = 300.0, post_s: float = 60.0,
            scrape_s: float = 15.0, now: datetime | None = None, batch: int = 200) -> TelemetryResult:
    """Query every threshold metric for the workload's nodes and window; pure apart from the HTTP calls."""
    if not workload.nodes:
        raise ValueError("the workload names no nodes")
    end_dt = workload.end_time or now or datetime.now(timezone.utc)
    start = (workload.start_time - timedelta(seconds=pre_s)).timestamp()
    end = (end_dt + timedelta(seconds=post_s)).timestamp()
    step = step_for(start, end, scrape_s)
    wanted = set(workload.nodes)
    samples: dict[tuple[str, str, int | None, float], MetricSample] = {}
    events: list[ThresholdEvent] = []
    series = 0
    for th in thresholds:
        for i in range(0, len(workload.nodes), batch):
            hosts = workload.nodes[i:i + batch]
            for s in client.query_range(host_selector(th.metric, host_label, hosts), start, end, step):
                labels = s.get("metric") or {}
                host = labels.get(host_label)
                if host not in wanted:
                    continue
                gpu_raw = labels.get(gpu_label)
                gpu = int(gpu_raw) if isinstance(gpu_raw, str) and gpu_raw.isdigit() else None
                values = [(float(t), _float(v)) for t, v in s.get("values") or []]
                if not values:
                    continue
                series += 1
                pts, found = _first(th, values, start, step)
                # first and last sample, the crossing and, for a counter, the resets before it:
                # the engine finds the same crossing in this compact file (rules/telemetry.py)
                keep = [values[0], values[-1]] + [pts[i] for i in kept_indices(th, [v for _, v in pts], found)]
                if found is not None:
                    (t, v), rise = pts[found.index], found.rise
                    events.append(ThresholdEvent(name=th.metric, host=host, gpu=gpu, first_crossing=_iso(t), value=v,
                                                 delta=rise, threshold=th.value, kind=th.kind, why=th.why))
                for t, v in keep:
                    if math.isfinite(v):
                        samples[(th.metric, host, gpu, t)] = MetricSample(ts=_iso(t), host=host, gpu=gpu,
                                                                          name=th.metric, value=v)
    ordered = sorted(samples.values(), key=lambda m: (m.ts, m.host, m.gpu if m.gpu is not None else -1, m.name))
    events.sort(key=lambda e: (e.first_crossing, e.host, e.gpu if e.gpu is not None else -1, e.name))
    return TelemetryResult(samples=ordered, events=events, series=series,
                           hosts_with_data=sorted({m.host for m in ordered}))


def write_jsonl(samples: Sequence[MetricSample], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for m in samples:
            fh.write(json.dumps(m.model_dump(), sort_keys=True) + "\n")
    return path


def _load_workload(path: Path) -> tuple[WorkloadRecord, Path | None]:
    if path.is_dir():
        return WorkloadRecord.model_validate_json((path / "workload.json").read_text()), path
    return WorkloadRecord.model_validate_json(path.read_text()), None


def main(argv: Sequence[str] | None = None) -> int:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m firstfault.connectors.telemetry", description=__doc__.split("\n")[0])
    p.add_argument("workload", help="a workload.json, or a bundle directory (metrics/dcgm.jsonl is written into it)")
    p.add_argument("--prometheus", default=env("FIRSTFAULT_PROMETHEUS_URL"), help="base URL (FIRSTFAULT_PROMETHEUS_URL)")
    p.add_argument("--host-label", default=env("FIRSTFAULT_TELEMETRY_HOST_LABEL", "Hostname"),
                   help="label naming the node (dcgm-exporter: Hostname)")
    p.add_argument("--thresholds", default=env("FIRSTFAULT_TELEMETRY_THRESHOLDS"), help="YAML list overriding the table")
    p.add_argument("--out", help="write the samples here (default: <bundle>/metrics/dcgm.jsonl, or stdout)")
    p.add_argument("--scrape-interval", type=float, default=15.0)
    args = p.parse_args(argv)
    if not args.prometheus:
        print("firstfault telemetry: set --prometheus or FIRSTFAULT_PROMETHEUS_URL", file=sys.stderr)
        return 2
    try:
        workload, bundle = _load_workload(Path(args.workload))
        thresholds = load_thresholds(args.thresholds)
        token = env("FIRSTFAULT_PROMETHEUS_TOKEN")
        client = PrometheusClient(args.prometheus, headers={"Authorization": f"Bearer {token}"} if token else None)
        result = collect(client, workload, thresholds, host_label=args.host_label, scrape_s=args.scrape_interval)
    except (OSError, ValueError, PrometheusError) as exc:
        print(f"firstfault telemetry: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else (bundle / "metrics" / "dcgm.jsonl" if bundle else None)
    report = json.dumps({"series": result.series, "hosts_with_data": result.hosts_with_data,
                         "events": [e.model_dump() for e in result.events]}, indent=2)
    if out is not None:
        write_jsonl(result.samples, out)
        sys.stdout.write(report + "\n")
    else:                                # samples on stdout, the report beside them on stderr
        for m in result.samples:
            sys.stdout.write(json.dumps(m.model_dump(), sort_keys=True) + "\n")
        sys.stderr.write(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
