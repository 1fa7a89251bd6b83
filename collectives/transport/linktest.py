"""A link routed around as slow, tested while the ops run: a member's side.

A link that the schedule avoids carries nothing but the ops' small commit messages, so its
own figures cannot say when it recovers. The coordinator (membership/reroute.py) asks for a
test instead: the sender of each link named posts a LINK_TEST frame of the size asked to its
receiver as each of its next few ops begins, and so does the sender of a healthy link into
the same receiver (the witness), alongside. The receiver times them from their posting
(linkstats.py: the fastest of a test's frames) and drops them; its heartbeat carries the
figures; the coordinator compares the two links.

Why a frame and not an op on the default schedule: a trial op sends the whole op's bytes over
the slow link and every rank waits for them; a test frame costs one frame's time on that link,
seen only by the receiver's next wait on its sender (the commit message queued behind it);
one frame per op, so no op waits for more than one.

The request arrives on the heartbeat thread; the sockets belong to the op thread, which posts
what is due at the start of its next op (channel.py, OpChannel.begin). Nothing is posted while
no op runs: the coordinator's wait for the figures has a deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import NamedTuple, Protocol

from .wire import LINK_TEST, encode_header

log = logging.getLogger("collectives")


class TestFrame(NamedTuple):
    """Test frames to send: to `dst`, `nbytes` of filler, for test `token`, one at each of
    the next `ops` ops."""

    dst: int
    nbytes: int
    token: int
    ops: int = 1


class Poster(Protocol):
    """What a test needs of its transport (base.py, Transport)."""

    rank: int
    size: int
    generation: int

    def post(self, peer: int, header: bytes, payload: object, zero_copy: bool) -> object: ...


class LinkTests:
    """The test frames asked for and not sent yet (the heartbeat thread adds, the op thread
    takes)."""

    def __init__(self) -> None:
        self._due: list[TestFrame] = []
        self._lock = threading.Lock()

    def ask(self, frames: list[TestFrame]) -> None:
        with self._lock:
            self._due.extend(frames)

    def take_due(self, rank: int, size: int) -> list[TestFrame]:
        """The frames to post as an op begins (each test's count goes down by one), to peers
        of a group of `size` other than `rank`: post_due's rule, for a shell that posts on its
        own clock (the simulator, collectives/simulation/)."""
        if not self._due:  # read without the lock: a frame added meanwhile waits one op
            return []
        with self._lock:
            due = self._due
            self._due = [f._replace(ops=f.ops - 1) for f in due if f.ops > 1]
        return [f for f in due if 0 <= f.dst < size and f.dst != rank]

    def post_due(self, t: Poster) -> None:
        """Post every test frame due (the op thread, as an op begins). Never raises: a test
        that cannot be sent says nothing, and the coordinator's deadline covers it."""
        if not self._due:  # take_due's first test, here: nearly every op has nothing due
            return
        for f in self.take_due(t.rank, t.size):
            header = encode_header(
                LINK_TEST, t.generation, 0, t.rank, f.token, "test", 0, 0, None, time.time()
            )
            try:
                t.post(f.dst, header, bytes(f.nbytes), False)
            except Exception as exc:  # a dead peer: failure detection reports it, not this
                log.debug("rank %d could not test its link to rank %d: %r", t.rank, f.dst, exc)


__all__ = ["LinkTests", "Poster", "TestFrame"]
