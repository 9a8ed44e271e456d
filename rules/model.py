"""The engine's working event: a mutable, slotted record with an order-free merge.

Converted to and from :class:`firstfault.schemas.Event` at the boundaries (the
structured-events topic, tests). Everything the rules add (role, taxonomy,
decoded fields, rule ids) lives here too.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter
from typing import Any

from firstfault.schemas import Event, GpuRef, Ref

_FAR = datetime.max.replace(tzinfo=None)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


@dataclass(slots=True, eq=False)      # identity: two events are never 'equal'
class Ev:
    kind: str
    pattern: str
    source: str
    path: str
    line: int
    text: str
    host: str | None = None
    pci: str | None = None
    gpu_index: int | None = None
    rank: int | None = None
    stamp: datetime | None = None
    last_stamp: datetime | None = None
    onset: datetime | None = None
    quality: str = "none"
    fields: dict[str, Any] = field(default_factory=dict)
    count: int = 1
    ranks: set[int] = field(default_factory=set)
    signature: str = ""
    # set by the rules
    role: str | None = None
    domain: str | None = None
    sub_domain: str | None = None
    strength: str = "strong"
    output: str | None = None
    early_rules: list[str] = field(default_factory=list)
    corrected_onset: datetime | None = None

    def order_key(self) -> tuple:
        """Earliest occurrence first; unstamped last; ties broken by the line's place."""
        return (self.stamp is None, self.stamp.replace(tzinfo=None) if self.stamp else _FAR, self.path, self.line)

    def copy(self) -> "Ev":
        """A copy whose containers the rules may change without touching this one."""
        other = Ev(*_FIELDS(self))          # copy.copy of a slotted object goes through __reduce_ex__: 4x slower
        other.fields = dict(self.fields)
        other.ranks = set(self.ranks)
        other.early_rules = list(self.early_rules)
        return other

    def astuple(self) -> tuple:
        """Every field in the constructor's order: ``Ev(*ev.astuple())`` is the same event. A tuple
        pickles at C speed; a slotted dataclass goes through a Python __getstate__ per object."""
        return _FIELDS(self)

    def canonical(self) -> list:
        """The extracted content (nothing the rules add), for content hashing."""
        stamp = _iso(self.stamp)
        # Most events' three times are one object (a line's stamp is its onset and its last): written once.
        last = stamp if self.last_stamp is self.stamp else _iso(self.last_stamp)
        onset = stamp if self.onset is self.stamp else _iso(self.onset)
        return [self.kind, self.pattern, self.source, self.path, self.line, self.text, self.host, self.pci,
                self.gpu_index, self.rank, stamp, last, onset, self.quality,
                self.fields, self.count, sorted(self.ranks) if self.ranks else [], self.signature]

    def ref(self) -> Ref:
        return Ref(path=self.path, line=self.line)

    def merge(self, other: "Ev") -> None:
        """Fold ``other`` (same signature) into self; associative and commutative.

        Once per merged line: comparisons in place of order_key() tuples and min/max lists
        (same results, ties included)."""
        if _earlier(other, self):
            self.path, self.line, self.text, self.rank = other.path, other.line, other.text, other.rank
            self.quality, self.fields, self.pci, self.gpu_index = other.quality, other.fields, other.pci, other.gpu_index
        self.count += other.count
        if other.ranks:
            self.ranks |= other.ranks
        stamp = other.stamp
        if stamp is not None and (self.stamp is None or stamp < self.stamp):
            self.stamp = stamp
        last = self.last_stamp            # max(): the first of equal values wins
        for s in (other.last_stamp, self.stamp, stamp):
            if s is not None and (last is None or s > last):
                last = s
        self.last_stamp = last
        if other.onset is not None and (self.onset is None or other.onset < self.onset):
            self.onset = other.onset

    def to_schema(self) -> Event:
        return Event(
            kind=self.kind, pattern=self.pattern, source=self.source, host=self.host,
            gpu=GpuRef(pci=self.pci, index=self.gpu_index) if (self.pci or self.gpu_index is not None) else None,
            rank=self.rank, stamp=self.stamp, last_stamp=self.last_stamp, onset=self.onset,
            stamp_quality=self.quality, fields=self.fields, ref=self.ref(), text=self.text,
            count=self.count, ranks=sorted(self.ranks), signature=self.signature,
        )

    @classmethod
    def from_schema(cls, ev: Event) -> "Ev":
        return cls(
            kind=ev.kind, pattern=ev.pattern, source=ev.source, path=ev.ref.path, line=ev.ref.line,
            text=ev.text, host=ev.host, pci=ev.gpu.pci if ev.gpu else None,
            gpu_index=ev.gpu.index if ev.gpu else None, rank=ev.rank, stamp=ev.stamp,
            last_stamp=ev.last_stamp, onset=ev.onset, quality=ev.stamp_quality, fields=dict(ev.fields),
            count=ev.count, ranks=set(ev.ranks), signature=ev.signature,
        )


_FIELDS = attrgetter(*Ev.__slots__)      # every field, in the constructor's order


def _earlier(a: Ev, b: Ev) -> bool:
    """``a.order_key() < b.order_key()`` without building the keys."""
    return _before(a.stamp, a.path, a.line, b)


def _before(sa: datetime | None, path: str, line: int, b: Ev) -> bool:
    """Would an occurrence at (sa, path, line) sort before ``b`` (``order_key``)?"""
    sb = b.stamp
    if sa is None or sb is None:
        if sa is not sb:                  # stamped sorts before unstamped
            return sb is None
    elif sa.tzinfo is sb.tzinfo:          # same tzinfo: aware comparison is the wall-clock one
        if sa != sb:
            return sa < sb
    else:
        na, nb = sa.replace(tzinfo=None), sb.replace(tzinfo=None)
        if na != nb:
            return na < nb
    return (path, line) < (b.path, b.line)


class EventSet:
    """Events keyed by signature; adding merges. Memory grows with distinct signatures only."""

    def __init__(self) -> None:
        self._by_sig: dict[str, Ev] = {}

    def add(self, ev: Ev) -> None:
        have = self._by_sig.get(ev.signature)
        if have is None:
            self._by_sig[ev.signature] = ev
        else:
            have.merge(ev)

    def fold(self, signature: str, stamp: datetime | None, onset: datetime | None, rank: int | None,
             path: str, line: int) -> bool:
        """One more occurrence of a known event that does not sort before its sample: counted into it
        as ``add`` would (``Ev.merge``), without building an event. False: the caller adds one."""
        have = self._by_sig.get(signature)
        if have is None:
            return False
        first = have.stamp
        if stamp is not None and first is not None and stamp.tzinfo is first.tzinfo:
            # _before's common case, inline: both stamped, one zone (an aware comparison is the wall clock's)
            if stamp < first or (stamp == first and (path, line) < (have.path, have.line)):
                return False
        elif _before(stamp, path, line, have):
            return False
        have.count += 1
        if rank is not None:
            have.ranks.add(rank)
        # merge()'s stamps with other.last_stamp = other.stamp = stamp (the first of equal values wins)
        if stamp is not None:
            if first is None or stamp < first:
                have.stamp = stamp
            last = have.last_stamp
            if last is None or stamp > last:
                have.last_stamp = stamp
        elif first is not None:
            last = have.last_stamp
            if last is None or first > last:
                have.last_stamp = first
        if onset is not None and (have.onset is None or onset < have.onset):
            have.onset = onset
        return True

    def update(self, events) -> None:
        for ev in events:
            self.add(ev)

    def __len__(self) -> int:
        return len(self._by_sig)

    def __iter__(self) -> Iterator[Ev]:
        return iter(self._by_sig.values())

    def sorted(self) -> list[Ev]:
        return sorted(self._by_sig.values(), key=lambda e: (e.order_key(), e.signature))
