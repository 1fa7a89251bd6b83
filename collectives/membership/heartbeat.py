"""A member's heartbeat thread (started by CoordinatorClient.start_heartbeat, client.py): it
beats every heartbeat_interval with this member's progress, answers the coordinator's pings,
and hands the notices sent to it -- a failure of other ranks, this rank's eviction -- to the
transport, whose current and next operations raise them. Its socket's connection also tells
whether the coordinator is there (restart.Watch).

The thread sees its client through `Beating`, the few things a heartbeat needs; what a
notice means is a pure function (`notice_error`).
"""

from __future__ import annotations

import logging
from typing import Any

import zmq

from ..common.errors import CollectiveError, Evicted, PeerFailure, PeerTimeout
from . import rank, restart, slowlinks
from .beating import Beating
from .protocol import (
    AnyReply,
    Beat,
    Invalid,
    Ping,
    SchedDrop,
    SchedGo,
    Schedule,
    State,
    TestLinks,
    decode_reply,
    pack,
)

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
    try:
        next_beat = 0.0
        beaten = False
        while not client.stopping.is_set():
            now = client.clock.monotonic()
            if watch.poll(now):
                next_beat = now  # connected again: beat at once (connections.GRACE)
            if beaten and watch.seen:
                # queued before the handshake, a beat goes out as it succeeds
                client.beat_sent.set()
            if now >= next_beat:
                try:
                    t = client.transport
                    beat = Beat(
                        mid=client.mid,
                        report=client.report(t),
                        links=slowlinks.beat_links(t),  # its links' figures
                    )
                    hb.send(pack(beat), zmq.NOBLOCK)
                    beaten = True
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
                try:
                    msg = decode_reply(hb.recv())
                except Invalid as exc:
                    log.warning(
                        "%s: dropped a malformed message from the coordinator: %s",
                        client.who(),
                        exc,
                    )
                    continue
                if not watch.on_reply(msg):
                    on_notice(client, hb, msg)
    except zmq.ContextTerminated:
        pass  # close() gave up waiting for this thread and terminated the context
    finally:
        watch.close()
        hb.close(linger=0)


def notice_error(msg: AnyReply, t: Any) -> CollectiveError | None:
    """What the transport `t` must raise for a notice: a failure of other ranks of its
    generation (PeerTimeout where the notice names the op they stalled, as the rank whose
    deadline fired first raises, else PeerFailure), or this rank's eviction (once). None: the
    notice is for another generation, or says nothing new. The rule is the rank machine's
    (rank.notice_fault), the one the simulator runs; this builds its error."""
    if t is None:
        return None
    held = rank.Fault("Evicted", "") if isinstance(t.failure, Evicted) else None
    fault = rank.notice_fault(msg, rank.Group(t.generation, t.rank, t.size, failure=held))
    return None if fault is None else error_of(fault)


def error_of(fault: rank.Fault) -> PeerFailure | None:
    """The exception a notice's Fault (rank.notice_fault) describes."""
    ranks = list(fault.failed_ranks)
    if fault.kind == "Evicted":
        return Evicted(
            fault.message, failed_ranks=ranks, generation=fault.generation, rank=fault.rank
        )
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
    return None  # no notice describes another kind


def on_notice(client: Beating, hb: zmq.Socket[bytes], msg: AnyReply) -> None:
    """What the coordinator sent the heartbeat socket: a ping (answered with this member's
    state), a schedule around slow links (slowlinks.py: answered), a test of a link routed
    around (slowlinks.py: its frames handed to the op thread), a failure of other ranks or
    this rank's eviction (the transport raises them)."""
    t = client.transport
    if isinstance(msg, Ping):
        # a diagnosis's ping names itself: the picture is placed after it (verdicts.py)
        state = State(mid=client.mid, report=client.report(t), token=msg.token)
        try:
            hb.send(pack(state), zmq.NOBLOCK)
        except zmq.Again:
            pass
        return
    if isinstance(msg, TestLinks):  # a link routed around, tested (transport/linktest.py)
        slowlinks.on_test(t, msg)
        return
    if isinstance(msg, (Schedule, SchedGo, SchedDrop)):  # around slow links: proposed, decided
        answer = slowlinks.on_notice(t, msg, client.mid)
        if answer is not None:
            try:
                hb.send(pack(answer), zmq.NOBLOCK)
            except zmq.Again:
                pass  # unanswered: the coordinator drops the proposal and makes it again
        return
    error = notice_error(msg, t)
    if error is not None:
        t.interrupt(error)
