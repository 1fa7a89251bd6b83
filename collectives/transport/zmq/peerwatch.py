"""PeerWatch: notice that a peer's process is gone from its closed connection, long before an
operation's deadline (ZmqTransport.watch_peers; the torch backend uses it, as Gloo notices a
dead peer from its socket)."""

from __future__ import annotations

from typing import Any

import threading
import time

import zmq
from ...common.monitor import next_event

from ...common.errors import PeerFailure
from ..base import Transport


class PeerWatch:
    """Notices a dead peer long before the op timeout, as Gloo does from a closed connection.

    ZeroMQ hides connections, but a socket monitor reports them: when the connection to a
    peer drops and has not come back after `grace` seconds while this rank is inside a
    collective (or waiting on that peer), the transport is interrupted with PeerFailure, and
    the op in flight raises it at once. The grace covers a peer that finished its last op and
    exited normally: its final messages are already queued here and are read well within it.
    """

    def __init__(
        self, transport: Transport, dealers: dict[int, zmq.Socket[Any]], grace: float = 2.0
    ) -> None:
        self.t = transport
        self.dealers = dealers  # the send side's DEALERs, one per peer (sending.py)
        self.grace = grace
        self.monitors = {}  # monitor socket -> peer
        for peer, sock in dealers.items():
            mon = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
            self.monitors[mon] = peer
        self.down: dict[int, float] = {}  # peer -> when its connection dropped
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, daemon=True, name=f"collectives-peerwatch-rank{transport.rank}"
        )
        self._thread.start()

    def _loop(self) -> None:
        t = self.t
        poller = zmq.Poller()
        for mon in self.monitors:
            poller.register(mon, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                for mon, _ in poller.poll(100):
                    event = next_event(mon).kind
                    peer = self.monitors[mon]
                    if event == zmq.EVENT_DISCONNECTED:
                        self.down.setdefault(peer, time.monotonic())
                    elif event == zmq.EVENT_CONNECTED:
                        self.down.pop(peer, None)
                now = time.monotonic()
                for peer, since in list(self.down.items()):
                    if now - since < self.grace or t.failure is not None:
                        continue
                    progress = t.progress()
                    if progress.in_op or progress.waiting_on == peer:
                        t.interrupt(
                            PeerFailure(
                                f"rank {t.rank}: the connection to rank {peer} closed "
                                f"{now - since:.1f} s ago and did not come back (the process died "
                                "or left); the group is unusable",
                                failed_ranks=[peer],
                                rank=t.rank,
                                peer=peer,
                                generation=t.generation,
                            )
                        )
        finally:
            for mon in self.monitors:
                mon.close(linger=0)

    def stop(self) -> None:
        """Stop watching. Call before the transport closes (its context waits for us).

        The monitors are switched off first, while the thread still reads our ends of their
        pipes: switching one off makes libzmq send a last event into its PAIR socket, and a
        PAIR send whose peer has already closed blocks for ever (seen: destroy_process_group
        hanging now and then on a loaded machine, when the thread had closed them first)."""
        for sock in self.dealers.values():
            try:
                sock.disable_monitor()
            except Exception:  # already closed
                pass
        self._stop.set()
        self._thread.join(5.0)
