"""A stalled op, as its channel reports it, and the blame that ends it.

A collective's channel (channel.py, OpChannel) does not judge its own stall: at the op's
deadline it stops and raises Stalled, carrying a Stall record with this rank's progress taken
as it stops, to whoever runs the op (the group's core, group/core.py). The op is not abandoned
yet -- its progress still shows it inside the op, waiting on that peer -- so that the
judgement, asked above the transport, reads it as stalled and can run a probe round over the
op's channel (OpChannel.probe_links). The runner then hands the channel a Blame, and the
channel raises what it calls for (OpChannel.fail_stalled).
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import Progress

# Blame.why where nobody judged: the peer waited on is blamed for sending nothing
SENT_NOTHING = "sent nothing"


@dataclass(frozen=True)
class Stall:
    """An op's deadline passed: which op, the peer it waited on, what it was doing, and
    where this rank was (the judgement reads it: no need to read the transport back)."""

    seq: int  # the op's sequence number
    peer: int | None  # the peer a receive waited on; None: it waited for a send to complete
    what: str  # what it was doing, as the error says it ("waiting for rank 2")
    where: str  # the op and its phase, as the error names them (OpChannel.where)
    progress: Progress  # this rank's, taken as the op stopped (Transport.progress)


@dataclass(frozen=True)
class Blame:
    """The verdict on a stall: whom to blame, why, and whether they were evicted -- False,
    "stalled" (this stall removed them) or "failed" (removed before: dead or gone)."""

    culprits: tuple[int, ...]
    why: str
    evicted: bool | str = False

    @classmethod
    def waited_on(cls, stall: Stall) -> Blame:
        """Nobody judged (no judge, or no answer): the peer waited on is blamed."""
        return cls(() if stall.peer is None else (stall.peer,), SENT_NOTHING)


class Stalled(Exception):
    """Raised by a collective's channel at its deadline, for the op's runner to judge; never
    seen by a caller of the group (the runner turns it into the error the verdict calls for)."""

    def __init__(self, stall: Stall):
        super().__init__(f"op #{stall.seq} stalled {stall.what} in {stall.where}")
        self.stall = stall


__all__ = ["SENT_NOTHING", "Blame", "Stall", "Stalled"]
