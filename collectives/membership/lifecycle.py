"""Membership: the life of one process in a job, across generations.

One coordinator link (client.py) per process, one transport and ProcessGroup per generation:
the first group (join), a replacement's (join_group: wait to be admitted), and the next one
after a failure or an admission (reconstruct). The groups it builds call back into it for
reconstruct(), leave() and destroy().
"""

from __future__ import annotations

import atexit
import errno
import logging

import msgspec
import zmq

from ..common import config
from ..common.errors import CollectiveError, CollectiveTimeout, Evicted, PeerFailure
from ..group.group import GroupState, ProcessGroup
from ..group.schedbook import ScheduleBook
from ..transport import faults
from ..common import security
from ..transport.zmq.transport import ZmqTransport
from .clock import REAL, Clock
from . import signals
from .client import CoordinatorClient
from .server import Coordinator

log = logging.getLogger("collectives")

# s: at most this long a rank waits for its first beat to go out (its connection's handshake
# done) before it asks to join generation 0 (a coordinator that is not there yet gets the
# join request's own deadline)
FIRST_BEAT_WAIT = 2.0


# why a rank may run out of files while opening its sockets, where its own servers noted nothing
OUT_OF_FILES_CAUSE = (
    "is this process flooded with connections that never authenticate (too many "
    "unauthenticated connections)?"
)


def sockets_failed(
    exc: BaseException, op: str, rank: int | None, generation: int
) -> CollectiveError:
    """A ZeroMQ (or OS) error while opening a generation's sockets, as the library's error:
    nothing of ZeroMQ escapes. Out of file descriptors, it says so and how many are open."""
    what = f"{op}: rank {rank} cannot open its sockets for generation {generation}: {exc}"
    if getattr(exc, "errno", None) in (errno.EMFILE, errno.ENFILE):
        used, limit = config.open_files()
        what += (
            f" ({'all' if used < 0 else used} files open, limit {limit}; "
            f"{security.flood_note() or OUT_OF_FILES_CAUSE})"
        )
    return CollectiveError(what, op=op, rank=rank, generation=generation)


class Membership:
    """Builds a process's successive groups: one coordinator link, one transport per generation."""

    clock: Clock = REAL  # the client's (init.py hands it over): one clock for both

    def __init__(
        self,
        client: CoordinatorClient,
        bind_host: str,
        timeout: float,
        transport: str,
        segment_bytes: int | None,
        hosted: Coordinator | None,
        clock: Clock = REAL,
    ) -> None:
        self.client = client
        self.clock = clock
        self.bind_host = bind_host  # every generation's sockets bind and advertise this
        self.timeout = timeout
        self.transport = transport
        self.segment_bytes = segment_bytes
        self.hosted = hosted
        self.launch_rank: int | None = None  # the rank of generation 0; None: a joiner
        self._lingers = False
        signals.opened(self)

    def _group(self, rank: int, world_size: int, generation: int, timeout: float) -> ProcessGroup:
        t0 = self.clock.monotonic()
        op = "init_process_group" if generation == 0 else "reconstruct"
        try:
            t = ZmqTransport(
                rank,
                world_size,
                generation,
                transport=self.transport,
                bind_host=self.bind_host,
                segment_bytes=self.segment_bytes,
                keys=self.client.keys,
            )
        except (zmq.ZMQError, OSError) as exc:
            raise sockets_failed(exc, op, rank, generation) from exc
        info = msgspec.structs.replace(t.address_info(), lrank=self.launch_rank)
        try:
            if generation == 0:
                # a replacement given the place of a rank that died before generation 0
                # formed (formation.py) joins with that rank
                self.client.rank, self.client.world_size = rank, world_size
                generation, infos = self.client.join(info, timeout)
            else:
                infos = self.client.exchange_addresses(generation, info, timeout)
            t.connect(infos)
        except zmq.ZMQError as exc:
            t.close(linger=0)
            raise sockets_failed(exc, op, rank, generation) from exc
        except BaseException:
            t.close(linger=0)
            raise
        self.client.rank = rank
        # the generation's schedule book: its group reads it, the heartbeat writes the
        # coordinator's notices into it and interrupts it with the group's failure
        book = ScheduleBook(generation)
        self.client.start_heartbeat(t, book)
        if generation == 0:
            log.info(
                "rank %d of %d: generation 0 formed in %.3f s",
                rank,
                world_size,
                self.clock.monotonic() - t0,
            )
        return ProcessGroup(
            t,
            timeout=self.timeout,
            on_destroy=self.close,
            membership=self,
            judge=self.client,  # whom a stall blames, and how a failed op ends (group/judge.py)
            arbiter=self.client,
            schedules=book,
        )

    def first_group(self, rank: int, world_size: int, timeout: float) -> ProcessGroup:
        self.launch_rank = rank
        # Beating before the rendezvous, as a joiner does: the first beat goes out before
        # this rank asks to join, so by the time the group forms its heartbeat connection has
        # spoken and its closing names this rank at once (connections.py). Started with the
        # group, a rank killed before its first beat reached the coordinator left a closed
        # connection that was nobody's, and only the heartbeat timeout found the death.
        self.client.start_heartbeat(None)
        self.client.beat_sent.wait(min(timeout, FIRST_BEAT_WAIT))
        return self._group(rank, world_size, 0, timeout)

    def join_group(self, timeout: float, spare: bool = False) -> ProcessGroup:
        """A replacement worker: wait for the members' next reconstruct(), then join. SIGTERM
        ends the wait (see signals.abandons_join). If the generation it was admitted to does
        not form (another newcomer or a member vanished), it waits for the members' next
        attempt, within the same timeout. A wait that ends without a group (its timeout,
        SIGTERM, an error) withdraws the request: otherwise the coordinator would keep it
        until the heartbeat timeout, and a reconstruct() meanwhile would wait for this
        process to take its place in the next generation. A spare is admitted only into the
        place of a rank that failed (membership/formation.py)."""
        self.client.start_heartbeat(None)
        deadline = self.clock.monotonic() + timeout
        fell_through = 0  # admissions whose generation did not form
        try:
            while True:
                try:
                    with signals.abandons_join(self.client):
                        regroup = self.client.request_join(
                            max(0.0, deadline - self.clock.monotonic()), spare=spare
                        )
                except CollectiveTimeout as exc:
                    if not fell_through:
                        raise
                    # The client's message names what was left of the timeout; say the whole.
                    raise CollectiveTimeout(
                        f"init_process_group(join=True): not admitted within {timeout:g} s "
                        f"({fell_through} admission(s) fell through when their generation "
                        "did not form)",
                        op="init_process_group",
                    ) from exc
                log.info("admitted as rank %d of generation %d", regroup.rank, regroup.generation)
                try:
                    return self._group(
                        regroup.rank, regroup.world_size, regroup.generation, timeout
                    )
                except CollectiveError as exc:
                    if not _formation_failed(exc) or self.clock.monotonic() >= deadline:
                        raise
                    fell_through += 1
                    log.warning(
                        "init_process_group(join=True): %s; waiting to be admitted again", exc
                    )
        except BaseException:
            self.client.leave()
            raise

    def reconstruct(
        self, pg: ProcessGroup, timeout: float, *, exclude: tuple[int, ...] = ()
    ) -> ProcessGroup:
        """The next generation, or `pg` itself if nothing changed. If the next generation
        does not form (a member or a joiner vanished after it was told its new rank), `pg`
        is closed already: ask again, and the coordinator forms a generation of those left.
        After `timeout` s of that: PeerFailure, and `pg` may be reconstructed again (it
        stays UNFORMED); never `pg` back once it is closed. exclude: ranks of `pg` to drop at
        once (ProcessGroup.reconstruct)."""
        start = self.clock.monotonic()
        while True:
            regroup = self.client.regroup(pg.generation, timeout, exclude=exclude)
            if regroup is None:
                if pg.state is GroupState.UNFORMED:
                    raise CollectiveError(
                        f"reconstruct: rank {pg.rank}: the coordinator answered 'unchanged' "
                        f"after this rank's group of generation {pg.generation} was closed "
                        "for a next generation that did not form; refusing to return the "
                        "closed group",
                        op="reconstruct",
                        rank=pg.rank,
                        generation=pg.generation,
                    )
                return pg
            pg.retire()
            try:
                new = self._group(regroup.rank, regroup.world_size, regroup.generation, timeout)
                break
            except CollectiveError as exc:
                if not _formation_failed(exc):
                    raise
                waited = self.clock.monotonic() - start
                if waited > timeout:
                    raise PeerFailure(
                        f"{exc}; gave up after {waited:.1f} s (timeout {timeout:g} s): this "
                        "rank's group is closed; call reconstruct() on it again",
                        op="reconstruct",
                        rank=pg.rank,
                        generation=pg.generation,
                        failed_ranks=getattr(exc, "failed_ranks", ()),
                        peer=getattr(exc, "peer", None),
                    ) from exc
                log.warning("%s; retrying", exc)
        # the op timeout the caller set on its group carries over (not this process's init
        # timeout: a joiner's is its long admission wait, bench.stress.chaos hung on it)
        new.timeout = pg.timeout
        pg.replaced_by(new)  # reconstruct() on it is an error from now on
        faults.from_environment(new)  # faults that follow the processes (faults.py)
        log.info(
            "rank %d -> rank %d of generation %d (%d ranks) in %.3f s",
            pg.rank,
            new.rank,
            new.generation,
            new.world_size,
            self.clock.monotonic() - start,
        )
        return new

    def leave(self) -> None:
        self.client.leave()

    def close_link(self) -> None:
        """Close the coordinator link (heartbeat thread, sockets) and nothing else: no leave,
        and a coordinator this process hosts keeps running (see ProcessGroup.close)."""
        signals.closed(self)  # first: a SIGTERM meanwhile has nothing to announce for it
        self.client.close()
        if self.hosted is not None and not self._lingers:
            # the job may still need the coordinator this process hosts (this rank was
            # evicted, the others go on): at exit, serve them until they are done
            self._lingers = True
            atexit.register(self.hosted.linger)

    def close(self) -> None:
        self.close_link()
        if self.hosted is not None:
            self.hosted.stop()


def _formation_failed(exc: CollectiveError) -> bool:
    """Whether a next generation failed to form in a way that asking again can mend: a
    peer vanished ('unformed', a PeerFailure), or the coordinator refused an address. Not
    when this rank itself was removed (Evicted) or a deadline passed (CollectiveTimeout:
    the time is spent)."""
    return not isinstance(exc, (Evicted, CollectiveTimeout))
