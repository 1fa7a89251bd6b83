"""Receive from any source: which peer's next point-to-point message arrives first.

A receive from any source (MPI_ANY_SOURCE; torch's recv without src) is a receive from the
peer whose next message is here first. Point-to-point messages are numbered per pair of ranks
(channel.py), so that peer is found by looking, without taking anything: at the frames already
kept for later (transport.early), then at new frames as they come, each vetted as an
OpChannel vets them (generation, sender, header) and kept for whoever wants it. The caller
then receives from that peer as usual, in its place among that peer's messages.
"""

from __future__ import annotations

import time
from collections import deque

from .base import Transport
from .channel import OpChannel
from .wire import LINK_TEST, STREAM_OF


def first_sender(t: Transport, expected: dict[int, int], timeout: float) -> int | None:
    """The peer p (of `expected`) whose point-to-point message number expected[p] has arrived
    first, or None once `timeout` seconds pass. Raises the group's failure, if it has one."""
    vet = OpChannel(t, -1, None, "recv", timeout, p2p_peer=-1)  # keeps every frame it vets
    deadline = time.monotonic() + timeout
    while True:
        for p, seq in expected.items():
            if any(h.seq == seq for h, _ in t.early.get((p, 1), ())):
                return p
        if t.failure is not None:
            raise t.failure
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        got = t.next_frame(min(left, 0.05))
        if got is None:
            continue
        src, raw, payload = got
        h = vet.admit(src, raw)  # None: dropped (malformed, another generation, a probe)
        if h is None or h.type == LINK_TEST:  # a test is timed, never kept (linktest.py)
            if h is not None:
                t.linkstats.tested(src, h.sent, time.time(), h.number)
            t.release(payload)
            continue
        t.early.setdefault((h.src, STREAM_OF[h.type]), deque()).append((h, payload))
