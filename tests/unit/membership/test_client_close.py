"""CoordinatorClient.close(): every blocking step has a deadline.

Invariant: close() returns within about 2 * CLOSE_TIMEOUT s even when the heartbeat thread
does not stop (stuck outside ZeroMQ, so ctx.term() would wait for its socket for ever), and
logs that it did not; once the thread gets going again it ends by itself. In-process: a bare
ROUTER on port 0 stands in for the coordinator.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
import zmq

from collectives.membership import client as link
from collectives.membership.client import CoordinatorClient
from collectives.transport.base import Progress
from collectives.transport.linkstats import LinkStats
from collectives.group.schedbook import ScheduleBook
from support.timing import scaled

pytestmark = pytest.mark.fast  # in-process: part of `make test-fast`


class _StuckTransport:
    """What the heartbeat thread reads each beat; reading it blocks until released: a
    heartbeat thread stuck outside ZeroMQ, which no join timeout or ctx.term() ends."""

    rank, size, generation, failure = 0, 1, 0, None

    def __init__(self):
        self.schedules = ScheduleBook(self.generation)  # a re-registration carries its state
        self.release = threading.Event()
        self.entered = threading.Event()
        self.linkstats = LinkStats(1)  # the beat's link figures (transport/linkstats.py)

    def progress(self):
        self.entered.set()
        self.release.wait(60)
        return Progress(0, -1, False, None, None, None)


@pytest.mark.timeout(40)
def test_close_returns_when_the_heartbeat_thread_does_not_stop(monkeypatch, caplog):
    """close() returns within its bound (CLOSE_TIMEOUT) even when the heartbeat thread is stuck
    inside its transport and never stops: the context is not left waiting on that thread's
    socket."""
    monkeypatch.setattr(link, "CLOSE_TIMEOUT", 0.5, raising=False)
    ctx = zmq.Context()
    server = ctx.socket(zmq.ROUTER)  # somewhere to connect to; answers nothing
    server.setsockopt(zmq.LINGER, 0)
    port = server.bind_to_random_port("tcp://127.0.0.1")
    client = CoordinatorClient(f"127.0.0.1:{port}", 0, 1, heartbeat_interval=0.05)
    stuck = _StuckTransport()
    closer = threading.Thread(target=client.close, daemon=True)
    try:
        client.start_heartbeat(None)
        # not a wait: a few real beats first; `stuck.entered` below is the event waited for
        time.sleep(0.2)
        client.transport = stuck
        assert stuck.entered.wait(scaled(5))
        caplog.set_level(logging.WARNING, logger="collectives")
        t0 = time.monotonic()
        closer.start()
        closer.join(scaled(10))
        took = time.monotonic() - t0
        assert not closer.is_alive(), f"close() still blocked after {scaled(10):g} s"
        assert took < scaled(3.0), took  # CLOSE_TIMEOUT (0.5 s) and a little, not forever
        assert any(
            "heartbeat thread did not stop" in r.getMessage() and "rank 0" in r.getMessage()
            for r in caplog.records
        ), caplog.text
    finally:
        stuck.release.set()
        closer.join(10)
        server.close()
        ctx.term()
    # released, the thread finds its context terminated, closes its socket and ends
    client._hb_thread.join(5)
    assert not client._hb_thread.is_alive()
