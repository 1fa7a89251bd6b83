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

The coordinator gone between a proposal and its decision. It sends `go` only once every
member accepted, and to every member; it may die while those messages are on their way, so
a member holding a proposal undecided cannot tell alone whether another member applied it
(go reached it) or nobody did (no go was sent, or a drop was). No rule that each member
applies on its own is safe both ways; the decision is made where every member's state is
seen, and until then an op at or past the proposal's start waits, never longer than the
library waits for its coordinator at all:

  * every member keeps an undecided proposal undecided while the coordinator is away (it
    neither applies nor forgets it), and sends the book's state() -- the proposal it holds
    undecided, the last one it applied -- with its re-registration (membership/restart.py);
  * a restarted coordinator, once every member is back (or removed), decides every proposal
    a member holds from those states alone: `go` if any member applied it (the old
    coordinator decided go, so every member had accepted it), else `drop` (nobody can have
    run an op on it); and numbers its own proposals past every version reported, so that no
    decision of its own is taken for an old one (membership/slowlinks.py, resolve);
  * a coordinator that does not come back within the grace makes every operation raise
    CoordinatorLost (restart.py): interrupt() ends the wait for the decision with it at once.

Who holds it. The group owns one book per generation (group/core.py, GroupCore.schedules), and
only its all_reduce reads it (group/rerouted.py); only membership writes it (the heartbeat
thread: membership/slowlinks.py, on_notice), through the book that membership/lifecycle.py
hands the coordinator client with the generation's transport. The transport never sees it: a
failure ends a wait here only through interrupt(), which whoever makes the group fail calls
along with Transport.interrupt (GroupCore.interrupt; the heartbeat's Interrupt effect). A
failure the transport finds by itself (a peer's connection closed: zmq/peerwatch.py) reaches
the book through the coordinator, which tells every member (the heartbeat's Interrupt); the
wait's deadline bounds it in any case.
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


class Answer(NamedTuple):
    """The book's answer for one op (ask): wait for a decision, or run `plan` (None: the
    default schedules)."""

    waits: bool
    plan: Any


class BookState(NamedTuple):
    """What a re-registration says of a book (-1: none): the proposal held undecided, and
    the last one applied."""

    pending_version: int = -1
    pending_start: int = -1
    current_version: int = -1
    current_start: int = -1

    def wire(self) -> list[int]:
        return list(self)

    @classmethod
    def from_wire(cls, raw: Any) -> BookState | None:
        if not isinstance(raw, (list, tuple)) or len(raw) != 4:
            return None
        if not all(type(x) is int and x >= -1 for x in raw):
            return None
        return cls(*raw)


class ScheduleBook:
    """One rank's schedules in one generation (`generation`: the group's, which the
    coordinator's notices name): the one in force, and at most one proposal being decided."""

    def __init__(self, generation: int) -> None:
        self.generation = generation
        # for_op takes the lock itself (in C, once per op); the Condition's own `with` is two
        # Python calls
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self.current: Decided | None = None  # None: the default schedules
        self._before: Any = None  # the plan in force before current.start (ops still ahead)
        self._pending: Decided | None = None  # accepted, not decided yet
        self._asked = -1  # the highest op seq for_op was asked about
        self._failure: Exception | None = None  # interrupt(): what a waiting op raises

    def propose(self, version: int, start: int, plan: Any) -> bool:
        """The coordinator proposes `plan` from op `start`: True if this rank accepts."""
        with self._cond:
            # (versions are only matched with their decision: a coordinator that restarted
            # numbers its proposals afresh)
            if self._asked >= start:
                return False
            self._pending = Decided(version, start, plan)
            return True

    def decide(self, version: int, go: bool) -> None:
        with self._cond:
            p = self._pending
            if p is None or p.version != version:
                return
            self._pending = None
            if go:
                self._before = None if self.current is None else self.current.plan
                self.current = p
            self._cond.notify_all()

    def interrupt(self, failure: Exception) -> None:
        """The group failed (its coordinator lost for good, a peer removed, the rank left):
        an op waiting for a decision, and every later one that would wait, raises `failure`
        now instead of waiting for its deadline."""
        with self._cond:
            self._failure = failure
            self._cond.notify_all()

    def state(self) -> BookState:
        with self._cond:
            p, c = self._pending, self.current
            return BookState(
                -1 if p is None else p.version,
                -1 if p is None else p.start,
                -1 if c is None else c.version,
                -1 if c is None else c.start,
            )

    def ask(self, seq: int) -> Answer:
        """for_op's rule without its wait: the plan in force for op `seq`, or that op must
        wait for the decision on a proposal it accepted (waits; ask again once decided).
        For a shell that waits on its own clock (the simulator, collectives/simulation/):
        the same rule as for_op, which asks it in its loop."""
        with self._lock:
            return self._ask(seq)

    def _ask(self, seq: int) -> Answer:  # under the lock
        self._asked = max(self._asked, seq)
        if self._pending is not None and self._pending.start <= seq:
            return Answer(True, None)
        return Answer(False, self._plan_for(seq))

    def for_op(self, seq: int, deadline: float, where: str = "") -> Any:
        """The plan in force for op `seq` (None: the default). Waits, until `deadline`
        (time.monotonic()), for an accepted proposal that starts at or before `seq`."""
        with self._lock:  # the condition's
            # _ask, written out for what nearly every op finds (no proposal pending that
            # starts by this op): once per op
            if seq > self._asked:
                self._asked = seq
            pending = self._pending
            if pending is None or pending.start > seq:
                cur = self.current  # _plan_for, written out
                if cur is None:
                    return None
                return self._before if seq < cur.start else cur.plan
            while (answer := self._ask(seq)).waits:
                assert self._pending is not None
                if self._failure is not None:
                    raise self._failure
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CollectiveTimeout(
                        f"{where or 'op'} #{seq}: no decision from the coordinator on the "
                        f"schedule it proposed from op #{self._pending.start}",
                        op=where or None,
                    )
                self._cond.wait(min(left, 0.5))
            return answer.plan

    def last(self) -> Any:
        """The plan the latest op ran on (None: the default), for a progress line."""
        with self._cond:
            return self._plan_for(self._asked)

    def _plan_for(self, seq: int) -> Any:
        cur = self.current
        if cur is None:
            return None
        if seq < cur.start:
            return self._before
        return cur.plan


__all__ = ["Answer", "BookState", "Decided", "ScheduleBook"]
