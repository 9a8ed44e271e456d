"""The extractor's reading of metrics samples (``metrics/*.jsonl`` lines on the raw topic).

A threshold crossing needs a series, not a line, so samples are kept per workload
attempt (only those of the threshold table, and their text: one may become the
crossing) and the crossings of the series a batch fed are computed with the offline
code (rules/telemetry.py). Each series' crossing is sent once: samples arrive in file order
(one key, one partition), so the first crossing found is the file's first crossing.
Unreadable lines go out as ``unparsed`` events counting only the new ones; the
correlator's order-free merge adds them up to the offline count.

Kept in memory only: a restarted extractor reads the metrics of attempts it had
begun again from its committed offset. At most ``MAX_ATTEMPTS`` attempts are kept
(least recently fed dropped first).
"""
from __future__ import annotations

from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

from firstfault.rules.diagnose import EVIDENCE_HORIZON_S
from firstfault.rules.extract import HostResolver
from firstfault.rules.model import Ev
from firstfault.rules.telemetry import MetricsRead, add_line, crossing_events, crossings, unparsed_events
from firstfault.schemas import RawLine, WorkloadRecord

MAX_ATTEMPTS = 1024

Key = tuple[str, int]


@dataclass
class _Attempt:
    read: MetricsRead = field(default_factory=MetricsRead)
    texts: dict[tuple[str, int], str] = field(default_factory=dict)
    sent: set[str] = field(default_factory=set)           # crossing signatures already sent
    bad_sent: int = 0                                      # entries of read.bad already sent
    unparsed_sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    hosts_sent: set[str] = field(default_factory=set)
    fed: bool = False
    touched: set[tuple[str, int | None, str]] = field(default_factory=set)   # series fed since the last drain


class MetricsReader:
    def __init__(self) -> None:
        self._attempts: OrderedDict[Key, _Attempt] = OrderedDict()

    def add(self, key: Key, workload: WorkloadRecord, rec: RawLine) -> None:
        """One metrics line of ``key``'s attempt."""
        st = self._attempts.get(key)
        if st is None:
            st = self._attempts[key] = _Attempt()
            while len(self._attempts) > MAX_ATTEMPTS:
                self._attempts.popitem(last=False)
        else:
            self._attempts.move_to_end(key)
        span = timedelta(seconds=EVIDENCE_HORIZON_S)
        lo = workload.start_time - span
        hi = workload.end_time + span if workload.end_time else None
        series = add_line(st.read, rec.path, rec.line, rec.text.encode("utf-8", "surrogateescape"),
                          workload.zone, lo, hi)
        if series is not None:
            st.texts[(rec.path, rec.line)] = rec.text[:2000]
            st.touched.add(series)
        st.fed = True

    def drain(self, workloads: dict[Key, WorkloadRecord]) -> dict[Key, tuple[list[Ev], list[str]]]:
        """Per attempt fed since the last drain: (new events, new metric hosts)."""
        out: dict[Key, tuple[list[Ev], list[str]]] = {}
        for key, st in self._attempts.items():
            if not st.fed or key not in workloads:
                continue
            st.fed = False
            wl = workloads[key]
            fed = MetricsRead(thresholds=st.read.thresholds)
            fed.series.update({k: st.read.series[k] for k in st.touched})
            st.touched.clear()
            found = crossings(fed, born_after=wl.start_time)
            events = [ev for ev in crossing_events(found, st.texts, HostResolver(wl).node)
                      if ev.signature not in st.sent]
            st.sent.update(ev.signature for ev in events)
            fresh = MetricsRead()
            fresh.bad = st.read.bad[st.bad_sent:]
            st.bad_sent = len(st.read.bad)
            for path, n in st.read.unparsed.items():
                if n > st.unparsed_sent[path]:
                    fresh.unparsed[path] = n - st.unparsed_sent[path]
                    st.unparsed_sent[path] = n
            events += [ev for ev in unparsed_events(fresh) if ev.path in fresh.unparsed]
            hosts = sorted(st.read.hosts - st.hosts_sent)
            st.hosts_sent.update(hosts)
            out[key] = (events, hosts)
        return out
