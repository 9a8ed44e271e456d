"""The readable summary of a diagnosis, for a person at a terminal."""
from __future__ import annotations

from firstfault.rules.order import AT_LEAST, shown_at
from firstfault.rules.summary import NOT_AT_FAULT, coverage_phrase, inferred_record, percent
from firstfault.schemas import Diagnosis

from .term import printable

_BAR = {"attributed": "ATTRIBUTED", "ambiguous": "AMBIGUOUS", "unattributed": "UNATTRIBUTED",
        "no_failure": "NO FAILURE"}


def _ranks(ranks: list[int], limit: int = 6) -> str:
    """[0,1,2,3,7,9,10] -> '0-3,7,9-10'."""
    if not ranks:
        return "-"
    spans, start, prev = [], ranks[0], ranks[0]
    for r in ranks[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        spans.append(f"{start}" if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    text = ",".join(spans[:limit])
    return text + (f",… ({len(ranks)} ranks)" if len(spans) > limit else "")


def _hosts(hosts: list[str], limit: int = 4) -> str:
    if not hosts:
        return "-"
    head = ", ".join(hosts[:limit])
    return head + (f" and {len(hosts) - limit} more" if len(hosts) > limit else "")


def _cut(text: str, width: int) -> str:
    """At most ``width`` characters, an ellipsis where it was cut."""
    return text if len(text) <= width else text[:width - 1] + "…"


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _t(stamp: str | None) -> str:
    return "(no time)" if not stamp else stamp.replace("T", " ").rstrip("Z")[:23]


def _when(rc) -> str:
    """The root's time, marked when it is not the line's own stamp."""
    if rc.time_basis == "inherited" and rc.timestamp:
        return f"≥{_t(rc.timestamp)} (no stamp of its own: the stamped line above)"
    if rc.time_basis == "line_order" or not rc.timestamp:
        return "(no time: placed by its line order)"
    return _t(rc.timestamp)


def _first(s) -> str:
    """A symptom group's first time, marked ≥ when it is a lower bound (no stamp of its own)."""
    return (AT_LEAST if s.first_basis == "inherited" and s.first else "") + _t(s.first)


def _wrap(text: str, indent: str, width: int = 100) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width=width, initial_indent=indent, subsequent_indent=indent) or [indent]


def summary(d: Diagnosis, stats: dict | None = None, color: bool = False) -> str:
    """Log lines, ids and file names are shown escaped (term.py): each line is made printable
    as it is added, and only then are our own colours put around parts of it."""
    def c(text: str, code: str) -> str:
        return f"\033[{code}m{printable(text)}\033[0m" if color else printable(text)

    out: list[str] = []

    def add(*lines: str) -> None:
        out.extend(printable(line) for line in lines)

    status_color = {"attributed": "1;31", "ambiguous": "1;33", "unattributed": "1;33", "no_failure": "1;32"}
    add(f"firstfault  {d.workload_id} (attempt {d.attempt})  terminal state: {d.terminal_state}", "")
    head = _BAR[d.status]
    if d.status == "attributed":
        head += f"  {d.domain} / {d.sub_domain}"
    elif d.status == "ambiguous":
        head += f"  {d.domain}: {len(d.candidates)} causes fit"
    out.append(c(head, status_color[d.status]))
    rc = d.root_cause
    why = ""
    if rc is not None and d.summary.startswith(rc.message.rstrip(".")):
        # The summary opens with the root's own sentence, which the root cause line prints: say it once.
        why = d.summary[len(rc.message.rstrip(".")):].lstrip(". ")
    elif d.summary:
        add(*_wrap(d.summary, "  "))
    no_record = inferred_record(d.missing_evidence)

    def ref(r) -> str:
        # A bare file or folder has no workload.json: its scheduler facts were inferred, not read from a file.
        return "the inferred workload record" if no_record and r.path == "workload.json" else f"{r.path}:{r.line}"

    if rc is not None:
        where = ", ".join(x for x in (rc.host and f"host {rc.host}", rc.gpu is not None and f"GPU {rc.gpu}",
                                      rc.rank is not None and f"rank {rc.rank}") if x)
        add(f"  root cause  {rc.message}")
        if why:
            add(*_wrap(why, " " * 14))
        add(f"              {where}; logged {_when(rc)}" + (f", onset {_t(rc.onset)}" if rc.onset != rc.timestamp and rc.onset else ""),
            f"              {ref(rc.ref)}",
            f"              | {_cut(rc.text, 160)}")
    for cand in d.candidates:
        add(f"  candidate   {cand.domain}/{cand.sub_domain} on {_hosts(cand.nodes)} "
            f"(explains {percent(cand.coverage)}): {cand.message}")
    blame = (f"responsible {_hosts(d.responsible_nodes)}" if d.domain not in NOT_AT_FAULT or not d.responsible_nodes
             else f"on          {_hosts(d.responsible_nodes)} (an application fault: the node is not at fault)")
    line = f"  {blame}    suspect {_hosts(d.suspect_nodes)}"
    if d.candidates:
        # Nobody is responsible until the candidates are told apart, but each names its nodes.
        line += f"    candidates on {_hosts(sorted({n for cand in d.candidates for n in cand.nodes}))}"
    add(line)
    coverage = coverage_phrase(d.status, d.symptom_coverage, d.symptoms)
    if coverage:
        add(f"  coverage    {coverage}")
    add("")
    timeline = []
    root_at = (rc.onset or rc.timestamp or "") if rc is not None else ""
    if rc is not None:
        timeline.append((root_at, 0, _when(rc) if rc.time_basis != "stamped" else _t(root_at), rc.host or "-",
                         f"{rc.kind}: {rc.message}"))
    for i, s in enumerate(d.symptoms):
        # Placed as the JSON orders them (rules/order.py shown_at): a lower bound is marked ≥ and an
        # explained one never sorts before its cause.
        at = shown_at(s.first, s.first_basis, s.explained, root_at or None) or ""
        timeline.append((at, 1 + i, _first(s), _hosts(s.hosts, 2), f"{s.kind} ×{s.count}"))
    if timeline:
        add("Timeline (first events, by onset; ≥ a lower bound, the time of the stamped line above)")
        for stamp, rank, label, host, what in sorted(timeline, key=lambda x: (x[0] == "", x[0], x[1]))[:8]:
            mark = c("ROOT ", "1") if rank == 0 else ""
            out.append(printable(f"  {_cut(label, 24):24}  {_cut(host, 28):28}  ") + mark + printable(what))
        add("")
    if d.symptoms:
        add("Symptoms")
        for s in d.symptoms:
            mark = "explained" if s.explained else "unexplained"
            hosts = f"{len(s.hosts):>4} host{'' if len(s.hosts) == 1 else 's'}" if s.hosts else ""
            ranks = f"ranks {_ranks(s.ranks)}  " if s.ranks else ""
            add(f"  {s.kind:24} {s.count:>8,}  {hosts:<10} {ranks}"
                f"{_first(s)} → {_t(s.last)}  [{mark}]  e.g. {ref(s.sample)}")
        add("")
    if d.missing_evidence:
        add("Missing evidence")
        for m in d.missing_evidence:
            what = _hosts(m.hosts) if m.hosts else ""
            if m.ranks:
                what += f" (ranks {_ranks(m.ranks)})"
            import textwrap

            add(*textwrap.wrap(f"{m.kind:10} {m.detail}" + (f": {what}" if what else ""), width=100,
                               initial_indent="  ", subsequent_indent=" " * 13))
        add("")
    add(f"Recovery    {d.recovery.action}" + (f" {', '.join(d.recovery.nodes)}" if d.recovery.nodes else ""))
    if d.recovery.reason:
        add(*_wrap(f"why: {d.recovery.reason}", "            "))
    if d.recovery.next_step:
        add(*_wrap(f"next: {d.recovery.next_step}", "            "))
    if stats:
        # The four parts add up to the lines read: a damaged line kept as evidence counts as
        # matched by the engine, so it is taken out of "matched" here.
        read, cands, matched, damaged = (stats.get(k, 0) for k in ("lines", "candidates", "matched", "unparsed"))
        files = stats["files"]
        # Parts that are none are left out: "0 unreadable" says nothing a person needs.
        parts = [f"{n:,} {what}" for n, what in ((matched - damaged, "matched a pattern"),
                                                 (cands - matched, "hit an anchor but no pattern"),
                                                 (read - cands, "had no anchor"), (damaged, "unreadable (kept as evidence)"))
                 if n]
        lines = _wrap(f"{_n(read, 'line')} in {_n(files, 'file')}" + (": " + ", ".join(parts) if parts else ""),
                      " " * 12)
        lines[0] = "Read        " + lines[0].lstrip()
        add(*lines)
    add(f"Rules       {d.rules_version}    diagnosis {d.diagnosis_id}")
    return "\n".join(out)
