"""Reading one received message of the ZeroMQ transport (ZeroMQ's frames, or a fast link's,
fastlink.py): who sent it, and what it carries -- a header and a payload in the frame itself, in a slot of
the sender's shared-memory arena (shm.py), or in a region of its registered buffer
(registered.py). Nothing in it is trusted: every length and every claim is checked, and a slot
or lend is taken only from the process that owns the arena (the kernel says who).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import zmq

from ...common import security
from ...common.throttle import Throttle
from ..address import SealedPage
from ..base import Frame
from .fastlink import FAST_MAX, FastLinks
from .registered import Borrower
from .shm import PeerArena, ReturnPage, SendArena, SlotView

_warn = Throttle()

SHM_FLAG = 0x8000  # set in a one-frame message's 2-byte header length: the rest is a slot
LEND_FLAG = 0x4000  # ... or: the rest names a region of the sender's registered buffer
# Sent once to each peer whose arena this rank has mapped: "you may send me slots; I hand them
# back through this return page" (its fd, 4 bytes, and its memfd's uuid, 32). Until a peer's
# arrives, payloads to it take the socket, so a rank that cannot map a peer's arena (another
# user, a locked-down /proc) costs speed, never a lost message. It cannot be taken for a
# message: those open with a header length whose frame length would not match.
_SHM_READY = b"\xff\xffcollectives-shm-ready"
_READY_BYTES = len(_SHM_READY) + 4 + 32
# Sent over ZeroMQ before the first message over a fast link (fastlink.py, Order).
FAST_ON = b"\xff\xffcollectives-fast-on"


class ShmSide(Protocol):
    """What the parser writes of the send side (sending.py, Sender): which peers may take
    slots of our arena."""

    @property
    def shm_peers(self) -> set[int]: ...

    @property
    def shm_ready(self) -> set[int]: ...

    @property
    def arena(self) -> SendArena | None: ...


class ParserView(Protocol):
    """What the parser reads of its transport (transport.py, ZmqTransport)."""

    @property
    def rank(self) -> int: ...

    @property
    def keys(self) -> security.JobKeys | None: ...

    @property
    def peer_ids(self) -> dict[bytes, int]: ...  # exactly the routing ids that are ranks

    @property
    def pids(self) -> dict[int, int]: ...  # peer -> the pid its address record gave

    @property
    def fast(self) -> FastLinks | None: ...

    @property
    def peer_arenas(self) -> dict[int, PeerArena]: ...

    @property
    def borrower(self) -> Borrower: ...

    @property
    def sender(self) -> ShmSide: ...


class FrameParser:
    """ZmqTransport's message parsing, held by it (ZmqTransport.frames): it reads the
    transport's keys, peers, arenas and fast links, and writes only its send side's
    shm_ready (sending.py)."""

    def __init__(self, transport: ParserView) -> None:
        self.t = transport

    def parse(self, frames: list[zmq.Frame]) -> Frame | None:
        """(src, header, payload) of one received message, or None if it is not one."""
        ident = frames[0].bytes
        proved = security.user_id(frames[-1]) if self.t.keys is not None else None
        if ident == b"wake" and proved is None:
            return None  # failure detection woke us; the OpChannel checks self.t.failure next
        src = self.t.peer_ids.get(ident)
        if src is None:
            _warn(
                "sender",
                "rank %d dropped a message from unknown sender %r",
                self.t.rank,
                ident[:32],
            )
            return None
        if self.t.keys is not None and proved != ident:
            _warn(
                "impostor",
                "rank %d dropped a message claiming to come from rank %d over a "
                "connection authenticated as %r",
                self.t.rank,
                src,
                proved,
            )
            return None
        if len(frames) == 3:
            return src, frames[1].bytes, frames[2].buffer
        if len(frames) == 2:
            data = frames[1].buffer
            if len(data) == _READY_BYTES and data[: len(_SHM_READY)] == _SHM_READY:
                self._on_shm_ready(src, bytes(data[len(_SHM_READY) :]), frames[-1])
                return None
            if len(data) == len(FAST_ON) and data == FAST_ON:
                if self.t.fast is not None:
                    self.t.fast.open(src)  # read its fast link from now on
                return None
            return self.parse_data(
                src,
                data,
                None,
                lambda: src in self.t.peer_arenas and self._from_owner(frames[-1], src),
            )
        _warn(
            "malformed",
            "rank %d dropped a malformed message (%d frames) from rank %s",
            self.t.rank,
            len(frames),
            ident[:32],
        )
        return None

    def parse_fast(self, src: int, data: bytes | memoryview) -> Frame | None:
        """A message from `src`'s fast link (fastlink.py): its socket's peer is the process
        that owns src's arena when the kernel says so (fast.pids)."""
        if type(data) is bytes:
            # The common case first, as parse_data reads it: a payload in the message itself
            # (no slot or lend flag), its header whole, the message no larger than a fast one.
            hlen = data[0] | data[1] << 8 if len(data) >= 2 else -1
            if 0 <= hlen < LEND_FLAG and 2 + hlen <= len(data) <= FAST_MAX:
                return src, data[2 : 2 + hlen], memoryview(data)[2 + hlen :]
        t = self.t
        fast = t.fast  # a fast link's frame: there are fast links

        def owner_ok() -> bool:
            return (
                fast is not None
                and src in t.peer_arenas
                and fast.pids.get(src) == t.peer_arenas[src].pid
            )

        return self.parse_data(src, memoryview(data), data, owner_ok)

    def parse_data(
        self, src: int, data: memoryview, raw: Any, owner_ok: Callable[[], bool]
    ) -> Frame | None:
        """A one-frame message from `src` (ZeroMQ's, or a fast link's: `raw` is then its
        bytes); owner_ok(): it came from the process that owns src's arena."""
        hlen = int.from_bytes(data[:2], "little")
        view: SlotView | None  # a payload read in place: a peer's slot or lent region
        if hlen & LEND_FLAG and not hlen & SHM_FLAG:
            hlen &= ~LEND_FLAG
            if 2 + hlen <= len(data) and owner_ok():
                view = self.t.borrower.view(self.t.peer_arenas[src], data[2 + hlen :])
                if view is not None:
                    return src, bytes(data[2 : 2 + hlen]), view
        elif hlen & SHM_FLAG:
            hlen &= ~SHM_FLAG
            if 2 + hlen + 12 == len(data) and owner_ok():
                slot = int.from_bytes(data[2 + hlen : 6 + hlen], "little")
                nbytes = int.from_bytes(data[6 + hlen :], "little")
                view = self.t.peer_arenas[src].view(slot, nbytes)
                if view is not None:
                    return src, bytes(data[2 : 2 + hlen]), view
        elif 2 + hlen <= len(data) and (raw is None or len(raw) <= FAST_MAX):
            return src, bytes(data[2 : 2 + hlen]), data[2 + hlen :]
        _warn("malformed", "rank %d dropped a malformed message from rank %s", self.t.rank, src)
        return None

    def _on_shm_ready(self, src: int, body: bytes, frame: zmq.Frame) -> None:
        """Rank `src` maps our arena: map its return page (read-only, sealed: shm.py) and send
        it slots from now on. Taken only over ipc from the process its address gave."""
        sender = self.t.sender
        if src not in sender.shm_peers or src in sender.shm_ready or sender.arena is None:
            return
        pid = self.t.pids.get(src)
        if pid is None or _peer_pid(frame) != pid:
            _warn(
                "ready",
                "rank %d ignored a shared-memory note from rank %d that did not come "
                "from its process over ipc",
                self.t.rank,
                src,
            )
            return
        try:
            name = "collectives-ret-" + body[4:].decode("ascii")
            page = SealedPage(pid=pid, fd=int.from_bytes(body[:4], "little"), name=name)
            sender.arena.attach(src, page)
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            _warn(
                "ready",
                "rank %d cannot map rank %d's return page (%s); its payloads to it "
                "stay on the socket",
                self.t.rank,
                src,
                exc,
            )
            return
        sender.shm_ready.add(src)

    def _from_owner(self, frame: zmq.Frame, src: int) -> bool:
        """A slot frame came over ipc from the process that owns rank `src`'s arena (ZeroMQ
        reports an ipc peer as "localhost:UID:GID:PID", from the kernel)."""
        owner = self.t.peer_arenas[src].pid
        if _peer_pid(frame) == owner:
            return True
        _warn(
            "slot",
            "rank %d dropped a shared-memory slot claimed by rank %d from %r, not "
            "from its arena's owner (pid %d) over ipc",
            self.t.rank,
            src,
            _address(frame),
            owner,
        )
        return False


def _address(frame: zmq.Frame) -> str | None:
    try:
        address = frame.get("Peer-Address")
    except (zmq.ZMQError, AttributeError):
        return None
    return address if isinstance(address, str) else None


def _peer_pid(frame: zmq.Frame) -> int | None:
    """The pid of the process that sent `frame` over ipc (ZeroMQ reports an ipc peer as
    "localhost:UID:GID:PID", from the kernel); None over tcp."""
    address = _address(frame)
    parts = address.split(":") if address is not None else []
    return int(parts[3]) if len(parts) == 4 and parts[3].isdigit() else None


def shm_ready_note(returns: ReturnPage) -> bytes:
    """The _SHM_READY note naming this rank's return page `returns` (shm.ReturnPage)."""
    return _SHM_READY + returns.fd.to_bytes(4, "little") + returns.name[-32:].encode()


def frame_prefix(header: bytes, flag: int) -> bytes:
    """The 2-byte length that opens a one-frame message (its top bit says "slot follows")."""
    return (len(header) | flag).to_bytes(2, "little")
