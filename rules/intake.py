"""What a user has -> a Bundle: one log file, a folder of logs in any layout, or a bundle.

Contract section 4: ``analyze`` takes a bare log file or a folder without
``workload.json``. Each file's source is sniffed from its content (kernel/syslog,
Fabric Manager, scheduler, else application with pasted kernel lines allowed:
``mixed``); when there is no scheduler record, one is inferred from the lines
(hosts they name, rank -> host, the stamped time window) and every inference is
listed so the diagnosis can say what it assumed.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath

from firstfault.schemas import WorkloadRecord

from .bundle import (
    MAX_WORKLOAD_BYTES, Bundle, BundleFile, _file_chunks, archive_cap_from_env, archive_kind, open_archive, open_bundle, parse_workload,
    read_workload, walk_files,
)
from .errors import BundleError
from .jsonsafe import load_json
from .extract import _whole_lines, source_of
from .prefixes import StampContext, read_head

SNIFF_LINES = 400                  # lines read to decide a file's source
SCAN_LINES = 200_000               # lines read per file to infer hosts, ranks and the window
SCAN_TOTAL = 1_000_000             # ... and over all files (a big folder still starts at once)
MAX_FILES = 10_000
_FALLBACK_ANCHOR = datetime(2024, 1, 1, tzinfo=timezone.utc)   # only for logs whose stamps carry no year

_KERNELISH = re.compile(
    r"^(?:\[\s*\d+\.\d+\]|<\d>\[|\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\]"
    r"|\w{3} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)? \S+ \S+?(?:\[\d+\])?: "
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\S* \S+ \S+?(?:\[\d+\])?: )"
    r"|\bkernel: |\bNVRM: ")
_FM = re.compile(r"^\[\w{3} \d\d \d{4} \d\d:\d\d:\d\d\] \[(?:INFO|ERROR|WARNING|WARN|DEBUG|FATAL)\]")
_SCHED = re.compile(r"^\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?\] (?:_job_complete|sched|_slurm_rpc|job_|JobId=|Batch JobId|error: Nodes)"
                    r"|^\s*LAST SEEN\s+TYPE\s+REASON")
_BINARY = re.compile(rb"[\x00-\x08\x0e-\x1a\x1c-\x1f]")
_SKIP_SUFFIX = (".png", ".jpg", ".jpeg", ".gif", ".pdf", ".gz", ".tgz", ".zip", ".tar", ".bz2", ".xz",
                ".pt", ".pth", ".bin", ".safetensors", ".so", ".pyc")

# Hosts named in the lines themselves (beyond the prefixes read_head knows).
_SLURM_ON = re.compile(r"\*\*\* (?:JOB|STEP) [\w.+]+ ON (?P<host>[A-Za-z0-9][\w.-]*) ")
_TORCHRUN_HOST = re.compile(r"^(?:\s*\[\d{1,7}\]:)?\s*host\s*:\s*(?P<host>[A-Za-z0-9][\w.-]*)\s*$")
_TORCHRUN_RANK = re.compile(r"^(?:\s*\[\d{1,7}\]:)?\s*rank\s*:\s*(?P<rank>\d+) \(local_rank")
_NCCL_INIT = re.compile(r"NCCL INFO comm 0x[0-9a-f]+ rank (?P<rank>\d+) nranks \d+ cudaDev \d+")
_NCCL_BOOT = re.compile(r"NCCL INFO (?:Bootstrap : Using|NET/Socket : Using|NET/IB : Using) .{0,256}?\b(?:\w+):(?P<ip>\d+\.\d+\.\d+\.\d+)")
# A shell prompt the user pasted with the output: "root@node1:~# dmesg -T", "(venv) user@gpu-3:~/x$ ..."
_PROMPT = re.compile(r"^(?:\([\w.-]+\) )?[\w.-]+@(?P<host>[A-Za-z][\w.-]*):\S*[#$] ")
_NOT_HOSTS = {"localhost", "kernel", "user", "root", "unknown", "(none)", "none"}


@dataclass
class Intake:
    bundle: Bundle
    inferred: list[dict] = field(default_factory=list)     # missing_evidence entries of kind "workload"
    warnings: list[str] = field(default_factory=list)     # files skipped, and why
    host_origin: dict[str, str] = field(default_factory=dict)
    ip_hosts: dict[str, str] = field(default_factory=dict)

    def facts(self) -> dict:
        """What the diagnosis should know of the inferences (it lands in the inventory)."""
        out: dict = {}
        if self.inferred:
            out["inferred"] = self.inferred
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
    if sum(1 for ln in body if _KERNELISH.search(ln)) >= 0.6 * n:
        return "syslog"
    return "mixed"


def _head_lines(path: Path, limit: int) -> tuple[list[str], bool]:
    """The first ``limit`` lines (decoded leniently) and whether the file looks binary."""
    with path.open("rb") as fh:
        blob = fh.read(256 * 1024)
    if b"\x00" in blob[:8192] or len(_BINARY.findall(blob[:8192])) > 32:
        return [], True
    return blob.decode("utf-8", "replace").splitlines()[:limit], False


def open_input(path: str | Path, max_archive_bytes: int | None = None) -> Intake:
    """Any input a user has -> an Intake (a bundle, plus what was inferred to build it).

    ``max_archive_bytes`` caps an archive's expansion (default: FIRSTFAULT_MAX_ARCHIVE_BYTES or 1 GiB).
    """
    p = Path(path)
    if not p.exists():
        raise BundleError(f"no such file or folder: {p}")
    if p.is_file() and archive_kind(p) is not None:
        return _from_archive(p, max_archive_bytes)
    if p.is_dir() and (p / "workload.json").is_file() and _contract_only(p) and not _partial_record(p):
        return Intake(bundle=open_bundle(p))
    if p.is_file():
        files = [(p.name, p)]
        root_name = p.stem or p.name
    elif p.is_dir():
        # Iterative and bounded (depth, count): a hostile tree is a BundleError, not a RecursionError.
        files = [(f.relative_to(p).as_posix(), f) for f in walk_files(p, limit=MAX_FILES)]
        root_name = p.name
    else:
        raise BundleError(f"{p} is neither a file nor a folder")
    return _assemble(files, root_name, p if p.is_dir() else None)


def _contract_only(root: Path) -> bool:
    """Does every log sit where the contract puts it? Then the bundle needs no sniffing
    (other JSON, Markdown and binary files beside it are not evidence, as before)."""
    for f in walk_files(root):
        rel = f.relative_to(root).as_posix()
        if any(part.startswith(".") for part in PurePosixPath(rel).parts) or source_of(rel) is not None:
            continue
        if rel.lower().endswith((".json", ".md") + _SKIP_SUFFIX):
            continue
        return False
    return True


def _from_archive(p: Path, max_bytes: int | None) -> Intake:
    # Read from the path, never whole into memory; one cap for any member and for all together.
    cap = archive_cap_from_env() if max_bytes is None else max_bytes
    kind = archive_kind(p) or "tar"
    return Intake(bundle=open_archive(p, kind, str(p), max_member=cap, max_total=cap))


def _assemble(files: list[tuple[str, Path]], root_name: str, root: Path | None) -> Intake:
    warnings: list[str] = []
    workload_path = root / "workload.json" if root is not None else None
    partial = _partial_record(root) if root is not None else None
    workload = None
    if workload_path is not None and workload_path.is_file() and partial is None:
        workload = read_workload(workload_path)
    chosen: list[BundleFile] = []
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
        head, binary = _head_lines(f, SNIFF_LINES)
        if binary:
            warnings.append(f"skipped {rel}: binary content")
            continue
        if not head:
            warnings.append(f"skipped {rel}: empty")
            continue
        chosen.append(BundleFile(path=rel, size=f.stat().st_size, open_chunks=_file_chunks(f),
                                 source=src or sniff(head)))
    chosen.sort(key=lambda b: b.path)
    if not chosen:
        raise BundleError(f"{root_name}: no log file to read" + (f" ({'; '.join(warnings)})" if warnings else ""))
    intake = Intake(bundle=Bundle(workload=workload or _placeholder(root_name), files=chosen), warnings=warnings)
    facts = _scan_facts(chosen, workload)
    intake.ip_hosts = facts.ip_hosts
    if workload is None:
        intake.bundle.workload, intake.inferred, intake.host_origin = _infer_workload(root_name, facts, partial)
    else:
        intake.host_origin = {h: how for h, how in facts.host_origin.items() if h in workload.nodes}
    return intake


def _placeholder(name: str) -> WorkloadRecord:
    return WorkloadRecord(workload_id=name[:256] or "input", state="UNKNOWN", scheduler="unknown",
                          start_time=_FALLBACK_ANCHOR)


@dataclass
class _Facts:
    hosts: Counter = field(default_factory=Counter)
    host_origin: dict[str, str] = field(default_factory=dict)
    ranks: dict[int, str] = field(default_factory=dict)
    ip_hosts: dict[str, str] = field(default_factory=dict)
    first: datetime | None = None
    last: datetime | None = None
    anchor: datetime | None = None


def _note_host(facts: _Facts, host: str | None, how: str) -> str | None:
    if not host or host.lower() in _NOT_HOSTS or host.isdigit() or len(host) > 128:
        return None
    facts.hosts[host] += 1
    facts.host_origin.setdefault(host, how)
    return host


def _scan_facts(files: list[BundleFile], workload: WorkloadRecord | None) -> _Facts:
    """One pass over the logs: hosts they name, rank -> host, the stamped window, IP -> host."""
    facts = _Facts()
    # Year-less stamps take the year nearest an anchor: the record's start, else the first
    # stamp that carries a year, else a fixed date (order is all that matters then).
    anchor = workload.start_time if workload else None
    pending: list[tuple[str, str]] = []
    budget = SCAN_TOTAL
    for bf in files:
        if bf.source == "metrics" or source_of(bf.path) == "metrics" or budget <= 0:
            continue
        n = 0
        for chunk in _whole_lines(bf.open_chunks()):
            for raw in chunk.split(b"\n"):
                n += 1
                if n > SCAN_LINES:
                    break
                pending.append((bf.source or source_of(bf.path) or "app", raw[:4096].decode("utf-8", "replace")))
            if n > SCAN_LINES:
                break
        if anchor is None:
            for _src, text in pending:
                h = read_head(text, StampContext(zone=timezone.utc, anchor=_FALLBACK_ANCHOR))
                if h.stamp is not None and h.quality == "exact":
                    anchor = h.stamp
                    break
        _read_lines(facts, pending, anchor or _FALLBACK_ANCHOR)
        budget -= len(pending)
        pending = []
    facts.anchor = anchor
    return facts


def _read_lines(facts: _Facts, lines: list[tuple[str, str]], anchor: datetime) -> None:
    ctx = StampContext(zone=timezone.utc, anchor=anchor)
    block_rank: int | None = None
    for src, text in lines:
        head = read_head(text, ctx)
        if head.stamp is not None and head.quality in ("exact", "no_year"):
            facts.first = head.stamp if facts.first is None else min(facts.first, head.stamp)
            facts.last = head.stamp if facts.last is None else max(facts.last, head.stamp)
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
        raw = load_json(path.read_bytes(), "workload.json")
    except (BundleError, OSError):
        return None                        # parse_workload says what is wrong with it
    if not isinstance(raw, dict) or all(raw.get(k) not in (None, "") for k in REQUIRED):
        return None
    return raw


def _short_names(facts: _Facts) -> None:
    """'gpu187.cluster.local' and 'gpu187' in one log are one host: keep the short name."""
    for name in sorted(facts.hosts):
        short = name.split(".")[0]
        if short != name and short in facts.hosts and not name.replace(".", "").isdigit():
            facts.hosts[short] += facts.hosts.pop(name)
            facts.ranks = {r: (short if h == name else h) for r, h in facts.ranks.items()}
            facts.ip_hosts = {ip: (short if h == name else h) for ip, h in facts.ip_hosts.items()}


def _infer_workload(name: str, facts: _Facts, partial: dict | None = None) -> tuple[WorkloadRecord, list[dict], dict[str, str]]:
    given = {k: v for k, v in (partial or {}).items() if v not in (None, "")}
    _short_names(facts)
    hosts = sorted(facts.hosts)
    record = {"workload_id": name[:256] or "input", "state": "UNKNOWN", "scheduler": "unknown",
              "start_time": facts.first or facts.anchor or _FALLBACK_ANCHOR, "end_time": facts.last,
              "nodes": hosts, "ranks": {r: h for r, h in sorted(facts.ranks.items()) if h in facts.hosts}}
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
    notes = [{"kind": "workload", "hosts": hosts, "ranks": sorted(wl.ranks),
              "detail": head + ("state unknown; " if "state" not in given else "")
                        + ("nodes from workload.json" if "nodes" in given else
                           f"nodes inferred from the lines ({how})" if hosts else "no host named in the lines (one unnamed node assumed)")
                        + ("; time window from the first and last stamped lines" if facts.first else "; no stamped line: order from line positions only")
                        + (f"; rank to host for {len(wl.ranks)} ranks from NCCL init / torchrun lines" if wl.ranks else "")}]
    return wl, notes, {h: facts.host_origin[h] for h in hosts if h in facts.host_origin}
