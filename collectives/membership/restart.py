"""A member's side of a coordinator restart (the coordinator's side: recovery.py).

The data path never asks the coordinator (only a stalled or half-finished op does: diagnosis,
outcome), so collectives go on while it is away. What must survive is the membership:

  * the heartbeat socket's connection says whether the coordinator is there (a socket
    monitor, read here: `Watch`; ZMTP heartbeats make a coordinator that stops answering, or
    whose host vanished, show as a lost connection too); the heartbeat thread feeds what it
    does to the rank machine (rank.py: on_gone, on_back, and _tick for the re-registration
    and the grace), the rules the simulator runs;
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

import zmq

from ..common.monitor import next_event
from .beating import Beating

# ms: a heartbeat connection that closed is made again this soon (ZeroMQ's default: 100 ms),
# doubling up to RECONNECT_IVL_MAX while it fails: the coordinator declares a member whose
# connection stays closed past connections.GRACE (0.5 s) dead
RECONNECT_IVL, RECONNECT_IVL_MAX = 10, 1000


class Watch:
    """The heartbeat socket's connection, for the heartbeat thread (heartbeat.py): made
    (a handshake succeeded) or closed, as its monitor says."""

    EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED

    def __init__(self, client: Beating, sock: zmq.Socket[bytes]):
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

    def events(self) -> list[bool]:
        """The connection's events queued now, in order: True made, False closed."""
        seen: list[bool] = []
        while True:
            try:
                kind = next_event(self.mon, zmq.NOBLOCK).kind
            except zmq.Again:
                return seen
            if kind in (zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_DISCONNECTED):
                seen.append(kind == zmq.EVENT_HANDSHAKE_SUCCEEDED)

    def close(self) -> None:
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self.mon.close(linger=0)
