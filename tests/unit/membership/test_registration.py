"""A member's re-registration with a restarted coordinator is the rank machine's rule.

Invariant: restart.registration (the heartbeat thread's) builds its Rejoin with rank.rejoin_of,
the function the machine's re-registration runs in the simulator: the transport's failure
decides whether there is one (evicted, lost: none) and which ranks it names as failed, the
link's roster and forming generation go with it, and the schedule book's state is added. In
process: a stand-in transport and client, no sockets.
"""

from __future__ import annotations

import threading

import pytest

from collectives.common.errors import CoordinatorLost, Evicted, PeerTimeout
from collectives.membership import rank, restart
from collectives.membership.clock import REAL
from collectives.membership.link import LinkState
from collectives.membership.protocol import NO_REPORT, Report
from collectives.transport.schedbook import ScheduleBook

pytestmark = [pytest.mark.fast, pytest.mark.timeout(10)]

MID = "b" * 32
REP = Report(generation=4, seq=9, in_op=False)


class _Transport:
    rank, size, generation = 1, 3, 4

    def __init__(self, failure=None) -> None:
        self.failure = failure
        self.schedules = ScheduleBook()


class _Client:
    """The few things of a client a heartbeat thread reads (beating.Beating)."""

    address, clock, mid = "h:1", REAL, MID
    heartbeat_interval, heartbeat_timeout = 0.5, 2.0

    def __init__(self, transport) -> None:
        self.transport = transport
        self.link = LinkState("h:1", 10.0)
        self.stopping, self.beat_sent = threading.Event(), threading.Event()

    def report(self, t):
        return NO_REPORT if t is None else REP

    def who(self) -> str:
        return "rank 1"


def _machine_says(client: _Client):
    t = client.transport
    g = rank.Group(t.generation, t.rank, t.size, restart.fault_of(t.failure))
    return rank.rejoin_of(MID, g, client.link, REP)


def test_a_member_re_registers_as_the_machine_would():
    c = _Client(_Transport())
    assert restart.registration(c) is None  # its generation's roster never came
    c.link.welcomed(4, ["m0", "m1", "m2"])
    c.link.forming = 5
    msg = restart.registration(c)
    assert msg is not None and (msg.rank, msg.world_size, msg.forming) == (1, 3, 5)
    assert msg.members == ["m0", "m1", "m2"] and msg.failed == [] and msg.report == REP
    assert msg.sched == c.transport.schedules.state().wire()
    assert (msg.mid, msg.report, msg.failed) == (_machine_says(c).mid, REP, [])


def test_the_transports_failure_decides_what_it_says():
    c = _Client(_Transport(PeerTimeout("stalled", failed_ranks=[2], generation=4, rank=1)))
    c.link.welcomed(4, ["m0", "m1", "m2"])
    msg = restart.registration(c)
    assert msg is not None and msg.failed == [2] == _machine_says(c).failed
    c.transport.failure = PeerTimeout("earlier", failed_ranks=[0], generation=3, rank=1)
    assert restart.registration(c).failed == []  # another generation's failure
    for gone in (Evicted("out", failed_ranks=[1], rank=1), CoordinatorLost("lost", rank=1)):
        c.transport.failure = gone
        assert restart.registration(c) is None and _machine_says(c) is None
    c.transport = None  # a joiner: its request is sent again instead
    assert restart.registration(c) is None
