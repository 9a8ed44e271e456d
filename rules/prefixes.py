"""Strip the prefixes that collectors and launchers put in front of a message.

``read_head`` peels them off one by one (syslog or journal header, dmesg stamp,
srun label, torchrun/PyTorch rank tags, glog header, NCCL ``host:pid:tid [dev]``, pdsh ``host: ``,
Fabric Manager header, bracketed or bare date-times) and records what they say:
stamp, host, rank, pid, CUDA device. What is left is the message the extraction
patterns read. Pure function of the line and a :class:`StampContext`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, tzinfo

from .stamps import MONTHS, from_uptime, micro_of, parse_iso, with_year

_MON = r"(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"

# RFC 3164: "Nov  2 10:03:11 node-02 kernel: " (host may be missing: "Aug 19 11:38:39  NVRM: ...")
_RFC3164 = re.compile(
    _MON + r" (?P<day>[ \d]\d) (?P<hh>\d\d):(?P<mm>\d\d):(?P<ss>\d\d)(?:\.(?P<frac>\d+))? "
    r"(?:(?P<host>[\w.:-]*[\w.-]) )?(?:(?P<prog>[\w./@-]+)(?:\[(?P<pid>\d{1,10})\])?: )?")
# journal / RFC 5424-ish: "2026-11-02T10:03:11.123456+00:00 node-02 kernel: "
_ISO_HOST = re.compile(
    r"(?P<iso>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?) "
    r"(?P<host>[\w.-]+) (?P<prog>[\w./@-]+)(?:\[(?P<pid>\d{1,10})\])?: ")
# bare ISO (dmesg --time-format iso, python logging "2026-11-02 10:01:00,123 ")
_ISO_BARE = re.compile(
    r"(?P<iso>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)(?: - |:? |$)")
# Open MPI --tag-output "[1,12]<stdout>:" (job, rank), with --timestamp-output a ctime before it
# ("Thu Jun 18 14:28:35 2020[1,2]<stderr>:"), SageMaker's "[1,mpirank:0,algo-1]<stdout>:" (job, rank,
# host) and Horovod's gloo runner "[0]<stdout>:" (rank; horovod/runner/common/util/safe_shell_exec.py).
_MPI_TAG = re.compile(r"(?:[A-Z][a-z]{2} (?P<mon>[A-Z][a-z]{2}) +(?P<day>\d{1,2}) (?P<hh>\d\d):(?P<mm>\d\d):(?P<ss>\d\d) "
                      r"(?P<year>\d{4}))?\[(?:(?P<job>\d{1,10}),(?:mpirank:)?)?(?P<rank>\d{1,7})(?:,(?P<host>[\w.-]{1,64}))?\]"
                      r"<(?:stdout|stderr)>: ?")
# "[gpu187:2]:" host and local rank tags (multi-node launchers that tag each line)
_HOST_RANK = re.compile(r"\[(?P<host>[A-Za-z][\w.-]*):(?P<local>\d{1,5})\]: ?")
# "[2026-11-02 10:01:00,123] " / slurmctld "[2026-11-02T10:21:14.123] " / Hydra "[2026-11-02 10:01:00,123][name][INFO] - "
_ISO_BRACKET = re.compile(
    r"\[(?P<iso>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)\](?::? |(?=\[))")
_DMESG_UPTIME = re.compile(r"\[\s*(?P<up>\d+\.\d+)\] ?")
_DMESG_DELTA = re.compile(r"\[\s*\+\s*\d+\.\d+\] ?")
_DMESG_CTIME = re.compile(
    r"\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) " + _MON +
    r" (?P<day>[ \d]?\d) (?P<hh>\d\d):(?P<mm>\d\d):(?P<ss>\d\d) (?P<year>\d{4})\] ?")   # "Feb 2" as pasted, too
# Fabric Manager: "[Jul 23 2024 07:53:55] [ERROR] [tid 841] "
_FM = re.compile(
    r"\[" + _MON + r" (?P<day>\d\d) (?P<year>\d{4}) (?P<hh>\d\d):(?P<mm>\d\d):(?P<ss>\d\d)\] "
    r"\[(?P<level>[A-Z]+)\] (?:\[tid \d+\] )?")
_SRUN_LABEL = re.compile(r"\s{0,8}(?P<rank>\d{1,7}): ")
_TORCHRUN = re.compile(r"\[default(?P<local>\d{1,5})\]:")
_RANK_TAG = re.compile(r"\[rank(?P<rank>\d{1,7})\]:")
# glog as PyTorch C++ prints it: "[E1102 10:13:12.044871 ProcessGroupNCCL.cpp:632] ",
# with a thread id in some builds, and the old "[E ProcessGroupNCCL.cpp:737] ".
_GLOG_BRACKET = re.compile(
    r"\[(?P<level>[EWIF])(?:(?P<mo>\d{1,2})(?P<dd>\d\d) (?P<hh>\d\d):(?P<mm>\d\d):(?P<ss>\d\d)\.(?P<frac>\d+))?"
    r"(?: \d+)? ?(?P<src>[\w./-]+:\d+)\] ")
# Python/absl glog: "W0726 10:59:50.786825 140538811684672 torch/distributed/.../api.py:858] "
_GLOG_BARE = re.compile(
    r"(?P<level>[EWIF])(?P<mo>\d{1,2})(?P<dd>\d\d) (?P<hh>\d\d):(?P<mm>\d\d):(?P<ss>\d\d)\.(?P<frac>\d+)\s+"
    r"\d+ (?P<src>[\w./-]+:\d+)\] ")
# NCCL: "gpu004:2200689:2200706 [3] "
_NCCL = re.compile(r"(?P<host>[A-Za-z0-9][\w.-]*):(?P<pid>\d{1,10}):(?P<tid>\d{1,10}) \[(?P<dev>\d{1,4})\] ")
# Talos / kmsg forwarders: "192.168.11.119: kern: warning: [2026-04-22T21:25:20.458998481Z]: "
_KMSG_HOST = re.compile(
    r"(?P<host>[\w.:-]+?): (?:kern|user|daemon|auth|syslog):\s+\w+: \[(?P<iso>\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:?\d\d)?)\]: ")
# vLLM's logger: "ERROR 09-09 02:24:28 [multiproc_executor.py:522] "
_VLLM = re.compile(
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<mo>\d\d)-(?P<dd>\d\d) (?P<hh>\d\d):(?P<mm>\d\d):(?P<ss>\d\d)"
    r"(?:\.(?P<frac>\d+))? \[[\w./-]+:\d+\] ")
# Markdown a user wrapped a pasted line in: "> " quotes, "**" bold, "```" fences
_MARKDOWN = re.compile(r"(?:> ?)+|\*\*|`{3,}")     # a single backtick is content (Lightning's `Trainer.fit`)
# docker compose logs: "daskcluster-worker-1     | " (service name, replica number, padding)
_COMPOSE = re.compile(r"(?P<svc>[a-z0-9][\w.-]*[-_]\d+)\s+\| ")
# Ray and vLLM worker tags: "(RayTrainWorker pid=5137, ip=10.128.0.103) ", "(VllmWorker rank=0 pid=104) ",
# "(raylet) ", "(pid=4331) ".
_PROC_TAG = re.compile(r"\((?P<who>[A-Za-z_][\w.:-]*)?(?: ?rank=(?P<rank>\d{1,7}))?(?:,? ?pid=(?P<pid>\d{1,10}))?(?:, ip=(?P<ip>[\d.]+))?(?:, [\w=.-]+)*\)\s")
# grep -H / grep -Hn output a user pasted: "ms-pd-llm-d-modelservice-prefill-2.log:[2025-09-17 15:16:23] ..."
# (the file name only; the host comes from the prefixes after it, never from the name)
# A tqdm progress bar redraws itself with a carriage return and no newline, so the next log line
# lands after it on one line: "epoch 1:  37%|█  | 521/1426 [02:47<04:46,  3.16it/s, loss=0.1][rank0]:[E..."
# ({desc}: {percentage}%|{bar}| {n}/{total} [{elapsed}<{remaining}, {rate}{postfix}], tqdm's default format).
_TQDM = re.compile(r" *(?:[^|\n]{1,120}?: *)?\d{1,3}%\|[^|\n]{0,200}\| *[\d.]+[kMGT]?/(?:[\d.]+[kMGT]?|\?) \[[^\]\n]{0,200}\]")
_GREP_FILE = re.compile(r"(?P<file>[\w.-]{1,200}\.(?:log|out|err|txt))(?::\d{1,9})?:")
# pdsh (DeepSpeed's multi-node runner), mpirun wrappers and nccl-tests put the host first: "c05r2n11: ",
# "worker-1: ", "slurmstepd-falkor7: error: " (pdsh's "%s: %s"). Only as the first thing on the line and
# only a name with a digit in it (or localhost): "RuntimeError: " is a message, "rank3: " a rank.
_PDSH = re.compile(r"(?:slurmstepd-)?(?P<host>(?!(?:rank|step|epoch|iter|iteration|layer)\d+:)"
                   r"(?:[A-Za-z][A-Za-z0-9-]{0,62}\d[A-Za-z0-9-]{0,62}|localhost)(?:\.[A-Za-z0-9-]{1,63}){0,6}): (?=\S)")


@dataclass(frozen=True)
class StampContext:
    zone: tzinfo                   # for stamps without a zone
    anchor: datetime               # UTC; picks the year for year-less stamps
    boot: datetime | None = None   # the file host's boot instant, for dmesg uptime


@dataclass
class Head:
    message: str
    stamp: datetime | None = None
    quality: str = "none"          # see schemas.events.StampQuality
    host: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    pid: int | None = None
    dev: int | None = None
    uptime: float | None = None


def _hms(m: re.Match[str]) -> tuple[int, int, int]:
    return int(m["hh"]), int(m["mm"]), int(m["ss"])


# Which prefix shapes can start with which character: tried in this order.
_BRACKET = ("torchrun", "rank", "dmesg_uptime", "dmesg_delta", "dmesg_ctime", "fm", "iso_bracket", "glog_bracket",
            "mpi_tag", "host_rank")
_DIGIT = ("srun", "iso_host", "iso_bare", "kmsg_host", "compose", "nccl", "grep_file")
_ALPHA = ("rfc3164", "glog_bare", "vllm", "kmsg_host", "compose", "nccl", "grep_file", "pdsh")
_ALPHA_CTIME = ("mpi_tag",) + _ALPHA
_WEEKDAYS = frozenset(("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"))
_REGEX = {
    "srun": _SRUN_LABEL, "torchrun": _TORCHRUN, "rank": _RANK_TAG, "rfc3164": _RFC3164, "iso_host": _ISO_HOST,
    "dmesg_ctime": _DMESG_CTIME, "dmesg_uptime": _DMESG_UPTIME, "dmesg_delta": _DMESG_DELTA, "fm": _FM,
    "iso_bracket": _ISO_BRACKET, "glog_bracket": _GLOG_BRACKET, "glog_bare": _GLOG_BARE, "nccl": _NCCL,
    "iso_bare": _ISO_BARE, "proc_tag": _PROC_TAG, "vllm": _VLLM, "kmsg_host": _KMSG_HOST,
    "mpi_tag": _MPI_TAG, "host_rank": _HOST_RANK, "markdown": _MARKDOWN, "compose": _COMPOSE,
    "grep_file": _GREP_FILE, "tqdm": _TQDM, "pdsh": _PDSH,
}


def _shapes(text: str, bar: bool) -> tuple[str, ...]:
    """The prefix shapes to try on ``text``, by its first character; ``bar``: the line holds a
    progress bar somewhere near its start (checked once a line)."""
    c = text[:1]
    by_char = _FIRST.get(c)
    if by_char is None:
        by_char = _by_first_char(c)
        if len(_FIRST) < 4096:                  # a crafted input's many first characters stay bounded
            _FIRST[c] = by_char
    if by_char is _ALPHA and text[3:4] == " " and text[:3] in _WEEKDAYS:
        by_char = _ALPHA_CTIME                  # mpirun --timestamp-output's "Thu Jun 18 14:28:35 2020[1,2]<stderr>:"
    return _WITH_TQDM[by_char] if bar else by_char


_FIRST: dict[str, tuple[str, ...]] = {}         # first character -> the shapes to try (memo)


def _by_first_char(c: str) -> tuple[str, ...]:
    if c in ">*`":
        return ("markdown",)
    if c == "[":
        return _BRACKET
    if c == "(":
        return ("proc_tag",)
    if c.isdigit() or c == " ":
        return _DIGIT
    if c.isalpha():
        return _ALPHA
    return ()


_WITH_TQDM = {shapes: ("tqdm",) + shapes for shapes in
              (_BRACKET, _DIGIT, _ALPHA, _ALPHA_CTIME, ("markdown",), ("proc_tag",), ())}


def read_head(line: str, ctx: StampContext) -> Head:
    """Peel prefixes off ``line``; at most a dozen rounds, each anchored at the start."""
    head = Head(message=line)
    text = line
    bar = "%|" in line                  # a progress bar may sit before the log line (tried first then)
    for round_ in range(12):
        stripped = text.lstrip(" ") if text[:1] == " " and head.rank is not None else text
        m = None
        for name in _shapes(stripped, bar):
            if name in ("grep_file", "pdsh") and round_:
                continue                       # only as the first thing on the line
            m = _REGEX[name].match(stripped)
            if m is not None and _apply(name, m, head, ctx):
                break
            m = None
        if m is None:
            break
        text = stripped[m.end():]
    head.message = text.lstrip(" ") if text is not line else text
    return head


def _apply(name: str, m: re.Match[str], head: Head, ctx: StampContext) -> bool:
    """Record what prefix ``name`` says; False if it does not apply here (try the next shape)."""
    if name == "srun":
        if head.rank is not None or head.stamp is not None:
            return False
        head.rank = int(m["rank"])
    elif name == "torchrun":
        head.local_rank = int(m["local"])
    elif name == "rank":
        head.rank = int(m["rank"])
    elif name == "rfc3164":
        if head.stamp is None:
            hh, mi, ss = _hms(m)
            head.stamp = with_year(MONTHS[m["mon"]], int(m["day"]), hh, mi, ss, micro_of(m["frac"]), ctx.zone, ctx.anchor)
            head.quality = "no_year"
        if m["pid"] and head.pid is None:
            head.pid = int(m["pid"])
        if m["host"] and m["prog"] and head.host is None and not m["host"].endswith(":"):
            head.host = m["host"]
    elif name in ("iso_host", "iso_bracket", "iso_bare"):
        if head.stamp is None:
            head.stamp = parse_iso(m["iso"], ctx.zone)
            head.quality = "exact" if head.stamp else "none"
        if name == "iso_host" and m["pid"] and head.pid is None:
            head.pid = int(m["pid"])
        if name == "iso_host" and head.host is None:
            head.host = m["host"]
    elif name == "dmesg_ctime":
        if head.stamp is None:
            hh, mi, ss = _hms(m)
            head.stamp = parse_iso(f"{m['year']}-{MONTHS[m['mon']]:02d}-{int(m['day']):02d}T{hh:02d}:{mi:02d}:{ss:02d}", ctx.zone)
            head.quality = "exact" if head.stamp else "none"
    elif name == "dmesg_uptime":
        head.uptime = float(m["up"])
        if head.stamp is None:
            anchored = from_uptime(ctx.boot, head.uptime)
            head.stamp, head.quality = (anchored, "uptime") if anchored else (None, "order_only")
    elif name == "dmesg_delta":
        if head.stamp is None:
            head.quality = "order_only"
    elif name == "fm":
        if head.stamp is None:
            hh, mi, ss = _hms(m)
            head.stamp = parse_iso(f"{m['year']}-{MONTHS[m['mon']]:02d}-{m['day']}T{hh:02d}:{mi:02d}:{ss:02d}", ctx.zone)
            head.quality = "exact" if head.stamp else "none"
    elif name in ("glog_bracket", "glog_bare", "vllm"):
        if head.stamp is None and m["mo"]:
            hh, mi, ss = _hms(m)
            head.stamp = with_year(int(m["mo"]), int(m["dd"]), hh, mi, ss, micro_of(m["frac"]), ctx.zone, ctx.anchor)
            head.quality = "no_year" if head.stamp else "none"
    elif name in ("markdown", "tqdm"):
        pass                                   # decoration, not content
    elif name == "grep_file":
        if head.stamp is not None or head.host is not None or head.rank is not None:
            return False
    elif name == "pdsh":
        head.host = m["host"]
    elif name == "compose":
        head.host = head.host or m["svc"]
    elif name == "mpi_tag":
        if m["year"] and m["mon"] in MONTHS and head.stamp is None:
            hh, mi, ss = _hms(m)
            head.stamp = parse_iso(f"{m['year']}-{MONTHS[m['mon']]:02d}-{int(m['day']):02d}T{hh:02d}:{mi:02d}:{ss:02d}", ctx.zone)
            head.quality = "exact" if head.stamp else "none"
        if head.rank is None:
            head.rank = int(m["rank"])
        if m["host"] and head.host is None:
            head.host = m["host"]
    elif name == "host_rank":
        head.local_rank = int(m["local"])
        head.host = head.host or m["host"]
    elif name == "kmsg_host":
        if head.stamp is None:
            head.stamp = parse_iso(m["iso"], ctx.zone)
            head.quality = "exact" if head.stamp else "none"
        head.host = head.host or m["host"]
    elif name == "proc_tag":
        if not (m["who"] or m["pid"]):
            return False
        if m["rank"] and head.rank is None:
            head.rank = int(m["rank"])
        if m["pid"] and head.pid is None:
            head.pid = int(m["pid"])
    elif name == "nccl":
        head.host = m["host"]
        head.pid = int(m["pid"])
        head.dev = int(m["dev"])
    return True
