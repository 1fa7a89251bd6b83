"""A member's heartbeat thread (started by CoordinatorClient.start_heartbeat, client.py): the
shell of the rank machine's heartbeat side (rank.py). It reads its socket, the socket's
connection (restart.Watch) and its transport, feeds what happened as events -- Tick when the
machine is due, Gone and Back as the connection closes and is made again, Received for each
message -- and carries out the effects: send a beat, a ping's answer or a re-registration,
make the group raise (its transport and its schedule book), hand a schedule notice to the
book, log a note. When
to beat, what a ping answers, what a notice means, when to re-register and when the
coordinator is lost are the machine's rules, the ones the simulator runs.

The thread sees its client through `Beating`, the few things a heartbeat needs. The op thread
runs the same machine's request side on a machine of its own (client._exchange); the two
share the client's LinkState (link.py), which this side moves on and the other reads.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import zmq

from ..common.errors import CollectiveError, CoordinatorLost, Evicted, PeerFailure, PeerTimeout
from ..group.schedbook import ScheduleBook
from . import rank, restart, slowlinks
from .beating import Beating
from .protocol import AnyReply, Beat, Invalid, Request, decode_reply, pack

log = logging.getLogger("collectives")


def run(client: Beating) -> None:
    """The thread's body, until client.stopping is set."""
    # Its own socket: a zmq socket belongs to one thread. Its connection tells whether the
    # coordinator is there (restart.Watch).
    hb = client.new_socket()
    watch = restart.Watch(client, hb)
    hb.connect(f"tcp://{client.address}")
    poller = zmq.Poller()
    poller.register(hb, zmq.POLLIN)
    poller.register(watch.mon, zmq.POLLIN)

    def send(request: Request) -> bool:
        try:
            hb.send(pack(request), zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False  # no connection to queue it on: the machine sends again when due

    shell = Shell(client, send)
    try:
        while not client.stopping.is_set():
            for connected in watch.events():
                shell.connection(connected, client.clock.monotonic())
            now = client.clock.monotonic()
            shell.tick(now)
            if shell.beaten and shell.machine.state.seen:
                # queued before the handshake, a beat goes out as it succeeds
                client.beat_sent.set()
            # the monitor too: a connection made again is beaten on at once
            wait = min(client.heartbeat_interval, max(0.0, shell.machine.due() - now))
            ready = dict(poller.poll(int(wait * 1000) + 1))
            if hb in ready:
                try:
                    msg = decode_reply(hb.recv())
                except Invalid as exc:
                    log.warning(
                        "%s: dropped a malformed message from the coordinator: %s",
                        client.who(),
                        exc,
                    )
                    continue
                shell.received(msg, client.clock.monotonic())
            if shell.machine.error is not None:
                # the machine said why (a Note); without it this member beats no more, and
                # the coordinator finds it dead as it would a hung process
                break
    except zmq.ContextTerminated:
        pass  # close() gave up waiting for this thread and terminated the context
    finally:
        watch.close()
        hb.close(linger=0)


class Shell:
    """The heartbeat side's machine and what it reads and does; no socket of its own
    (`send` queues a request on the heartbeat socket: False where it could not)."""

    def __init__(self, client: Beating, send: Callable[[Request], bool]):
        self.client = client
        self.send = send
        self.machine = rank.RankMachine(
            rank.RankState(
                client.mid, client.heartbeat_interval, client.heartbeat_timeout, client.link
            )
        )
        self.told: tuple[Any, Any] = (None, None)  # the transport and failure fed last
        self.beaten = False  # a beat went out (queued on a connection)

    def tick(self, now: float) -> None:
        """The clock moved: a Tick if the machine is due (a beat, a re-registration, the
        grace's end)."""
        if now >= self.machine.due():
            t = self._sync(now)
            links = tuple(slowlinks.beat_links(t))
            self._feed(rank.Tick(self.client.report(t), links, _book(self._book(t))), now)

    def connection(self, connected: bool, now: float) -> None:
        """The heartbeat connection was made (a handshake succeeded) or closed."""
        t = self._sync(now)
        event = rank.Back(self.client.report(t), _book(self._book(t))) if connected else rank.Gone()
        self._feed(event, now)

    def received(self, msg: AnyReply, now: float) -> None:
        t = self._sync(now)
        self._feed(rank.Received(msg, "heartbeat", self.client.report(t)), now)

    def _sync(self, now: float) -> Any:
        """Tell the machine the client's transport as it is now -- its generation, and what
        it raises (set by anyone: a notice, the op's own verdict, a peer's closing) -- when it
        changed; the transport."""
        t = self.client.transport
        failure = None if t is None else t.failure
        told_t, told_failure = self.told
        if t is not None and (t is not told_t or failure is not told_failure):
            group = rank.NewGroup(t.generation, t.rank, t.size, fault_of(failure))
            self._carry(self.machine.feed(group, now), now)
        self.told = (t, failure)
        return t

    def _book(self, t: Any) -> ScheduleBook | None:
        """The schedule book of `t`'s group (read after `t`: beating.Beating); None where
        there is no group, or the book is already the next generation's."""
        book = self.client.book
        if t is None or book is None or book.generation != t.generation:
            return None
        return book

    def _feed(self, event: rank.Event, now: float) -> None:
        self._carry(self.machine.feed(event, now), now)

    def _carry(self, effects: list[rank.Effect], now: float) -> None:
        for e in effects:
            t = self.client.transport
            book = self._book(t)
            if isinstance(e, rank.Send):
                sent = self.send(e.request)
                if sent and isinstance(e.request, Beat):
                    self.beaten = True
            elif isinstance(e, rank.Interrupt):
                error = error_of(e.fault)
                if t is not None and error is not None:
                    # the group fails: what it waits on raises, the transport's frames and
                    # a schedule's decision alike (the transport knows no book)
                    t.interrupt(error)
                    if book is not None:
                        book.interrupt(error)
                    self.told = (t, t.failure)  # the machine set it itself
            elif isinstance(e, rank.ToBook):
                answer = slowlinks.on_notice(t, book, e.notice)
                if answer is not None:
                    self._feed(answer, now)
            elif isinstance(e, rank.ToTests):
                slowlinks.on_test(t, e.notice)
            elif isinstance(e, rank.Note):
                log.log(logging.WARNING if e.warn else logging.INFO, "%s", e.what)
            else:  # the request side's effects: the heartbeat side has no request waiting
                log.warning("%s: heartbeat: unexpected %r", self.client.who(), e)


def _book(book: ScheduleBook | None) -> tuple[int, ...]:
    """A schedule book's state, as a re-registration carries it (none: empty)."""
    return () if book is None else tuple(book.state().wire())


def fault_of(error: CollectiveError | None) -> rank.Fault | None:
    """A transport's failure (what it raises now) as the rank machine describes it."""
    if error is None:
        return None
    kind: rank.FaultKind = "CollectiveError"
    if isinstance(error, Evicted):
        kind = "Evicted"
    elif isinstance(error, CoordinatorLost):
        kind = "CoordinatorLost"
    elif isinstance(error, PeerTimeout):
        kind = "PeerTimeout"
    elif isinstance(error, PeerFailure):
        kind = "PeerFailure"
    ranks = tuple(error.failed_ranks) if isinstance(error, PeerFailure) else ()
    return rank.Fault(kind, str(error), ranks, error.generation, error.rank)


def error_of(fault: rank.Fault) -> CollectiveError | None:
    """The exception the machine's Interrupt describes (a notice's fault, rank.notice_fault,
    or the coordinator lost)."""
    ranks = list(fault.failed_ranks)
    if fault.kind == "Evicted":
        return Evicted(
            fault.message, failed_ranks=ranks, generation=fault.generation, rank=fault.rank
        )
    if fault.kind == "CoordinatorLost":
        return CoordinatorLost(fault.message, rank=fault.rank, generation=fault.generation)
    if fault.kind in ("PeerTimeout", "PeerFailure"):
        cls = PeerTimeout if fault.kind == "PeerTimeout" else PeerFailure
        return cls(
            fault.message,
            failed_ranks=ranks,
            generation=fault.generation,
            rank=fault.rank,
            peer=ranks[0] if ranks else None,
            graceful=fault.graceful,
        )
    return None  # no Interrupt describes another kind
