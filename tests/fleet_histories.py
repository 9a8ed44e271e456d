"""Random fleet histories for the fleet-memory property tests: episodes made directly (no engine),
a small fleet, short cycles and windows so broad events, lapses and the per-cycle cap all happen."""
from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from firstfault.rules.fleet import Episode, Policy, SUB_DOMAIN_FAMILY, iso

T0 = datetime(2026, 11, 2, 10, 0, 0, tzinfo=timezone.utc)
SUBS: dict[str, list[str]] = {}
for _sub, _fam in SUB_DOMAIN_FAMILY.items():
    SUBS.setdefault(_fam, []).append(_sub)


@dataclass(frozen=True)
class Attempt:
    """One diagnosis' part of the record: its attempt key, revision and episodes (all at one time)."""

    key: str
    revision: int | None
    episodes: tuple[Episode, ...]

    @property
    def when(self) -> datetime:
        return self.episodes[0].when if self.episodes else T0


def random_policy(rng: random.Random) -> Policy:
    return Policy(min_episodes=rng.choice([1, 2, 2, 3]), window_days=rng.choice([0.02, 0.05, 0.1, 0.25]),
                  max_new_per_cycle=rng.choice([0, 1, 1, 2]), cycle_s=rng.choice([300.0, 600.0, 900.0]),
                  broad_threshold=rng.choice([2, 3, 5, 16]), count_suspects=rng.random() < 0.7,
                  retain_margin_days=rng.choice([0.01, 0.03, 0.1]))


def random_history(rng: random.Random, n: int, hosts: int = 12, span_s: float = 2 * 86400.0) -> list[Attempt]:
    """``n`` attempts over ``span_s`` seconds on ``hosts`` nodes, oldest first (ties in any order)."""
    pool = [f"n{i:02d}" for i in range(hosts)]
    out = []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(n / span_s) if rng.random() < 0.8 else 0.0      # some attempts share an instant
        at = iso(T0 + timedelta(seconds=round(t, 3)))
        rows: dict[tuple[str, str], Episode] = {}
        attempt = rng.choice([0, 0, 1])
        for _ in range(rng.choice([1, 1, 1, 2, 3, 6])):
            host, fam = rng.choice(pool), rng.choice(list(SUBS))
            rows[(host, fam)] = Episode.model_validate({
                "host": host, "family": fam, "sub_domain": rng.choice(SUBS[fam]),
                "role": rng.choice(["attributed", "suspect"]), "workload_id": f"w{i}", "attempt": attempt, "at": at,
                "diagnosis_id": f"d{i}", "summary": f"s{i}"})
        eps = tuple(sorted(rows.values(), key=lambda e: (e.host, e.family)))
        out.append(Attempt(key=f"{attempt}:w{i}", revision=None, episodes=eps))
    return out


def with_revisions(rng: random.Random, history: list[Attempt], p: float = 0.2) -> list[Attempt]:
    """Some attempts again as later revisions (other nodes or families, a moved onset), and some
    revisions again with a lower number, as a late, stale copy would come."""
    out = []
    for a in history:
        if rng.random() >= p:
            out.append(a)
            continue
        first = Attempt(a.key, 0, tuple(e.model_copy(update={"revision": 0}) for e in a.episodes))
        at = iso(a.when + timedelta(seconds=rng.uniform(-600, 600)))
        redone = [e.model_copy(update={"host": rng.choice([e.host, "n00", "n01"]), "at": at, "revision": 1})
                  for e in a.episodes]
        moved = tuple(sorted({(e.host, e.family): e for e in redone}.values(), key=lambda e: (e.host, e.family)))
        second = Attempt(a.key, 1, moved if rng.random() < 0.8 else ())
        out += [first, second] + ([Attempt(a.key, 0, first.episodes)] if rng.random() < 0.3 else [])
    return out


def arrival_order(rng: random.Random, history: list[Attempt], max_late_s: float) -> list[Attempt]:
    """The attempts in an order they may arrive: each up to ``max_late_s`` after its own time;
    the revisions of one attempt in the order given."""
    t0 = min((a.when for a in history if a.episodes), default=T0)
    arrive = [(a.when if a.episodes else t0).timestamp() + rng.uniform(0, max_late_s) for a in history]
    seen: dict[str, float] = {}
    for i, a in enumerate(history):
        arrive[i] = max(arrive[i], seen.get(a.key, arrive[i]))
        seen[a.key] = arrive[i]
    return [a for _, a in sorted(zip(arrive, history), key=lambda p: p[0])]


def records_of(attempts: list[Attempt]) -> dict[str, list[Episode]]:
    """host -> episodes: each attempt key's last arrival, unless it is a lower revision (as the store does)."""
    latest: dict[str, Attempt] = {}
    for a in attempts:
        cur = latest.get(a.key)
        if cur is not None and a.revision is not None and cur.revision is not None and a.revision < cur.revision:
            continue
        latest[a.key] = a
    out: dict[str, list[Episode]] = {}
    for a in latest.values():
        for e in a.episodes:
            out.setdefault(e.host, []).append(e)
    return out
