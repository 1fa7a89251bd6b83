"""The exceptions this library raises.

Every error says which operation failed, on which rank, waiting for which peer, in which
phase, so that a hang in a 64-rank job never ends with "timed out" and nothing else.

    CollectiveError
    |-- CollectiveTimeout     a deadline passed (names the rank that was waited on)
    |-- CollectiveMismatch    ranks called different collectives, sizes, dtypes, ops or algorithms
    |-- CoordinatorLost       the coordinator stayed away longer than the grace
    `-- PeerFailure           a member died, left or was evicted (failed_ranks, generation)
        |-- Evicted           this very rank was removed from the group
        `-- PeerTimeout       (also a CollectiveTimeout) an op stalled and its culprit was evicted
"""

from __future__ import annotations

from typing import Any, Iterable


class CollectiveError(RuntimeError):
    """Base class. Attributes are None where they do not apply."""

    def __init__(
        self,
        message: str,
        *,
        op: str | None = None,
        rank: int | None = None,
        peer: int | None = None,
        phase: str | None = None,
        generation: int | None = None,
    ) -> None:
        super().__init__(message)
        self.op = op
        self.rank = rank
        self.peer = peer
        self.phase = phase
        self.generation = generation


class CollectiveTimeout(CollectiveError, TimeoutError):
    """A blocking call passed its deadline. `peer` is the rank held responsible."""


class CollectiveMismatch(CollectiveError, ValueError):
    """Ranks disagree on what the operation is. `peer` is the rank that differs."""


class CoordinatorLost(CollectiveError):
    """The coordinator has been unreachable for longer than COLLECTIVES_COORDINATOR_GRACE:
    membership (failure detection, reconstruct, joiners) is gone, so every operation of this
    process raises this. Not a PeerFailure: reconstruct() cannot mend it."""


class PeerFailure(CollectiveError):
    """One or more members of the group failed; the group must be reconstructed."""

    def __init__(
        self, message: str, *, failed_ranks: Iterable[int] = (), graceful: bool = False, **kw: Any
    ) -> None:
        super().__init__(message, **kw)
        self.failed_ranks = tuple(sorted(failed_ranks))
        # The ranks left on purpose (destroy, leave, SIGTERM) after sending all they had to:
        # their last frames may still be on the way (see transport/channel.py, LEAVE_GRACE).
        self.graceful = bool(graceful)


class Evicted(PeerFailure):
    """This rank was removed from the group (declared dead, stalled or preempted)."""


class PeerTimeout(CollectiveTimeout, PeerFailure):
    """An operation passed its deadline and the rank(s) it points to were evicted from the
    group: both a timeout (of this op) and a peer failure (reconstruct to go on)."""
