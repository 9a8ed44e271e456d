"""Strip the prefixes that collectors and launchers put in front of a message.

``read_head`` peels them off one by one (syslog or journal header, dmesg stamp,
srun label, torchrun/PyTorch rank tags, glog header, NCCL ``host:pid:tid [dev]``, pdsh ``host: ``,
kubectl's ``[pod/<pod>/<container>] ``,
Fabric Manager header, bracketed or bare date-times) and records what they say:
stamp, host, rank, pid, CUDA device. What is left is the message the extraction
patterns read. Pure function of the line and a :class:`StampContext`.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone, tzinfo
from zoneinfo import ZoneInfo

from .stamps import LOCAL_MONTHS, MONTHS, from_uptime, micro_of, parse_iso, with_year

_MON = r"(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"

# RFC 3164: "Nov  2 10:03:11 node-02 kernel: " (host may be missing: "Aug 19 11:38:39  NVRM: ...")
_RFC3164 = re.compile(
    _MON + r" (?P<day>[ \d]\d) (?P<hh>\d\d):(?P<mm>\d\d):(?P<ss>\d\d)(?:\.(?P<frac>\d+))? "
    r"(?:(?P<host>[\w.:-]*[\w.-]) )?(?:(?P<prog>[\w./@-]+)(?:\[(?P<pid>\d{1,10})\])?: )?")
# The same with the month in the writer's locale (journalctl's %b): "kwi 15 07:56:59 testowy kernel: ",
# "4月 20 19:55:29 Reverier-Arch kernel: " (ja_JP and ko_KR pad the month: " 4月 20 ...");
# the applier reads the word through stamps.LOCAL_MONTHS and declines any other.
_RFC3164_LOCAL = re.compile(
    r" ?(?P<mon>[^\W\d_]{3,6}\.?|\d{1,2}[月월]) (?P<day>[ \d]\d) (?P<hh>\d\d):(?P<mm>\d\d):(?P<ss>\d\d)(?:\.(?P<frac>\d+))? "
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
# "[2026-11-02 10:01:00,123] " / slurmctld "[2026-11-02T10:21:14.123] " / Hydra "[2026-11-02 10:01:00,123][name][INFO] - ",
# and SGLang's logger, whose processes add their parallel ranks inside the brackets ("[2025-03-09 00:57:15 TP4] ",
# "[2025-06-26 07:25:31 DP4 TP4] ": configure_logger's "[%(asctime)s{prefix}] ", the prefix " DP{} TP{} EP{} PP{}"
# a scheduler process builds). The ranks are the engine's own (TP4 is a GPU of one server), not the job's global rank.
_ISO_BRACKET = re.compile(
    r"\[(?P<iso>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)(?: [A-Z][A-Z_]{1,10}\d{1,5}){0,6}\]"
    r"(?::? |(?=\[))")
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
# TorchX's log tee ("{role_name}/{replica_id} {line}", torchx/util/log_tee_helpers.py; NeMo-Run
# launches through it) in front of torchrun's rank tag: "i.pretrain/0 [default2]:[rank2]: ...". Read
# only when torchrun's tag follows: "1/8 workers are evicted" is a message.
_TORCHX = re.compile(r"(?P<role>[\w.-]{1,64})/(?P<replica>\d{1,4}) (?=\[default\d{1,5}\]:)")
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
# NCCL: "gpu004:2200689:2200706 [3] ". The device is what cudaGetDevice gave (src/debug.cc); releases that
# did not initialize it first print whatever int was there when CUDA itself failed ("VM-192-150-centos:2871:
# 2871 [32523] misc/cudawrap.cc:182 NCCL WARN Cuda failure 'CUDA driver version is insufficient ...'",
# NVIDIA/cuml#5961; current releases start it at 0): still NCCL's prefix and host, naming no device.
_NCCL = re.compile(r"(?P<host>[A-Za-z0-9][\w.-]*):(?P<pid>\d{1,10}):(?P<tid>\d{1,10}) \[(?P<dev>-?\d{1,10})\] ")
_MAX_DEV = 1024                    # no node has more GPUs: a larger number is the uninitialized int
# Talos / kmsg forwarders: "192.168.11.119: kern: warning: [2026-04-22T21:25:20.458998481Z]: "
_KMSG_HOST = re.compile(
    r"(?P<host>[\w.:-]+?): (?:kern|user|daemon|auth|syslog):\s+\w+: \[(?P<iso>\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:?\d\d)?)\]: ")
# vLLM's logger: "ERROR 09-09 02:24:28 [multiproc_executor.py:522] ", and before the brackets (vllm/logger.py's
# _FORMAT "%(levelname)s %(asctime)s %(filename)s:%(lineno)d] %(message)s" of the 0.2-0.7 releases):
# "ERROR 10-09 02:13:55 client.py:250] "
_VLLM = re.compile(
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<mo>\d\d)-(?P<dd>\d\d) (?P<hh>\d\d):(?P<mm>\d\d):(?P<ss>\d\d)"
    r"(?:\.(?P<frac>\d+))? (?:\[[\w./-]+:\d+\]|[\w-]+(?:\.[\w-]+)*\.py:\d+\]) ")
# Markdown a user wrapped a pasted line in: "> " quotes, "**" bold, "```" fences
_MARKDOWN = re.compile(r"(?:> ?)+|\*\*|`{3,}")     # a single backtick is content (Lightning's `Trainer.fit`)
# A pasted line indented (a Markdown list item, an issue form's log field, an e-mail quote) before the line's own
# start: taken off only where an NCCL "host:pid:tid [dev]" prefix or a date stamp follows, so a traceback's
# indented frames and a report's indented fields keep their text.
_INDENT = re.compile(r"[ \t]{1,40}(?=[A-Za-z0-9][\w.-]*:\d{1,10}:\d{1,10} \[\d{1,4}\] |\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)")
# kubectl logs --prefix (kubectl's addPrefixIfNeeded: "[pod/%s/%s] ", the pod and the container), e.g. over every
# worker pod of a job at once with -l <selector>: the pod names the line's host through the record's pods map.
_KUBECTL = re.compile(r"\[pod/(?P<pod>[a-z0-9][a-z0-9.-]{0,252})/(?P<container>[a-z0-9][a-z0-9-]{0,62})\] ")
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
# "worker-1: ", "slurmstepd-falkor7: error: " (pdsh's "%s: %s"), or the address the host was given by
# ("10.10.23.10: ", a hostfile of IPs). Only as the first thing on the line and only a name with a digit
# in it (or localhost) or a dotted IPv4 address: "RuntimeError: " is a message, "rank3: " a rank.
# Ascend CANN's error codes ("EI0006: ...", "EJ0001: ...", "EZ9999: ...": two capitals and four digits) lead
# a line the same way and are no host, nor is the program name glibc's failed assert() puts first
# ("python3: /path/file.cpp:223: int f(...): Assertion `x' failed.", the shape "%s: %s:%u: %s").
_PDSH = re.compile(r"(?:slurmstepd-)?(?P<host>(?!(?:rank|step|epoch|iter|iteration|layer)\d+:|E[A-Z]\d{4}:|python[\d.]*: \S+:\d+: )"
                   r"(?:[A-Za-z][A-Za-z0-9-]{0,62}\d[A-Za-z0-9-]{0,62}|localhost)(?:\.[A-Za-z0-9-]{1,63}){0,6}"
                   r"|(?:\d{1,3}\.){3}\d{1,3}): (?=\S)")


@dataclass(frozen=True)
class StampContext:
    zone: tzinfo                   # for stamps without a zone
    anchor: datetime               # UTC; picks the year for year-less stamps
    boot: datetime | None = None   # the file host's boot instant, for dmesg uptime


@dataclass(slots=True)
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


_UNREAD = object()
_SECONDS: dict[tuple, tuple[int, ...] | None] = {}     # (zone, anchor, the second as written) -> its UTC fields
_SECONDS_MAX = 8192                # then forgotten at once


def _yearless(ctx: StampContext, second: tuple[str, str, str, str, str], micro: int,
              month_of: Callable[[str], int]) -> datetime | None:
    """``with_year`` for (month, day, hh, mm, ss) as written, read once a second: a log writes
    thousands of lines a second. The fraction is added to the second's instant, which is exact
    when the zone's offsets and transitions fall on whole seconds (ZoneInfo, fixed offsets).
    Keyed like with_year's own year memo (zone and anchor by equality)."""
    key = (ctx.zone, ctx.anchor, *second)
    utc = _SECONDS.get(key, _UNREAD)            # None: no stamp
    if utc is _UNREAD:
        mon, day, hh, mi, ss = second
        base = with_year(month_of(mon), int(day), int(hh), int(mi), int(ss), 0, ctx.zone, ctx.anchor)
        if type(ctx.zone) not in (ZoneInfo, timezone) or (base is not None and base.microsecond):
            return with_year(month_of(mon), int(day), int(hh), int(mi), int(ss), micro, ctx.zone, ctx.anchor)
        if len(_SECONDS) >= _SECONDS_MAX:
            _SECONDS.clear()
        utc = _SECONDS[key] = None if base is None else (
            base.year, base.month, base.day, base.hour, base.minute, base.second)
    return None if utc is None else datetime(*utc, micro, timezone.utc)     # with_year's is in timezone.utc too


# Which prefix shapes can start with which character: tried in this order.
_BRACKET = ("torchrun", "rank", "dmesg_uptime", "dmesg_delta", "dmesg_ctime", "fm", "iso_bracket", "glog_bracket",
            "mpi_tag", "host_rank", "kubectl")
_DIGIT = ("srun", "iso_host", "iso_bare", "kmsg_host", "compose", "nccl", "torchx", "grep_file", "pdsh", "indent",
          "rfc3164_local")          # a CJK locale's month, "4月 20 19:55:29 host prog: "
_ALPHA = ("rfc3164", "glog_bare", "vllm", "kmsg_host", "compose", "nccl", "torchx", "grep_file", "pdsh",
          "rfc3164_local")
_ALPHA_CTIME = ("mpi_tag",) + _ALPHA
_REGEX = {
    "srun": _SRUN_LABEL, "torchrun": _TORCHRUN, "rank": _RANK_TAG, "rfc3164": _RFC3164, "iso_host": _ISO_HOST,
    "rfc3164_local": _RFC3164_LOCAL,
    "dmesg_ctime": _DMESG_CTIME, "dmesg_uptime": _DMESG_UPTIME, "dmesg_delta": _DMESG_DELTA, "fm": _FM,
    "iso_bracket": _ISO_BRACKET, "glog_bracket": _GLOG_BRACKET, "glog_bare": _GLOG_BARE, "nccl": _NCCL,
    "iso_bare": _ISO_BARE, "proc_tag": _PROC_TAG, "vllm": _VLLM, "kmsg_host": _KMSG_HOST,
    "mpi_tag": _MPI_TAG, "host_rank": _HOST_RANK, "markdown": _MARKDOWN, "indent": _INDENT, "compose": _COMPOSE,
    "grep_file": _GREP_FILE, "tqdm": _TQDM, "pdsh": _PDSH, "kubectl": _KUBECTL, "torchx": _TORCHX,
}


_WEEKDAYS = frozenset(("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"))
_FIRST_ONLY = ("grep_file", "pdsh", "torchx")  # only as the first thing on the line (or after a wrapper)
_WRAPPERS = frozenset(("kubectl", "compose", "markdown", "grep_file", "indent"))
_NAMED = re.compile(r"\(\?P<\w+>")


class _Round:
    """The shapes one round tries, in order, and one regex of them all.

    The alternation's first alternative that matches is the first shape whose regex matches
    (leftmost-first), so one call replaces one a shape (most lines fail most shapes); its groups
    are unnamed, and the winner is matched again alone for its own."""

    __slots__ = ("names", "regexes", "appliers", "_any")

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.regexes = tuple(_REGEX[n] for n in names)
        self.appliers: tuple = ()          # set once _APPLY is defined (below)
        self._any: re.Pattern[str] | None = None

    def peel(self, text: str, head: Head, ctx: StampContext) -> tuple[re.Match[str] | None, int]:
        """The first shape that matches ``text`` and applies, recorded in ``head``, and its index;
        the index is -1 when a shape before it matched but did not apply (its applier said no)."""
        if not self.names:
            return None, 0
        if self._any is None:
            self._any = re.compile("|".join(f"({_NAMED.sub('(?:', rx.pattern)})" for rx in self.regexes))
        hit = self._any.match(text)
        if hit is None:
            return None, 0
        regexes, appliers = self.regexes, self.appliers or self._appliers()
        # The alternatives are its only groups; the shapes before the winner do not match.
        first = hit.lastindex - 1
        for k in range(first, len(regexes)):
            m = regexes[k].match(text)
            if m is not None and appliers[k](m, head, ctx):
                return m, k if k == first else -1
        return None, -1

    def _appliers(self) -> tuple:
        self.appliers = tuple(_APPLY[n] for n in self.names)
        return self.appliers


class _Shapes:
    """The shapes a first character admits, as the rounds that try them: with and without a
    progress bar on the line, in its first round or a later one (``grep_file``/``pdsh`` only first)."""

    __slots__ = ("rounds", "ctime")

    def __init__(self, names: tuple[str, ...], ctime: "_Shapes | None" = None) -> None:
        self.rounds = tuple(_Round(tuple(n for n in (("tqdm",) + names if bar else names)
                                         if first or n not in _FIRST_ONLY))
                            for bar in (False, True) for first in (False, True))
        self.ctime = ctime             # mpirun --timestamp-output's "Thu Jun 18 14:28:35 2020[1,2]<stderr>:"


_BY_CLASS = {"markdown": _Shapes(("markdown",)), "bracket": _Shapes(_BRACKET), "proc": _Shapes(("proc_tag",)),
             "digit": _Shapes(_DIGIT), "alpha": _Shapes(_ALPHA, ctime=_Shapes(_ALPHA_CTIME)), "other": _Shapes(("rfc3164_local",))}


def _by_first_char(c: str) -> _Shapes:
    if c in ">*`":
        return _BY_CLASS["markdown"]
    if c == "[":
        return _BY_CLASS["bracket"]
    if c == "(":
        return _BY_CLASS["proc"]
    if c.isdigit() or c == " " or c == "\t":
        return _BY_CLASS["digit"]
    if c.isalpha():
        return _BY_CLASS["alpha"]
    return _BY_CLASS["other"]


_FIRST: dict[str, _Shapes] = {}                # first character -> the shapes to try (memo)


def _round(text: str, bar: bool, first: bool) -> _Round:
    """The shapes to try on ``text``, by its first character; ``bar``: the line holds a
    progress bar somewhere near its start (checked once a line)."""
    c = text[:1]
    shapes = _FIRST.get(c)
    if shapes is None:
        shapes = _by_first_char(c)
        if len(_FIRST) < 4096:                  # a crafted input's many first characters stay bounded
            _FIRST[c] = shapes
    if shapes.ctime is not None and text[3:4] == " " and text[:3] in _WEEKDAYS:
        shapes = shapes.ctime
    return shapes.rounds[2 * bar + first]


# Lines alike but for their digits peel alike: every shape's regex treats the ten ASCII digits
# as one (tests/test_prefixes.py checks it), so the line with its digits as "0" keys the chain of
# shapes that won, and a line of that key replays it: one match a prefix instead of a search of
# every shape a round. Only the shapes' appliers read values, and they are run again; a chain
# where one declined (it depends on values: srun after an unreadable stamp) is never kept.
_ZEROS = bytes.maketrans(b"0123456789", b"0000000000")
_CHAINS: dict[bytes, tuple[tuple, dict]] = {}      # key -> (chain, the heads it read, by prefix text)
_CHAINS_MAX = 4096                 # then forgotten at once
# A chain's appliers read only its prefixes' text and the context, so a line whose prefixes are the very
# text of an earlier line of the same key reads as that one did: a cascade's NCCL lines repeat their
# "host:pid:tid [dev] " and srun label line after line. Kept per chain (its key fixes every shape's match).
_HEADS_MAX = 256                   # prefixes a chain remembers, then forgotten at once
_CHAIN_LINE = 1024                 # longer lines are read, not keyed: the memo stays a few MiB
# A pointer (printf's %p: NCCL's "opId=0x7f018ec0a720") differs from line to line in its hex letters
# too. No shape tells a-f from 0-9 inside a whole word "0x<hex>": the classes that reach into it hold
# both (\w, [\w.-], [^|\n]), and a digit run (\d+) cannot pass its "x". A line with a progress bar keeps
# its letters all the same: tqdm's shape reads digits apart from letters right before its "%|".
_POINTER = re.compile(rb"(?<![0-9A-Za-z_])0x[0-9a-f]+(?![0-9A-Za-z_])")


def _pointer_blind(key: bytes) -> bytes:
    """The chain key with each pointer's hex letters as "0" too (same length: offsets stay)."""
    if b"0x" not in key or b"%|" in key:
        return key
    return _POINTER.sub(lambda m: b"0x" + b"0" * (len(m[0]) - 2), key)


def _line_keys(data: bytes) -> tuple[bytes, bytes]:
    """(data with its digits as "0", that with its pointers blinded too): the match memo's key and the
    chain's. rules/_linekey.c makes both in one pass where it is built (tests/test_prefixes.py: alike)."""
    zeroed = data.translate(_ZEROS)
    return zeroed, (_pointer_blind(zeroed) if b"0x" in zeroed else zeroed)      # most lines hold no pointer


try:
    from ._linekey import head_hit as _head_hit, line_keys as _line_keys_c
except ImportError:                 # not compiled: the pure-Python keys and memo, the same answers
    _head_hit = _line_keys_c = None
if os.environ.get("FIRSTFAULT_PURE_PYTHON") == "1":         # as the record decoders (README)
    _head_hit = _line_keys_c = None
line_keys = _line_keys_c or _line_keys


# Terminal colours a program wrote into its log (Ray wraps every relayed line's "(Worker pid=N)" in
# them; colour loggers paint the level): "\x1b[36m...\x1b[0m", the same with the ESC lost to a paste
# ("[36m(RayWorkerWrapper pid=4183)[0m") or turned into U+FFFD. They are not the message: the prefixes
# and patterns read the line without them. A bare "[Nm" is only taken for one beside a reset "[0m".
_CSI = re.compile("\x1b\\[[0-?]*[ -/]*[@-~]|\ufffd\\[[0-9;]{0,16}m")
_BARE_SGR = re.compile(r"\[\d[0-9;]{0,15}m")         # a digit first: "[m" is the start of "[multiproc.py:522]"


def plain(line: str) -> str:
    """``line`` without its terminal colour and cursor sequences, and without the byte-order mark an
    editor put at the start of a file (Windows' Notepad saves UTF-8 with one)."""
    if line[:1] == "\ufeff":
        line = line[1:]
    if "\x1b" in line or "\ufffd[" in line:
        line = _CSI.sub("", line)
    if "[0m" in line:
        line = _BARE_SGR.sub("", line)
    return line


def read_head(line: str, ctx: StampContext) -> Head:
    """Peel prefixes off ``line``; at most a dozen rounds, each anchored at the start."""
    return read_head_keyed(line, ctx)[0]


def read_head_keyed(line: str, ctx: StampContext) -> tuple[Head, bytes | None, bytes | None]:
    """``read_head``, and the UTF-8 of the message it leaves and that with its digits as "0": the
    extractor's match memo (rules/extract.py) keys the message without encoding it again. Both None
    for a line that is not ASCII (byte offsets would not be character offsets) or too long to key."""
    if _head_hit is not None:
        # rules/_linekey.c: a plain ASCII line's remembered head and its message's keys in one call
        # (most lines), else the line's keys
        hit = _head_hit(line, ctx, _CHAINS, Head, _CHAIN_LINE)
        if hit is not None and len(hit) == 3:
            return hit
        return read_head_missed(line, ctx, hit)
    return read_head_missed(line, ctx, None)


def read_head_missed(line: str, ctx: StampContext, hit: tuple | None) -> tuple[Head, bytes | None, bytes | None]:
    """``read_head_keyed`` of a line whose head is not remembered: ``hit`` is what head_hit answered
    for it (its keys and chain), None where it was not asked or answered None."""
    if hit is not None:
        _, data, zeroed, key, known = hit
        return _keyed(line, ctx, data, zeroed, key, known)
    if "\x1b" in line or "[0m" in line or "\ufffd[" in line or line[:1] == "\ufeff":      # plain()'s tests, inline: most lines pass all
        line = plain(line)
    if len(line) <= _CHAIN_LINE:
        data = line.encode("utf-8", "surrogatepass")
        zeroed, key = line_keys(data)
        known = _CHAINS.get(key)
        if known is not None:
            chain, heads = known
            seen = heads.get(line[:chain[-1]])
            if seen is not None and seen[0] is ctx:
                return _message_keys(Head(line[chain[-1]:], *seen[1:]), data, zeroed)
        return _keyed(line, ctx, data, zeroed, key, known)
    head, _ = _read(line, ctx)
    return head, None, None


def _message_keys(head: Head, data: bytes, zeroed: bytes) -> tuple[Head, bytes | None, bytes | None]:
    """``head`` with its message's UTF-8 and key: the tails of the line's (``data``, ``zeroed``)."""
    if not data.isascii():
        return head, None, None
    cut = len(data) - len(head.message)
    return head, data[cut:], zeroed[cut:]


def _keyed(line: str, ctx: StampContext, data: bytes, zeroed: bytes, key: bytes,
           known: tuple | None) -> tuple[Head, bytes | None, bytes | None]:
    """read_head_keyed past its memo of heads: the chain replayed (its head remembered), else the line
    read shape by shape (its chain remembered under ``key``)."""
    if known is not None:
        chain, heads = known
        head = _replay(line, chain, ctx)
        if head is not None:
            if len(heads) >= _HEADS_MAX:
                heads.clear()
            heads[line[:chain[-1]]] = (ctx, head.stamp, head.quality, head.host, head.rank, head.local_rank,
                                       head.pid, head.dev, head.uptime)
            return _message_keys(head, data, zeroed)
    head, chain = _read(line, ctx)
    if chain is not None:
        if len(_CHAINS) >= _CHAINS_MAX:
            _CHAINS.clear()
        _CHAINS[key] = (chain, {})
    return _message_keys(head, data, zeroed)


def _read(line: str, ctx: StampContext) -> tuple[Head, tuple | None]:
    """read_head's search, shape by shape, and the chain of shapes that won (None: not replayable):
    ((regex, applier, where its prefix starts, where it ends), ...), then where the message starts."""
    head = Head(message=line)
    text = line
    bar = "%|" in line                  # a progress bar may sit before the log line (tried first then)
    first = True
    chain: list | None = []
    n = len(line)
    for _ in range(12):
        stripped = text.lstrip(" ") if text[:1] == " " and head.rank is not None else text
        rnd = _round(stripped, bar, first)
        m, k = rnd.peel(stripped, head, ctx)
        if k < 0:
            chain = None
        if m is None:
            break
        if chain is not None:
            start = n - len(stripped)
            chain.append((rnd.regexes[k], rnd.appliers[k], start, start + m.end()))
        text = stripped[m.end():]
        # A collector's wrapper (kubectl logs --prefix, docker compose, a quote, grep -H's file name) was
        # added around the line after it was written: what follows it is still the line's own start.
        first = first and k >= 0 and rnd.names[k] in _WRAPPERS
    head.message = text.lstrip(" ") if text is not line else text
    if chain is None:
        return head, None
    chain.append(n - len(head.message))
    return head, tuple(chain)


def _replay(line: str, chain: tuple, ctx: StampContext) -> Head | None:
    """``_read`` along a known chain; None when a shape declines here (read it in full then).

    The chain was learnt on a line alike but for its digits (and pointers' hex letters), which every
    shape reads alike: each prefix starts and ends where it did there, so each shape is matched at its
    own offset without cutting the line, and a shape that ends elsewhere is read in full."""
    head = Head(message=line)
    for regex, applier, start, end in chain[:-1]:
        m = regex.match(line, start)
        if m is None or m.end() != end or not applier(m, head, ctx):
            return None
    if len(chain) > 1:
        head.message = line[chain[-1]:]
    return head


def _srun(m: re.Match[str], head: Head, ctx: StampContext) -> bool:
    if head.rank is not None or head.stamp is not None:
        return False
    head.rank = int(m["rank"])
    return True


def _torchrun(m: re.Match[str], head: Head, ctx: StampContext) -> bool:
    head.local_rank = int(m["local"])
    return True


def _rank(m: re.Match[str], head: Head, ctx: StampContext) -> bool:
    head.rank = int(m["rank"])
    return True


def _rfc3164(m: re.Match[str], head: Head, ctx: StampContext,
             months: Callable[[str], int] = MONTHS.__getitem__) -> bool:
    mon, day, hh, mi, ss, frac, host, prog, pid = m.group("mon", "day", "hh", "mm", "ss", "frac", "host", "prog", "pid")
    if head.stamp is None:
        head.stamp = _yearless(ctx, (mon, day, hh, mi, ss), micro_of(frac), months)
        head.quality = "no_year"
    if pid and head.pid is None:
        head.pid = int(pid)
    if host and prog and head.host is None and not host.endswith(":"):
        head.host = host
    return True


def _rfc3164_local(m: re.Match[str], head: Head, ctx: StampContext) -> bool:
    """rfc3164 with a month word of stamps.LOCAL_MONTHS; any other word is not a stamp."""
    if m["mon"].lower() not in LOCAL_MONTHS:
        return False
    return _rfc3164(m, head, ctx, _local_month)


def _local_month(mon: str) -> int:
    return LOCAL_MONTHS[mon.lower()]


def _iso(m: re.Match[str], head: Head, ctx: StampContext) -> bool:
    """iso_bracket and iso_bare; iso_host adds its pid and host."""
    if head.stamp is None:
        head.stamp = parse_iso(m["iso"], ctx.zone)
        head.quality = "exact" if head.stamp else "none"
    return True


# Python logging's "%(asctime)s %(name)s %(levelname)s: %(message)s" has the shape of an ISO syslog line: its
# logger name where the host is and its level where the program is. No syslog program is called INFO.
_LOG_LEVELS = frozenset(("DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL", "FATAL", "NOTICE", "TRACE"))


def _iso_host(m: re.Match[str], head: Head, ctx: StampContext) -> bool:
    if m["prog"] in _LOG_LEVELS or m["host"] in _LOG_LEVELS:
        # a logger's level and name ("%(asctime)s %(levelname)s %(name)s: "), not a host and a
        # program: read as a bare stamp
        return False
    _iso(m, head, ctx)
    if m["pid"] and head.pid is None:
        head.pid = int(m["pid"])
    if head.host is None:
        head.host = m["host"]
    return True


def _dmesg_ctime(m: re.Match[str], head: Head, ctx: StampContext) -> bool:
    if head.stamp is None:
        hh, mi, ss = _hms(m)
        head.stamp = parse_iso(f"{m['year']}-{MONTHS[m['mon']]:02d}-{int(m['day']):02d}T{hh:02d}:{mi:02d}:{ss:02d}", ctx.zone)
        head.quality = "exact" if head.stamp else "none"
    return True


# A bracketed "[seconds.micros]" this large is no uptime (31 years) but the epoch: UCX stamps its log
# lines with gettimeofday() as "[%lu.%06lu]" (openucx/ucx src/ucs/debug/log.c UCS_LOG_TIME_FMT).
_EPOCH_MIN_S = 1_000_000_000


def _dmesg_uptime(m: re.Match[str], head: Head, ctx: StampContext) -> bool:
    up = float(m["up"])
    if up >= _EPOCH_MIN_S:
        if head.stamp is None:
            sec, _, frac = m["up"].partition(".")
            try:        # whole seconds and micros apart: a float this large loses the last digit
                stamp = datetime.fromtimestamp(int(sec), timezone.utc).replace(microsecond=int((frac + "000000")[:6]))
            except (OverflowError, OSError, ValueError):      # past datetime's range: no time
                head.quality = "order_only"
            else:
                head.stamp, head.quality = stamp, "exact"
        return True
    head.uptime = up
    if head.stamp is None:
        anchored = from_uptime(ctx.boot, head.uptime)
        head.stamp, head.quality = (anchored, "uptime") if anchored else (None, "order_only")
    return True


def _dmesg_delta(m: re.Match[str], head: Head, ctx: StampContext) -> bool:
    if head.stamp is None:
        head.quality = "order_only"
    return True


def _fm(m: re.Match[str], head: Head, ctx: StampContext) -> bool:
    if head.stamp is None:
        hh, mi, ss = _hms(m)
        head.stamp = parse_iso(f"{m['year']}-{MONTHS[m['mon']]:02d}-{m['day']}T{hh:02d}:{mi:02d}:{ss:02d}", ctx.zone)
        head.quality = "exact" if head.stamp else "none"
    return True


def _glog(m: re.Match[str], head: Head, ctx: StampContext) -> bool:
    """glog_bracket, glog_bare and vLLM's logger: month and day, no year."""
    if head.stamp is None:
        mo, dd, hh, mi, ss, frac = m.group("mo", "dd", "hh", "mm", "ss", "frac")
        if mo:
            head.stamp = _yearless(ctx, (mo, dd, hh, mi, ss), micro_of(frac), int)
            head.quality = "no_year" if head.stamp else "none"
    return True


def _decoration(m: re.Match[str], head: Head, ctx: StampContext) -> bool:
    return True                                # markdown, tqdm: decoration, not content


def _grep_file(m: re.Match[str], head: Head, ctx: StampContext) -> bool:
    return head.stamp is None and head.host is None and head.rank is None


def _pdsh(m: re.Match[str], head: Head, ctx: StampContext) -> bool:
    head.host = m["host"]
    return True


def _kubectl(m: re.Match[str], head: Head, ctx: StampContext) -> bool:
    head.host = head.host or m["pod"]
    return True


def _compose(m: re.Match[str], head: Head, ctx: StampContext) -> bool:
    head.host = head.host or m["svc"]
    return True


def _mpi_tag(m: re.Match[str], head: Head, ctx: StampContext) -> bool:
    if m["year"] and m["mon"] in MONTHS and head.stamp is None:
        hh, mi, ss = _hms(m)
        head.stamp = parse_iso(f"{m['year']}-{MONTHS[m['mon']]:02d}-{int(m['day']):02d}T{hh:02d}:{mi:02d}:{ss:02d}", ctx.zone)
        head.quality = "exact" if head.stamp else "none"
    if head.rank is None:
        head.rank = int(m["rank"])
    if m["host"] and head.host is None:
        head.host = m["host"]
    return True


def _host_rank(m: re.Match[str], head: Head, ctx: StampContext) -> bool:
    head.local_rank = int(m["local"])
    head.host = head.host or m["host"]
    return True


def _kmsg_host(m: re.Match[str], head: Head, ctx: StampContext) -> bool:
    if head.stamp is None:
        head.stamp = parse_iso(m["iso"], ctx.zone)
        head.quality = "exact" if head.stamp else "none"
    head.host = head.host or m["host"]
    return True


def _proc_tag(m: re.Match[str], head: Head, ctx: StampContext) -> bool:
    if not (m["who"] or m["pid"]):
        return False
    if m["rank"] and head.rank is None:
        head.rank = int(m["rank"])
    if m["pid"] and head.pid is None:
        head.pid = int(m["pid"])
    return True


def _nccl(m: re.Match[str], head: Head, ctx: StampContext) -> bool:
    host, pid, dev = m.group("host", "pid", "dev")
    device = int(dev)
    head.host, head.pid, head.dev = host, int(pid), device if 0 <= device < _MAX_DEV else None
    return True


# Each shape's applier records what its prefix says in the Head; False: it does not apply here
# (the next shape is tried).
_APPLY = {
    "srun": _srun, "torchrun": _torchrun, "rank": _rank, "rfc3164": _rfc3164, "iso_host": _iso_host,
    "rfc3164_local": _rfc3164_local,
    "iso_bracket": _iso, "iso_bare": _iso, "dmesg_ctime": _dmesg_ctime, "dmesg_uptime": _dmesg_uptime,
    "dmesg_delta": _dmesg_delta, "fm": _fm, "glog_bracket": _glog, "glog_bare": _glog, "vllm": _glog,
    "markdown": _decoration, "indent": _decoration, "tqdm": _decoration, "torchx": _decoration, "grep_file": _grep_file, "pdsh": _pdsh, "compose": _compose, "kubectl": _kubectl,
    "mpi_tag": _mpi_tag, "host_rank": _host_rank, "kmsg_host": _kmsg_host, "proc_tag": _proc_tag, "nccl": _nccl,
}
