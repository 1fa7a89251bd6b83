"""Same-host small messages without ZeroMQ's I/O threads: one SOCK_SEQPACKET Unix
socket per ordered pair of ranks, written and read by the calling threads themselves.

Why: a ZeroMQ send hands the message to the context's I/O thread (an eventfd write that wakes
it), which writes the socket; the receiver's I/O thread reads it and wakes the receiving thread.
On a busy 2-core machine each of those hops waits for a core, and they were ~70 % of a 4-byte
all_reduce (py-spy, docs/benchmarks.md "Small operations"). Here the sender's write() lands the message
in the receiver's socket buffer and the kernel wakes the receiver directly: one hop.

What travels: the one-frame messages of the ZeroMQ transport (sending.py: small payloads,
probes, aborts, shared-memory slot and lend notes), byte for byte the same frame; a payload sent
zero-copy over ZeroMQ (two frames) does not. SEQPACKET keeps message boundaries, and the kernel bounds what may wait
(the socket buffer); a message that finds it full takes ZeroMQ instead.

Who: every rank listens on a name in the abstract Unix namespace (no file: nothing to remove,
even after SIGKILL; same network namespace only, which the shm host id guarantees). Anyone in
the namespace may connect, so the kernel says who did (SO_PEERCRED): a connection is kept only
if its pid is the one rank r published (and its uid ours), and then carries rank r's messages
only. The listener answers a kept connection with one byte; until the sender has read it, its
messages go over ZeroMQ, so a refused or broken link costs speed, never a message.

Order: messages from one peer must arrive in the order sent (OpChannel checks each message's
index). The sender keeps it (ZmqTransport.post): within one op, once a message to a peer went
over ZeroMQ the rest of that op's messages to it do too. The receiver keeps it: before it uses a
ZeroMQ message from a peer it takes everything already in that peer's fast socket (those were
written before the ZeroMQ message was sent). Across ops order does not matter: a frame of a
later op waits in the early stash (stash.py) whatever came first. The one switch that would
reorder more than that, the first (messages went over ZeroMQ until the link was confirmed),
is marked: the sender sends FAST_ON over ZeroMQ before its first fast message, and the
receiver reads the link only once FAST_ON has come, that is after every earlier ZeroMQ
message (so an aborted op's slot notes are read, and their slots freed, in the order sent).
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import uuid

from ...common.throttle import Throttle

log = logging.getLogger("collectives")
# refused connections: a few lines every 10 s, not one per stranger's connect (anyone in the
# network namespace may connect to an abstract name, as often as it likes)
_refused = Throttle(log)

FAST_MAX = 80 << 10  # largest message sent this way (a 64 KiB payload + its header); under
# glibc's mmap threshold, so each receive is a cheap heap allocation
_OK = b"\x01"
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class FastLinks:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.name = f"collectives-fast-{os.getpid()}-{uuid.uuid4().hex[:16]}"
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind("\0" + self.name)
        self.listener.listen(256)
        self.listener.setblocking(False)
        self.pids: dict[int, int] = {}  # peer -> the pid it published
        self.out: dict[int, socket.socket] = {}  # peer -> connected, not yet confirmed
        self.ready: dict[int, socket.socket] = {}  # peer -> confirmed: send this way
        self.inbound: dict[int, tuple[socket.socket, int]] = {}  # fd -> (socket, peer)
        self.by_peer: dict[int, socket.socket] = {}  # peer -> its inbound socket
        self.waiting: dict[int, socket.socket] = {}  # peer -> accepted, not read before its
        # FAST_ON (see Order)
        self.changed = True  # the set of fds to poll changed

    def connect(self, peer: int, name: str, pid: int) -> None:
        """Open the link to `peer` (its listener `name`); used once it confirms."""
        self.pids[peer] = pid
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            s.settimeout(5.0)
            s.connect("\0" + name)
            s.setblocking(False)
        except OSError:
            s.close()
            raise
        self.out[peer] = s

    def sender(self, peer: int) -> socket.socket | None:
        """The confirmed socket to `peer`, or None (not confirmed yet: use ZeroMQ)."""
        s = self.out.get(peer)
        if s is None:
            return None
        try:
            got = s.recv(1)
        except BlockingIOError:
            return None
        except OSError:
            got = b""
        del self.out[peer]
        if got == _OK:
            self.ready[peer] = s
            log.debug("rank %d -> rank %d: fast link confirmed", self.rank, peer)
            return s
        s.close()  # refused or closed: ZeroMQ only, from now on
        return None

    def send(self, peer: int, s: socket.socket, msg: bytes | bytearray) -> bool:
        """Send one message; False if the link is full or broke: the caller sends it over
        ZeroMQ instead. Never waits: two ranks that each send the other more than a socket
        buffer before receiving (isend loops) would wait on each other for ever; ZeroMQ's
        queues are far larger, and its sends wait with the op's deadline."""
        try:
            s.send(msg)
            return True
        except BlockingIOError:
            return False
        except OSError:
            self._drop_out(peer)
            return False

    def _drop_out(self, peer: int) -> None:
        s = self.ready.pop(peer, None)
        if s is not None:
            s.close()

    def accept(self) -> None:
        """Take pending connections: keep those from a peer's published pid, refuse others."""
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.debug("rank %d: fast link accept failed: %s", self.rank, exc)
                return
            try:
                pid, uid, _ = _CRED.unpack(
                    conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
                )
                peer = next((r for r, p in self.pids.items() if p == pid), None)
                if (
                    peer is None
                    or uid != os.getuid()
                    or peer in self.by_peer
                    or peer in self.waiting
                ):
                    _refused(
                        "fastlink",
                        "rank %d refused a fast link from pid %d (uid %d): not "
                        "a rank of this group",
                        self.rank,
                        pid,
                        uid,
                    )
                    conn.close()
                    continue
                conn.setblocking(False)
                conn.send(_OK)
            except OSError:
                conn.close()
                continue
            self.waiting[peer] = conn

    def open(self, peer: int) -> None:
        """`peer`'s FAST_ON came (over ZeroMQ, after all it sent there before): read its
        fast socket from now on."""
        conn = self.waiting.pop(peer, None)
        if conn is not None:
            self.inbound[conn.fileno()] = (conn, peer)
            self.by_peer[peer] = conn
            self.changed = True

    def fds(self) -> list[int]:
        return [self.listener.fileno(), *self.inbound]

    def take(self, fd: int) -> tuple[int, bytes] | None:
        """(peer, message) from the socket `fd`, or None (nothing there, or it closed)."""
        conn, peer = self.inbound[fd]
        try:
            data = conn.recv(FAST_MAX + 1)
        except BlockingIOError:
            return None
        except OSError:
            data = b""
        if not data:  # the peer closed it (left, died): stop polling it
            self._drop_in(fd)
            return None
        return peer, data

    def drain(self, peer: int) -> list[bytes]:
        """Every message already waiting from `peer` (see Order above)."""
        conn = self.by_peer.get(peer)
        out = []
        while conn is not None:
            got = self.take(conn.fileno())
            if got is None:
                break
            out.append(got[1])
        return out

    def _drop_in(self, fd: int) -> None:
        conn, peer = self.inbound.pop(fd)
        self.by_peer.pop(peer, None)
        conn.close()
        self.changed = True

    def close(self) -> None:
        for s in (
            *self.out.values(),
            *self.ready.values(),
            *self.waiting.values(),
            *(c for c, _ in self.inbound.values()),
            self.listener,
        ):
            s.close()
        self.out.clear()
        self.ready.clear()
        self.inbound.clear()
        self.by_peer.clear()
        self.waiting.clear()
