"""Attempts that repeat: when attempt N fails like attempt N-1, recovery escalates.

A person who retried a job and saw it fail the same way does not retry it again: they
rerun without the node, and when that node failed twice, they take it out of service.
:func:`escalate` does the same within the contract's recovery object:

    retry  ->  retry_excluding_nodes  ->  drain_nodes

"Like" means the same node (a host blamed or suspected by both attempts) or the same
failure family (the domain; for application faults the same sub_domain). The ladder
continues from where the previous attempt's recovery stood. Draining needs a node and an
infrastructure family; an application fault that repeats stops at ``notify_owner``
(no retry helps; the owner must change something). ``notify_owner`` stays ``notify_owner``.
The diagnosis says so in ``recovery.reason`` and ``summary``. Pure: no I/O, no clock;
idempotent (escalating an escalated diagnosis again changes nothing).
"""
from __future__ import annotations

from firstfault.schemas import Diagnosis

from .fleet import family_of

LADDER = ("retry", "retry_excluding_nodes", "drain_nodes")
MARK = "repeats attempt"


def _blamed(d: Diagnosis) -> set[str]:
    hosts = set(d.responsible_nodes) | set(d.suspect_nodes) | {h for c in d.candidates for h in c.nodes}
    if d.root_cause is not None and d.root_cause.host:
        hosts.add(d.root_cause.host)
    return {h for h in hosts if h}


def _failed(d: Diagnosis) -> bool:
    return d.status != "no_failure" and d.terminal_state != "completed"


def likeness(current: Diagnosis, previous: Diagnosis) -> tuple[str, list[str]] | None:
    """How ``current`` fails like ``previous`` (a phrase and the shared nodes), or None."""
    if not (_failed(current) and _failed(previous)):
        return None
    shared = sorted(_blamed(current) & _blamed(previous))
    fam_c, fam_p = family_of(current.domain), family_of(previous.domain)
    same_sub = current.sub_domain == previous.sub_domain and current.sub_domain not in (
        "unattributed", "ambiguous", "none")
    same_family = fam_c is not None and fam_c == fam_p
    if same_sub:
        what = f"the same {current.sub_domain}"
    elif same_family:
        what = f"the same {fam_c} family ({previous.sub_domain}, then {current.sub_domain})"
    elif shared and (fam_c or fam_p or current.status != "attributed"):
        what = "a failure"
    else:
        return None
    return what, shared


def escalate(current: Diagnosis, previous: Diagnosis | None) -> Diagnosis:
    """``current`` with its recovery escalated when it repeats ``previous`` (attempt N-1)."""
    if previous is None or previous.workload_id != current.workload_id or previous.attempt != current.attempt - 1:
        return current
    if current.recovery.reason.startswith(MARK) or current.recovery.action == "none":
        return current
    like = likeness(current, previous)
    if like is None:
        return current
    what, shared = like
    rec = current.recovery
    # Only a proven infrastructure cause drains; weak evidence repeated on one node stops at excluding it.
    can_drain = current.status == "attributed" and family_of(current.domain) is not None
    can_exclude = family_of(current.domain) is not None or (current.status != "attributed" and bool(shared))
    nodes = shared or sorted(set(rec.nodes) | set(current.responsible_nodes))
    where = f" on {', '.join(shared)}" if shared else ""
    level_now = LADDER.index(rec.action) if rec.action in LADDER else -1
    level_prev = LADDER.index(previous.recovery.action) if previous.recovery.action in LADDER else -1
    if rec.action == "notify_owner":
        action, target = "notify_owner", list(rec.nodes)
    else:
        level = min(max(level_now, level_prev + 1), 2)
        if level == 2 and not can_drain:
            level = 1
        if level >= 1 and (not nodes or not can_exclude):
            action, target = "notify_owner", []          # nothing to exclude, or the job's own fault: stop retrying
        else:
            action = LADDER[level]
            target = nodes if level >= 1 else list(rec.nodes)
            if level_now == 2:
                target = list(rec.nodes)                  # already draining: keep the vendor's nodes
            elif action == "retry_excluding_nodes" and not shared:
                # Same family on another node: exclude both attempts' nodes.
                target = sorted(set(nodes) | (_blamed(previous) if family_of(previous.domain) else set()))
    head = (f"{MARK} {previous.attempt} ({what}{where}): recovery escalates from "
            f"{previous.recovery.action} to {action}" if action != previous.recovery.action
            else f"{MARK} {previous.attempt} ({what}{where}): recovery stays {action}")
    reason = f"{head}; {rec.reason}" if rec.reason else head
    step = {"retry_excluding_nodes": f"rerun without {', '.join(target)}; the same failure on the same node twice "
                                     "means the node, not the job",
            "drain_nodes": f"drain {', '.join(target)}: it failed this workload twice the same way",
            "notify_owner": "stop retrying: the same failure twice; " + (rec.next_step or "find out why first")}
    next_step = step.get(action, rec.next_step) if action != rec.action else rec.next_step
    sentence = (f"Attempt {current.attempt} failed like attempt {previous.attempt} ({what}{where}), so recovery "
                f"{'escalates to ' + action if action != rec.action else 'stays ' + action}.")
    summary = f"{current.summary} {sentence}".strip()
    recovery = rec.model_copy(update={"action": action, "nodes": sorted(target), "reason": reason,
                                      "next_step": next_step})
    return current.model_copy(update={"recovery": recovery, "summary": summary})
