"""The ZeroMQ transport's receive side, held by it (ZmqTransport.receiver, transport.py): how
the next frame is found, and what only that needs (the inbox, the poller, the ROUTER's
current timeout).

* without fast links, one blocking receive on the ROUTER with the socket's own timeout;
* with fast links, first a receive on the awaited peer's fast socket, then one poll over the
  ROUTER, the fast listener and the inbound fast sockets; a ZeroMQ message is queued after
  what its sender's fast link already holds (fastlink.py, Order);
* frames read early (while a sender looks for a peer's _SHM_READY note) wait in an inbox;

What a frame says is read by frames.py (FrameParser); a payload in a peer's arena or registered
buffer is handed back once used by ZmqTransport.release.
"""

from __future__ import annotations

import os
import socket
import time
from collections import deque
from typing import Any, Protocol

import zmq

from ..base import Frame, OpContext
from .fastlink import FAST_MAX, FastLinks
from .frames import FrameParser


# wait_peer's spin (see _spin): after a spin that found nothing, the next SPIN_SKIP waits
# sleep at once, twice as many after each further such spin, up to SPIN_SKIP_MAX
SPIN_SKIP = 8
SPIN_SKIP_MAX = 1024


class InOp(Protocol):
    """What the receive side reads of its transport (base.py, Transport): the op in progress,
    for the peer it waits on."""

    @property
    def op(self) -> OpContext: ...


class Receiver:
    """wait_any() and read_ahead(). Reads the transport's op in progress (whom it waits on);
    reads the ROUTER, the frame parser and the fast links it is handed."""

    def __init__(
        self,
        transport: InOp,
        router: zmq.Socket[Any],
        frames: FrameParser,
        fast: FastLinks | None,
    ) -> None:
        self.t = transport
        self.router = router
        self.frames = frames
        self.fast = fast
        self._inbox: deque[Frame | None] = deque()  # frames read while looking for _SHM_READY
        self._rcvtimeo = -1  # the ROUTER's RCVTIMEO as last set
        self._poller: zmq.Poller | None = None
        # the fast socket read_peer just found empty: the next wait does not read it again
        # before its poll (which sees whatever has come since)
        self._read_empty: object = None
        # wait_peer's poller: the ROUTER and one peer's fast socket (rebuilt for another)
        self._peer_poll: tuple[socket.socket, zmq.Poller] | None = None
        self._spin_skip = 0  # waits left that sleep at once (see _spin) ...
        self._spin_backoff = SPIN_SKIP  # ... and how many after the next spin that finds nothing

    def wait_any(self, timeout: float) -> Frame | None:
        # One blocking receive with the socket's own timeout: cheaper than poll() + recv(),
        # and pyzmq's Socket.poll builds a Poller on every call. The timeout is set only when
        # it changes (callers wait in slices of at most 100 ms and loop).
        ms = max(1, min(int(timeout * 1000), 100))
        if ms != self._rcvtimeo:
            self.router.setsockopt(zmq.RCVTIMEO, ms)
            self._rcvtimeo = ms
        if self._inbox:
            return self._inbox.popleft()
        if self.fast is not None:
            return self._wait_both(self.fast, ms)
        router = self.router
        try:
            frame = router.recv(copy=False)
        except zmq.Again:
            return None
        # recv_multipart's loop asks the socket for RCVMORE after every part; the frame
        # already knows (the parts of one message arrive together, never a timeout between).
        frames = [frame]
        while frame.more:
            frame = router.recv(copy=False)
            frames.append(frame)
        return self.frames.parse(frames)

    def read_peer(self, peer: int) -> Frame | None:
        """The next message in `peer`'s fast link, if one is there and nothing read earlier
        waits in the inbox (that came first); never blocks. Taking a fast message before
        ZeroMQ's is always in order (fastlink.py, Order)."""
        fast = self.fast  # _peer_link, written out: once per small receive
        if fast is None or self._inbox:
            return None
        conn = fast.by_peer.get(peer)
        return None if conn is None else self._take_peer(peer, conn)

    def _peer_link(self, peer: int) -> socket.socket | None:
        """`peer`'s inbound fast socket, where one may be read now: none while something
        read earlier waits in the inbox (that came first)."""
        fast = self.fast
        if fast is None or self._inbox:
            return None
        return fast.by_peer.get(peer)

    def _take_peer(self, peer: int, conn: socket.socket) -> Frame | None:
        """The next message on `peer`'s fast socket `conn`, if one is there; never blocks.
        FastLinks.take, written out: once per small receive."""
        try:
            data = conn.recv(FAST_MAX + 1)
        except BlockingIOError:
            self._read_empty = conn  # the wait that follows polls it first thing
            return None
        except OSError:
            data = b""
        if not data:  # closed: FastLinks.take stops polling it
            assert self.fast is not None
            self.fast.take(conn.fileno())
            return None
        return self.frames.parse_fast(peer, data)

    def wait_peer(
        self, peer: int, timeout: float, spin: float = 0.0, yields: bool = False
    ) -> Frame | None:
        """read_peer, blocking up to `timeout` s (one poll, the GIL released) for `peer`'s
        fast socket or the ROUTER; None when the ROUTER has something (a frame from anyone, a
        failure's wake-up: transport.py, interrupt), when the time is up, or where read_peer
        has no link to read. The ROUTER is in the poll so that nothing waits behind it: the
        general wait (wait_any) takes what it holds. Cheaper than wait_any when the frame
        comes on the peer's fast link: one poll over two items built once per peer, no inbox.
        spin: first read the link for up to that many seconds (within `timeout`), yielding
        the CPU between reads where `yields` (see _spin)."""
        conn = self._peer_link(peer)
        if conn is None:
            return None
        if spin > 0.0:
            if self._spin_skip:
                self._spin_skip -= 1
            else:
                spun = min(spin, timeout)
                got = self._spin(peer, conn, spun, yields)
                if got is not None:
                    return got
                if self._peer_link(peer) is not conn:  # it closed while we read it
                    return None
                timeout -= spun
        cached = self._peer_poll
        if cached is None or cached[0] is not conn:
            poller = zmq.Poller()
            poller.register(self.router, zmq.POLLIN)
            poller.register(conn.fileno(), zmq.POLLIN)
            cached = self._peer_poll = (conn, poller)
        cached[1].poll(max(1, int(timeout * 1000)))
        # taken before anything on the ROUTER: always in order (fastlink.py, Order)
        got = self._take_peer(peer, conn)
        if got is not None:
            self._read_empty = None
        return got

    def _spin(self, peer: int, conn: socket.socket, spin: float, yields: bool) -> Frame | None:
        """Read `peer`'s fast socket again and again, never blocking, for up to `spin` s.
        A peer running on a CPU of its own often sends within microseconds; a frame taken so
        costs no sleep here and no wake-up in the peer's send, and the rank keeps its CPU (on
        a busy machine a rank that sleeps waits its turn to run again). yields: give the CPU
        away between reads (os.sched_yield, the GIL released), where the host has fewer CPUs
        than ranks: the peer awaited may be waiting for this very CPU, and gets it at once,
        while this rank stays runnable, so the peer's send wakes nobody (a wake-up across
        CPUs costs both sides tens of microseconds) and the rank reads the frame when its turn
        comes again. A spin that finds nothing makes the next waits sleep at once, SPIN_SKIP
        of them, twice as many after each further spin that finds nothing (up to
        SPIN_SKIP_MAX): where the peer is seldom running when it is waited for (more ranks
        than free CPUs), spinning costs next to nothing; one spin that finds its frame starts
        over."""
        clock = time.perf_counter
        end = clock() + spin
        take = self._take_peer
        while True:
            got = take(peer, conn)
            if got is not None:
                self._read_empty = None
                self._spin_backoff = SPIN_SKIP
                return got
            if clock() >= end or self._peer_link(peer) is not conn:
                self._spin_skip = backoff = self._spin_backoff
                self._spin_backoff = min(2 * backoff, SPIN_SKIP_MAX)
                return None
            if yields:
                os.sched_yield()

    def _wait_both(self, fast: FastLinks, ms: int) -> Frame | None:
        """wait_any with fast links: one poll over the ROUTER, the fast listener and the
        inbound fast sockets."""
        waiting_on = self.t.op.waiting_on
        conn = fast.by_peer.get(waiting_on) if waiting_on is not None else None
        read_empty, self._read_empty = self._read_empty, None
        if conn is not None and conn is not read_empty:
            # The peer awaited has often written already: one recv, no poll. (Taking a fast
            # message before ZeroMQ's is always in order: fastlink.py, Order.)
            got = fast.take(conn.fileno())
            if got is not None:
                return self.frames.parse_fast(*got)
        if fast.changed or self._poller is None:
            self._poller = zmq.Poller()
            self._poller.register(self.router, zmq.POLLIN)
            for fd in fast.fds():
                self._poller.register(fd, zmq.POLLIN)
            fast.changed = False
        for what, _ in self._poller.poll(ms):
            if what is self.router:
                try:
                    frames = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    continue
                self._queue(self.frames.parse(frames))
            elif what == fast.listener.fileno():
                fast.accept()
            elif what in fast.inbound:
                got = fast.take(what)
                if got is not None:
                    self._inbox.append(self.frames.parse_fast(*got))
        while self._inbox:
            frame = self._inbox.popleft()
            if frame is not None:
                return frame
        return None

    def _queue(self, got: Frame | None) -> None:
        """Queue a message taken from ZeroMQ, after what its sender's fast link already
        holds: that was sent first (fastlink.py, Order)."""
        if got is None:
            return
        if self.fast is not None:
            self._inbox.extend(self.frames.parse_fast(got[0], d) for d in self.fast.drain(got[0]))
        self._inbox.append(got)

    def read_ahead(self) -> None:
        """Take every frame already here without waiting: _SHM_READY notes are applied, the
        rest queued in arrival order for wait_any. (A wake-up read here is not lost: waits
        run in slices of at most 100 ms and check for a failure after each.)"""
        while True:
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._queue(self.frames.parse(frames))
