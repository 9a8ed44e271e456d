"""What a user has -> a Bundle: one log file, a folder of logs in any layout, or a bundle.

Contract section 4: ``analyze`` takes a bare log file or a folder without
``workload.json``. Each file's source is sniffed from its content (kernel/syslog,
Fabric Manager, scheduler, else application with pasted kernel lines allowed:
``mixed``; a kernel log with one application line in it is ``mixed`` too, so the
lines are read as they would be under ``logs/app/`` of a bundle); when there is no
scheduler record, or it names no nodes, what it lacks is inferred from the lines
(hosts they name, rank -> host, the stamped time window, the year of stamps that
carry none) and every inference is listed so the diagnosis can say what it assumed.
Bare = folder = bundle: the same lines give the same diagnosis however they come
(``bench/accuracy.py --shapes-must-agree``).
"""
from __future__ import annotations

import re
import shutil
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone, tzinfo
from pathlib import Path, PurePosixPath
from zoneinfo import ZoneInfo

from firstfault.schemas import WorkloadRecord

from .bundle import (
    CHUNK, MAX_WORKLOAD_BYTES, Bundle, BundleFile, _file_chunks, archive_cap_from_env, archive_kind, compressed_log, gunzipped,
    extract_archive, gzip_size, is_hidden, log_name, open_bundle, parse_workload, read_workload,
    read_workload_bytes, walk_files,
)
from .errors import BundleError
from .jsonsafe import load_json
from .extract import _whole_lines, source_of
from .prefixes import StampContext, read_head, plain
from .stamps import MONTHS, parse_iso, parse_rfc1123z, plausible, with_year

SNIFF_LINES = 400                  # lines read to decide a file's source
SCAN_LINES = 200_000               # lines read per file to infer hosts, ranks and the window
SCAN_TOTAL = 1_000_000             # ... and over all files (a big folder still starts at once)
MAX_FILES = 10_000
# Year-less stamps (syslog "Nov  2 10:03:11", glog "E1203 00:00:07.812004") take their year from,
# in order: full dates in the same file, full dates in the input's other files, workload.json's
# start_time, the file's modification time (a guess the diagnosis names), the day of the analysis
# (a guess too). Never a fixed date.
MTIME_LAG = timedelta(days=180)    # a log is written before its mtime: stamps within a year before it (2 days' slack)
# Read a year-less stamp once with any anchor to learn its month, day and time; its year comes later.
# (A leap year in range: "Feb 29" is a date.)
_PROBE = datetime(2024, 7, 1, tzinfo=timezone.utc)

_KERNELISH = re.compile(
    r"^(?:\[\s*\d+\.\d+\]|<\d>\[|\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) \w{3} [ \d]?\d \d\d:\d\d:\d\d \d{4}\]"
    r"|[\w.:-]+: kern:\s+\w+: \["
    r"|\w{3} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)? \S+ \S+?(?:\[\d+\])?: "
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\S* \S+ \S+?(?:\[\d+\])?: )"
    r"|\bkernel: |\bNVRM: ")
_FM = re.compile(r"^\[\w{3} \d\d \d{4} \d\d:\d\d:\d\d\] \[(?:INFO|ERROR|WARNING|WARN|DEBUG|FATAL)\]")
_SCHED = re.compile(r"^\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?\] (?:_job_complete|sched|_slurm_rpc|job_|JobId=|Batch JobId|error: Nodes)"
                    r"|^\s*LAST SEEN\s+TYPE\s+REASON")
_BINARY = re.compile(rb"[\x00-\x08\x0e-\x1a\x1c-\x1f]")
# A gzipped log (syslog.2.gz, nvidia-bug-report.log.gz) is read as it expands; an archive inside a folder is not.
_SKIP_SUFFIX = (".png", ".jpg", ".jpeg", ".gif", ".pdf", ".tar.gz", ".tgz", ".zip", ".tar", ".bz2", ".xz",
                ".pt", ".pth", ".bin", ".safetensors", ".so", ".pyc")

# Hosts named in the lines themselves (beyond the prefixes read_head knows).
_SLURM_ON = re.compile(r"\*\*\* (?:JOB|STEP) [\w.+]+ ON (?P<host>[A-Za-z0-9][\w.-]*) ")
_TORCHRUN_HOST = re.compile(r"^(?:\s*\[\d{1,7}\]:)?\s*host\s*:\s*(?P<host>[A-Za-z0-9][\w.-]*)\s*$")
_TORCHRUN_RANK = re.compile(r"^(?:\s*\[\d{1,7}\]:)?\s*rank\s*:\s*(?P<rank>\d+) \(local_rank")
_NCCL_INIT = re.compile(r"NCCL INFO comm 0x[0-9a-f]+ rank (?P<rank>\d+) nranks \d+ cudaDev \d+")
_NCCL_BOOT = re.compile(r"NCCL INFO (?:Bootstrap : Using|NET/Socket : Using|NET/IB : Using) .{0,256}?\b(?:\w+):(?P<ip>\d+\.\d+\.\d+\.\d+)")
# A shell prompt the user pasted with the output: "root@node1:~# dmesg -T", "(venv) user@gpu-3:~/x$ ..."
_PROMPT = re.compile(r"^(?:\([\w.-]+\) )?[\w.-]+@(?P<host>[A-Za-z][\w.-]*):\S*[#$] ")
# kubectl describe pod (kubernetes/kubectl pkg/describe/describe.go describePod): "Name:\t<pod>" opens the
# report, "Node:\t<nodeName>/<hostIP>" names where the pod ran (the catalog's k8s.describe_name and
# k8s.describe_node read the same lines for the extraction; here they give the inventory its nodes and pods).
_DESCRIBE_NAME = re.compile(r"^Name:\s+(?P<name>[a-z0-9][a-z0-9.-]*)\s*$")
_DESCRIBE_NODE = re.compile(r"^Node:\s+(?P<node>[A-Za-z0-9][\w.-]*)/[0-9A-Fa-f.:]*\s*$")
_NOT_HOSTS = {"localhost", "kernel", "user", "root", "unknown", "(none)", "none"}
# What a user pastes with kernel lines that is not the application's: "...", "[...]", journalctl's
# "-- Boot 5c1b... --" and "-- Logs begin at ... --" markers.
_NOT_CONSOLE = re.compile(r"^\s*(?:\[?(?:\.{3}|…|snip|snipped)\]?|-- .* --|-- (?:Logs|Journal) begin.*|-- No entries --)\s*$")
# A year-less stamp as written, for the note that names its guessed year.
_YEARLESS = re.compile(r"\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ \d]\d \d\d:\d\d:\d\d"
                       r"|\b[EWIF]\d{3,4} \d\d:\d\d:\d\d|\b\d\d-\d\d \d\d:\d\d:\d\d")
# Dates with a year that are not a line's stamp prefix: slurmstepd's "CANCELLED AT 2026-12-03T00:00:07",
# `date`'s "Wed Dec  2 22:00:04 UTC 2026", a checkpoint's "saved at 2026-12-02 22:00:04". They give the year of
# the file's year-less stamps (never the window: a date a message mentions is not when it was written).
_DATED_SOURCE = (
    r"(?<![\d.:-])(?P<iso>(?:19|20)\d\d-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])[T ](?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d)(?![\d:])"
    r"|\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) (?P<day>[ \d]?\d) "
    r"(?P<hms>\d\d:\d\d:\d\d)(?: [A-Z]{2,5})? (?P<year>(?:19|20)\d\d)\b"
    # kubectl describe's times (Go's RFC1123Z): "Start Time:  Fri, 15 Sep 2023 09:40:02 +0200"
    r"|\b(?P<rfc>(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) "
    r"(?:19|20)\d\d \d\d:\d\d:\d\d [+-]\d{4})(?!\d)")
_DATED: re.Pattern[str] | None = None     # compiled at its first use (a file with unstamped lines): not at start-up
_DATED_HINT = re.compile(r"(?:19|20)\d\d")      # cheap test before _DATED


@dataclass
class Intake:
    """An input read: its bundle, what was inferred of the workload and the files skipped."""

    bundle: Bundle
    inferred: list[dict] = field(default_factory=list)     # missing_evidence entries of kind "workload"
    warnings: list[str] = field(default_factory=list)     # files skipped, and why
    host_origin: dict[str, str] = field(default_factory=dict)
    ip_hosts: dict[str, str] = field(default_factory=dict)
    window_given: bool = False            # only the nodes were inferred: the record's own window stands
    year_anchors: dict[str, datetime] = field(default_factory=dict)   # see _Facts.year_anchors (Extractor reads them)

    def facts(self) -> dict:
        """What the diagnosis should know of the inferences (it lands in the inventory)."""
        out: dict = {}
        if self.inferred:
            out["inferred"] = self.inferred
            if self.window_given:
                out["window_given"] = True
        if self.host_origin:
            out["host_origin"] = dict(sorted(self.host_origin.items()))
        if self.ip_hosts:
            out["ip_hosts"] = dict(sorted(self.ip_hosts.items()))
        return out


def sniff(lines: list[str]) -> str:
    """A file's source from its first lines: syslog, fabricmanager, scheduler, else mixed."""
    body = [ln for ln in lines if ln.strip()]
    if not body:
        return "mixed"
    n = len(body)
    if sum(1 for ln in body if _FM.match(ln)) >= 0.6 * n:
        return "fabricmanager"
    if sum(1 for ln in body if _SCHED.search(ln)) >= 0.5 * n:
        return "scheduler"
    # A kernel log, unless a line of it is the application's: a file sniffed "syslog" is read with
    # the kernel's patterns only, so one console line among dmesg lines (a DataLoader's "bus error
    # ... insufficient shared memory") makes it "mixed", read as under logs/app/ of a bundle.
    # The shell prompt pasted with them and elisions are neither.
    kernel = sum(1 for ln in body if _KERNELISH.search(ln))
    if kernel and not any(not _KERNELISH.search(ln) and _console(ln) for ln in body):
        return "syslog"
    return "mixed"



def _console(line: str) -> bool:
    """Is this line of a kernel log an application's line (not a prompt, not an elision)?"""
    return any(c.isalpha() for c in line) and not _PROMPT.match(line) and not _NOT_CONSOLE.match(line)


HEAD_BYTES = 256 * 1024            # what is read of a file to tell its kind


def _opener(f: Path, rel: str, cap: int, piece: int = CHUNK) -> Callable[[], Iterator[bytes]]:
    """A file's bytes in pieces of ``piece``; a gzipped log's as it expands (at most ``cap``)."""
    raw = _file_chunks(f, piece)
    return gunzipped(raw, rel, cap, piece) if compressed_log(rel) else raw


def _head_lines(opener: Callable[[], Iterator[bytes]], limit: int) -> tuple[list[str], bool]:
    """The first ``limit`` lines (decoded leniently) of the first HEAD_BYTES, and whether the file
    looks binary."""
    blob = b""
    chunks = opener()
    try:
        for chunk in chunks:
            blob += chunk[:HEAD_BYTES - len(blob)]
            if len(blob) >= HEAD_BYTES:
                break
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()                         # the file is closed now, not when the generator is collected
    if b"\x00" in blob[:8192] or len(_BINARY.findall(blob[:8192])) > 32:
        return [], True
    return [plain(line) for line in blob.decode("utf-8", "replace").splitlines()[:limit]], False


def _blank(opener: Callable[[], Iterator[bytes]]) -> bool:
    """Nothing but whitespace in the whole file (read in pieces: only a file blank at the top gets here)."""
    return not any(piece.strip() for piece in opener())


def open_input(path: str | Path, max_archive_bytes: int | None = None) -> Intake:
    """Any input a user has -> an Intake (a bundle, plus what was inferred to build it).

    ``max_archive_bytes`` caps an archive's expansion (default: FIRSTFAULT_MAX_ARCHIVE_BYTES or 1 GiB).
    """
    p = Path(path)
    if not p.exists():
        raise BundleError(f"no such file or folder: {p}")
    if p.is_file() and archive_kind(p) is not None:
        return _with_nodes(_from_archive(p, max_archive_bytes))
    return _from_path(p, max_archive_bytes)


def _from_path(p: Path, max_archive_bytes: int | None, root_name: str | None = None) -> Intake:
    """A bundle folder, a folder of logs in any layout, or one log file (``root_name``: the name the
    workload is known by when the folder's own is not it)."""
    if p.is_dir() and (p / "workload.json").is_file() and _contract_only(p) and not _partial_record(p):
        return _with_nodes(Intake(bundle=open_bundle(p, max_archive_bytes)))
    if p.is_file():
        files = [(p.name, p)]
        root_name = PurePosixPath(log_name(p.name)).stem or p.name
    elif p.is_dir():
        # Iterative and bounded (depth, count): a hostile tree is a BundleError, not a RecursionError.
        files = [(f.relative_to(p).as_posix(), f) for f in walk_files(p, limit=MAX_FILES)]
        root_name = root_name or p.name
    else:
        raise BundleError(f"{p} is neither a file nor a folder")
    cap = archive_cap_from_env() if max_archive_bytes is None else max_archive_bytes
    return _assemble(files, root_name, p if p.is_dir() else None, cap)


def _contract_only(root: Path) -> bool:
    """Does every log sit where the contract puts it? Then the bundle needs no sniffing
    (other JSON, Markdown and binary files beside it are not evidence, as before)."""
    for f in walk_files(root):
        rel = f.relative_to(root).as_posix()
        if is_hidden(PurePosixPath(rel).parts) or source_of(rel) is not None:
            continue
        if rel.lower().endswith((".json", ".md") + _SKIP_SUFFIX):
            continue
        return False
    return True


def _from_archive(p: Path, max_bytes: int | None) -> Intake:
    """An archive read as the folder it was made from: a bundle (its layout at the top or under one
    folder), a folder of logs in any layout, or one log, as ``open_input`` reads each."""
    # Read from the path, never whole into memory; one cap for any member and for all together.
    cap = archive_cap_from_env() if max_bytes is None else max_bytes
    kind = archive_kind(p) or "tar"
    import tempfile         # only for an archive: not at start-up

    tmp = Path(tempfile.mkdtemp(prefix="firstfault-archive-"))
    try:
        extract_archive(p, kind, str(p), tmp, max_member=cap, max_total=cap)
        top = sorted(tmp.iterdir())
        root = top[0] if len(top) == 1 and top[0].is_dir() else tmp
        intake = _from_path(root, max_bytes, root_name=root.name if root != tmp else _archive_stem(p.name))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    weakref.finalize(intake.bundle, shutil.rmtree, str(tmp), True)     # the files live as long as the bundle
    return intake


_ARCHIVE_SUFFIX = re.compile(r"\.(?:tar(?:\.(?:gz|bz2|xz|zst))?|tgz|tbz2?|txz|zip)$", re.IGNORECASE)


def _archive_stem(name: str) -> str:
    """logs-4711.tar.gz -> logs-4711: the workload's name when the archive holds loose files."""
    return _ARCHIVE_SUFFIX.sub("", name) or name


def _assemble(files: list[tuple[str, Path]], root_name: str, root: Path | None, cap: int) -> Intake:
    """``cap``: how far a gzipped log may expand."""
    warnings: list[str] = []
    workload_path = root / "workload.json" if root is not None else None
    partial = _partial_record(root) if root is not None else None
    workload = None
    if workload_path is not None and workload_path.is_file() and partial is None:
        workload = read_workload(workload_path)
    chosen: list[BundleFile] = []
    mtimes: dict[str, float] = {}
    for rel, f in files:
        if rel == "workload.json":
            continue
        src = source_of(rel)
        if src == "metrics":
            chosen.append(BundleFile(path=rel, size=f.stat().st_size, open_chunks=_file_chunks(f)))
            continue
        low = rel.lower()
        if low.endswith(_SKIP_SUFFIX):
            warnings.append(f"skipped {rel}: not a text log ({PurePosixPath(rel).suffix})")
            continue
        if low.endswith(".json") and src is None:
            warnings.append(f"skipped {rel}: a JSON file that is not workload.json")
            continue
        head, binary = _head_lines(_opener(f, rel, cap, HEAD_BYTES), SNIFF_LINES)
        if binary:
            warnings.append(f"skipped {rel}: binary content")
            continue
        if not any(line.strip() for line in head) and _blank(_opener(f, rel, cap, 1 << 20)):
            warnings.append(f"skipped {rel}: empty")
            continue
        st = f.stat()
        mtimes[rel] = st.st_mtime
        chosen.append(BundleFile(path=rel, size=gzip_size(f) if compressed_log(rel) else st.st_size,
                                 open_chunks=_opener(f, rel, cap), source=src or sniff(head)))
    chosen.sort(key=lambda b: b.path)
    if not chosen:
        raise BundleError(f"{root_name}: no log file to read" + (f" ({'; '.join(warnings)})" if warnings else ""))
    zone = workload.zone if workload is not None else _given_zone(partial)
    given_start = workload.start_time if workload is not None else _given_start(partial, zone)
    facts = _scan_facts(chosen, given_start, mtimes, zone)
    if workload is None:
        workload, inferred, host_origin = _infer_workload(root_name, facts, partial)
    else:
        inferred, host_origin = [], {h: how for h, how in facts.host_origin.items() if h in workload.nodes}
    intake = Intake(bundle=Bundle(workload=workload, files=chosen), inferred=inferred, warnings=warnings,
                    host_origin=host_origin, ip_hosts=facts.ip_hosts, year_anchors=facts.year_anchors)
    return _with_nodes(intake, facts) if not inferred else intake


def _with_nodes(intake: Intake, facts: _Facts | None = None) -> Intake:
    """A complete record that names no nodes (users write such records) takes them from the lines,
    as a bare file does, and says so; its own window stands. Any other record is read as it is."""
    wl = intake.bundle.workload
    if wl.nodes or intake.inferred:
        return intake
    if facts is None:
        facts = _scan_facts(intake.bundle.files, wl.start_time, zone=wl.zone)
    _short_names(facts)
    intake.year_anchors = intake.year_anchors or facts.year_anchors
    hosts = sorted(facts.hosts)
    if not hosts:
        return intake                       # nothing to infer: the record as it is
    ranks = dict(wl.ranks) or {r: h for r, h in sorted(facts.ranks.items()) if h in facts.hosts}
    pods = dict(wl.pods) or {p: h for p, h in sorted(facts.pods.items()) if h in facts.hosts}
    try:
        filled = parse_workload({**wl.model_dump(), "nodes": hosts, "ranks": ranks, "pods": pods})
    except BundleError:
        return intake                       # e.g. more GPUs than a record may have: as it is
    how = "; ".join(f"{h} from {facts.host_origin[h]}" for h in hosts if h in facts.host_origin)
    note = {"kind": "workload", "hosts": hosts, "ranks": sorted(filled.ranks),
            "detail": f"workload.json names no nodes: nodes inferred from the lines ({how})"
                      + (f"; rank to host for {len(filled.ranks)} ranks from NCCL init / torchrun lines"
                         if filled.ranks and not wl.ranks else "")}
    intake.bundle.workload = filled
    intake.inferred = [note]
    intake.window_given = True
    intake.host_origin = {h: facts.host_origin[h] for h in hosts if h in facts.host_origin}
    intake.ip_hosts = intake.ip_hosts or facts.ip_hosts
    return intake


def _given_start(partial: dict | None, zone: tzinfo) -> datetime | None:
    """A partial record's start_time, when it has a readable one (the year of year-less stamps)."""
    value = (partial or {}).get("start_time")
    if not isinstance(value, str):
        return None
    return parse_iso(value, zone)


def _given_zone(partial: dict | None) -> tzinfo:
    """A partial record's time zone, when it names a known one: zone-less stamps are read in it,
    here as the extraction reads them (else the window read here is hours off theirs)."""
    value = (partial or {}).get("timezone")
    if isinstance(value, str) and value:
        try:
            return ZoneInfo(value)
        except (ValueError, OSError, KeyError):     # ZoneInfoNotFoundError is a KeyError
            pass
    return timezone.utc


@dataclass
class _FileTimes:
    """What one file's stamps say of time: full stamps, and the year-less ones (month, day, time)."""
    path: str
    mtime: float | None = None
    own: datetime | None = None            # the first full date in the file (a stamp, else one a line states)
    first: datetime | None = None          # earliest and latest full stamp prefixes
    last: datetime | None = None
    yearless: dict[tuple[int, int], list[tuple[int, int, int, int]]] = field(default_factory=dict)   # (mo, dd) -> [min, max]
    sample: str = ""                       # one year-less stamp as written (for the note)

    def note_full(self, stamp: datetime, prefix: bool) -> None:
        if self.own is None:
            self.own = stamp
        if prefix:
            self.first = stamp if self.first is None else min(self.first, stamp)
            self.last = stamp if self.last is None else max(self.last, stamp)

    def note_yearless(self, stamp: datetime, text: str) -> None:
        key = (stamp.month, stamp.day)
        hms = (stamp.hour, stamp.minute, stamp.second, stamp.microsecond)
        span = self.yearless.get(key)
        if span is None:
            self.yearless[key] = [hms, hms]
        else:
            span[0], span[1] = min(span[0], hms), max(span[1], hms)
        if not self.sample:
            m = _YEARLESS.search(text, 0, 200)
            self.sample = m.group(0) if m else text[:24].strip()


@dataclass
class _Facts:
    """What the lines of a bare input say of its workload: hosts, ranks, pods and their origins."""

    hosts: Counter = field(default_factory=Counter)
    host_origin: dict[str, str] = field(default_factory=dict)
    ranks: dict[int, str] = field(default_factory=dict)
    ip_hosts: dict[str, str] = field(default_factory=dict)
    pods: dict[str, str] = field(default_factory=dict)     # pod -> node (kubectl describe pod)
    first: datetime | None = None
    last: datetime | None = None
    dated: datetime | None = None          # the earliest full date any line states (no stamp prefix at all)
    guessed: list[dict] = field(default_factory=list)   # year-less stamps whose year is a guess (mtime, today)
    # path -> the instant its year-less stamps are read nearest to, where the lines decide it (their
    # own full stamps, else another file's): contract section 2's order, ahead of workload.json
    year_anchors: dict[str, datetime] = field(default_factory=dict)

    def undated_start(self) -> datetime:
        """A start for an input whose lines hold no date at all: nothing is placed by it, so it is a
        constant (the same lines give the same diagnosis_id whenever and wherever the file was written)."""
        return _PROBE


def _note_host(facts: _Facts, host: str | None, how: str) -> str | None:
    if not host or host.lower() in _NOT_HOSTS or host.isdigit() or len(host) > 128:
        return None
    facts.hosts[host] += 1
    facts.host_origin.setdefault(host, how)
    return host


def _scan_facts(files: list[BundleFile], start: datetime | None, mtimes: dict[str, float] | None = None,
                zone: tzinfo = timezone.utc) -> _Facts:
    """One pass over the logs: hosts they name, rank -> host, the stamped window, IP -> host.

    ``start``: the record's start_time when there is one; ``zone``: its time zone (stamps without
    one are read in it). Each file's year-less stamps get their year after every file is read
    (see ``_year_anchor``), so neither the files' order nor their layout changes it."""
    facts = _Facts()
    times: list[_FileTimes] = []
    budget = SCAN_TOTAL
    for bf in files:
        if bf.source == "metrics" or source_of(bf.path) == "metrics" or budget <= 0:
            continue
        pending: list[tuple[str, str]] = []
        n = 0
        for chunk in _whole_lines(bf.open_chunks()):
            for raw in chunk.split(b"\n"):
                n += 1
                if n > SCAN_LINES:
                    break
                pending.append((bf.source or source_of(bf.path) or "app", plain(raw[:4096].decode("utf-8", "replace"))))
            if n > SCAN_LINES:
                break
        ft = _FileTimes(path=bf.path, mtime=(mtimes or {}).get(bf.path))
        _read_lines(facts, pending, ft, zone)
        times.append(ft)
        budget -= len(pending)
    _place_years(facts, times, start, zone)
    return facts


def _year_anchor(ft: _FileTimes, times: list[_FileTimes], start: datetime | None) -> tuple[datetime, str]:
    """The instant a file's year-less stamps are read nearest to, and where it came from."""
    if ft.own is not None:
        return ft.own, "file"
    others = [t.own for t in times if t is not ft and t.own is not None]
    if others:
        return min(others), "other files"
    if start is not None:
        return start, "workload.json"
    when = _plausible_mtime(ft.mtime)
    if when is not None:
        return when - MTIME_LAG, "mtime"
    return datetime.now(timezone.utc) - MTIME_LAG, "today"


def _plausible_mtime(mtime: float | None) -> datetime | None:
    """A modification time that can date a log: after 1990 and not in the future (an archive
    member without one reads as 1970; a clock far ahead is no evidence either)."""
    if mtime is None:
        return None
    try:
        when = datetime.fromtimestamp(mtime, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        return None
    if when.year < 1990 or when > datetime.now(timezone.utc) + timedelta(days=2):
        return None
    return when


def _place_years(facts: _Facts, times: list[_FileTimes], start: datetime | None, zone: tzinfo) -> None:
    """Year-less stamps get the year nearest their file's anchor; the window spans every stamp."""
    stamps = [t for ft in times for t in (ft.first, ft.last) if t is not None]
    for ft in times:
        if not ft.yearless:
            continue
        anchor, basis = _year_anchor(ft, times, start)
        if basis in ("file", "other files"):
            facts.year_anchors[ft.path] = anchor
        years: set[int] = set()
        for (mo, dd), span in ft.yearless.items():
            for hh, mi, ss, us in span:
                stamp = with_year(mo, dd, hh, mi, ss, us, zone, anchor)
                if stamp is not None:
                    stamps.append(stamp)
                    years.add(stamp.year)
        if basis in ("mtime", "today") and years:
            facts.guessed.append({"path": ft.path, "basis": basis, "years": sorted(years), "sample": ft.sample,
                                  "mtime": _plausible_mtime(ft.mtime)})
    if stamps:
        facts.first, facts.last = min(stamps), max(stamps)
    dated = [ft.own for ft in times if ft.own is not None]
    facts.dated = min(dated) if dated else None


def _read_lines(facts: _Facts, lines: list[tuple[str, str]], ft: _FileTimes, zone: tzinfo = timezone.utc) -> None:
    ctx = StampContext(zone=zone, anchor=_PROBE)
    block_rank: int | None = None
    pod: str | None = None                  # the pod a kubectl describe report above is about
    for src, text in lines:
        if text[:5] in ("Name:", "Node:"):
            m = _DESCRIBE_NAME.match(text)
            if m:
                pod = m["name"]
            m = _DESCRIBE_NODE.match(text)
            if m and _note_host(facts, m["node"], "kubectl describe pod's Node: line") and pod:
                facts.pods.setdefault(pod, m["node"])
        head = read_head(text, ctx)
        if head.stamp is not None and head.quality == "exact":
            ft.note_full(head.stamp, prefix=True)
        elif head.stamp is not None and head.quality == "no_year":
            ft.note_yearless(head.stamp.astimezone(zone), text)      # as written: month, day, time
        if ft.own is None and _DATED_HINT.search(text, 0, 512):
            dated = _dated(text[:512], zone)
            if dated is not None:
                ft.note_full(dated, prefix=False)
        host = None
        if head.host:
            host = _note_host(facts, head.host, "NCCL line prefix" if head.dev is not None else "line prefix (syslog header, container or launcher tag)")
        msg = head.message
        m = _PROMPT.match(text)
        if m:
            _note_host(facts, m["host"], "shell prompt")
        m = _SLURM_ON.search(msg)
        if m:
            _note_host(facts, m["host"], "slurmstepd banner")
        m = _TORCHRUN_RANK.match(msg)
        if m:
            block_rank = int(m["rank"])
        m = _TORCHRUN_HOST.match(msg)
        if m:
            h = _note_host(facts, m["host"], "torchrun failure summary")
            if h and block_rank is not None:
                facts.ranks.setdefault(block_rank, h)
            block_rank = None
        if host and head.dev is not None:
            m = _NCCL_INIT.search(msg)
            if m:
                facts.ranks.setdefault(int(m["rank"]), host)
            m = _NCCL_BOOT.search(msg)
            if m:
                facts.ip_hosts.setdefault(m["ip"], host)


def _dated(text: str, zone: tzinfo = timezone.utc) -> datetime | None:
    """The first full date (with its year) a line states anywhere, in UTC (read in ``zone``)."""
    global _DATED
    if _DATED is None:
        _DATED = re.compile(_DATED_SOURCE)
    m = _DATED.search(text)
    if m is None:
        return None
    if m["iso"]:
        return parse_iso(m["iso"], zone)
    if m["rfc"]:
        return parse_rfc1123z(m["rfc"])
    try:
        hh, mi, ss = (int(x) for x in m["hms"].split(":"))
        local = datetime(int(m["year"]), MONTHS[m["mon"]], int(m["day"]), hh, mi, ss, tzinfo=zone)
        return plausible(local.astimezone(timezone.utc))
    except (ValueError, OverflowError):
        return None


REQUIRED = ("workload_id", "state", "start_time")


def _partial_record(root: Path) -> dict | None:
    """A workload.json that is a JSON object but lacks required keys (users write such records):
    its keys are kept and the rest inferred from the lines. None when complete or not an object."""
    path = root / "workload.json"
    if not path.is_file():
        return None
    try:
        if path.stat().st_size > MAX_WORKLOAD_BYTES:
            return None                    # read_workload refuses it, naming the size
        raw = load_json(read_workload_bytes(path), "workload.json")     # a regular file of the bundle's own
    except (BundleError, OSError):
        return None                        # parse_workload says what is wrong with it
    if not isinstance(raw, dict) or all(_given(k, raw.get(k)) for k in REQUIRED):
        return None
    return raw


def _given(key: str, value) -> bool:
    """Does a record's value say something? ``null`` and ``""`` do not, nor an empty list or map
    of an optional key (``"nodes": []``); a required key's wrong type is for the parser to name."""
    if value in (None, ""):
        return False
    return key in REQUIRED or not (isinstance(value, (list, dict)) and not value)


def _short_names(facts: _Facts) -> None:
    """'gpu187.cluster.local' and 'gpu187' in one log are one host: keep the short name."""
    for name in sorted(facts.hosts):
        short = name.split(".")[0]
        if short != name and short in facts.hosts and not name.replace(".", "").isdigit():
            facts.hosts[short] += facts.hosts.pop(name)
            facts.ranks = {r: (short if h == name else h) for r, h in facts.ranks.items()}
            facts.pods = {p: (short if h == name else h) for p, h in facts.pods.items()}
            facts.ip_hosts = {ip: (short if h == name else h) for ip, h in facts.ip_hosts.items()}


def _infer_workload(name: str, facts: _Facts, partial: dict | None = None) -> tuple[WorkloadRecord, list[dict], dict[str, str]]:
    given = {k: v for k, v in (partial or {}).items() if _given(k, v)}
    _short_names(facts)
    hosts = sorted(facts.hosts)
    record = {"workload_id": name[:256] or "input", "state": "UNKNOWN", "scheduler": "unknown",
              "start_time": facts.first or facts.dated or facts.undated_start(),
              "end_time": facts.last,
              "nodes": hosts, "ranks": {r: h for r, h in sorted(facts.ranks.items()) if h in facts.hosts},
              "pods": {p: h for p, h in sorted(facts.pods.items()) if h in facts.hosts}}
    record.update(given)
    origin = "workload.json" if partial is not None else "the inferred workload"
    try:
        wl = parse_workload(record, origin)
    except BundleError:
        if "start_time" in given or "end_time" not in given:
            raise
        record["end_time"] = None          # the record's end is before the first stamped line
        wl = parse_workload(record, origin)
    hosts = list(wl.nodes)
    missing = [k for k in REQUIRED if k not in given]
    how = "; ".join(f"{h} from {facts.host_origin[h]}" for h in hosts if h in facts.host_origin)
    head = (f"workload.json lacks {', '.join(missing)}: inferred from the lines; " if partial is not None
            else "no workload.json: ")
    window = ("; time window from the first and last stamped lines" if facts.first
              else "; no stamped line: the start from the first date a line states, order from line positions"
              if facts.dated else "; no stamped line: order from line positions only")
    notes = [{"kind": "workload", "hosts": hosts, "ranks": sorted(wl.ranks),
              "detail": head + ("state unknown; " if "state" not in given else "")
                        + ("nodes from workload.json" if "nodes" in given else
                           f"nodes inferred from the lines ({how})" if hosts else "no host named in the lines (one unnamed node assumed)")
                        + window
                        + (f"; rank to host for {len(wl.ranks)} ranks from NCCL init / torchrun lines" if wl.ranks else "")
                        + "".join(f"; {note}" for note in _year_notes(facts))}]
    # One entry: diagnosis_id sorts the inventory's lists, and dicts do not sort.
    return wl, notes, {h: facts.host_origin[h] for h in hosts if h in facts.host_origin}


def _year_notes(facts: _Facts) -> list[str]:
    """One sentence per guessed year: which files, the year, and what it was guessed from."""
    groups: dict[tuple[str, tuple[int, ...]], list[dict]] = {}
    for g in facts.guessed:
        groups.setdefault((g["basis"], tuple(g["years"])), []).append(g)
    out = []
    for (basis, years), items in sorted(groups.items()):
        names = [g["path"] for g in items]
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        year = f"{years[0]}-{years[-1]}" if len(years) > 1 else str(years[0])
        if basis == "mtime":
            when = min(g["mtime"] for g in items).strftime("%Y-%m-%d")
            why = f"guessed from the file's modification time ({when})"
        else:
            why = f"guessed from the day of the analysis ({datetime.now(timezone.utc):%Y-%m-%d}): no usable modification time"
        out.append(f"year of the year-less stamps (\"{items[0]['sample']}\") in {shown}: {year}, "
                   f"{why}, as no line of the input has a full date and no workload.json a start_time")
    return out
