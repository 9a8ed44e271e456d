"""Telemetry thresholds: the pure part shared by the telemetry connector and the engine.

A bundle's ``metrics/*.jsonl`` holds samples ``{"ts", "host", "gpu", "name", "value"}``
(contract section 1). A series is the time-ordered samples of one (host, gpu, name);
its *crossing* is the first sample past the metric's threshold:

* ``increase``: the first sample where the sum of increases since the series' first
  sample (a counter reset summed across, like PromQL ``increase``) exceeds ``value``;
* ``above``: the first sample ``>= value`` (temperatures, the row-remap-failure flag);
* ``changed``: the first sample, later than the first one, whose value is non-zero and
  differs from the first sample's (``DCGM_FI_DEV_XID_ERRORS`` holds the last Xid, so the
  value is then the Xid). ``born_late``: the series began inside the window, so a
  non-zero first value is itself new.

The telemetry connector keeps, per series, the first and last sample, the crossing and
(for ``increase``) the samples on both sides of each counter reset before it
(:func:`kept_indices`): the crossing computed over that compact file is the crossing of
the full series.

Threshold events in the engine: :func:`read_metrics` turns the samples of a bundle into
one ``dcgm_threshold`` event per crossing; the EARLY catalog (``early/telemetry.yaml``)
gives them meaning.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from .model import Ev
from .stamps import parse_iso

# DCGM field names as dcgm-exporter exports them (NVIDIA/dcgm-exporter etc/default-counters.csv
# and etc/dcp-metrics-included.csv; signatures.md section 3.17).
DEFAULT_THRESHOLDS: tuple[dict[str, Any], ...] = (
    {"metric": "DCGM_FI_DEV_XID_ERRORS", "kind": "changed", "value": 0, "why": "a new Xid on this GPU"},
    {"metric": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "kind": "increase", "value": 0, "why": "uncorrectable (double-bit) ECC error"},
    {"metric": "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "kind": "increase", "value": 0, "why": "row remapped for an uncorrectable error"},
    {"metric": "DCGM_FI_DEV_ROW_REMAP_FAILURE", "kind": "above", "value": 1, "why": "row remapping failed: the GPU needs service"},
    {"metric": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "kind": "increase", "value": 100, "why": "NVLink flit CRC errors"},
    {"metric": "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "kind": "increase", "value": 100, "why": "NVLink data CRC errors"},
    {"metric": "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "kind": "increase", "value": 100, "why": "NVLink replays"},
    {"metric": "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "kind": "increase", "value": 0, "why": "NVLink link recovery"},
    {"metric": "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "kind": "increase", "value": 100, "why": "PCIe replays"},
    {"metric": "DCGM_FI_DEV_GPU_TEMP", "kind": "above", "value": 90, "why": "GPU temperature (C)"},
    {"metric": "DCGM_FI_DEV_MEMORY_TEMP", "kind": "above", "value": 95, "why": "HBM temperature (C)"},
)
# The same table as a thresholds file reads (JSON objects are YAML flow mappings).
DEFAULT_THRESHOLDS_YAML = "".join(f"- {json.dumps(row)}\n" for row in DEFAULT_THRESHOLDS)

XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"
EVENT_KIND = "dcgm_threshold"
EVENT_PATTERN = "telemetry.threshold"
# A DCGM sample reports a value the exporter read up to one collection interval (30 s by
# default) before Prometheus scraped it (15 s), and a range query's point may be a step
# older still: the change it shows happened up to about a minute before its stamp.
SAMPLE_LAG_S = 60.0


class Threshold(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)     # built when a table is read, not at import

    metric: str = Field(pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
    kind: Literal["increase", "above", "changed"]
    value: float
    why: str = ""


THRESHOLDS_ADAPTER = TypeAdapter(list[Threshold], config=ConfigDict(defer_build=True))


def load_thresholds(path: str | Path | None = None) -> list[Threshold]:
    if path is None:            # the built-in table: no YAML to parse at start-up
        return THRESHOLDS_ADAPTER.validate_python(list(DEFAULT_THRESHOLDS))
    import yaml

    return THRESHOLDS_ADAPTER.validate_python(yaml.safe_load(Path(path).read_text()))


@lru_cache(maxsize=1)
def default_thresholds() -> dict[str, Threshold]:
    """metric name -> its threshold, from the default table (parsed once)."""
    return {t.metric: t for t in load_thresholds()}


# ---------------------------------------------------------------- crossing

@dataclass(frozen=True)
class Crossing:
    index: int                    # into the points given (NaN points included)
    value: float
    rise: float | None = None     # increase: the counter rise by then


def first_crossing(th: Threshold, values: Sequence[float], born_late: bool = False) -> Crossing | None:
    """The first point of a time-ordered series past ``th``; NaN points are skipped."""
    idx = [i for i, v in enumerate(values) if not math.isnan(v)]
    if not idx:
        return None
    if th.kind == "above":
        hit = next((i for i in idx if values[i] >= th.value), None)
        return None if hit is None else Crossing(hit, values[hit])
    if th.kind == "increase":
        rise, prev = 0.0, values[idx[0]]
        for i in idx[1:]:
            v = values[i]
            rise += v - prev if v >= prev else v      # a reset: the counter restarted from 0
            prev = v
            if rise > th.value:
                return Crossing(i, v, rise)
        return None
    base = values[idx[0]]
    if born_late and base != 0:
        return Crossing(idx[0], base)
    for i in idx[1:]:
        v = values[i]
        if v != base and v != 0:
            return Crossing(i, v)
    return None


def kept_indices(th: Threshold, values: Sequence[float], hit: Crossing | None) -> list[int]:
    """The points a compact series must keep so its crossing is the full series' crossing:
    first and last, the crossing, and for a counter each reset (with the point before it) up to
    the crossing, so the summed increase is the same."""
    idx = [i for i, v in enumerate(values) if not math.isnan(v)]
    if not idx:
        return []
    keep = {idx[0], idx[-1]}
    if hit is not None:
        keep.add(hit.index)
        if th.kind == "increase":
            for a, b in zip(idx, idx[1:]):
                if b > hit.index:
                    break
                if values[b] < values[a]:
                    keep.update((a, b))
    return sorted(keep)


# ---------------------------------------------------------------- bundle metrics -> events

# One sample as kept while reading: (ts, value, path, line). Only metrics of the threshold
# table are kept, and not their text: the few crossing lines are read again at the end.
Point = tuple[datetime, float, str, int]
MAX_BAD = 1000          # unreadable lines remembered per read (all are counted)


@dataclass
class MetricsRead:
    """What the metrics files held: samples by series, hosts named, lines not readable."""

    thresholds: dict[str, Threshold] = field(default_factory=lambda: default_thresholds())
    series: dict[tuple[str, int | None, str], list[Point]] = field(default_factory=lambda: defaultdict(list))
    hosts: set[str] = field(default_factory=set)
    lines: int = 0
    unparsed: dict[str, int] = field(default_factory=lambda: defaultdict(int))    # path -> lines
    bad: list[tuple[str, int, str, str]] = field(default_factory=list)   # path, line, text, reason


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def parse_sample(raw: bytes, zone: tzinfo) -> tuple[dict[str, Any] | None, str | None, str | None]:
    """One JSONL line -> (sample fields, host named if any, reason it is not a sample)."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):     # RecursionError: nested 100k deep
        return None, None, "not JSON"
    if not isinstance(doc, dict):
        return None, None, "not a JSON object"
    host = doc.get("host") if isinstance(doc.get("host"), str) else None
    ts = parse_iso(doc["ts"], zone) if isinstance(doc.get("ts"), str) else None
    gpu = doc.get("gpu")
    if ts is None:
        return None, host, "no ISO-8601 ts"
    if not host:
        return None, host, "no host"
    if not isinstance(doc.get("name"), str) or not doc["name"]:
        return None, host, "no name"
    if gpu is not None and not (isinstance(gpu, int) and not isinstance(gpu, bool)):
        return None, host, "gpu is not an integer or null"
    if not _number(doc.get("value")) or not math.isfinite(doc["value"]):
        return None, host, "value is not a finite number"
    return {"ts": ts, "host": host, "gpu": gpu, "name": doc["name"], "value": float(doc["value"])}, host, None


def _lines(chunks: Iterable[bytes], progress=None) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line) of a file given as byte chunks of any split."""
    rest = b""
    n = 0
    for chunk in chunks:
        if progress is not None:
            progress(len(chunk))
        data = rest + chunk
        *lines, rest = data.split(b"\n")
        for raw in lines:
            n += 1
            yield n, raw
    if rest:
        yield n + 1, rest


def _text(raw: bytes) -> str:
    return raw[:2000].decode("utf-8", errors="replace").rstrip("\r")


def read_metrics_file(path: str, chunks: Iterable[bytes], zone: tzinfo, out: MetricsRead,
                      lo: datetime | None = None, hi: datetime | None = None,
                      progress=None) -> None:
    """Add one metrics file's samples (those within [lo, hi]) to ``out``."""
    for n, raw in _lines(chunks, progress):
        add_line(out, path, n, raw, zone, lo, hi)


def add_line(out: MetricsRead, path: str, n: int, raw: bytes, zone: tzinfo,
             lo: datetime | None = None, hi: datetime | None = None) -> tuple[str, int | None, str] | None:
    """Add line ``n`` of a metrics file to ``out``; the series it joined when it is a sample of
    the threshold table inside [lo, hi] (the stream keeps such lines' text: one may become a
    crossing), else None."""
    if not raw.strip():
        return None
    out.lines += 1
    fields, host, reason = parse_sample(raw, zone)
    if host:
        out.hosts.add(host)
    if fields is None:
        out.unparsed[path] += 1
        if len(out.bad) < MAX_BAD:
            out.bad.append((path, n, _text(raw), reason or "invalid sample"))
        return None
    if fields["name"] not in out.thresholds:
        return None
    if (lo is not None and fields["ts"] < lo) or (hi is not None and fields["ts"] > hi):
        return None
    key = (fields["host"], fields["gpu"], fields["name"])
    out.series[key].append((fields["ts"], fields["value"], path, n))
    return key


@dataclass(frozen=True)
class Found:
    """A series' crossing, before its line's text is known."""

    host: str
    gpu: int | None
    th: Threshold
    point: Point
    first: Point
    rise: float | None


def crossings(read: MetricsRead, born_after: datetime | None = None) -> list[Found]:
    """The crossing of every series (sorted by series). ``born_after``: a series whose first
    sample is later than this instant began inside the window (a DCGM Xid series labelled
    with the new Xid is born at the error), so its non-zero first value is new."""
    out = []
    for (host, gpu, name), points in sorted(read.series.items(),
                                            key=lambda kv: (kv[0][0], kv[0][1] is None, kv[0][1] or 0, kv[0][2])):
        th = read.thresholds[name]
        points = sorted(points)
        born_late = born_after is not None and points[0][0] > born_after
        hit = first_crossing(th, [p[1] for p in points], born_late=born_late)
        if hit is not None:
            out.append(Found(host, gpu, th, points[hit.index], points[0], hit.rise))
    return out


def wanted_lines(found: Iterable[Found]) -> dict[str, set[int]]:
    """path -> the line numbers whose text the events need."""
    want: dict[str, set[int]] = defaultdict(set)
    for f in found:
        want[f.point[2]].add(f.point[3])
    return want


def line_texts(chunks: Iterable[bytes], lines: set[int]) -> dict[int, str]:
    """The text of these lines of one file (read again; stops after the last one)."""
    out: dict[int, str] = {}
    last = max(lines, default=0)
    for n, raw in _lines(chunks):
        if n in lines:
            out[n] = _text(raw)
        if n >= last:
            break
    return out


def crossing_events(found: Iterable[Found], texts: dict[tuple[str, int], str], node_of=lambda h: h) -> list[Ev]:
    """One ``dcgm_threshold`` event per crossing, sorted; ``node_of`` maps a sample's host name
    to the workload's node name."""
    out: list[Ev] = []
    for f in found:
        ts, value, path, line = f.point
        name = f.th.metric
        fields: dict[str, Any] = {"metric": name, "value": _num(value), "threshold": _num(f.th.value),
                                  "rule": f.th.kind, "why": f.th.why}
        if f.rise is not None:
            fields["delta"] = _num(f.rise)
        if f.th.kind == "changed":
            fields["previous"] = _num(f.first[1])
        if name == XID_METRIC:
            fields["xid"] = _num(value)
        node = node_of(f.host) or f.host
        out.append(Ev(kind=EVENT_KIND, pattern=EVENT_PATTERN, source="metrics", path=path, line=line,
                      text=texts.get((path, line), ""), host=node, gpu_index=f.gpu, stamp=ts, last_stamp=ts,
                      onset=ts - timedelta(seconds=SAMPLE_LAG_S), quality="exact", fields=fields,
                      signature="\x1f".join((EVENT_KIND, EVENT_PATTERN, "metrics", node, repr(f.gpu), name))))
    out.sort(key=lambda e: (e.order_key(), e.signature))
    return out


def unparsed_events(read: MetricsRead) -> list[Ev]:
    """Unreadable metrics lines, one aggregated ``unparsed`` event per file (like log lines)."""
    by_file: dict[str, Ev] = {}
    for path, n, text, reason in sorted(read.bad):
        ev = Ev(kind="unparsed", pattern="unparsed", source="metrics", path=path, line=n, text=text,
                fields={"reason": f"metrics line: {reason}"}, signature="\x1f".join(("unparsed", path)))
        have = by_file.get(path)
        if have is None:
            by_file[path] = ev
        else:
            have.merge(ev)
    for path, ev in by_file.items():
        ev.count = read.unparsed.get(path, ev.count)
    return [by_file[p] for p in sorted(by_file)]


def _num(v: float) -> int | float:
    return int(v) if float(v).is_integer() else v
