"""The ZeroMQ transport's send side (a part of ZmqTransport, transport.py): how a frame
leaves for a peer.

* to a peer on this host that mapped our arena, a large payload travels as a slot of our
  shared memory (shm.py), or, from a registered buffer, as the region the peer may read in
  place (a lend, registered.py); either way one short frame names it;
* any other large payload is two frames, the payload zero-copy: libzmq reads the caller's
  array, and the MessageTracker returned is waited on by the OpChannel before that memory is
  written again;
* a small message is one frame (header and payload together), over the peer's fast link
  where there is one (fastlink.py), unless a message of the same op already went by ZeroMQ;
* a peer that stops taking our messages makes a send wait, until the op's deadline, not grow
  a queue (SND_QUEUE).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import zmq

from ...common.errors import CollectiveError, CollectiveTimeout
from ..base import OpContext
from . import registered, shm
from .fastlink import FAST_MAX, FastLinks
from .frames import _FAST_ON, _LEND_FLAG, _SHM_FLAG, _frame_prefix

SND_QUEUE = 1 << 14  # messages to one peer that may wait in its queue (ZeroMQ's SNDHWM)


class ZmqSending:
    """Mixed into ZmqTransport: post() and what it needs. Uses the transport's dealers (one
    per peer), arena, lender, fast links, the op in progress and the failure notice."""

    rank: int
    generation: int
    op: OpContext
    failure: CollectiveError | None
    dealers: dict[int, zmq.Socket]
    arena: shm.SendArena | None
    lender: registered.Lender
    fast: FastLinks | None
    _shm_peers: set[int]
    shm_ready: set[int]
    shm_sent: int
    shm_fallbacks: int
    _zmq_op: dict[int, object]

    if TYPE_CHECKING:

        def _read_ahead(self) -> None: ...  # receiving.py

    def post(self, peer, header, payload, zero_copy):
        s = self.dealers[peer]
        if zero_copy and peer in self._shm_peers and peer not in self.shm_ready:
            self._read_ahead()  # its _SHM_READY may be waiting in our socket
        if zero_copy and peer in self.shm_ready and len(header) < _LEND_FLAG:
            lent = self.op.lend and self.lender.lend(payload, peer)  # registered: no copy
            if lent:
                self._one(peer, s, _frame_prefix(header, _LEND_FLAG) + header + lent[0])
                return lent[1]  # done when the peer says it has read the region
            put = self.arena.put(payload, peer)
            if put is not None:
                self._one(
                    peer,
                    s,
                    _frame_prefix(header, _SHM_FLAG)
                    + header
                    + put[0].to_bytes(4, "little")
                    + put[1].to_bytes(8, "little"),
                )
                self.shm_sent += 1
                return None
            self.shm_fallbacks += 1  # no slot free, or too large: the socket takes it
        if zero_copy or len(header) >= _LEND_FLAG:
            # Two frames; libzmq reads the payload straight from the caller's memory.
            self._zmq_op[peer] = self.op.key
            return self._send(peer, s.send_multipart, (header, payload), copy=False, track=True)
        # Small: one frame [header length, header, payload] -- one syscall-sized message and
        # one Python call fewer on each side, which is most of a small op's cost.
        self._one(peer, s, _frame_prefix(header, 0) + header + memoryview(payload).cast("B"))
        return None

    def _one(self, peer, s, msg):
        """Send a one-frame message: over the peer's fast link where there is one, unless a
        message of this op already went to it over ZeroMQ (order, fastlink.py)."""
        fast = self.fast
        if fast is not None and len(msg) <= FAST_MAX and self._zmq_op.get(peer) != self.op.key:
            link = fast.ready.get(peer)
            if link is None and peer in fast.out:
                link = fast.sender(peer)
                if link is not None:  # confirmed: say so behind every ZeroMQ message so far
                    self._send(peer, s.send, _FAST_ON)
            if link is not None and fast.send(peer, link, msg):
                return
        self._zmq_op[peer] = self.op.key
        self._send(peer, s.send, msg)

    def _send(self, peer, send, what, **kw):
        """send(what, NOBLOCK); while `peer`'s queue is full (SND_QUEUE messages it has not
        taken), wait for room -- until the op's deadline, not for ever."""
        try:
            return send(what, zmq.NOBLOCK, **kw)
        except zmq.Again:
            pass
        s = self.dealers[peer]
        deadline = self.op.deadline or time.monotonic() + 30.0
        while True:
            if self.failure is not None:
                raise self.failure
            if s.poll(100, zmq.POLLOUT):
                try:
                    return send(what, zmq.NOBLOCK, **kw)
                except zmq.Again:
                    continue
            if time.monotonic() >= deadline:
                raise CollectiveTimeout(
                    f"rank {self.rank} timed out sending to rank {peer}: it has not taken "
                    f"the last {SND_QUEUE} messages sent to it",
                    rank=self.rank,
                    peer=peer,
                    generation=self.generation,
                )

    def wait_sent(self, tracker, timeout):
        if isinstance(tracker, registered.LendTracker):
            return registered.wait_lend(tracker, timeout)
        try:
            tracker.wait(timeout)
            return True
        except zmq.NotDone:
            return False
