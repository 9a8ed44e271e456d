"""The extractor's reading of metrics samples (``metrics/*.jsonl`` lines on the raw topic).

A threshold crossing needs a series, not a line, so samples are kept per workload
attempt (only those of the threshold table, and their text: one may become the
crossing). For every crossing signature a batch fed, its event is computed with the
offline code (rules/telemetry.py) over all the samples so far, the series of one
signature folded as the engine folds them.

Samples need not come in time order, so a later batch may change an event already
sent: an earlier sample may become the crossing, add to a counter's rise, or give a
``changed`` series an earlier base (its crossing then may move later or go away). The
first event of a signature goes out plain; each change goes out as a *replacement*
marked with the number of samples of the signature it was computed over, or as a
*retraction* when no crossing is left. The samples only grow, so the version over the
most samples is the last one, the crossing over every sample, as offline: the correlator
keeps that one whatever order the batches come in (``workload_state.merge_events``).

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
from firstfault.rules.model import Ev, EventSet
from firstfault.rules.telemetry import MetricsRead, add_line, crossing_events, crossings, unparsed_events
from firstfault.schemas import Event, RawLine, WorkloadRecord

MAX_ATTEMPTS = 1024
# Stream-only fields of a replacement (never in a diagnosis: the correlator takes them off).
VERSION_FIELD = "stream:samples"          # the samples of its signature the version was computed over
RETRACTED_FIELD = "stream:retracted"      # no crossing any more

Key = tuple[str, int]
Series = tuple[str, int | None, str]         # host named by the samples, GPU, metric
Crossing = tuple[str, int | None, str]       # node, GPU, metric: one crossing signature


@dataclass
class _Attempt:
    read: MetricsRead = field(default_factory=MetricsRead)
    texts: dict[tuple[str, int], str] = field(default_factory=dict)
    crossing: dict[Series, Crossing] = field(default_factory=dict)      # series -> the crossing it folds into
    members: dict[Crossing, list[Series]] = field(default_factory=lambda: defaultdict(list))
    sent: dict[Crossing, Ev | None] = field(default_factory=dict)       # the last version sent
    bad_sent: int = 0                                      # entries of read.bad already sent
    unparsed_sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    hosts_sent: set[str] = field(default_factory=set)
    fed: bool = False
    touched: set[Series] = field(default_factory=set)      # series fed since the last drain


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
            events = _crossing_changes(st, workloads[key]) + _new_unparsed(st)
            hosts = sorted(st.read.hosts - st.hosts_sent)
            st.hosts_sent.update(hosts)
            out[key] = (events, hosts)
        return out


def _touched_crossings(st: _Attempt, node_of) -> set[Crossing]:
    out = set()
    for series in st.touched:
        key = st.crossing.get(series)
        if key is None:
            host, gpu, name = series
            key = st.crossing[series] = (node_of(host) or host, gpu, name)     # as crossing_events names it
            st.members[key].append(series)
        out.add(key)
    st.touched.clear()
    return out


def _crossing_changes(st: _Attempt, wl: WorkloadRecord) -> list[Ev]:
    """The crossing events of the signatures fed since the last drain that differ from what was sent."""
    node_of = HostResolver(wl).node
    keys = _touched_crossings(st, node_of)
    fed = MetricsRead(thresholds=st.read.thresholds)
    fed.series.update({s: st.read.series[s] for key in keys for s in st.members[key]})
    folded = EventSet()                 # as the engine adds them: one event per signature
    folded.update(crossing_events(crossings(fed, born_after=wl.start_time), st.texts, node_of))
    now = {(ev.host, ev.gpu_index, ev.fields["metric"]): ev for ev in folded.sorted()}
    out = []
    for key in sorted(keys, key=repr):
        ev = now.get(key)
        if key not in st.sent:
            if ev is not None:
                st.sent[key] = ev.copy()
                out.append(ev)
            continue
        last = st.sent[key]
        if _same(ev, last):
            continue
        st.sent[key] = ev.copy() if ev is not None else None
        samples = sum(len(st.read.series[s]) for s in st.members[key])
        out.append(_replacement(ev, samples) if ev is not None else _retraction(last, samples))
    return out


def _same(a: Ev | None, b: Ev | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and a.canonical() == b.canonical())


def _replacement(ev: Ev, samples: int) -> Ev:
    ev.fields[VERSION_FIELD] = samples
    return ev


def _retraction(last: Ev, samples: int) -> Ev:
    return Ev(kind=last.kind, pattern=last.pattern, source=last.source, path=last.path, line=last.line, text="",
              host=last.host, gpu_index=last.gpu_index, fields={VERSION_FIELD: samples, RETRACTED_FIELD: True},
              signature=last.signature)


def replacement_of(ev: Event) -> tuple[int, Event | None] | None:
    """A replacement's version and event as the engine makes it (None: retracted); None for a plain event."""
    version = ev.fields.get(VERSION_FIELD)
    if not isinstance(version, int) or isinstance(version, bool):
        return None
    if ev.fields.get(RETRACTED_FIELD):
        return version, None
    return version, ev.model_copy(update={"fields": {k: v for k, v in ev.fields.items() if k != VERSION_FIELD}})


def _new_unparsed(st: _Attempt) -> list[Ev]:
    fresh = MetricsRead()
    fresh.bad = st.read.bad[st.bad_sent:]
    st.bad_sent = len(st.read.bad)
    for path, n in st.read.unparsed.items():
        if n > st.unparsed_sent[path]:
            fresh.unparsed[path] = n - st.unparsed_sent[path]
            st.unparsed_sent[path] = n
    return [ev for ev in unparsed_events(fresh) if ev.path in fresh.unparsed]
