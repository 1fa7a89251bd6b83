"""The schedules the coordinator hands this rank, and the op each one starts at.

A new schedule (a ring order, a tree root: algorithms/schedule.py) must start at the same op
on every rank, or two ranks run different schedules of one op. The coordinator agrees it with
the ranks in two phases over their heartbeat sockets (membership/reroute.py):

    propose(version, start, plan)  ->  this rank accepts iff it has not yet asked for the
                                       schedule of op `start` or later (for_op), and then
                                       promises to ask for it only once the decision is in
    decide(version, go)            ->  go: the plan holds from op `start` on; else forgotten

for_op(seq) is asked by the op thread at the start of every op that has a schedule (all_reduce):
it returns the plan in force for `seq`, and waits for the decision if a proposal it accepted
starts at or before `seq` and is still undecided (a heartbeat round trip, normally: the start is
a few ops ahead). Both sides take one lock, so a proposal either finds the op thread before
`start` (accepted: the op thread will wait) or past it (refused: the coordinator proposes again,
further ahead). Every rank that runs op `start` therefore runs it with the same plan.

The plan itself is opaque here: the transport only keeps it for the group.
"""

from __future__ import annotations

import threading
import time
from typing import Any, NamedTuple

from ..common.errors import CollectiveTimeout


class Decided(NamedTuple):
    version: int
    start: int  # the first op seq the plan holds for
    plan: Any
    until: int | None = None  # the plan holds before this op only; then the one before it


class ScheduleBook:
    """One rank's schedules: the one in force, and at most one proposal being decided."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.current: Decided | None = None  # None: the default schedules
        self._before: Any = None  # the plan in force before current.start (ops still ahead)
        self._pending: Decided | None = None  # accepted, not decided yet
        self._asked = -1  # the highest op seq for_op was asked about

    def propose(self, version: int, start: int, plan: Any, ops: int | None = None) -> bool:
        """The coordinator proposes `plan` from op `start` (for `ops` ops, then back to the
        plan in force now; None: for good): True if this rank accepts."""
        with self._cond:
            # (versions are only matched with their decision: a coordinator that restarted
            # numbers its proposals afresh)
            if self._asked >= start:
                return False
            self._pending = Decided(version, start, plan, None if ops is None else start + ops)
            return True

    def decide(self, version: int, go: bool) -> None:
        with self._cond:
            p = self._pending
            if p is None or p.version != version:
                return
            self._pending = None
            if go:
                before = self.current
                if before is None or before.until is None:
                    self._before = None if before is None else before.plan
                self.current = p
            self._cond.notify_all()

    def for_op(self, seq: int, deadline: float, where: str = "") -> Any:
        """The plan in force for op `seq` (None: the default). Waits, until `deadline`
        (time.monotonic()), for an accepted proposal that starts at or before `seq`."""
        with self._cond:
            self._asked = max(self._asked, seq)
            while self._pending is not None and self._pending.start <= seq:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CollectiveTimeout(
                        f"{where or 'op'} #{seq}: no decision from the coordinator on the "
                        f"schedule it proposed from op #{self._pending.start}",
                        op=where or None,
                    )
                self._cond.wait(min(left, 0.5))
            return self._plan_for(seq)

    def last(self) -> Any:
        """The plan the latest op ran on (None: the default), for a progress line."""
        with self._cond:
            return self._plan_for(self._asked)

    def _plan_for(self, seq: int) -> Any:
        cur = self.current
        if cur is None:
            return None
        if seq < cur.start or (cur.until is not None and seq >= cur.until):
            return self._before
        return cur.plan


__all__ = ["Decided", "ScheduleBook"]
