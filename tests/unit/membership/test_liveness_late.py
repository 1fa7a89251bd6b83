"""The connection witness (membership/liveness.py) when a connection closes before its only
message is read: the monitor's events are read before messages, so the closing comes first
and names nobody. The message read afterwards says whose connection it was, and the closing
is handed over again with that routing id -- after the message, which is what makes the id a
member's (its first beat), not before it."""

from __future__ import annotations

import time

import pytest
import zmq

from collectives.membership.liveness import Liveness
from collectives.membership.machine import Connection


@pytest.mark.timeout(30)
def test_a_connection_that_closed_before_its_message_was_read_is_named_after_it():
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    witness = Liveness(router, None, frozenset({"connection"}), known=set)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.ROUTING_ID, b"member-a")
    try:
        dealer.connect(f"tcp://127.0.0.1:{port}")
        dealer.send(b"first beat")
        # the message is on its way; the peer closes before the coordinator reads anything
        deadline = time.monotonic() + 10
        while not router.poll(10):
            assert time.monotonic() < deadline, "the message never came"
        dealer.close(linger=1000)
        seen: list = []
        while not any(isinstance(e, Connection) and e.what == "closed" for e in seen):
            assert time.monotonic() < deadline, f"no closing seen: {seen}"
            witness.poll(10)  # reads the monitor's events, not the message
            seen += witness.take_observed()
        closed = [e for e in seen if isinstance(e, Connection) and e.what == "closed"]
        assert [e.ident for e in closed] == [None], seen  # nobody's yet

        ident, body = witness.recv()
        assert (ident, body) == (b"member-a", b"first beat")
        assert witness.take_observed() == [], "the late closing must wait for the message"
        late = witness.take_observed()
        assert [(e.what, e.ident) for e in late] == [("closed", b"member-a")], late
    finally:
        witness.close()
        dealer.close(linger=0)
        router.close(linger=0)
        ctx.term()
