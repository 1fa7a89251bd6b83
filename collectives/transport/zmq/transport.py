"""ZeroMQ transport: one ROUTER socket in, one DEALER socket out per peer.

Each rank binds a ROUTER on tcp (and on ipc, a Unix socket, for peers on the same host and
network namespace: faster on loopback) and connects a DEALER to every peer's ROUTER, with its
rank as the routing id. A frame is [header, payload]: the msgpack header of wire.py and the raw
bytes of the array -- no pickle, no copy into Python objects.

Modes (`transport=`, or COLLECTIVES_TRANSPORT): "tcp"; "ipc" (Unix sockets to peers on this
host, tcp to the others); "shm" (ipc, and large payloads through shared memory, shm.py);
"auto" (shm where it can, tcp elsewhere). Every message still travels over ZeroMQ; with shm a
large one carries only the slot that holds its payload.

* Sends of 64 KiB and more are zero-copy (libzmq reads straight from the caller's array);
  their MessageTracker is kept by the OpChannel, which waits on it before that memory is
  written again and before the op returns.
* Receives return the frame's buffer; the OpChannel copies or reduces it into place.
* Small messages travel as one frame (header and payload together); large ones as two, the
  payload zero-copy -- or, to a peer that maps our arena, as one frame naming the slot, or
  naming the region of a registered buffer it may read in place (a lend, registered.py).
* Failure detection (another thread) interrupts a wait blocked on a dead peer by sending a
  frame to the ROUTER itself, over inproc, from the routing id b"wake".

Only the job's ranks get in (common/security.py, docs/security.md): the ROUTER is a CURVE server that
admits exactly the keys of the other ranks of this generation, and a message is taken only
if the rank its connection proved to be (ZeroMQ's User-Id) is the routing id it claims, and
that routing id is exactly b"%d" % rank (never int(): b"01", b" 1" and b"+1" are nobody). A
slot or lend frame is taken only from the arena's owner, over ipc (the kernel says who
connected).
Memory is bounded: no message may be larger than a segment plus MAX_HEADER (ZeroMQ drops a
connection that sends one), at most RCV_BUFFER bytes wait in each peer's queue, and a peer
that stops taking our messages makes a send wait, until the op's deadline, not grow a queue.

This file sets the sockets up, connects them and closes them; the transport holds its send
side (sending.py, Sender: post), its receive side (receiving.py, Receiver: wait_any) and its
frame parser (frames.py, FrameParser: what an arriving frame says), and calls each explicitly.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

import zmq

from ...common import config
from ...common.errors import CollectiveError
from .. import stash
from ...common import security
from . import registered, shm
from .fastlink import FastLinks
from .frames import FrameParser, shm_ready_note
from .receiving import Receiver
from .sending import SND_QUEUE, Sender, open_arena
from .addresses import cpu_mask, host_id, parse_cpu_mask
from ..address import RankAddress
from .context import term_context
from ..base import Frame, Transport
from .peerwatch import PeerWatch

log = logging.getLogger("collectives")

# On Linux a transport's ipc endpoint is a name in the abstract socket namespace: the kernel
# drops it with the last socket bound to it, so nothing outlives the process, not even after
# a SIGKILL (a socket file in the temp dir would stay there, one per transport, for good). An
# abstract name is reachable only from the same network namespace, which is what host_id()
# asks of an ipc peer; a stranger there who connects meets CURVE, as over tcp, and a slot
# frame is taken only from its arena owner's pid (frames.py). Elsewhere the endpoint is a
# file in the temp dir, and the files of the transports not closed yet are removed at exit.
ABSTRACT_IPC = sys.platform.startswith("linux")
_ipc_files: set[str] = set()


# libzmq's ipc listener aborts the whole process when accept() finds it out of file
# descriptors (EMFILE is not among the errors its accept tolerates; the tcp listener drops the
# connection instead). Idle connections from anyone who can reach a tcp port can fill a small
# descriptor table (docs/security.md, "Denial of service"), so where the open-files limit is
# below this, "auto" reaches same-host peers over tcp: a slower link, not a crash.
IPC_MIN_OPEN_FILES = 4096


def refuse_ipc(rank: int, transport: str) -> None:
    """An explicit ipc or shm transport under a small open-files limit: the limit raised to the
    hard one, or a clear error before anything listens (a flood would abort the process)."""
    config.raise_open_files()
    limit = config.open_files_limit()
    if limit is not None and limit < IPC_MIN_OPEN_FILES:
        raise ValueError(
            f"rank {rank}: transport {transport!r} needs an open-files limit of at least "
            f"{IPC_MIN_OPEN_FILES}, and this process's is {limit} (its hard limit too): "
            "libzmq's ipc listener aborts the whole process when it runs out of file "
            "descriptors, which idle connections from anyone who can reach a port can cause; "
            f"raise the limit (ulimit -n {IPC_MIN_OPEN_FILES}) or use transport 'tcp' (or "
            "'auto', which does so by itself)"
        )


def ipc_path(name: str) -> str:
    """Where an ipc endpoint called `name` lives: "@name" (abstract) or a temp-dir file."""
    return "@" + name if ABSTRACT_IPC else os.path.join(tempfile.gettempdir(), name)


def _unlink_all() -> None:
    for p in list(_ipc_files):
        _unlink(p)


atexit.register(_unlink_all)


def _unlink(path: str) -> None:
    # removed from the set only once it is gone: a signal's SystemExit between the two
    # leaves the file to the atexit pass rather than to nobody
    try:
        os.unlink(path)
    except OSError:
        pass
    _ipc_files.discard(path)


MAX_HEADER = 64 << 10  # bytes a message may carry beyond one segment (its header)
RCV_BUFFER = 64 << 20  # bytes of messages that may wait in the queue from one peer


class ZmqTransport(Transport):
    # hierarchical all_reduce across hosts: k leaders per host from 1 MiB, one below. Measured
    # (2 hosts x 2 ranks, 1 Gbit/s, CURVE; bench/results/multihost/2x2_1gbit_64M_leaders.txt):
    # one leader 4.5 ms at 64 KiB and 7.3 ms at 256 KiB against 6.5 and 10.9 ms with two;
    # two leaders ahead from 1 MiB (15.4 against 16.6 ms).
    leaders_min_bytes = 1 << 20
    # and its pieces are 1 MiB, not a 4 MiB segment: across a link, CURVE encrypts and decrypts
    # a message whole, so a piece's cipher and its trip hold up the next phase; smaller pieces
    # fill and drain the pipeline sooner. 64 MiB, three interleaved rounds, 5 repeats each
    # (bench.studies.multihost --backends hierarchical,tcp --segment-bytes 4M|2M|1M): 1.19/1.17/1.22x
    # the link's time with 4 MiB, 1.16/1.16/1.16x with 2 MiB, 1.14/1.11/1.13x with 1 MiB; 1.07-1.11x
    # against 1.04-1.06x the time of the same bytes over bare TCP in the same repeats.
    link_segment_bytes = 1 << 20

    def __init__(
        self,
        rank: int,
        size: int,
        generation: int = 0,
        transport: str = "auto",
        bind_host: str = "127.0.0.1",
        segment_bytes: int | None = None,
        keys: security.JobKeys | None | str = security.AUTO,
    ) -> None:
        """keys: the job's security.JobKeys, None for no authentication (insecure), or AUTO
        (security.resolve: the environment's, or this process's own)."""
        super().__init__()
        self.frames = FrameParser(self)  # reads what arrives (frames.py)
        if transport not in ("auto", "tcp", "ipc", "shm"):
            raise ValueError(f"transport must be 'auto', 'tcp', 'ipc' or 'shm', got {transport!r}")
        self.rank, self.size, self.generation = rank, size, generation
        limit = config.open_files_limit()
        if transport == "auto" and limit is not None and limit < IPC_MIN_OPEN_FILES:
            log.info(
                "rank %d: same-host peers over tcp, not ipc: the open-files limit (%d) is below "
                "%d, and libzmq's ipc listener aborts the process when it runs out",
                rank,
                limit,
                IPC_MIN_OPEN_FILES,
            )
            transport = "tcp"
        elif transport in ("ipc", "shm") and limit is not None and limit < IPC_MIN_OPEN_FILES:
            refuse_ipc(rank, transport)
        self.mode = transport
        if segment_bytes:
            self.segment_bytes = segment_bytes
        self.keys = security.resolve(keys)
        self.max_message = self.segment_bytes + MAX_HEADER
        # Exactly these routing ids are ranks: b"%d" % r, nothing that int() would also read.
        self.peer_ids = {b"%d" % r: r for r in range(size) if r != rank}
        self.ctx = zmq.Context(io_threads=1)
        self.guard = None
        if self.keys is not None:  # before the ROUTER binds: without it any key gets in
            self.guard = security.Guard(
                self.ctx,
                self.keys.rank_table(generation, size, rank),
                f"rank {rank} (generation {generation})",
            )
        self.router = self.ctx.socket(zmq.ROUTER)
        security.make_server(self.router, self.keys)
        self.router.setsockopt(zmq.MAXMSGSIZE, self.max_message)
        self.router.setsockopt(zmq.RCVHWM, max(8, min(4096, RCV_BUFFER // self.max_message)))
        if self.guard is not None:
            self.guard.watch(self.router)
        self.router.setsockopt(zmq.LINGER, 0)
        try:
            port = self.router.bind_to_random_port(f"tcp://{bind_host}")
        except BaseException:
            self._close_sockets()
            self.ctx.term()
            raise
        self.tcp_endpoint = f"tcp://{bind_host}:{port}"
        self.ipc_path = None  # where our ipc endpoint lives: "@name" (abstract) or a file
        if transport != "tcp":
            self.ipc_path = ipc_path(f"collectives-{os.getpid()}-{uuid.uuid4().hex[:12]}.ipc")
            self.router.bind(f"ipc://{self.ipc_path}")
            if not ABSTRACT_IPC:
                _ipc_files.add(self.ipc_path)
        # Failure detection runs on other threads; it wakes a blocked wait by sending a frame
        # from the routing id b"wake" to this same ROUTER, so a wait polls one socket only.
        self.wake_addr = f"inproc://wake-{uuid.uuid4().hex}"
        self.router.bind(self.wake_addr)
        self.wake_tx = self.ctx.socket(zmq.DEALER)  # used only under _wake_lock
        self.wake_tx.setsockopt(zmq.ROUTING_ID, b"wake")
        self.wake_tx.setsockopt(zmq.LINGER, 0)
        self.wake_tx.connect(self.wake_addr)
        self._wake_lock = threading.Lock()
        arena = None
        if transport in ("auto", "shm"):
            arena = open_arena(rank, self.segment_bytes, required=transport == "shm")
        self.peer_arenas: dict[int, shm.PeerArena] = {}  # peers' arenas we receive from
        self.routes: dict[int, str] = {}
        self.kinds: dict[int, str] = {}  # peer -> "tcp", "ipc" or "shm": how we reach it
        self.pids: dict[int, int] = {}  # peer -> the pid its address record gave
        self.borrower = registered.Borrower()
        # Small messages to same-host peers skip ZeroMQ's I/O threads (fastlink.py); both
        # sides use them: the send side writes them, the receive side reads them.
        self.fast: FastLinks | None = None
        if transport != "tcp" and config.fast_links():
            try:
                self.fast = FastLinks(rank)
            except OSError as exc:  # no abstract Unix sockets here: ZeroMQ carries all
                log.info("rank %d: no fast links (%s)", rank, exc)
        # The two sides read this transport's identity, op in progress and failure notice
        # (sending.py, OpState); the send side asks the receive side to read ahead.
        self.receiver = Receiver(self, self.router, self.frames, self.fast)
        self.sender = Sender(self, arena, self.fast, self.receiver.read_ahead)
        self.small_post = self.sender.post_small  # post_small, without its hop (base.py)
        self.closed = False
        self._watch: PeerWatch | None = None

    # --- moving frames: the send and receive sides do it ------------------------------------
    def post(self, peer: int, header: bytes, payload: Any, zero_copy: bool) -> Any:
        return self.sender.post(peer, header, payload, zero_copy)

    def wait_sent(self, tracker: Any, timeout: float) -> bool:
        return self.sender.wait_sent(tracker, timeout)

    def shares_memory(self) -> bool:
        return self.sender.arena is not None

    def wait_any(self, timeout: float) -> Frame | None:
        return self.receiver.wait_any(timeout)

    def post_small(self, peer: int, header: bytes, payload: Any) -> None:
        self.sender.post_small(peer, header, payload)

    def take_now(self, peer: int) -> Frame | None:
        # base.py's, with read_peer's call made here: once per small receive
        if self.held or self.link_faults:
            return None
        return self.receiver.read_peer(peer)

    def read_peer(self, peer: int) -> Frame | None:
        return self.receiver.read_peer(peer)

    def wait_peer(
        self, peer: int, timeout: float, spin: float = 0.0, yields: bool = False
    ) -> Frame | None:
        if self.held or self.link_faults:
            return None
        return self.receiver.wait_peer(peer, timeout, spin, yields)

    def release(self, payload: Any) -> None:
        # A payload in a peer's arena: its slot may be reused; or in a peer's registered
        # buffer (a lend, registered.py): its owner may write it again. A fast link's or a
        # socket's own bytes (a memoryview) hold nothing.
        if type(payload) is not memoryview:
            shm.free_slot(payload)

    def address_info(self) -> RankAddress:
        return RankAddress(
            rank=self.rank,
            tcp=self.tcp_endpoint,
            ipc=f"ipc://{self.ipc_path}" if self.ipc_path else None,
            host=host_id(),
            shm=self.sender.arena.describe() if self.sender.arena else None,
            shm_host=shm.shm_host_id(),
            segment_bytes=self.segment_bytes,
            fast=self.fast.name if self.fast else None,
            pid=os.getpid(),
            # None: this rank keeps its group off the crowded schedules (tuning.crowded)
            cpus=cpu_mask() if config.crowded_schedules() else None,
        )

    def connect(self, infos: list[RankAddress]) -> None:
        """Open a DEALER to every other rank, over ipc where it can reach it, else tcp."""
        if len(infos) != self.size:
            raise ValueError(f"connect: expected {self.size} address records, got {len(infos)}")
        mine, my_shm_host = host_id(), shm.shm_host_id()
        self.hosts = [info.host or f"rank{r}" for r, info in enumerate(infos)]
        self.cpus = [parse_cpu_mask(info.cpus) for info in infos]
        # the RANK each process started with (None: a replacement), for faults that follow
        # processes across generations (faults.py)
        self.launch_ranks = [info.lrank for info in infos]
        for peer, info in enumerate(infos):
            if peer == self.rank:
                continue
            if info.tcp is None:
                raise ValueError(f"connect: rank {peer}'s address record names no tcp endpoint")
            theirs = self.segment_bytes if info.segment_bytes is None else info.segment_bytes
            if theirs != self.segment_bytes:
                raise ValueError(
                    f"connect: rank {peer} cuts messages into {theirs}-byte "
                    f"segments, rank {self.rank} into {self.segment_bytes}: pass "
                    "the same segment_bytes on every rank"
                )
            use_ipc = self.mode != "tcp" and info.ipc is not None and info.host == mine
            endpoint = info.ipc if use_ipc and info.ipc is not None else info.tcp
            kind = "ipc" if use_ipc else "tcp"
            if (
                use_ipc
                and self.sender.arena
                and info.shm is not None
                and my_shm_host
                and info.shm_host == my_shm_host
            ):
                # Both offer an arena on this host: payloads go through them, each direction
                # once its receiver has mapped the sender's arena and said so.
                self.sender.shm_peers.add(peer)
                try:
                    self.peer_arenas[peer] = shm.PeerArena(info.shm)
                    kind = "shm"
                except (OSError, ValueError, KeyError) as exc:
                    if self.mode == "shm":
                        raise ConnectionError(
                            f"connect: rank {self.rank} cannot map rank {peer}'s shared memory "
                            f"({exc}); use COLLECTIVES_TRANSPORT=auto or ipc"
                        ) from exc
                    log.warning(
                        "rank %d cannot map rank %d's shared memory (%s); rank %d's "
                        "payloads to it stay on the socket",
                        self.rank,
                        peer,
                        exc,
                        peer,
                    )
            if self.mode == "shm" and kind != "shm":
                raise ConnectionError(
                    f"connect: transport 'shm' asked for, but rank {peer} is "
                    f"not on this host or offers no shared memory (reachable "
                    f"over {kind}); use COLLECTIVES_TRANSPORT=auto"
                )
            s = self.ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.ROUTING_ID, b"%d" % self.rank)
            pair = self.keys.rank(self.generation, self.rank) if self.keys is not None else None
            security.make_client(s, self.keys, pair)
            s.setsockopt(zmq.SNDHWM, SND_QUEUE)
            s.setsockopt(zmq.MAXMSGSIZE, MAX_HEADER)  # it receives nothing
            # On close, give queued frames a bounded time to leave (a last send must not be lost
            # because the sender returned and exited first).
            s.setsockopt(zmq.LINGER, 2000)
            s.connect(endpoint)
            self.sender.dealers[peer] = s
            self.routes[peer] = endpoint
            self.kinds[peer] = kind
            log.info(
                "rank %d of generation %d -> rank %d: %s (%s)",
                self.rank,
                self.generation,
                peer,
                kind,
                endpoint,
            )
            if info.pid is not None:  # frames.py takes a slot only from this process
                self.pids[peer] = info.pid
            if peer in self.peer_arenas:
                # "you may send me slots; I hand them back through this page"
                s.send(shm_ready_note(self.peer_arenas[peer].returns), zmq.NOBLOCK)
            if (
                use_ipc
                and self.fast
                and info.fast is not None
                and info.pid is not None
                and my_shm_host
                and info.shm_host == my_shm_host
            ):
                try:
                    self.fast.connect(peer, info.fast, info.pid)
                except (OSError, ValueError, TypeError) as exc:
                    log.warning("rank %d: no fast link to rank %d (%s)", self.rank, peer, exc)

    # --- failure detection and closing -------------------------------------------------------
    def watch_peers(self, grace: float = 2.0) -> None:
        """After connect(): raise PeerFailure in a wait once a peer's connection has been
        down for `grace` s (see peerwatch.py) instead of at the op's deadline."""
        if self._watch is None and self.sender.dealers:
            self._watch = PeerWatch(self, self.sender.dealers, grace)

    def interrupt(self, failure: CollectiveError) -> None:
        """Called from another thread: make the current and next waits raise `failure`."""
        self.failure_at = time.monotonic()
        self.failure = failure
        with self._wake_lock:
            if not self.closed:
                try:
                    self.wake_tx.send(b"", zmq.NOBLOCK)
                except zmq.ZMQError:  # a wake-up already queued does the same job
                    pass

    def close(self, linger: float = 2.0) -> None:
        """Close every socket. Queued frames get `linger` seconds to leave; after a failure
        pass 0: frames for a dead peer would only delay the reconstruction."""
        with self._wake_lock:
            if self.closed:
                return
            self.closed = True
        if self._watch is not None:
            self._watch.stop()  # first: it reads our sockets' monitors
        # frames kept for ops this transport will never run: freed now, not when the retired
        # group object is collected (slots go back to their senders first)
        stash.drop_all(self.early, self.release)
        for s in self.sender.dealers.values():
            s.close(linger=int(linger * 1000))
        self.wake_tx.close(linger=0)
        self._close_sockets()
        # Bounded: the dealers' linger, plus a margin for a socket someone else opened on
        # this context (a monitor) and has not closed yet.
        term_context(self.ctx, linger + 5.0, f"rank {self.rank}'s transport")
        if self.fast is not None:
            self.fast.close()
        for arena in self.peer_arenas.values():
            arena.close()
        self.borrower.close()
        self.sender.lender.close()  # before the arena: its flag page is a view of the arena
        if self.sender.arena is not None:
            self.sender.arena.close()
        if self.ipc_path and not ABSTRACT_IPC:
            _unlink(self.ipc_path)

    def _close_sockets(self) -> None:
        if self.guard is not None:
            self.guard.stop()  # first: it reads the ROUTER's monitor
        self.router.close(linger=0)
