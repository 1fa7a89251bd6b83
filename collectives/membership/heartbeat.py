"""A member's heartbeat thread (started by CoordinatorClient.start_heartbeat, client.py): it
beats every heartbeat_interval with this member's progress, answers the coordinator's pings,
and hands the notices sent to it -- a failure of other ranks, this rank's eviction -- to the
transport, whose current and next operations raise them. Its socket's connection also tells
whether the coordinator is there (restart.Watch).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import zmq

from ..common.errors import Evicted, PeerFailure, PeerTimeout
from . import restart, slowlinks
from .protocol import pack, unpack

if TYPE_CHECKING:
    from .client import CoordinatorClient


def run(client: CoordinatorClient) -> None:
    """The thread's body, until client.close() stops it."""
    # Its own socket: a zmq socket belongs to one thread. Its connection tells whether the
    # coordinator is there (restart.Watch).
    hb = client._socket()
    watch = restart.Watch(client, hb)
    hb.connect(f"tcp://{client.address}")
    poller = zmq.Poller()
    poller.register(hb, zmq.POLLIN)
    poller.register(watch.mon, zmq.POLLIN)
    try:
        next_beat = 0.0
        while not client._stop.is_set():
            now = time.monotonic()
            if watch.poll(now):
                next_beat = now  # connected again: beat at once (liveness.GRACE)
            if now >= next_beat:
                try:
                    beat = dict(client._state(client.transport), t="beat")
                    beat.update(slowlinks.beat_fields(client.transport))  # fail-slow hook
                    hb.send(pack(beat), zmq.NOBLOCK)
                except zmq.Again:
                    pass  # no connection to queue it on: the next one may have one
                next_beat = now + client.heartbeat_interval
            # the monitor too: a connection made again is beaten on at once
            ready = dict(
                poller.poll(
                    int(min(client.heartbeat_interval, max(0.0, next_beat - now)) * 1000) + 1
                )
            )
            if hb in ready:
                msg = unpack(hb.recv())
                if msg is not None and not watch.on_reply(msg):
                    on_notice(client, hb, msg)
    except zmq.ContextTerminated:
        pass  # close() gave up waiting for this thread and terminated the context
    finally:
        watch.close()
        hb.close(linger=0)


def on_notice(client: CoordinatorClient, hb: zmq.Socket, msg: dict) -> None:
    """What the coordinator sent the heartbeat socket: a ping (answered with this member's
    state), a failure of other ranks or this rank's eviction (the transport raises them)."""
    t = client.transport
    if msg["t"] == "ping":
        try:
            hb.send(pack(dict(client._state(t), t="state")), zmq.NOBLOCK)
        except zmq.Again:
            pass
    elif msg["t"] == "failure" and t is not None and msg["generation"] == t.generation:
        ranks = msg["failed_ranks"]
        # a stall's culprits: the same error type as the rank whose deadline fired first
        cls = PeerTimeout if msg.get("op") is not None else PeerFailure
        failure = cls(
            f"rank(s) {', '.join(map(str, ranks))} of generation {t.generation} "
            f"{msg['reason']}; call reconstruct() to go on without them",
            failed_ranks=ranks,
            generation=t.generation,
            rank=t.rank,
            peer=ranks[0] if ranks else None,
            graceful=bool(msg.get("graceful")),
        )
        t.interrupt(failure)
    elif msg["t"] in slowlinks.NOTICES:  # fail-slow hook: a schedule proposed or decided
        answer = slowlinks.on_notice(t, msg)
        if answer is not None:
            try:
                hb.send(pack(dict(answer, mid=client.mid)), zmq.NOBLOCK)
            except zmq.Again:
                pass  # unanswered: the coordinator drops the proposal and makes it again
    elif msg["t"] == "evicted" and t is not None and not isinstance(t.failure, Evicted):
        t.interrupt(
            Evicted(
                f"rank {t.rank} of generation {t.generation} was removed from "
                f"the group: {msg['reason']}",
                failed_ranks=[t.rank],
                generation=t.generation,
                rank=t.rank,
            )
        )
