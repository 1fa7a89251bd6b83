"""The ZeroMQ transport's send side, held by it (ZmqTransport.sender, transport.py): how a
frame leaves for a peer, and what only that needs -- the DEALER to each peer, our shared-memory
arena, the lender of registered buffers, which peers may take slots, and the counts of what
went where. The fast links (fastlink.py) carry both ways: the transport owns them and hands
them to both sides.

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

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import zmq

from ...common import config
from ...common.errors import CollectiveError, CollectiveTimeout
from ..base import OpContext
from . import registered, shm
from .fastlink import FAST_MAX, FastLinks
from .frames import FAST_ON, LEND_FLAG, SHM_FLAG, frame_prefix

log = logging.getLogger("collectives")

SND_QUEUE = 1 << 14  # messages to one peer that may wait in its queue (ZeroMQ's SNDHWM)


class OpState(Protocol):
    """What the send side reads of its transport (base.py, Transport): who this rank is, the
    op in progress (its deadline, its key, whether it may lend) and the failure notice."""

    @property
    def rank(self) -> int: ...

    @property
    def generation(self) -> int: ...

    @property
    def op(self) -> OpContext: ...

    @property
    def failure(self) -> CollectiveError | None: ...


class Sender:
    """post() and what only it uses. Reads the transport's OpState; calls `read_ahead` (the
    receive side's) while a peer's _SHM_READY note may be waiting."""

    def __init__(
        self,
        transport: OpState,
        arena: shm.SendArena | None,
        fast: FastLinks | None,
        read_ahead: Callable[[], None],
    ) -> None:
        self.t = transport
        self.read_ahead = read_ahead
        self.dealers: dict[int, zmq.Socket[Any]] = {}  # peer -> our DEALER to its ROUTER
        self.arena = arena  # our outgoing shared memory (shm.py), if any
        self.lender = registered.Lender(arena)
        self.fast = fast
        self.shm_peers: set[int] = set()  # same-host peers with an arena, may map ours ...
        self.shm_ready: set[int] = set()  # ... and those that said they did (_SHM_READY)
        self.shm_sent = 0  # payloads sent through our arena ...
        self.shm_fallbacks = 0  # ... and those to ready peers that found no slot free
        self._zmq_op: dict[int, object] = {}  # peer -> the op (op.key) that last used ZeroMQ

    def post(self, peer: int, header: bytes, payload: Any, zero_copy: bool) -> Any:
        s = self.dealers[peer]
        if zero_copy and peer in self.shm_peers and peer not in self.shm_ready:
            self.read_ahead()  # its _SHM_READY may be waiting in our socket
        if zero_copy and peer in self.shm_ready and len(header) < LEND_FLAG:
            lent = self.t.op.lend and self.lender.lend(payload, peer)  # registered: no copy
            if lent:
                self._one(peer, s, frame_prefix(header, LEND_FLAG) + header + lent[0])
                return lent[1]  # done when the peer says it has read the region
            put = self.arena.put(payload, peer) if self.arena is not None else None
            if put is not None:
                self._one(
                    peer,
                    s,
                    frame_prefix(header, SHM_FLAG)
                    + header
                    + put[0].to_bytes(4, "little")
                    + put[1].to_bytes(8, "little"),
                )
                self.shm_sent += 1
                return None
            self.shm_fallbacks += 1  # no slot free, or too large: the socket takes it
        if zero_copy or len(header) >= LEND_FLAG:
            # Two frames; libzmq reads the payload straight from the caller's memory.
            self._zmq_op[peer] = self.t.op.key
            return self._send(peer, s.send_multipart, (header, payload), copy=False, track=True)
        # Small: one frame [header length, header, payload] -- one syscall-sized message and
        # one Python call fewer on each side, which is most of a small op's cost.
        self._one(peer, s, frame_prefix(header, 0) + header + memoryview(payload).cast("B"))
        return None

    def post_small(self, peer: int, header: bytes, payload: Any) -> None:
        """post() of a payload below the zero-copy size: one frame, as post() sends it, without
        post()'s tests for the large ways; a ready fast link is tried here first (as _one
        would, which takes every other case)."""
        if len(header) >= LEND_FLAG:  # two frames: libzmq reads a private copy, not tracked
            self.post(peer, header, bytes(memoryview(payload).cast("B")), False)
            return
        msg = len(header).to_bytes(2, "little") + header + memoryview(payload).cast("B")
        fast = self.fast
        if fast is not None and len(msg) <= FAST_MAX and self._zmq_op.get(peer) != self.t.op.key:
            link = fast.ready.get(peer)
            if link is not None:
                try:  # FastLinks.send, written out: once per small send
                    link.send(msg)
                    return
                except OSError:  # full, or broken: _one tries it again and takes ZeroMQ
                    pass
        self._one(peer, self.dealers[peer], msg)

    def _one(self, peer: int, s: zmq.Socket[Any], msg: bytes | bytearray) -> None:
        """Send a one-frame message: over the peer's fast link where there is one, unless a
        message of this op already went to it over ZeroMQ (order, fastlink.py)."""
        fast = self.fast
        if fast is not None and len(msg) <= FAST_MAX and self._zmq_op.get(peer) != self.t.op.key:
            link = fast.ready.get(peer)
            if link is None and peer in fast.out:
                link = fast.sender(peer)
                if link is not None:  # confirmed: say so behind every ZeroMQ message so far
                    self._send(peer, s.send, FAST_ON)
            if link is not None and fast.send(peer, link, msg):
                return
        self._zmq_op[peer] = self.t.op.key
        self._send(peer, s.send, msg)

    def _send(self, peer: int, send: Callable[..., Any], what: Any, **kw: Any) -> Any:
        """send(what, NOBLOCK); while `peer`'s queue is full (SND_QUEUE messages it has not
        taken), wait for room -- until the op's deadline, not for ever."""
        try:
            return send(what, zmq.NOBLOCK, **kw)
        except zmq.Again:
            pass
        s = self.dealers[peer]
        deadline = self.t.op.deadline or time.monotonic() + 30.0
        while True:
            if self.t.failure is not None:
                raise self.t.failure
            if s.poll(100, zmq.POLLOUT):
                try:
                    return send(what, zmq.NOBLOCK, **kw)
                except zmq.Again:
                    continue
            if time.monotonic() >= deadline:
                raise CollectiveTimeout(
                    f"rank {self.t.rank} timed out sending to rank {peer}: it has not taken "
                    f"the last {SND_QUEUE} messages sent to it",
                    rank=self.t.rank,
                    peer=peer,
                    generation=self.t.generation,
                )

    def wait_sent(self, tracker: Any, timeout: float) -> bool:
        if isinstance(tracker, registered.LendTracker):
            return registered.wait_lend(tracker, timeout)
        try:
            tracker.wait(timeout)
            return True
        except zmq.NotDone:
            return False


def open_arena(rank: int, segment_bytes: int, required: bool) -> shm.SendArena | None:
    """Our outgoing shared-memory arena (COLLECTIVES_SHM_BYTES of `segment_bytes` slots), or
    None where none can be made; `required` (transport "shm"): raise instead."""
    total = config.shm_bytes()
    slots = min(total // segment_bytes, 4096)
    try:
        if slots < 1:
            raise ValueError(
                f"COLLECTIVES_SHM_BYTES={total} is less than one {segment_bytes}-byte segment"
            )
        return shm.SendArena(segment_bytes, slots)
    except (OSError, ValueError) as exc:
        if required:
            raise ValueError(
                f"transport 'shm': rank {rank} cannot make its shared memory arena: {exc}"
            ) from exc
        if total:
            log.info("rank %d: no shared memory arena (%s); large payloads use sockets", rank, exc)
        return None
