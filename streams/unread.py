"""Partitions nobody reads: records wait and no reader makes progress. Pure: the caller looks.

A worker sees its own assignment only, so a partition its group left unowned (a member gone
and no rebalance yet, an assignor's mistake), or owned by a member that stopped reading,
shows nowhere in its lag metric. Seen from outside it is plain: the partition's high
watermark is past what its readers have done (the group's committed offset, or the position
the extractors last reported), and that has not moved for a while. The correlator looks at
every partition of its own inputs and of the raw topic this way (``refresh_unread``) and
exports, per partition, how long it has gone unread (``firstfault_partition_unread_seconds``).
"""
from __future__ import annotations

from collections.abc import Hashable


class UnreadWatch:
    """Per partition: the offset its readers had reached, and since when records wait beyond it."""

    def __init__(self) -> None:
        self._done: dict[Hashable, int] = {}
        self._since: dict[Hashable, float] = {}      # partition -> when records began waiting unread

    def look(self, key: Hashable, done: int | None, high: int | None, now: float) -> None:
        """One look at a partition: ``done`` what its readers have done (None: nothing yet, so from
        offset 0), ``high`` its high watermark (None: unknown, the look says nothing)."""
        if high is None or high < 0:
            return
        done = max(done or 0, 0)
        if done >= high:                             # nothing waits
            self._since.pop(key, None)
        elif done != self._done.get(key):            # progress since the last look: the wait starts again
            self._since[key] = now
        else:
            self._since.setdefault(key, now)
        self._done[key] = done

    def forget(self, keep: set) -> None:
        """Drop the partitions not in ``keep`` (a topic that went away)."""
        for table in (self._done, self._since):
            for key in set(table) - keep:
                del table[key]

    def seconds(self, now: float) -> dict[Hashable, float]:
        """Every partition looked at: how long records have waited there with no progress (0: none wait)."""
        return {key: (now - self._since[key]) if key in self._since else 0.0 for key in self._done}

    def unread(self, now: float, after_s: float) -> list[Hashable]:
        """The partitions unread for ``after_s`` or longer."""
        return sorted((key for key, since in self._since.items() if now - since >= after_s), key=repr)
