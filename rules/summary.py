"""The diagnosis' ``summary``: the sentence or two a person reads first (contract section 2).

Built only from what the FINAL rules decided and recorded, so the summary, the page and the
JSON say the same thing: the cause and why it is first (attributed), the candidates and what
would decide (ambiguous), the strongest suspect and why, then what to collect (unattributed),
or why the alarming lines did not matter (no_failure).
"""
from __future__ import annotations

from typing import Any

from firstfault.schemas import Candidate, RootCause

from .final import FinalContext, placed


def percent(x: float) -> str:
    """A share as people read it: 100% only when it is all, 0% only when it is none (the CLI
    summary and the page say the same: firstfault/render.py, templates/_percent.html)."""
    if x >= 1:
        return "100%"
    if x <= 0:
        return "0%"
    whole = round(x * 100)
    if whole >= 100:
        return f"{int(x * 1000) / 10:.1f}%"      # 99.87% reads 99.8%, not 100%
    if whole <= 0:
        return "<1%"
    return f"{whole}%"


_pct = percent


NOT_AT_FAULT = frozenset({"application"})   # domains whose cause runs on a node without being the node's fault


def node_blame(domain: str, nodes: list[str]) -> str:
    """``responsible_nodes`` in the words every text surface uses (the CLI, ``diagnoses``, alerts, the
    page): "responsible" only where the node is at fault; an application fault happened on its node,
    which is not at fault and not drained."""
    if not nodes:
        return "responsible -"
    if domain in NOT_AT_FAULT:
        return f"on {', '.join(nodes)} (not at fault)"
    return f"responsible {', '.join(nodes)}"


def _where(ref: Any) -> str:
    return f"{ref.path}:{ref.line}"


def write_summary(ctx: FinalContext, status: str, root: RootCause | None, candidates: list[Candidate],
                  symptom_lines: int) -> str:
    if status == "no_failure":
        alarming = sorted({e.kind for e in ctx.events if e.role in ("root", "symptom") and e.source != "scheduler"})
        if not alarming:
            return "The workload completed; nothing in the logs looked like a failure."
        return (f"The workload completed, so the alarming lines ({', '.join(alarming[:4])}"
                f"{' and more' if len(alarming) > 4 else ''}) did not stop it: they are not a cause.")
    if status == "attributed" and root is not None:
        return f"{_sentence(root.message)} {_why_first(ctx, symptom_lines)}"
    rec = ctx.recovery or {}
    nxt = rec.get("next_step", "")
    if status == "ambiguous":
        parts = [f"{c.sub_domain} on {', '.join(c.nodes) or 'an unnamed host'} ({c.message})" for c in candidates]
        return (f"{len(candidates)} causes fit and nothing in the lines says which came first: "
                + "; ".join(parts) + f". To decide: {nxt}.")
    suspect = _suspect_reason(ctx)
    return ("No cause is proven by the lines." + (f" {suspect}" if suspect else "")
            + (f" Next: {nxt}." if nxt else ""))


def _sentence(text: str) -> str:
    text = (text or "").strip()
    return text if text.endswith(".") else text + "."


def _why_first(ctx: FinalContext, n_sym: int) -> str:
    chosen = ctx.chosen
    steps = {s.action for s in ctx.steps if s.rule_id == "final.choose"}
    folded = [i for i, into in ctx.fault_of.items() if into in chosen]
    demoted = len([i for i, r in ctx.explained_by.items() if r in chosen and i not in ctx.fault_of])
    if "only_cause" in steps and ctx.coverage < float(ctx.settings["min_coverage"]):
        why = "It is the only cause in the lines, and no stamped line contradicts it"
    elif chosen[0].quality == "inherited":
        why = (f"Its line has no stamp of its own (it follows the stamped line above), it comes before the "
               f"echoes in its file, and it explains {_pct(ctx.coverage)} of the {n_sym:,} symptom lines") if n_sym else \
              "Its line has no stamp of its own, and nothing stamped contradicts it"
    elif not placed(chosen[0]):
        why = (f"It has no time of its own; it comes before the echoes in its file and explains "
               f"{_pct(ctx.coverage)} of the {n_sym:,} symptom lines") if n_sym else \
              "It has no time of its own, and nothing stamped contradicts it"
    elif n_sym:
        why = f"It is the earliest cause, and it explains {_pct(ctx.coverage)} of the {n_sym:,} symptom lines after it"
    else:
        why = "It is the earliest cause in the lines"
    if folded:
        why += (f"; {len(folded)} report{'s' if len(folded) != 1 else ''} of the same fault by another layer "
                f"(CUDA, NCCL, a coarser decode) {'are' if len(folded) != 1 else 'is'} its evidence, not another cause")
    if demoted:
        why += f"; it also explains {demoted} later fault report{'s' if demoted != 1 else ''}"
    return why + "."


def _suspect_reason(ctx: FinalContext) -> str:
    silent = _silent_reason(ctx)
    for st in ctx.steps:
        if st.rule_id == "final.straggler":
            hosts = ", ".join(st.detail.get("hosts", []))
            ranks = sorted({r for e in st.events for r in e.ranks})
            return (f"Strongest suspect: {hosts}: rank{'s' if len(ranks) != 1 else ''} "
                    f"{', '.join(map(str, ranks)) or '?'} never reached collective {st.detail.get('stuck_at')} "
                    f"that the other ranks waited on." + (f" {silent}" if silent else ""))
    return " ".join(part for part in (silent, _unattributed_reason(ctx)) if part)


def _unattributed_reason(ctx: FinalContext) -> str:
    for st in ctx.steps:
        if st.rule_id == "final.choose" and st.action == "unattributed" and st.events:
            hosts = sorted({e.host for e in st.events if e.host} | {h for h in ctx.suspects if h})
            kinds = sorted({e.sub_domain or e.kind for e in st.events})
            if st.detail.get("weak"):
                return (f"Only weak evidence ({', '.join(kinds)}), which other faults also produce"
                        + (f"; suspects: {', '.join(hosts)}." if hosts else "."))
            return (f"Root-like lines ({', '.join(kinds)}) explain too little of the failure"
                    + (f"; suspects: {', '.join(hosts)}." if hosts else "."))
    return ""


def _silent_reason(ctx: FinalContext) -> str:
    """final.silent_ranks: the ranks whose logs are present but say nothing of the hung collective."""
    st = next((s for s in ctx.steps if s.rule_id == "final.silent_ranks" and s.action == "suspect"), None)
    if st is None:
        return ""
    d = st.detail
    ranks = d.get("silent_ranks", [])
    where = d.get("rank_hosts", {})
    by_host: dict[str, list[int]] = {}
    for r in ranks:
        by_host.setdefault(where.get(str(r), ""), []).append(r)
    named = ", ".join(_spans(rs) + (f" ({host})" if host else "") for host, rs in by_host.items())
    one = len(ranks) == 1
    op = f" ({d['op']})" if d.get("op") else ""
    return (f"Suspect: rank{'' if one else 's'} {named} printed nothing about collective {d.get('collective')}{op} "
            f"while {d.get('timed_out')} of {d.get('world_size')} ranks timed out on it; "
            f"{'its' if one else 'their'} other lines are in the logs, so the silence is evidence, "
            f"not a log left out.")


def _spans(ranks: list[int]) -> str:
    """[3, 16, 17, 18] -> '3, 16-18'."""
    out: list[str] = []
    for r in sorted(ranks):
        if out and out[-1].split("-")[-1] == str(r - 1):
            out[-1] = out[-1].split("-")[0] + f"-{r}"
        else:
            out.append(str(r))
    return ", ".join(out)


def coverage_phrase(status: str, coverage: float, symptoms: list[Any]) -> str | None:
    """The coverage line as the CLI and the page say it (None: nothing to say, the workload completed).
    ``symptom_coverage`` is the cause's share; with no proven cause (unattributed) the lines' own
    ``explained`` marks say it, and with no symptom lines there is no share to give."""
    if status == "no_failure":
        return None
    total = sum(s.count for s in symptoms)
    if not total:
        return "no symptom lines"
    lines = f"{total:,} symptom line{'' if total == 1 else 's'}"
    if status == "unattributed":
        explained = sum(s.count for s in symptoms if s.explained)
        if explained:
            return f"no cause proven; {explained:,} of {lines} explained"
        return ("no cause proven, so its 1 symptom line is unexplained" if total == 1 else
                f"no cause proven, so none of its {lines} is explained")
    return f"{percent(coverage)} of {lines} explained"


def inferred_record(missing_evidence: list[Any]) -> bool:
    """The input had no workload.json (a bare file or folder): references to it name no file."""
    return any(m.kind == "workload" and m.detail.startswith("no workload.json") for m in missing_evidence)
