"""Raw lines -> structured events, with the catalog's extraction patterns.

The same code serves the offline bundle (whole files, read in chunks) and the
stream (batches of raw records): both end in :meth:`Extractor.scan_block`, which
runs the prefilter over one block of text and reads only the candidate lines.
"""
from __future__ import annotations

import itertools
import math
import os
import re
from collections import OrderedDict, deque
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from operator import itemgetter
from pathlib import PurePosixPath
from typing import Any

from firstfault.schemas import WorkloadRecord
from firstfault.schemas.workload import INTAKE_EXTRA

from .bundle import log_name, source_of
from .catalog import Catalog, Pattern
from .model import Ev, EventSet
from .prefilter import Prefilter, TooManyHits, anchor_index
from .prefixes import _CHAIN_LINE, _CHAINS, Head, StampContext, read_head, read_head_missed
from .prefixes import _head_hit as head_hit
from .stamps import iso_z, parse_iso, parse_rfc1123z


def _newlines(data: bytes, start: int, end: int) -> int:
    """How many lines end in ``data[start:end]``."""
    return data.count(b"\n", start, end)


try:        # rules/_linekey.c: the same count, vectorized (a block's bytes are counted twice, in full)
    from ._linekey import newlines as _newlines_c
except ImportError:                 # not compiled (or built before it had one): the same answers
    _newlines_c = None
newlines = _newlines if _newlines_c is None or os.environ.get("FIRSTFAULT_PURE_PYTHON") == "1" else _newlines_c


def _group_bytes(data: bytes, spans: list[tuple[int, int]], indices: tuple[int, ...]) -> tuple[bytes | None, ...]:
    """The bytes of the groups at ``indices`` of a match (its ``spans`` on ``data``), None for one unset."""
    return tuple(data[s:e] if s >= 0 else None for s, e in map(spans.__getitem__, indices))


try:        # rules/_linekey.c: the same tuple, without a generator a line
    from ._linekey import group_bytes as _group_bytes_c
except ImportError:                 # not compiled (or built before it had one): the same answers
    _group_bytes_c = None
group_bytes = (_group_bytes if _group_bytes_c is None or os.environ.get("FIRSTFAULT_PURE_PYTHON") == "1"
               else _group_bytes_c)

MIXED = "mixed"               # a file of unknown kind: any source's patterns apply
MAX_LINE = 64 * 1024          # longer lines are matched on their first MAX_LINE bytes (and flagged)
MAX_RANK = 10_000_000         # a larger "rank" is not one (and would not fit the event's Avro long)
LONG = 2 ** 63                # Avro long: an int field outside it is kept as its text
MAX_ONSET_MS = 366 * 86400 * 1000     # "ran for N ms" past a year is not a duration to subtract
LOOKBACK = 64                 # lines searched upward for a stamp to inherit
SHOWN = 2000                  # characters of a line kept as its evidence text
_HAS_TIME = re.compile(r"\d:\d\d:\d\d|\[\s*\d+\.\d+\]")
_RANK_FILE = re.compile(r"rank[-_.]?(\d{1,7})", re.IGNORECASE)
_PCI = re.compile(r"^(?:(?P<dom>[0-9a-fA-F]{4,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})(?:\.(?P<fn>[0-7]))?$")


def normalize_pci(value: Any) -> str | None:
    """'0000:91:00', '00000000:91:00.0', '91:00.0' -> '0000:91:00.0'."""
    if value is None:
        return None
    m = _PCI.match(str(value).strip())
    if not m:
        return None
    dom = (m["dom"] or "0000")[-4:]
    return f"{dom}:{m['bus']}:{m['dev']}.{m['fn'] or '0'}".lower()


class HostResolver:
    """Names seen in lines (FQDNs, pod names, short names) -> the workload's node names."""

    def __init__(self, workload: WorkloadRecord) -> None:
        self.nodes = set(workload.nodes)
        self.short = {n.split(".")[0]: n for n in workload.nodes}
        # Host names are case-insensitive (RFC 4343): srun's "Orion-01-01" is slurmstepd's "orion-01-01".
        # (filled in reverse order: where two nodes differ only in case, the first in sorted order wins)
        self.folded = {n.lower(): n for n in sorted(workload.nodes, reverse=True)}
        self.short_folded = {k.lower(): v for k, v in sorted(self.short.items(), reverse=True)}
        self.pods = dict(workload.pods)
        self.workload = workload
        # The one node of a one-node job is where every unplaced line happened.
        self.sole = workload.nodes[0] if len(workload.nodes) == 1 else None

    def node(self, name: str | None) -> str | None:
        if not name:
            return None
        if name in self.nodes:
            return name
        if name in self.pods:
            return self.pods[name]
        short = name.split(".")[0]
        if short in self.short:
            return self.short[short]
        folded = self.folded.get(name.lower()) or self.short_folded.get(short.lower())
        return folded or name

    def pod_node(self, name: str | None) -> str | None:
        """The node a pod ran on (the workload's pods map), or the node itself when ``name`` is one of
        the workload's; None for a name it does not know (a pod name is never taken for a host)."""
        if not name:
            return None
        if name in self.pods:
            return self.pods[name]
        resolved = self.node(name)
        return resolved if resolved in self.nodes else None

    def file_host(self, path: str, source: str) -> str | None:
        stem = PurePosixPath(log_name(path)).stem             # node-02.log.gz is node-02's too
        if source in ("syslog", "fabricmanager") and source_of(path) == source:
            return self.node(stem)          # the contract names a node-scoped file by its host
        resolved = self.node(stem)
        return resolved if resolved in self.nodes else None

    def rank_host(self, rank: int | None) -> str | None:
        return None if rank is None else self.workload.host_of_rank(rank)

    def placed_by_block(self, rank: int | None) -> bool:
        """Is ``rank``'s host only the block-placement guess (rank // gpus_per_node), not a stated map?
        torchrun's rendezvous numbers nodes in its own order, so the guess can name another node."""
        return rank is not None and rank not in self.workload.ranks and len(self.nodes) > 1


@dataclass
class ExtractStats:
    files: int = 0
    lines: int = 0
    candidates: int = 0
    matched: int = 0
    unparsed: int = 0
    truncated: int = 0
    unparsed_refs: list[tuple[str, int]] = field(default_factory=list)

    def absorb(self, other: "ExtractStats") -> None:
        for name in ("files", "lines", "candidates", "matched", "unparsed", "truncated"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.unparsed_refs = sorted(self.unparsed_refs + other.unparsed_refs)[:10]


class LineMemory:
    """The last few lines of each file, for stamp inheritance (bounded LRU of paths)."""

    def __init__(self, paths: int = 4096, depth: int = LOOKBACK) -> None:
        self.paths, self.depth = paths, depth
        self._mem: OrderedDict[str, deque[tuple[int, str]]] = OrderedDict()

    def above(self, path: str, line: int) -> Iterable[str]:
        """The file's lines just above ``line`` (within the look-back window), nearest first."""
        buf = self._mem.get(path)
        if not buf:
            return ()
        return [t for n, t in reversed(buf) if line - self.depth <= n < line]

    def add(self, path: str, line: int, text: str) -> None:
        buf = self._mem.get(path)
        if buf is None:
            buf = self._mem[path] = deque(maxlen=self.depth)
            if len(self._mem) > self.paths:
                self._mem.popitem(last=False)
        else:
            self._mem.move_to_end(path)
        buf.append((line, text))


class _Memo:
    """What the extractors of one catalog learn as they read, shared and bounded (a stream worker
    holds an extractor per live workload): how a message alike but for its digits matched
    (``Extractor._match``), a number per candidate set to key it, each pattern's _Plan."""

    def __init__(self) -> None:
        self.outcomes: dict[tuple[int, bytes], tuple[int, list] | None] = {}
        self.plans: dict[tuple[str, str], _Plan] = {}
        self.block_patterns: dict[tuple[str, str], Pattern] = {}
        self._cids: dict[tuple[str, ...], int] = {}
        self._next = itertools.count()

    def cid(self, patterns: tuple[Pattern, ...]) -> int:
        """A number for this candidate set, never given to another (outcomes are keyed by it)."""
        key = tuple(p.id for p in patterns)
        cid = self._cids.get(key)
        if cid is None:
            if len(self._cids) >= MEMO_ENTRIES:
                self._cids.clear()             # numbers are not reused: old outcomes just go unread
            cid = self._cids[key] = next(self._next)
        return cid

    def plan(self, pat: Pattern) -> _Plan:
        # by id and kind: a line read with its block's kind (Pattern.in_block) is that pattern's too
        plan = self.plans.get((pat.id, pat.kind))
        if plan is None:
            plan = self.plans[(pat.id, pat.kind)] = _Plan(pat)
        return plan

    def in_block(self, pat: Pattern) -> Pattern:
        """``pat`` read with its block's kind (``Pattern.in_block``), made once."""
        key = (pat.id, pat.in_block.kind)
        found = self.block_patterns.get(key)
        if found is None:
            found = self.block_patterns[key] = replace(pat, kind=pat.in_block.kind, in_block=None)
        return found


@lru_cache(maxsize=8)
def _memo(catalog: Catalog) -> _Memo:
    return _Memo()


def _anchor_key(anchor_ids: Collection[int]) -> int | frozenset[int]:
    """A line's anchor ids as the candidates memo's key: one id as itself (most lines hit one
    anchor: no set to build), more as their frozenset. An int never equals a frozenset."""
    if len(anchor_ids) == 1:
        (aid,) = anchor_ids
        return aid
    return frozenset(anchor_ids)


class _Candidates:
    """The patterns to try for a line that hit some anchors, in priority order (and their plans)."""

    __slots__ = ("patterns", "plans", "cid", "blind")

    def __init__(self, patterns: tuple[Pattern, ...], cid: int, plans: tuple[_Plan, ...]) -> None:
        self.patterns, self.cid, self.plans = patterns, cid, plans
        # How many of them, from the first, read digits alike (see Extractor._match).
        self.blind = next((i for i, p in enumerate(patterns) if not p.digit_blind), len(patterns))


class Extractor:
    """Extraction for one workload (its stamps' year, zone and host names)."""

    def __init__(self, catalog: Catalog, workload: WorkloadRecord, force_fallback: bool = False,
                 year_anchors: Mapping[str, datetime] | None = None) -> None:
        self.catalog = catalog
        self.workload = workload
        # path -> where its year-less stamps take their year from, when its lines decide it (the
        # intake's, rules/intake.py _Facts.year_anchors); a shipped input carries them on its record
        self._year_anchors = dict(year_anchors) if year_anchors is not None else shipped_year_anchors(workload)
        self.hosts = HostResolver(workload)
        pre, self.by_anchor = anchor_index(catalog)
        self.prefilter = Prefilter(pre.anchors, force_fallback=True) if force_fallback else pre
        self._priority = {p.id: i for i, p in enumerate(catalog.patterns)}
        # source -> anchor ids (one id as itself, more as a frozenset: see _anchor_key) -> candidates
        self._cand_cache: dict[str, dict[int | frozenset[int], _Candidates]] = {}
        self._ctx_cache: dict[str | None, StampContext] = {}
        self._file_ctx: dict[tuple[str | None, str], StampContext] = {}     # (host, path) -> with its year anchor
        self._stated: dict[str, tuple[int, Any]] = {}     # path -> (line, time) of its last line stating its time
        self._scopes: dict[str, dict[str, str | None]] = {}   # path -> what its lines so far say of the next (Pattern.scope)
        self._memo = _memo(catalog)
        self._outcomes = self._memo.outcomes          # cleared in place, never replaced
        # (plan, looked-up groups' bytes, head rank and host, source, file host, path) -> what _event's lookups
        # make of a line: this workload's hosts answer them, so they are the extractor's own
        self._facts: dict[tuple, tuple] = {}

    def carry_file_state(self, earlier: "Extractor") -> None:
        """Take over what ``earlier``'s lines said of the lines below them in their files (scopes, the
        last stated times): an extractor made again for a newer record of the same workload reads the
        files' next lines as the one extractor of an offline read does. Its memos are not taken (they
        answer from the earlier record's hosts)."""
        self._scopes = dict(earlier._scopes)
        self._stated = dict(earlier._stated)

    def _candidates(self, anchor_ids: Collection[int], source: str) -> _Candidates:
        """Patterns to try for a line that hit these anchors, in priority order (memoized)."""
        return self._source_candidates(source).get(_anchor_key(anchor_ids)) or self._new_candidates(anchor_ids, source)

    def _source_candidates(self, source: str) -> dict[int | frozenset[int], _Candidates]:
        """The candidates memo of one source's lines, by _anchor_key (scan_block looks it up once a block)."""
        table = self._cand_cache.get(source)
        if table is None:
            table = self._cand_cache[source] = {}
        return table

    def _new_candidates(self, anchor_ids: Iterable[int], source: str) -> _Candidates:
        ids = frozenset(anchor_ids)
        # A console log (an application file, or one of unknown kind) may hold any source's
        # lines: users paste dmesg and kubectl output into the job's output file.
        pats = {p.id: p for aid in ids for p in self.by_anchor[aid]
                if source in p.sources or source in (MIXED, "app")}
        patterns = tuple(sorted(pats.values(), key=lambda p: self._priority[p.id]))
        found = _Candidates(patterns, self._memo.cid(patterns), tuple(self._memo.plan(p) for p in patterns))
        self._source_candidates(source)[_anchor_key(ids)] = found
        return found

    @staticmethod
    def context_for(workload: WorkloadRecord, host: str | None) -> StampContext:
        boot = workload.boot_times.get(host) if host else None
        return StampContext(zone=workload.zone, anchor=workload.start_time, boot=boot)

    def context(self, host: str | None, path: str | None = None) -> StampContext:
        """How ``host``'s stamps are read; with ``path``, that file's year anchor where it has one."""
        ctx = self._ctx_cache.get(host)
        if ctx is None:
            ctx = self._ctx_cache[host] = self.context_for(self.workload, host)
        if path is not None and self._year_anchors:
            anchor = self._year_anchors.get(path)
            if anchor is not None:
                # the stream asks once a record: one context per file, not one per line
                key = (host, path)
                found = self._file_ctx.get(key)
                if found is None:
                    if len(self._file_ctx) >= 4096:
                        self._file_ctx.clear()
                    found = self._file_ctx[key] = replace(ctx, anchor=anchor)
                return found
        return ctx

    # ------------------------------------------------------------ offline files
    def scan_file(self, path: str, chunks: Iterable[bytes], events: EventSet,
                  progress=None, source: str | None = None) -> ExtractStats:
        """Read one bundle file given as byte chunks (any split); merge its events into ``events``.

        ``source`` is the file's kind when its path does not say it (a sniffed file)."""
        stats = ExtractStats(files=1)
        source = source_of(path) or source or "app"
        # Read from its first line: nothing above it places or scopes it.
        self._scopes.pop(path, None)
        self._stated.pop(path, None)
        file_host = self.hosts.file_host(path, source)
        ctx = self.context(file_host, path)
        tail: list[bytes] = []
        base_line = 1
        for chunk in _whole_lines(chunks):
            lines_here = newlines(chunk, 0, len(chunk)) + (0 if chunk.endswith(b"\n") else 1)
            self.scan_block(path, source, file_host, ctx, chunk, base_line, events, stats, tail, lines_here)
            stats.lines += lines_here
            base_line += lines_here
            # The look-back spans chunks: a chunk of a few lines (a slow writer, a small read)
            # must not hide the stamped line just before it.
            tail = (tail + _last_lines(chunk, LOOKBACK))[-LOOKBACK:]
            if progress is not None:
                progress(len(chunk))
        return stats

    def scan_block(self, path: str, source: str, file_host: str | None, ctx: StampContext,
                   block: bytes, first_line: int, events: EventSet, stats: ExtractStats,
                   tail: list[bytes] | None = None, lines: int | None = None) -> None:
        """Prefilter one block of consecutive lines of ``path`` starting at ``first_line``
        (``lines``: how many it holds, when the caller has counted them)."""
        lines = newlines(block, 0, len(block)) + 1 if lines is None else lines
        try:
            # Real logs hit a few anchors a line; far more means a line made of anchors.
            hits = self.prefilter.scan(block, MAX_LINE, max_hits=8 * lines + 10_000)
        except TooManyHits:
            block = _cut_long_lines(block, MAX_LINE + 1)
            hits = self.prefilter.scan(block, MAX_LINE)
        if not hits:
            return
        candidates_of = self._source_candidates(source)
        read = self._read_line
        find = block.find
        line_no = first_line
        pos = 0
        candidates = matched = 0
        above = _Above(block, 0, tail, line_no, events)     # one for the block, moved from line to line
        try:
            for start, ids in sorted(hits.items()):
                line_no += newlines(block, pos, start)
                pos = start
                end = find(b"\n", start)
                candidates += 1
                above.start, above.line_no = start, line_no
                # the anchors' candidates, keyed as _anchor_key keys them (most lines hit one anchor)
                if len(ids) == 1:
                    (key,) = ids
                else:
                    key = frozenset(ids)
                ev = read(path, source, file_host, ctx, line_no, block[start:end if end >= 0 else len(block)],
                          candidates_of.get(key) or self._new_candidates(ids, source), above, stats)
                if ev is not None:
                    matched += 1
                    if ev is not FOLDED:
                        events.add(ev)
        finally:                        # counted as they were read, whatever stops the block
            stats.candidates += candidates
            stats.matched += matched

    # ------------------------------------------------------------ one line
    def read_line(self, path: str, source: str, file_host: str | None, ctx: StampContext,
                  line_no: int, raw: bytes, anchor_ids: Collection[int], above, stats: ExtractStats,
                  remember_only: bool = False) -> Ev | None:
        """The line's event (None: no pattern matched, or FOLDED). ``remember_only``: a line read again
        for context (a stream worker taking a partition over re-reads the lines before its offset):
        what it says of the lines below it (``Pattern.scope``, a stated time) is kept, and no event is
        made, so the lines after it are read as one reader would."""
        return self._read_line(path, source, file_host, ctx, line_no, raw, self._candidates(anchor_ids, source),
                               above, stats, remember_only)

    def _read_line(self, path: str, source: str, file_host: str | None, ctx: StampContext, line_no: int,
                   raw: bytes, candidates: _Candidates, above, stats: ExtractStats,
                   remember_only: bool = False) -> Ev | None:
        """``read_line`` with the line's candidate patterns found."""
        truncated = len(raw) > MAX_LINE
        if truncated:
            raw = raw[:MAX_LINE]
            stats.truncated += 1
        text = raw.decode("utf-8", "replace").rstrip("\r")
        damaged = truncated or "\ufffd" in text
        # read_head_keyed (the head and the message's UTF-8 and key, if ASCII), its remembered case inline
        hit = head_hit(text, ctx, _CHAINS, Head, _CHAIN_LINE) if head_hit is not None else None
        if hit is not None and len(hit) == 3:
            head, data, zeroed = hit
        else:
            head, data, zeroed = read_head_missed(text, ctx, hit)
        message = head.message
        # _match's remembered outcome, inline (most lines of a cascade): the same key, the same answer
        known = (self._outcomes.get((candidates.cid, zeroed), _UNSEEN)
                 if data is not None and len(data) <= MEMO_BYTES else _UNSEEN)
        if known is _UNSEEN:
            found = self._match(candidates, message, data, zeroed)
            if found is None:
                if damaged and not remember_only:
                    return self._unparsed(path, source, file_host, line_no, text, head, truncated, stats)
                return None
            plan, spans, data = found
        elif known is None:
            if damaged and not remember_only:
                return self._unparsed(path, source, file_host, line_no, text, head, truncated, stats)
            return None
        else:
            plan = candidates.plans[known[0]]
            spans = known[1]
        if plan.usual:
            pat = None
            base = None
        else:
            pat = plan.pat
            if pat.in_block is not None and above is not None and _under_header(pat, above, ctx):
                pat = self._memo.in_block(pat)
                plan = self._memo.plan(pat)
            base = None
            if pat.scope:
                base = plan.fields(message, data, spans)
                self._set_scope(path, pat, base)
        # An _Above is the block's (scan_block); a callable gives the lines above (the stream's).
        block_above = above if type(above) is _Above else None
        if head.stamp is None and head.quality != "order_only" and above is not None:
            if block_above is None:
                gap = _inherit(head, above(), ctx)
            elif block_above._for == block_above.line_no - 1:
                # _Above.inherit's first case, inline (a run of unstamped lines): the line above's find
                n = block_above.line_no
                stamp, came = block_above._stamp, block_above._from
                if stamp is not None and n - came <= LOOKBACK:
                    head.stamp, head.quality = stamp, "inherited"
                    block_above._for = n
                    gap = n - came
                else:
                    block_above._for, block_above._stamp, block_above._from = n, None, None
                    gap = None
            else:
                gap = block_above.inherit(head, ctx)
            if path in self._stated:
                self._stated_above(head, path, line_no, gap)
        if pat is not None and pat.stamp_field and head.quality in ("none", "inherited", "order_only"):
            # A report's field (kubectl describe's "Finished:") dates its record above it, not the
            # lines below: only a log line's stated time bounds what follows it.
            m = _Spans(message, data, spans, pat.regex)
            if _own_stamp(head, m.group_text(pat.stamp_field), ctx) and not pat.dates_above:
                self._note_stated(path, line_no, head.stamp)
        if remember_only:
            return None
        into = block_above.events if block_above is not None else None
        if into is not None and plan.usual and not (self._scopes and self._scopes.get(path)):
            # _event's remembered facts and fold, inline (most lines of a cascade): see _event
            key = (plan, group_bytes(data, spans, plan.looked_at), head.host, source, file_host, path)
            facts = self._facts.get(key)
            if facts is None:
                facts = self._new_facts(key, plan, spans, message, data, head, path, source, file_host)
            if facts is not _BY_RANK:
                rank = head.rank
                if rank is None:
                    rank = facts[1]
                elif not 0 <= rank < MAX_RANK:
                    rank = facts[2]
                stamp = onset = head.stamp
                ran_ms = facts[6]
                if ran_ms is not None and stamp is not None:
                    try:
                        onset = stamp - timedelta(milliseconds=ran_ms)
                    except OverflowError:           # a stamp near year 1
                        onset = stamp
                if into.fold(facts[0], stamp, onset, rank, path, line_no):
                    return FOLDED
        return self._event(plan, spans, message, data, base, head, path, source, file_host, line_no, text,
                           damaged, into)

    @staticmethod
    def _unparsed(path: str, source: str, file_host: str | None, line_no: int, text: str, head: Head,
                  truncated: bool, stats: ExtractStats) -> Ev:
        """A damaged line no pattern matched, kept as evidence: one aggregated event per file, so a
        flood stays one entry."""
        stats.unparsed += 1
        if len(stats.unparsed_refs) < 10:
            stats.unparsed_refs.append((path, line_no))
        return Ev(kind="unparsed", pattern="unparsed", source=source, path=path, line=line_no,
                  text=_shown(text), host=file_host, stamp=head.stamp, last_stamp=head.stamp,
                  onset=head.stamp, quality=head.quality,
                  fields={"reason": "line too long" if truncated else "invalid UTF-8"},
                  signature="\x1f".join(("unparsed", path)))

    def _set_scope(self, path: str, pat: Pattern, fields: dict[str, Any]) -> None:
        """What this line says of the lines below it in its file (``Pattern.scope``): the host they
        are on, the object (pod) they are about, the tear-down they belong to; a key whose field is
        empty or unnamed clears it."""
        scope = dict(self._scopes.get(path) or {})
        for key, name in pat.scope.items():
            value = fields.get(name) if name else None
            value = str(value) if value not in (None, "") else None
            if key == "pod":
                scope["object"], scope["host"] = value, self.hosts.pod_node(value)
            elif key == "host":
                scope["host"] = self.hosts.node(value)
            else:
                scope[key] = value
        if len(self._scopes) >= 4096 and path not in self._scopes:
            self._scopes.clear()
        self._scopes[path] = scope

    def _note_stated(self, path: str, line_no: int, stamp) -> None:
        """A line that states its own time (slurmstepd's 'CANCELLED AT ...') is a stamped line for
        the lines below it, as a stamp prefix is: remembered per file (lines are read in order)."""
        if len(self._stated) >= 4096 and path not in self._stated:
            self._stated.clear()
        self._stated[path] = (line_no, stamp)

    def _stated_above(self, head: Head, path: str, line_no: int, gap: int | None) -> None:
        """An unstamped line inherits from the nearest stamped line above: a stated time nearer than
        the stamp prefix found (``gap`` lines up, None: none within the look-back) is that line."""
        stated = self._stated.get(path)
        if stated is None:
            return
        at, stamp = stated
        if 0 < line_no - at <= LOOKBACK and (gap is None or line_no - at < gap):
            head.stamp, head.quality = stamp, "inherited"

    def _match(self, candidates: _Candidates, message: str, data: bytes | None = None,
               zeroed: bytes | None = None) -> _Found | None:
        """The first of the candidates (priority order) whose regex matches ``message``: the pattern's
        _Plan, its match (as the groups' spans on the message's UTF-8) and that UTF-8 (the fields are read
        off them by _Plan, only as far as they are needed). ``data``, ``zeroed``: the message's UTF-8
        and that with its digits as "0", when the caller has them.

        A message alike but for its digits to one seen before matches alike (digit-blind patterns,
        ``regex.digit_blind``): the outcome (which pattern, the groups' offsets) is remembered under
        the message with its digits as "0", and the groups are read off this message's own text."""
        if data is None:
            data = message.encode("utf-8", "surrogatepass")      # once, for every pattern tried
            zeroed = None
        if len(data) > MEMO_BYTES:
            k, spans = _first(candidates.patterns, data)
            return None if spans is None else (candidates.plans[k], spans, data)
        outcomes = self._outcomes
        key = (candidates.cid, zeroed if zeroed is not None else data.translate(_ZEROS))
        known = outcomes.get(key, _UNSEEN)
        if known is _UNSEEN:
            k, spans = _first(candidates.patterns, data)
            # Kept only when every pattern tried reads digits alike (the outcome is then the key's).
            if candidates.blind >= (k + 1 if spans is not None else k):
                if len(outcomes) >= MEMO_ENTRIES:
                    outcomes.clear()
                outcomes[key] = None if spans is None else (k, spans)
            if spans is None:
                return None
        elif known is None:
            return None
        else:
            k, spans = known
        return candidates.plans[k], spans, data

    def _event(self, plan: _Plan, spans: list[tuple[int, int]], message: str, data: bytes,
               base: dict[str, Any] | None, head: Head, path: str, source: str, file_host: str | None,
               line_no: int, text: str, damaged: bool, into: EventSet | None = None) -> Ev:
        """The line's event; with ``into``, a repeat of an event already there is folded into it
        instead (most lines of a cascade) and FOLDED comes back. ``base``: the pattern's fields of
        this line when the caller read them already (``_Plan.fields``).

        What the lookups make of a line (its signature, rank, host, GPU and source, the onset field)
        depends only on the pattern's looked-up groups and the line's rank, host, source, file and file
        host, when no scope applies and no lookup reads a field the line adds (``_Plan.plain``): those
        are remembered (``_new_facts``; by rank only where the rank places the line or is in its
        signature), so a repeat reads no field at all."""
        if base is None and plan.plain and not (self._scopes and self._scopes.get(path)):
            key = (plan, group_bytes(data, spans, plan.looked_at), head.host, source, file_host, path)
            facts = self._facts.get(key)
            if facts is None:
                facts = self._new_facts(key, plan, spans, message, data, head, path, source, file_host)
            if facts is _BY_RANK:
                facts = self._facts.get((key, head.rank))
                if facts is None:
                    self._new_facts(key, plan, spans, message, data, head, path, source, file_host)
                    facts = self._facts[(key, head.rank)]
                signature, rank, host, pci, source, by_block, ran_ms = facts
            else:
                signature, rank_none, rank_bad, host, pci, source, ran_ms = facts
                rank = head.rank
                if rank is None:
                    rank = rank_none
                elif not 0 <= rank < MAX_RANK:
                    rank = rank_bad
                by_block = False
            stamp = onset = head.stamp
            if ran_ms is not None and stamp is not None:
                try:
                    onset = stamp - timedelta(milliseconds=ran_ms)
                except OverflowError:           # a stamp near year 1
                    onset = stamp
            if into is not None and into.fold(signature, stamp, onset, rank, path, line_no):
                return FOLDED
            fields = _line_fields(plan.fields(message, data, spans), head, damaged)
            if by_block:
                fields["host_basis"] = "rank_placement"
            return Ev(kind=plan.pat.kind, pattern=plan.pat.id, source=source, path=path, line=line_no,
                      text=text if len(text) <= SHOWN else _shown(text), host=host, pci=pci, rank=rank,
                      stamp=stamp, last_stamp=stamp, onset=onset, quality=head.quality, fields=fields,
                      count=1, ranks={rank} if rank is not None else set(), signature=signature)
        return self._event_read(plan, spans, message, data, base, head, path, source, file_host, line_no, text,
                                damaged, into)

    def _new_facts(self, key: tuple, plan: _Plan, spans: list[tuple[int, int]], message: str, data: bytes,
                   head: Head, path: str, source: str, file_host: str | None) -> tuple:
        """``_event``'s remembered facts of a line (see there), worked out as _event_read works them out,
        and what is remembered under ``key``: where neither the signature nor the host reads the rank
        (the usual case: ranks aggregated, a host named), the facts with the rank to take when the line
        has none and when its own is out of range; else _BY_RANK, and the facts under (key, rank)."""
        fields = plan.read(message, data, spans, plan.looked)
        source, rank, host, by_block, pci, by_rank = self._lookups(plan, fields, head, path, source, file_host,
                                                                   None)
        pat = plan.pat
        ran_ms = fields.get(pat.onset_field) if pat.onset_field else None
        if not (isinstance(ran_ms, (int, float)) and 0 <= ran_ms <= MAX_ONSET_MS):
            ran_ms = None
        rank_key = "*" if pat.aggregate_ranks else repr(rank)
        signature = f"{plan.head}\x1f{source}\x1f{host or ''}\x1f{pci or ''}\x1f{rank_key}{plan.group(fields)}"
        facts = self._facts
        if len(facts) >= FACTS_ENTRIES:
            facts.clear()
        if pat.aggregate_ranks and not by_rank:
            found = facts[key] = (signature, _line_rank(pat, fields, None, path, source),
                                  _line_rank(pat, fields, -1, path, source), host, pci, source, ran_ms)
            return found
        facts[key] = _BY_RANK
        facts[(key, head.rank)] = (signature, rank, host, pci, source, by_block, ran_ms)
        return _BY_RANK

    def _lookups(self, plan: _Plan, fields: dict[str, Any], head: Head, path: str, source: str,
                 file_host: str | None, scope: dict[str, str | None] | None) -> tuple:
        """Who and where the line is about: (source, rank, host, by_block, pci, by_rank: whether the host
        came from the rank). ``fields``: the pattern's (and the line's, unless plan.plain), completed in
        place by the scope."""
        pat = plan.pat
        if source in (MIXED, "app") and source not in pat.sources:
            source = plan.console_source          # a pasted kernel line in a console log is still a kernel line
        rank = _line_rank(pat, fields, head.rank, path, source)
        # Who the line is about: a host it names, the NCCL prefix, the file's host, then the
        # rank map (explicit, else block placement by gpus_per_node, which is only a guess).
        hosts = self.hosts
        host = None
        by_block = False
        if pat.host_field and fields.get(pat.host_field):
            host = hosts.node(str(fields[pat.host_field]))
        if host is None and pat.pod_field and fields.get(pat.pod_field):
            host = hosts.pod_node(str(fields[pat.pod_field]))
        if host is None and source in ("syslog", "fabricmanager"):
            host = file_host
        if host is None and head.host:
            host = head.host if head.host in hosts.nodes else hosts.node(head.host)    # most name a node
        if scope:
            # A report's lines (kubectl describe) are about its object, on its node.
            if host is None:
                host = scope.get("host")
            if scope.get("object") and fields.get("object") is None:
                fields["object"] = scope["object"]
            if scope.get("teardown") and "torn_down_by" not in fields:
                fields["torn_down_by"] = scope["teardown"]
        if host is None and file_host:
            host = file_host
        by_rank = host is None              # placed by its rank (or the one node): the rank is in the answer
        if host is None:
            host = hosts.rank_host(rank)
            by_block = host is not None and hosts.placed_by_block(rank)
            if by_block and not plan.plain:
                fields["host_basis"] = "rank_placement"      # a guess: it never drains a node by itself
            if host is None:
                host = hosts.sole
        pci = normalize_pci(fields.get(pat.gpu_field)) if pat.gpu_field else None
        return source, rank, host, by_block, pci, by_rank

    def _event_read(self, plan: _Plan, spans: list[tuple[int, int]], message: str, data: bytes,
                    base: dict[str, Any] | None, head: Head, path: str, source: str, file_host: str | None,
                    line_no: int, text: str, damaged: bool, into: EventSet | None = None) -> Ev:
        """``_event`` reading the fields (a scope applies, a lookup reads a field the line adds, or the
        caller read them already)."""
        pat = plan.pat
        scope = self._scopes.get(path) if self._scopes else None
        # Lookups read the pattern's fields; the line's additions come in only for an event that is
        # kept, unless a lookup names one (plan.plain). Until the event is kept only the fields the
        # lookups name are read (plan.looked): a folded repeat never needs the rest.
        lazy = False
        if base is not None:
            fields: dict[str, Any] = base
        elif plan.lazy and not scope:
            lazy = True
            fields = plan.read(message, data, spans, plan.looked)
        else:
            fields = base = plan.read(message, data, spans, plan.groups)
        if not plan.plain:
            fields = _line_fields(fields, head, damaged)
        source, rank, host, by_block, pci, _ = self._lookups(plan, fields, head, path, source, file_host, scope)
        stamp = onset = head.stamp
        if pat.onset_field and stamp is not None:
            ran_ms = fields.get(pat.onset_field)
            if isinstance(ran_ms, (int, float)) and 0 <= ran_ms <= MAX_ONSET_MS:
                try:
                    onset = stamp - timedelta(milliseconds=ran_ms)
                except OverflowError:           # a stamp near year 1
                    onset = stamp
        rank_key = "*" if pat.aggregate_ranks else repr(rank)
        signature = f"{plan.head}\x1f{source}\x1f{host or ''}\x1f{pci or ''}\x1f{rank_key}{plan.group(fields)}"
        if into is not None and into.fold(signature, stamp, onset, rank, path, line_no):
            return FOLDED
        if lazy or plan.plain:
            fields = _line_fields(plan.fields(message, data, spans) if lazy else fields, head, damaged)
            if by_block:
                fields["host_basis"] = "rank_placement"
        return Ev(kind=pat.kind, pattern=pat.id, source=source, path=path, line=line_no,
                  text=text if len(text) <= SHOWN else _shown(text), host=host, pci=pci, rank=rank,
                  stamp=stamp, last_stamp=stamp, onset=onset, quality=head.quality, fields=fields,
                  count=1, ranks={rank} if rank is not None else set(), signature=signature)


def year_anchors_extra(anchors: Mapping[str, datetime]) -> dict[str, str]:
    """The year anchors as a shipped record carries them (INTAKE_EXTRA's ``year_anchors``)."""
    return {path: iso_z(when) for path, when in sorted(anchors.items())}


def shipped_year_anchors(workload: WorkloadRecord) -> dict[str, datetime]:
    """The year anchors a shipped bare input's record carries (``year_anchors_extra``); {} if none."""
    extra = (workload.model_extra or {}).get(INTAKE_EXTRA)
    found = extra.get("year_anchors") if isinstance(extra, dict) else None
    if not isinstance(found, dict):
        return {}
    out = {}
    for path, when in found.items():
        stamp = parse_iso(when, timezone.utc) if isinstance(path, str) and isinstance(when, str) else None
        if stamp is not None:
            out[path] = stamp
    return out


def _line_fields(fields: dict[str, Any], head: Head, damaged: bool) -> dict[str, Any]:
    """The event's fields: the pattern's (``fields``, completed in place), then what the line says."""
    if damaged:
        fields["damaged_line"] = True
    if head.uptime is not None:
        fields.setdefault("uptime_s", head.uptime)
    if head.pid is not None:
        fields.setdefault("pid_prefix", head.pid)
    if head.dev is not None:
        fields.setdefault("cuda_dev", head.dev)
    return fields


class _Plan:
    """What a pattern's events need, worked out once per pattern instead of once per line."""

    __slots__ = ("pat", "head", "console_source", "plain", "lazy", "groups", "looked", "looked_at", "usual",
                 "_constants", "_group_by", "_one", "_values")

    def __init__(self, pat: Pattern) -> None:
        self.pat = pat
        self.head = f"{pat.kind}\x1f{pat.id}"
        self.console_source = "app" if "app" in pat.sources else sorted(pat.sources)[0]
        self._constants = dict(pat.constants)
        self._group_by = pat.group_by
        # group_by's one name (most patterns group by one field or none), else None
        self._one = pat.group_by[0] if len(pat.group_by) == 1 else None
        # (name, index, type or None for text) of each named group, in the regex's order
        self.groups = tuple((name, i, None if pat.types.get(name, str) is str else pat.types[name])
                            for name, i in pat.regex.names)
        self._values = itemgetter(*pat.group_by) if len(pat.group_by) > 1 else None
        # No lookup of _event names a field the line adds: the pattern's fields answer them all.
        named = {pat.rank_field, pat.host_field, pat.pod_field, pat.gpu_field, pat.onset_field, *pat.group_by}
        self.plain = not named & LINE_ADDS
        # The groups those lookups name (looked): fewer than all, and a folded repeat reads only them.
        self.looked = tuple(g for g in self.groups if g[0] in named)
        self.looked_at = tuple(i for _, i, _ in self.looked)       # their indices in a match's spans
        # Read as most lines are: no block header above it to look for, nothing said of the lines below
        # it, no time of its own, and lookups that read only the pattern's fields (Extractor._read_line)
        self.usual = pat.in_block is None and not pat.scope and not pat.stamp_field and self.plain
        self.lazy = len(self.looked) < len(self.groups)

    def fields(self, text: str, data: bytes, spans: list[tuple[int, int]]) -> dict[str, Any]:
        """The pattern's constants and typed groups (read off ``spans``, the regex's on ``data``, the
        UTF-8 of ``text``), in the order events carry them."""
        return self.read(text, data, spans, self.groups)

    def read(self, text: str, data: bytes, spans: list[tuple[int, int]],
             groups: tuple[tuple[str, int, Any], ...]) -> dict[str, Any]:
        """The constants and ``groups``: all of them (``fields``), or ``looked``, as far as _event's lookups
        read them (a folded repeat never needs the rest)."""
        fields: dict[str, Any] = self._constants.copy()
        ascii_ = len(data) == len(text)         # byte offsets are character offsets
        for name, i, typ in groups:
            start, end = spans[i]
            if start < 0:
                fields.setdefault(name, None)
                continue
            value = text[start:end] if ascii_ else data[start:end].decode("utf-8", "replace")
            if typ is None:
                fields[name] = value
            elif typ is int:            # most typed groups: _typed's int case, without the call
                try:
                    number = int(value)
                except (ValueError, OverflowError):
                    fields[name] = value
                else:
                    fields[name] = number if -LONG <= number < LONG else value
            else:
                fields[name] = _typed(typ, value)
        return fields

    def group(self, fields: dict[str, Any]) -> str:
        """The signature's group_by part ("" without group_by): "\x1f" + each value's repr."""
        one = self._one
        if one is not None:
            # group_by names a group or a constant: always there (.get: as the general case reads it)
            return "\x1f" + repr(fields.get(one))
        group_by = self._group_by
        if not group_by:
            return ""
        try:                                    # group_by names a group or a constant: always there
            values = self._values(fields)
        except KeyError:
            values = tuple(fields.get(g) for g in group_by)
        return "\x1f" + "\x1f".join(map(repr, values))


def _first(candidates: tuple[Pattern, ...], data: bytes) -> tuple[int, list | None]:
    """The index of the first pattern that matches (and its spans); len(candidates), None if none."""
    for k, pat in enumerate(candidates):
        spans = pat.spans(data)
        if spans is not None:
            return k, spans
    return len(candidates), None


class _Spans:
    """A match as its spans, read only when a group's text is asked for (most lines never are)."""

    __slots__ = ("text", "data", "spans", "regex")

    def __init__(self, text: str, data: bytes, spans: list[tuple[int, int]], regex) -> None:
        self.text, self.data, self.spans, self.regex = text, data, spans, regex

    def group_text(self, name: str) -> str | None:
        return self.regex.match_of(self.text, self.data, self.spans).groupdict().get(name)


_Found = tuple["_Plan", list[tuple[int, int]], bytes]     # the pattern's plan, its groups' spans, the message's UTF-8
_UNSEEN = object()
LINE_ADDS = frozenset({"damaged_line", "uptime_s", "pid_prefix", "cuda_dev", "host_basis"})    # see _line_fields
_ZEROS = bytes.maketrans(b"0123456789", b"0000000000")
MEMO_ENTRIES = 8192           # match outcomes remembered per catalog (then forgotten at once)
FACTS_ENTRIES = 1024          # lines' facts an extractor remembers (a stream worker holds one a live workload)
MEMO_BYTES = 1024             # longer messages are matched, not remembered: the memo stays a few MiB
# read_line's answer for a matched line already counted into an event of the set (see _event)
FOLDED = Ev(kind="folded", pattern="folded", source="app", path="", line=0, text="")


_BY_RANK = object()           # Extractor._facts: this key's facts are remembered by rank too


def _line_rank(pat: Pattern, fields: dict[str, Any], rank: int | None, path: str, source: str) -> int | None:
    """The line's rank: its prefix's (``rank``), else the pattern's rank field, else its file's name
    (an application file's); None for one out of range."""
    if rank is None and pat.rank_field and isinstance(fields.get(pat.rank_field), int):
        rank = fields[pat.rank_field]
    if rank is not None and not 0 <= rank < MAX_RANK:
        rank = None
    if rank is None and source == "app":
        rank = _rank_of_file(path)
    return rank


@lru_cache(maxsize=4096)
def _rank_of_file(path: str) -> int | None:
    """The rank a per-rank log's name gives (rank-3.log, train_rank12.out), per path once."""
    fm = _RANK_FILE.search(PurePosixPath(log_name(path)).stem)
    return int(fm.group(1)) if fm else None


def _shown(text: str, limit: int = SHOWN) -> str:
    """The line as evidence shows it: a cut line ends in an ellipsis, so nobody reads it as whole."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _typed(typ: Any, value: str) -> Any:
    """A captured group as its declared type; its text when the value does not fit one."""
    try:
        out = typ(value)
    except (ValueError, OverflowError):     # 5,000 digits exceed int()'s string limit
        return value
    if typ is int and not -LONG <= out < LONG:
        return value
    if typ is float and not math.isfinite(out):
        return value
    return out


def _own_stamp(head: Head, text: str | None, ctx: StampContext) -> bool:
    """A line that states its own time (slurmstepd's 'CANCELLED AT ...', kubectl describe's
    'Finished: Fri, 15 Sep 2023 09:56:17 +0200') is placed by it. True when it was read."""
    stamp = (parse_iso(text, ctx.zone) or parse_rfc1123z(text)) if text else None
    if stamp is not None:
        head.stamp, head.quality = stamp, "exact"
    return stamp is not None


def _under_header(pat: Pattern, above, ctx: StampContext) -> bool:
    """Is the line at the end of a block (``Pattern.in_block``) whose first line, the nearest above it
    matching ``start`` within the look-back, has a line matching ``header`` just above it (blank lines and
    progress bars, which other writers interleave, skipped)?"""
    block = pat.in_block
    started = False
    for text in _texts_above(above):
        if started:
            message = read_head(text, ctx).message
            if not message.strip():
                continue                # a blank line, a progress bar's redraw between the two: not the program's
            return block.header.search(message) is not None
        # the literal first: most lines above (a traceback's frames) are not read at all
        started = block.anchor in text and block.start.search(read_head(text, ctx).message) is not None
    return False


def _texts_above(above) -> Iterator[str]:
    """The lines above a candidate, nearest first: an offline block's (_Above) or the stream's memory."""
    if isinstance(above, _Above):
        for raw in _lines_above(above.block, above.start, above.tail):
            yield raw.decode("utf-8", errors="replace").rstrip("\r")
    else:
        yield from above()


def _inherit(head: Head, lines_above: Iterator[str], ctx: StampContext) -> int | None:
    """Take the stamp of the nearest stamped line above, whatever rank wrote it.

    A merged stdout (srun --label) interleaves ranks in about real time, so the
    nearest stamped line is the best bound; the same rank's last stamp may be
    minutes older (a rank that hangs prints nothing until its error).
    """
    for k, text in enumerate(lines_above, start=1):
        if not _HAS_TIME.search(text, 0, 96):        # cheap test before a full prefix read
            continue
        other = read_head(text, ctx)
        if other.stamp is not None:
            head.stamp, head.quality = other.stamp, "inherited"
            return k                                  # how many lines up (the lines above are consecutive)
    return None


class _Above:
    """Lines above a candidate in its block, with a memo of the last inherited stamp.

    Consecutive unstamped candidates (a traceback, a ChildFailedError block) would each
    scan the same lines upward; the memo stops the scan where the previous one ended.
    """

    # memo: the line last inherited for, the stamp it found (None: none) and the line that stamp came from
    __slots__ = ("block", "start", "tail", "line_no", "events", "_for", "_stamp", "_from")

    def __init__(self, block: bytes, start: int, tail, line_no: int, events: EventSet | None = None) -> None:
        self.block, self.start, self.tail, self.line_no = block, start, tail, line_no
        self.events = events            # where the block's events go: repeats are folded in (Extractor._event)
        self._for: int | None = None
        self._stamp = self._from = None

    def inherit(self, head: Head, ctx: StampContext) -> int | None:
        """Take the stamp of the nearest stamped line above; how many lines up it is (None: none)."""
        n = self.line_no
        prev = self._for
        if prev is not None and prev == n - 1:
            # The line just above inherited too (a traceback, a run of NCCL warnings): the scan below
            # would stop at once on it and take its find, so take it without the scan.
            return self._take_memo(head, n)
        for raw in _lines_above(self.block, self.start, self.tail):
            n -= 1
            if prev is not None and n <= prev:
                # Everything from here up was scanned for the previous line; its find counts
                # only if it is within this line's own look-back window.
                return self._take_memo(head, self.line_no)
            text = raw.decode("utf-8", errors="replace").rstrip("\r")       # only lines not scanned before
            if not _HAS_TIME.search(text, 0, 96):
                continue
            other = read_head(text, ctx)
            if other.stamp is not None:
                head.stamp, head.quality = other.stamp, "inherited"
                self._for, self._stamp, self._from = self.line_no, other.stamp, n
                return self.line_no - n
        self._for, self._stamp, self._from = self.line_no, None, None
        return None

    def _take_memo(self, head: Head, n: int) -> int | None:
        """The previous line's find for line ``n`` (kept as its find too), if within its look-back."""
        stamp, source = self._stamp, self._from
        if stamp is not None and n - source <= LOOKBACK:
            head.stamp, head.quality = stamp, "inherited"
            self._for = n
            return n - source
        self._for, self._stamp, self._from = n, None, None
        return None


def _lines_above(block: bytes, start: int, tail: list[bytes] | None) -> Iterator[bytes]:
    """The lines above ``start`` (the block's, then the previous chunks' tail), nearest first, each
    to its first MAX_LINE bytes; the caller decodes the ones it reads."""
    end = start - 1
    n = 0
    while end >= 0 and n < LOOKBACK:
        begin = block.rfind(b"\n", 0, end) + 1
        yield block[begin:min(end, begin + MAX_LINE)]
        end = begin - 1
        n += 1
    for raw in reversed(tail or []):
        if n >= LOOKBACK:
            return
        yield raw[:MAX_LINE]
        n += 1


def _cut_long_lines(block: bytes, cap: int) -> bytes:
    """Each line to its first ``cap`` bytes (what the reader matches); line count unchanged."""
    return b"\n".join(line[:cap] for line in block.split(b"\n"))


def _last_lines(chunk: bytes, k: int) -> list[bytes]:
    """The chunk's last ``k`` lines, empty ones included (their count places the others)."""
    end = len(chunk) - 1 if chunk.endswith(b"\n") else len(chunk)
    pos = end
    for _ in range(k):                  # rfind, not rsplit: no copy of the rest of the chunk
        pos = chunk.rfind(b"\n", 0, pos)
        if pos < 0:
            break
    return chunk[pos + 1:end].split(b"\n")


def _whole_lines(chunks: Iterable[bytes], cap: int = MAX_LINE + 1) -> Iterator[bytes]:
    """Re-cut arbitrary byte chunks at line ends (the last line may lack its newline).

    A line longer than ``cap`` that spans chunks is kept to its first ``cap`` bytes (the
    reader matches that window and flags the line), so a 50 MiB line costs one pass over
    its bytes and bounded memory; the line count is unchanged."""
    rest = b""
    skipping = False            # inside a line already cut at ``cap``: drop bytes to its end
    for chunk in chunks:
        if not chunk:
            continue
        if skipping:
            nl = chunk.find(b"\n")
            if nl < 0:
                continue
            chunk, skipping = chunk[nl:], False
        data = rest + chunk
        cut = data.rfind(b"\n")
        if cut >= 0:
            yield data[:cut + 1]
            rest = data[cut + 1:]
        else:
            rest = data
        if len(rest) > cap:
            rest, skipping = rest[:cap], True
    if rest:
        yield rest
