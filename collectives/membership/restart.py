"""A member's side of a coordinator restart (the coordinator's side: recovery.py).

The data path never asks the coordinator (only a stalled or half-finished op does: diagnosis,
outcome), so collectives go on while it is away. What must survive is the membership:

  * the heartbeat socket's connection says whether the coordinator is there (a socket
    monitor; ZMTP heartbeats make a coordinator that stops answering, or whose host vanished,
    show as a lost connection too);
  * when a new coordinator answers at the same address (same job secret, so the same CURVE
    keys), the member re-registers: `rejoin {mid, rank, world_size, generation, members,
    failed, forming, progress}`; the coordinator rebuilds the generation from these, without
    a generation change, and acknowledges (`rejoined`) or refuses (`evicted`);
  * after the acknowledgement the client's `epoch` grows, and every request still waiting
    for an answer (reconstruct, diagnosis, outcome, admission) is sent again: the old
    coordinator may have died with it. While the coordinator is away a request waits for it
    past its own deadline: the grace bounds that wait;
  * away longer than the grace (COLLECTIVES_COORDINATOR_GRACE): every operation of the
    process raises CoordinatorLost, naming the address and how long it has been gone.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import zmq

from ..common.monitor import next_event
import msgspec

from ..common.errors import CollectiveError, CoordinatorLost, Evicted, PeerFailure, PeerTimeout
from . import rank
from .protocol import AnyReply, Rejoin, Rejoined, pack
from .protocol import Evicted as EvictedMsg

if TYPE_CHECKING:
    from .beating import Beating

log = logging.getLogger("collectives")

REJOIN_EVERY = rank.REJOIN_EVERY  # s: a re-registration not acknowledged is sent again
# ms: a heartbeat connection that closed is made again this soon (ZeroMQ's default: 100 ms),
# doubling up to RECONNECT_IVL_MAX while it fails: the coordinator declares a member whose
# connection stays closed past connections.GRACE (0.5 s) dead
RECONNECT_IVL, RECONNECT_IVL_MAX = 10, 1000


def registration(client: Beating) -> Rejoin | None:
    """This member's re-registration, or None where it has none to make: the rank machine's
    rule (rank.rejoin_of), fed this generation as its transport has it, with the schedule
    book's state added (a proposal held undecided: the restarted coordinator decides it,
    schedbook.py)."""
    t = client.transport
    g = None if t is None else rank.Group(t.generation, t.rank, t.size, fault_of(t.failure))
    msg = rank.rejoin_of(client.mid, g, client.link, client.report(t))
    if msg is None:
        return None
    return msgspec.structs.replace(msg, sched=t.schedules.state().wire())


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


class Watch:
    """Read by the heartbeat thread (heartbeat.py), on its own socket: the connection's
    events move the client's LinkState (link.py) on."""

    EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED

    def __init__(self, client: Beating, sock: zmq.Socket[bytes]):
        self.client = client
        self.link = client.link
        self.sock = sock
        # ZMTP heartbeats: a coordinator that is stopped or whose host is gone (no FIN)
        # shows as a lost connection after the heartbeat timeout
        ivl = max(100, int(client.heartbeat_interval * 2000))
        sock.setsockopt(zmq.HEARTBEAT_IVL, ivl)
        # (twice the heartbeat timeout: a busy host must not look like a lost coordinator)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, max(ivl, int(client.heartbeat_timeout * 2000)))
        sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX)
        self.mon: zmq.Socket[bytes] = sock.get_monitor_socket(self.EVENTS)
        self.seen = False  # the first handshake: the coordinator as the member found it
        # when to send the re-registration (again); None: not due
        self.rejoin_due: float | None = None

    def poll(self, now: float) -> bool:
        """Read the connection's events; whether it was made again after it closed (the
        caller then beats at once)."""
        link = self.link
        again = False
        while True:
            try:
                kind = next_event(self.mon, zmq.NOBLOCK).kind
            except zmq.Again:
                break
            if kind == zmq.EVENT_DISCONNECTED:
                self.rejoin_due = None
                if link.went_away(now):
                    log.warning(
                        "%s: lost the coordinator at %s; collectives go on without "
                        "it, waiting up to %g s for it to come back",
                        self.client.who(),
                        link.address,
                        link.grace,
                    )
            elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                if self.seen and link.away_since is not None:
                    self.rejoin_due = now
                again = self.seen
                self.seen = True
        if self.rejoin_due is not None and now >= self.rejoin_due:
            self._rejoin(now)
        lost = link.overdue(now)
        if lost is not None:
            log.error("%s: %s", self.client.who(), lost)
            t = self.client.transport
            if t is not None:
                t.interrupt(
                    CoordinatorLost(
                        f"{self.client.who()}: {lost}", rank=t.rank, generation=t.generation
                    )
                )
        return again

    def _rejoin(self, now: float) -> None:
        msg = registration(self.client)
        if msg is None:
            self._back(now)
            return
        try:
            self.sock.send(pack(msg), zmq.NOBLOCK)
        except zmq.Again:
            pass
        self.rejoin_due = now + REJOIN_EVERY

    def on_reply(self, msg: AnyReply) -> bool:
        """Whether `msg` was the answer to a re-registration (and is handled)."""
        if self.rejoin_due is None or not isinstance(msg, (Rejoined, EvictedMsg)):
            return False
        self._back(self.client.clock.monotonic())
        return isinstance(msg, Rejoined)  # an eviction is for heartbeat.on_notice to deliver

    def _back(self, now: float) -> None:
        away = self.link.came_back(now)
        if away is not None:
            log.warning(
                "%s: the coordinator at %s is back after %.1f s",
                self.client.who(),
                self.link.address,
                away,
            )
        self.rejoin_due = None

    def close(self) -> None:
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self.mon.close(linger=0)
