"""Assigned input partitions nobody fetches are named and resumed (issue 26, part 3)."""
from faust.types import TP

from firstfault.streams.partition_watch import StuckPartitions, unfetched

E0, E1, S0 = TP("p.events", 0), TP("p.events", 1), TP("p.scheduler", 0)


def test_paused_or_inactive_without_a_full_buffer_is_unfetched():
    assigned = {E0, E1, S0}
    assert unfetched(assigned, paused=(), active=assigned, buffered=()) == set()
    assert unfetched(assigned, paused={S0}, active={E0, E1}, buffered=()) == {S0}
    assert unfetched(assigned, paused=(), active={E0}, buffered={E1}) == {S0}      # a full buffer explains E1
    assert unfetched(assigned, paused={TP("other", 0)}, active=None, buffered=()) == set()   # not built yet


def test_a_partition_is_resumed_once_unfetched_long_enough_then_watched_again():
    watch = StuckPartitions(after_s=10)
    assert watch.update({S0}, now=0) == []
    assert watch.update({S0, E1}, now=5) == []
    assert watch.update({S0, E1}, now=10) == [S0]
    assert watch.update({E1}, now=12) == []                  # S0 is read again: forgotten
    assert watch.update({E1, S0}, now=15) == [E1]
    assert watch.update({S0}, now=24) == []                  # S0's clock started again at 15
    assert watch.update({S0}, now=25) == [S0]
    assert watch.update(set(), now=26) == [] and watch.update({S0}, now=30) == []


def test_a_partition_no_fetch_ever_reported_is_unfetched():
    assigned = {E0, E1, S0}
    assert unfetched(assigned, paused=(), active=assigned, buffered=(), never_fetched={E1}) == {E1}
    assert unfetched(assigned, paused=(), active=assigned, buffered=(), never_fetched={TP("other", 3)}) == set()
