"""What every transport shares: the Transport base (transport/channel.py has the Channel that
algorithms talk to, built on it).

A transport (inproc.py, zmq/transport.py) only moves frames: `post(peer, header, payload)` and
`wait_any(timeout) -> (src, header, payload)`. The base holds what is the same for all of them:
the frames that came early (stash.py), the progress record that diagnosis reads (Progress),
injected link faults, and how the last few ops ended. It calls nothing above it: a stalled op is
reported to the op's runner (stall.py), which has it judged and settles it (group/core.py).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..common.errors import CollectiveError
from ..common.throttle import Throttle
from .linkstats import LinkStats
from .linktest import LinkTests
from .stash import EarlyFrames

log = logging.getLogger("collectives")
warn_frame = Throttle(log)  # bad frames: a few warning lines per kind every 10 s, not one each
TRACE = 5  # COLLECTIVES_DEBUG=TRACE (common/logs.py names it): one line per message

# When a peer leaves on purpose (destroy, leave, SIGTERM) after its last op, its last frames
# and the coordinator's notice race to us; a starved wait gives the frames this long to land.
LEAVE_GRACE = 0.2
PROBE_AFTER = 0.1  # seconds a receive waits before probing (cheap: n-1 empty frames) ...
PROBE_EVERY = 0.5  # ... and again this often while it still waits


# A received frame: (source rank, header bytes, payload buffer). Header and payload are whatever
# buffer the transport received (bytes, a memoryview, a slot of shared memory): Any.
Frame = tuple[int, Any, Any]
# prober(token, peers, nbytes, window): this rank's side of a link probe round (linkprobe.py)
Prober = Callable[[int, Iterable[int], int, float], "dict[int, float | None]"]


@dataclass(frozen=True)
class Progress:
    """Where a rank is, as its transport knows it (Transport.progress()): read by diagnosis
    (membership/diagnose.py, through the heartbeats) and by failure watches."""

    generation: int
    seq: int  # the current (or last) collective op; -1 before the first
    in_op: bool  # inside op `seq`
    waiting_on: int | None  # the peer a receive waits on now
    sent: tuple[int, ...] | None  # messages sent to each peer in op `seq`
    recv: tuple[int, ...] | None  # messages taken from each peer in op `seq`
    has_data: bool = False  # inside op `seq` with its result in place (the commit round)
    done: tuple[tuple[int, int], ...] = ()  # how the last few ops ended: (seq, COMPLETED | ...)
    # per peer, seconds since this rank last sent it a frame (of any op), at the moment of
    # this snapshot; None: never. The coordinator places the send on its own clock from it,
    # so that a stalled link is judged on bytes sent long before the receiver's picture
    # (membership/diagnose.py, stalled_links), not on a send that merely came later.
    sent_age: tuple[float | None, ...] | None = None


class OpContext:
    """The op in progress, as its channel states it (channel.py, OpChannel): the channel owns
    one per op, hands it to the transport when the op begins (Transport.begin_op) and alone
    writes it; the transport reads it -- post() its deadline, key and whether it may lend,
    progress() where the op is."""

    __slots__ = (
        "stream",
        "seq",
        "key",
        "deadline",
        "lend",
        "sent",
        "recv",
        "in_op",
        "waiting_on",
        "has_data",
    )

    def __init__(
        self,
        stream: int = 0,
        seq: int = -1,
        deadline: float | None = None,
        lend: bool = False,
        sent: list[int] | None = None,
        recv: list[int] | None = None,
    ):
        self.stream, self.seq = stream, seq
        # (stream, seq): a transport keeps each op's messages in order; None before any op
        self.key: tuple[int, int] | None = (stream, seq) if seq >= 0 else None
        self.deadline = deadline  # a send blocked by a full queue waits until then
        self.lend = lend  # the op may lend registered buffers (registered.py)
        self.sent, self.recv = sent, recv  # messages sent to / taken from each peer
        self.in_op = False  # inside the op (a collective's, for the heartbeats)
        self.waiting_on: int | None = None  # the peer a receive waits on now
        self.has_data = False  # the op's result is in place (its commit round)


# How an op ended on a rank (Progress.done), for settling an op that failed somewhere
# (membership/diagnose.py, outcome): it finished; it stopped without its result; it held its
# result but the verdict on the op was "abort".
COMPLETED, LACKED, ABANDONED = 1, 0, 2


class Transport:
    """Base of a group's message mover. Subclasses implement post / wait_any (and may
    override release, wait_sent, close)."""

    rank: int
    size: int
    generation: int
    segment_bytes: int = 4 << 20  # pipelining unit; 4 MiB beat 1 and 2 MiB (docs/algorithms.md)
    # The host of every rank (any labels, equal = same host), the same list on every rank; set
    # by the transport that knows it (zmq/transport.py from the published addresses, inproc.py from the
    # simulation's host map); None: all on one host. Read by hierarchical all_reduce.
    hosts: list[Any] | None = None
    # The CPUs each rank may run on (zmq/addresses.py, parse_cpu_mask), where the transport
    # learnt them; None: unknown. Read by the group's crowding judgement (group/tuning.py).
    cpus: list[Any] | None = None
    # The RANK each process started with (None: a replacement), where known: fault rules that
    # follow processes across generations (faults.py).
    launch_ranks: list[int | None] | None = None
    # hierarchical all_reduce: below this many bytes, one leader per host instead of k (its
    # trees send fewer messages; zmq/transport.py has the measured crossover). 0 for in-process
    # transports: teaching shows the k-leader schedule at any size.
    leaders_min_bytes: int = 0
    # hierarchical all_reduce across hosts: its pieces (the pipelining unit of every phase, as
    # they must line up) are at most this many bytes; None: segment_bytes.
    link_segment_bytes: int | None = None
    zero_copy_bytes: int = 1 << 16  # at and above this, sends reference the caller's buffer

    def __init__(self) -> None:
        # Frames that arrived before this rank wanted them, per (source rank, stream); bounded
        # (stash.py).
        self.early = EarlyFrames()
        # The op in progress (any stream), and the current (or last) collective: the progress
        # record, written by their OpChannels only (begin_op); read it with progress(). The
        # collective's seq is -1 until the first op begins, so that diagnosis can tell "never
        # entered op #0" from "finished op #0".
        self.op = OpContext()
        self.collective = self.op
        # post_small as the op channels call it (OpChannel.send_small, once per small send):
        # a transport whose post_small only hands the frame on binds the method that does
        # the work here, one call fewer per send
        self.small_post: Callable[[int, bytes, Any], None] = self.post_small
        self._done: dict[int, int] = {}  # seq -> how it ended, the last few ops
        self.failure: CollectiveError | None = None  # set asynchronously by failure detection
        self.failure_at = 0.0
        # Fault injection on incoming links (faults.py): src -> ("delay", s) or ("drop", None).
        self.link_faults: dict[int, tuple[str, float]] = {}
        self.held: list[tuple[float, int, Frame]] = []  # delayed frames: (release, tiebreak, frame)
        self._tiebreak = itertools.count()
        # fail-slow: every inbound link's running figures and the tests of links routed
        # around (linkstats.py, linktest.py); the figures made on first use, when size is
        # known
        self._linkstats: LinkStats | None = None
        self.linktests = LinkTests()
        self._sent_clock: list[float] | None = None

    @property
    def sent_clock(self) -> list[float]:
        """Per peer, the monotonic time this rank last handed it a frame (0.0: never); the
        op channels write it as they send (channel.py), progress() reads it as ages."""
        if self._sent_clock is None:
            self._sent_clock = [0.0] * self.size
        return self._sent_clock

    @property
    def linkstats(self) -> LinkStats:
        if self._linkstats is None:
            self._linkstats = LinkStats(self.size)
        return self._linkstats

    # --- to implement -------------------------------------------------------------------
    def post(self, peer: int, header: bytes, payload: Any, zero_copy: bool) -> Any:
        """Queue a frame to `peer`; return a completion tracker for zero-copy sends or None."""
        raise NotImplementedError

    def wait_any(self, timeout: float) -> Frame | None:
        """Next frame from anyone as (src, header bytes, payload buffer), or None on timeout."""
        raise NotImplementedError

    def post_small(self, peer: int, header: bytes, payload: Any) -> None:
        """post() of a payload that is one message and never zero-copy (below zero_copy_bytes:
        OpChannel.send_small); a transport with a shorter way for it overrides this."""
        self.post(peer, header, payload, False)

    def release(self, payload: Any) -> None:
        """A received payload has been used (copied or reduced): hand back what holds it
        (e.g. a shared-memory slot, transport/zmq/receiving.py). Nothing to do for a plain buffer."""

    # --- shared by every transport --------------------------------------------------------
    def begin_op(self, ctx: OpContext) -> None:
        """The op of `ctx` begins: post() follows it; a collective's is the progress record."""
        self.op = ctx
        if ctx.stream == 0:
            self.collective = ctx

    def progress(self) -> Progress:
        """A snapshot of this rank's progress (see Progress)."""
        c = self.collective
        sent, recv = c.sent, c.recv
        now = time.monotonic()
        return Progress(
            self.generation,
            c.seq,
            c.in_op,
            self.op.waiting_on,
            None if sent is None else tuple(sent),
            None if recv is None else tuple(recv),
            c.has_data,
            tuple(self._done.items()),
            tuple(round(now - at, 4) if at else None for at in self.sent_clock),
        )

    def record(self, seq: int, how: int) -> None:
        """Note how op `seq` ended here (Progress.done): a failed end is published by the op's
        runner (group/core.py), so that survivors waiting for the op's verdict need not wait
        for the next heartbeat."""
        self._done[seq] = how
        while len(self._done) > 4:
            del self._done[min(self._done)]

    def set_link_fault(self, src: int, kind: str, seconds: float = 0.0) -> None:
        """Injected fault on the link from `src` (faults.py): "delay" its frames by `seconds`,
        or "drop" them."""
        self.link_faults[src] = (kind, seconds)

    def interrupt(self, failure: CollectiveError) -> None:
        """Make the current and every later wait raise `failure` (failure detection). Only
        this transport's waits: whoever fails the group interrupts what the group waits on
        too (GroupCore.interrupt)."""
        self.failure_at = time.monotonic()
        self.failure = failure

    def next_frame(self, timeout: float) -> Frame | None:
        """wait_any, with the injected link faults applied (delayed frames are held back)."""
        if self.held:
            now = time.monotonic()
            if self.held[0][0] <= now:
                return heapq.heappop(self.held)[2]
            timeout = min(timeout, self.held[0][0] - now)
        got = self.wait_any(timeout)
        if got is not None and self.link_faults:
            rule = self.link_faults.get(got[0])
            if rule is not None:
                kind, seconds = rule
                if kind == "drop":
                    self.release(got[2])
                    log.info(
                        "rank %d dropped a frame from rank %d (injected fault)", self.rank, got[0]
                    )
                else:
                    heapq.heappush(
                        self.held, (time.monotonic() + seconds, next(self._tiebreak), got)
                    )
                return None
        return got

    def take_now(self, peer: int) -> Frame | None:
        """The next frame from `peer` if it is already here and may be taken before anything
        else waiting (never blocks); None: none, or ask next_frame (the general wait). The
        small-op path (group/smallop.py) reads the awaited peer's link itself with it. Injected
        link faults and held frames go through next_frame: none is taken here then."""
        if self.held or self.link_faults:
            return None
        return self.read_peer(peer)

    def wait_peer(
        self, peer: int, timeout: float, spin: float = 0.0, yields: bool = False
    ) -> Frame | None:
        """take_now, blocking up to `timeout` s for `peer`'s own link: its next frame once
        there. None as soon as anything else may need the general wait (a frame on another
        link or socket, a failure's wake-up), when the time is up, and at once where take_now
        would return None for want of such a link (or with injected faults): then the caller
        waits the general way (next_frame), which takes whatever came. spin: seconds it may
        read that link before it sleeps (group/core.py: where its host has a CPU per rank);
        yields: give the CPU away between those reads (where the host has fewer CPUs than
        ranks); a transport without such a link ignores both."""
        return None

    def read_peer(self, peer: int) -> Frame | None:
        """take_now's transport part: a frame from `peer`'s own link, already here, that no
        earlier frame from it can be queued behind; None where a transport has no such link."""
        return None

    def shares_memory(self) -> bool:
        """Whether payloads to same-host peers may travel through shared memory (the ZeroMQ
        transport's arena): then a registered buffer (group/alloc.py) can be lent, not copied."""
        return False

    def wait_sent(self, tracker: Any, timeout: float) -> bool:
        """Block until a zero-copy send no longer references the caller's buffer."""
        return True

    def close(self, linger: float = 0.0) -> None:
        pass


__all__ = [
    "Frame",
    "Progress",
    "Transport",
    "COMPLETED",
    "LACKED",
    "ABANDONED",
]
