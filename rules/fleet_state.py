"""Fleet memory, kept incrementally: ``fleet.evaluate``'s verdicts without replaying the fleet.

Pure: no I/O and no clock (the caller passes the instants). A diagnosis touches its nodes and
its cycle (``absorb``); a report at an instant touches the nodes asked for (a page, one node),
the nodes whose episodes moved since the last step, and the broad events and shared causes.

Time flows on the record's own clock, its *watermark* (the newest episode, never past the
``now`` the caller gives): steps more than ``retain_margin_days`` behind it are final, and
episodes whose cycles ended ``window_days`` before the last final step are dropped. An
episode arriving within the margin is replayed exactly, as if it had come in order; one
arriving later still counts from then on, but the final steps are not redone. So the state is
a function of the sequence of attempts it was given: the same sequence (a rebuild from the
diagnoses topic) gives the same verdicts, and verdicts match ``evaluate`` over every episode
ever recorded whenever arrivals are within the margin.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from firstfault.schemas import Diagnosis

from .fleet import (NETWORK_NOTE, NO_EPISODES_NOTE, NO_TOPOLOGY_NOTE, WORKLOAD_CAUSED, BroadEvent, Episode,
                    FleetReport, NodeView, Policy, SharedCause, Topology, broad_note, episode_ref, episodes_from, iso,
                    node_view, shared_causes)
from .fleet_index import (AT, ATTEMPT_NO, FAMILY, HOST, ROLE, SUB_DOMAIN, WHEN, WORKLOAD_ID, EpisodeIndex, Partial,
                          episode_data, episode_of, from_us, to_us)
from .fleet_replay import MISSING, Replay


def topology_key(topology: Topology | None) -> int:
    """A fingerprint of the topology, so cached shared causes follow an edited file."""
    return 0 if topology is None else hash((topology.source, tuple(topology.groups)))


class FleetState:
    def __init__(self, policy: Policy, keep_from: datetime | None = None) -> None:
        """``keep_from``: never make final a step after this instant (a report at it stays exact)."""
        self.policy = policy
        self.index = EpisodeIndex(policy)
        self.replay = Replay(policy.max_new_per_cycle)
        self.margin_us = timedelta(days=policy.retain_margin_days) // timedelta(microseconds=1)
        self.keep_from = None if keep_from is None else to_us(keep_from)
        self.watermark: int | None = None
        self.final: int | None = None          # steps at or before it are final
        self.dirty_from: int | None = None     # steps at or after it must be replayed
        self._cache: dict[tuple[str, int], tuple[Any, Any]] = {}
        self._memo: tuple[Any, int, set[str], dict[str, tuple[bool, int, int]]] | None = None

    # ------------------------------------------------------------ writing

    def absorb(self, key: str, revision: int | None, episodes: Sequence[Episode], now: datetime,
               force: bool = False) -> bool:
        """Replace attempt ``key``'s episodes (``attempt:workload_id``); False for a late lower
        revision, which is ignored unless ``force``. ``now`` caps the watermark, so an episode
        stamped in the future does not make the present final."""
        ch = self.index.put(key, revision, episodes, force)
        if ch is None:
            return False
        self._forget_judged(ch)
        late = False
        for c in ch.cycles:
            end = c + self.index.cycle_us
            if self.final is not None and end <= self.final:
                late = True           # a final step saw this cycle otherwise: judge its nodes afresh
            else:
                self._dirty(end)
        if late:
            self.replay.force |= ch.hosts
            for c in ch.flipped:
                self.replay.force |= set(self.index.cycles[c].hosts) if c in self.index.cycles else set()
            self._dirty(self.final + 1)       # type: ignore[operator]
        if ch.newest is not None:
            mark = min(ch.newest, to_us(now))
            self.watermark = mark if self.watermark is None else max(self.watermark, mark)
            self._settle()
        return True

    def absorb_diagnosis(self, d: Diagnosis, now: datetime, fallback_at: str | None = None) -> list[Episode]:
        """A diagnosis' episodes, as the store records them (provisional ones make none)."""
        if d.provisional:
            return []
        eps = episodes_from(d, fallback_at)
        return eps if self.absorb(f"{d.attempt}:{d.workload_id}", d.revision, eps, now) else []

    def _forget_judged(self, ch: Any) -> None:
        """Keep the last report's judgements of the nodes this change did not touch (see ``_step_at``)."""
        memo, f = self._memo, self.replay.frontier
        if memo is None:
            return
        if ch.flipped or any(f is not None and c + self.index.cycle_us <= f for c in ch.cycles):
            self._memo = None          # a step already taken changes: the next report starts afresh
            return
        for h in ch.hosts:
            memo[3].pop(h, None)
        memo[2].update(ch.hosts)

    def _dirty(self, at: int) -> None:
        self.dirty_from = at if self.dirty_from is None else min(self.dirty_from, at)

    def _settle(self) -> None:
        """Make final the steps more than the margin behind the watermark; drop what they no longer need."""
        assert self.watermark is not None
        through = self.watermark - self.margin_us
        if self.keep_from is not None:
            through = min(through, self.keep_from - 1)
        if self.final is not None and through <= self.final:
            return
        self._replay_until(through, inclusive=True, rewind_past=False)
        self.replay.settle(through)
        self.final = through
        # The next step looks back to the last final non-broad step: older episodes never count again.
        look_back = self.replay.settled_nonbroad
        if look_back is not None:
            dropped = self.index.drop_through(look_back - self.index.window_us)
            if dropped:
                self._cache = {k: v for k, v in self._cache.items() if k[1] in self.index.cycles}
        self.replay.compact()

    def _replay_until(self, limit: int, inclusive: bool, rewind_past: bool = True) -> None:
        """Undo the dirty steps (and, ``rewind_past``, any step past ``limit``), then step through
        every cycle end before ``limit`` (or at it, ``inclusive``)."""
        rewind = self.dirty_from
        if rewind_past:
            past = limit + 1 if inclusive else limit
            rewind = past if rewind is None else min(rewind, past)
        if rewind is not None:
            self.replay.rewind(rewind)
        self.dirty_from = None
        idx = self.index
        while True:
            # A cycle that first got episodes after its end was final gets no step of its own:
            # the final past is not redone, its nodes are judged afresh at the next step (force).
            f = self.replay.frontier
            end = idx.next_end(f if self.final is None or (f is not None and f > self.final) else self.final)
            if end is None or end > limit or (end == limit and not inclusive):
                return
            carried = self._carried(end)
            if carried is None:
                hosts, judge = idx.hosts_moved(self.replay.last_nonbroad, end), idx.judge
            else:
                hosts, judged = carried

                def judge(h: str, u: int) -> tuple[bool, int, int]:
                    got = judged.get(h)
                    return idx.judge(h, u) if got is None else got
            log = self.replay.step(end, idx.broad(idx.cycle_key(end - 1)), hosts, judge)
            self.replay.journal.append(log)

    def _carried(self, end: int) -> tuple[set[str], dict[str, tuple[bool, int, int]]] | None:
        """The last report's nodes and judgements, when they hold for the step at ``end`` too:
        the same steps before it, the cycle it closes as broad, or not, as the report saw it.
        Then the step judges only the nodes that moved since the report."""
        memo, rp, idx = self._memo, self.replay, self.index
        if memo is None:
            return None
        (frontier, nonbroad, part, force), t, hosts, judged = memo
        if (frontier, nonbroad, force) != (rp.frontier, rp.last_nonbroad, frozenset(rp.force)) or t > end \
                or part[0] != idx.cycle_key(end - 1) or part[1] != idx.broad(part[0]):
            return None
        moved = idx.hosts_moved(t, end)
        return hosts | moved, {h: v for h, v in judged.items() if h not in moved}

    # ------------------------------------------------------------ reading

    @property
    def horizon(self) -> datetime | None:
        """Reports at or after it are exact; before it the steps are final."""
        return None if self.final is None else from_us(self.final)

    def stats(self) -> dict[str, Any]:
        return {"episodes": len(self.index), "nodes": len(self.index.hosts), "cycles": len(self.index.cycles),
                "attempts": len(self.index.attempts), "journal": len(self.replay.journal),
                "avoided": len(self.replay.avoided), "waiting": len(self.replay.waiting),
                "watermark": None if self.watermark is None else iso(from_us(self.watermark)),
                "final_through": None if self.final is None else iso(from_us(self.final)),
                "kept_since": None if self.index.cut is None else iso(from_us(self.index.cut))}

    def hosts(self) -> list[str]:
        return list(self.index.names)

    def report(self, at: datetime, topology: Topology | None = None, *, after: str | None = None,
               limit: int | None = None, hosts: Iterable[str] | None = None) -> tuple[FleetReport, str | None]:
        """The fleet report at ``at``: every node (``hosts``: those; ``after``/``limit``: a page of
        them, by name), the broad events and the shared causes. Returns it with the cursor of the
        next page (None: the last)."""
        report, nxt, _ = self._report(at, topology, after, limit, hosts, models=True)
        return report, nxt

    def report_data(self, at: datetime, topology: Topology | None = None, *, after: str | None = None,
                    limit: int | None = None, hosts: Iterable[str] | None = None) -> tuple[dict[str, Any], str | None]:
        """The same report as JSON-ready data (``report(...)[0].model_dump(mode="json")``), made
        without a model per episode: a page of a busy fleet shows a thousand of them."""
        report, nxt, rows = self._report(at, topology, after, limit, hosts, models=False)
        data = report.model_dump(mode="json")
        for node, eps in zip(data["nodes"], rows):
            node["episodes"] = eps
        return data, nxt

    def _report(self, at: datetime, topology: Topology | None, after: str | None, limit: int | None,
                hosts: Iterable[str] | None, models: bool) -> tuple[FleetReport, str | None, list[list[dict]]]:
        t = to_us(at)
        if self.final is not None and t <= self.final:
            return self._past(at, topology, after, limit, hosts, models)
        notes = [] if topology is not None else [NO_TOPOLOGY_NOTE]
        if not self.index.hosts:
            return FleetReport(at=iso(at), policy=self.policy, nodes=[], broad_events=[], shared_causes=[],
                               topology=topology.source if topology else None,
                               notes=notes + [NO_EPISODES_NOTE]), None, []
        avoided, waiting, part = self._step_at(t)
        names = list(hosts) if hosts is not None else self.index.page(after, None if limit is None else limit + 1)
        nxt = None
        if hosts is None and limit is not None and len(names) > limit:
            names, nxt = names[:limit], names[limit - 1]
        names = [h for h in names if h in self.index.hosts]
        views = [self._view(h, t, avoided, waiting, part, models) for h in names]
        rows = [] if models else [[episode_data(x) for x in reversed(self.index.episodes(h))] for h in names]
        tkey = topology_key(topology)
        if topology is None and self._network_note(t):
            notes.append(NETWORK_NOTE)
        return FleetReport(at=iso(at), policy=self.policy, nodes=views,
                           broad_events=self._broad_events(t, topology, tkey),
                           shared_causes=self._shared(t, topology, tkey),
                           topology=topology.source if topology else None, notes=notes), nxt, rows

    def _past(self, at: datetime, topology: Topology | None, after: str | None, limit: int | None,
              hosts: Iterable[str] | None, models: bool) -> tuple[FleetReport, str | None, list[list[dict]]]:
        """A report before the final steps: replay the kept episodes afresh up to ``at``."""
        fresh = FleetState(self.policy, keep_from=at)
        for key, rev, eps in self.index.attempts_in_order():
            fresh.absorb(key, rev, eps, at, force=True)
        report, nxt, rows = fresh._report(at, topology, after, limit, hosts, models)
        final = iso(from_us(self.final)) if self.final is not None else "-"
        kept = iso(from_us(self.index.cut)) if self.index.cut is not None else "the first"
        report.notes.append(f"evaluated at {iso(at)}, before this record's final steps ({final}; episodes are kept "
                            f"since {kept}): replayed afresh from the episodes kept")
        return report, nxt, rows

    def _step_at(self, t: int) -> tuple[dict[str, Any], dict[str, Any], Partial]:
        """Step at ``t`` (the cycle so far) and undo it: what evaluate's last step decides.

        The nodes to judge are those whose episodes moved since the last step. Between two
        reports on the same steps, only the nodes that moved since the previous report, or
        that a diagnosis touched, are judged again: the others' episodes did not move.
        """
        self._replay_until(t, inclusive=False)
        idx, rp = self.index, self.replay
        c = idx.cycle_key(t - 1)
        cyc = idx.cycles.get(c)
        part: Partial = (c, cyc is not None and len({x[HOST] for x in cyc.eps if x[WHEN] < t})
                         > self.policy.broad_threshold)
        key = (rp.frontier, rp.last_nonbroad, part, frozenset(rp.force))
        memo = self._memo
        if memo is not None and memo[0] == key and memo[1] <= t:
            moved = idx.hosts_moved(memo[1], t)
            judged = memo[3]
            for h in moved:
                judged.pop(h, None)
            hosts = memo[2] | moved
        else:
            hosts, judged = idx.hosts_moved(rp.last_nonbroad, t), {}
        self._memo = (key, t, hosts, judged)

        def judge(h: str, u: int) -> tuple[bool, int, int]:
            got = judged.get(h)
            if got is None:
                got = judged[h] = idx.judge(h, u, part)
            return got

        log = rp.step(t, part[1], set(hosts), judge)    # type: ignore[index]
        av, wt = rp.changes(log)
        rp.undo(log)
        rp.compact()
        return av, wt, part

    def _view(self, h: str, t: int, avoided: dict[str, Any], waiting: dict[str, Any], part: Partial,
              models: bool) -> NodeView:
        """The node's view; its episodes as models only with ``models`` (else none: see ``report_data``)."""
        idx = self.index
        since = avoided.get(h, self.replay.avoided.get(h, MISSING))
        pending = waiting.get(h, self.replay.waiting.get(h, MISSING)) is not MISSING
        recent = idx.window(h, t - idx.window_us, t)
        counted = {f: [episode_ref(x[HOST], x[WORKLOAD_ID], x[ATTEMPT_NO], x[SUB_DOMAIN], x[ROLE], x[AT]) for x in v]
                   for f, v in idx.counted(h, t, part).items()}
        ignored = sorted({x[SUB_DOMAIN] for x in recent if x[SUB_DOMAIN] in WORKLOAD_CAUSED})
        return node_view(self.policy, h, [episode_of(x) for x in reversed(idx.episodes(h))] if models else [],
                         counted, bool(recent), ignored, sum(idx.wide(x, part) for x in recent),
                         None if since is MISSING else iso(from_us(since)), pending)

    def _closed(self, c: int, t: int) -> bool:
        return c + self.index.cycle_us <= t

    def _broad_events(self, t: int, topology: Topology | None, tkey: int) -> list[BroadEvent]:
        idx, out = self.index, []
        for c in idx.broad_starts:
            if c >= t:
                break
            cyc = idx.cycles[c]
            closed = self._closed(c, t)
            hit = self._cache.get(("broad", c)) if closed else None
            if hit is not None and hit[0] == (cyc.version, tkey):
                out.append(hit[1])
                continue
            this = [x for x in cyc.ordered() if x[WHEN] < t]
            nodes = sorted({x[HOST] for x in this})
            if len(nodes) <= self.policy.broad_threshold:
                continue
            ev = BroadEvent(cycle_start=iso(from_us(c)), cycle_end=iso(from_us(c + idx.cycle_us)), nodes=nodes,
                            families=sorted({x[FAMILY] for x in this}),
                            shared_causes=shared_causes([episode_of(x) for x in this], topology,
                                                        self.policy.shared_min_nodes),
                            note=broad_note(len(nodes), self.policy, topology))
            if closed:
                self._cache[("broad", c)] = ((cyc.version, tkey), ev)
            out.append(ev)
        return out

    def _shared(self, t: int, topology: Topology | None, tkey: int) -> list[SharedCause]:
        """Network episodes on several nodes in one cycle of the window: the switch or rack they share."""
        if topology is None:
            return []
        idx, out = self.index, []
        lo = t - idx.window_us
        for c in idx.net_starts:
            if c >= t:
                break
            if c + idx.cycle_us <= lo:
                continue
            cyc = idx.cycles[c]
            whole = self._closed(c, t) and c >= lo          # every episode of it is in the window
            hit = self._cache.get(("shared", c)) if whole else None
            if hit is not None and hit[0] == (cyc.version, tkey):
                out += hit[1]
                continue
            if self._closed(c, t):
                wide = idx.broad(c)
            else:                       # the cycle so far: a broad event if it already has too many nodes
                wide = len({x[HOST] for x in cyc.eps if x[WHEN] < t}) > self.policy.broad_threshold
            net = [] if wide else [episode_of(x) for x in cyc.ordered()
                                   if x[FAMILY] == "network" and lo <= x[WHEN] < t]
            found = shared_causes(net, topology, self.policy.shared_min_nodes)
            if whole:
                self._cache[("shared", c)] = ((cyc.version, tkey), found)
            out += found
        return out

    def _network_note(self, t: int) -> bool:
        """evaluate's note: network episodes on several nodes in one cycle (before ``t``)."""
        idx = self.index
        for c in idx.net_starts:
            if c >= t:
                return False
            if self._closed(c, t):
                return True
            return len({x[HOST] for x in idx.cycles[c].eps if x[FAMILY] == "network" and x[WHEN] < t}) \
                >= self.policy.shared_min_nodes
        return False
