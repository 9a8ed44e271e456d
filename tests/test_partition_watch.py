"""Assigned input partitions nobody fetches are named and resumed (issue 26, part 3)."""
from faust.types import TP

from firstfault.streams.partition_watch import StuckPartitions, unfetched
from firstfault.streams.unread import UnreadWatch

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


def test_a_partition_is_unread_while_records_wait_and_its_readers_do_not_move():
    w = UnreadWatch()
    w.look("raw0", done=None, high=0, now=0.0)            # empty: nothing waits
    w.look("raw1", done=5, high=5, now=0.0)               # read to its end
    assert w.seconds(0.0) == {"raw0": 0.0, "raw1": 0.0}
    w.look("raw0", done=None, high=3, now=1.0)            # three records, nobody ever read it
    w.look("raw1", done=5, high=9, now=1.0)
    w.look("raw0", done=None, high=3, now=40.0)
    w.look("raw1", done=8, high=9, now=40.0)              # its reader moved: the wait starts again
    assert w.seconds(40.0) == {"raw0": 39.0, "raw1": 0.0}
    assert w.unread(40.0, after_s=30.0) == ["raw0"]
    w.look("raw1", done=8, high=9, now=80.0)              # ... and then stopped
    assert w.unread(80.0, after_s=30.0) == ["raw0", "raw1"]
    w.look("raw0", done=3, high=3, now=81.0)              # read at last
    w.look("raw1", done=8, high=None, now=81.0)           # an unknown high says nothing
    assert w.seconds(81.0) == {"raw0": 0.0, "raw1": 41.0}
    w.forget({"raw0"})
    assert w.seconds(81.0) == {"raw0": 0.0}
