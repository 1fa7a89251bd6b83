"""The heartbeat thread is the rank machine's shell: beats, notices, re-registration and the
coordinator's loss run through the machine's transitions (rank.py), the ones the simulator
runs.

Invariant: the shell (heartbeat.Shell) feeds the machine what its connection and its transport
say -- Back and Gone, a Tick when the machine is due, each message as Received, the transport's
generation and failure as NewGroup -- and carries out the effects: what it sends is what the
machine says (a beat, a ping's answer, the re-registration with the schedule book's state), a
notice makes the transport raise the machine's fault, a proposal goes to the book and its
answer back through the machine, and the grace's end makes the transport raise
CoordinatorLost. In process: a stand-in transport and client, no sockets.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from collectives.common.errors import (
    CoordinatorLost,
    Evicted,
    PeerFailure,
    PeerTimeout,
)
from collectives.membership import heartbeat, protocol, rank
from collectives.membership.clock import REAL
from collectives.membership.link import LinkState
from collectives.membership.protocol import NO_REPORT, Report
from collectives.transport import linktest
from support.timing import scaled
from collectives.group.schedbook import ScheduleBook

pytestmark = [pytest.mark.fast, pytest.mark.timeout(10)]

MID = "b" * 32
REP = Report(generation=4, seq=9, in_op=False)


class _Transport:
    rank, size, generation = 1, 3, 4

    def __init__(self, failure=None) -> None:
        self.failure = failure
        self.book = ScheduleBook(self.generation)  # its group's, handed with it (lifecycle.py)
        self.raised: list = []
        self.tests: list = []  # the link tests' frames asked for (linktest.LinkTests.ask)
        self.linktests = SimpleNamespace(ask=self.tests.extend)

    def interrupt(self, failure) -> None:
        self.failure = failure
        self.raised.append(failure)


class _Client:
    """The few things of a client a heartbeat thread reads (beating.Beating)."""

    address, clock, mid = "h:1", REAL, MID
    heartbeat_interval, heartbeat_timeout = 0.5, 2.0

    def __init__(self, transport) -> None:
        self.transport = transport
        self.book = None if transport is None else transport.book  # as start_heartbeat
        self.link = LinkState("h:1", 10.0)
        self.stopping, self.beat_sent = threading.Event(), threading.Event()

    def report(self, t):
        return NO_REPORT if t is None else REP

    def who(self) -> str:
        return "rank 1"


def shell(transport=None):
    sent: list = []
    sh = heartbeat.Shell(_Client(transport), lambda m: sent.append(m) or True)
    return sh, sent


def restarted(sh, sent, at=5.0):
    """First handshake, the connection lost, a new coordinator's handshake: what is sent."""
    sh.connection(True, 0.0)
    sh.connection(False, at - 1.0)
    del sent[:]
    sh.connection(True, at)
    return [m for m in sent if isinstance(m, protocol.Rejoin)]


def test_the_first_handshake_beats_and_a_beat_goes_out_when_due():
    sh, sent = shell(_Transport())
    sh.connection(True, 0.0)
    assert [type(m) for m in sent] == [protocol.Beat] and sh.beaten
    assert sent[0].report == REP and sent[0].mid == MID
    sh.tick(0.49)
    assert len(sent) == 1  # not due yet
    sh.tick(0.5)
    assert [type(m) for m in sent] == [protocol.Beat, protocol.Beat]


def test_a_member_re_registers_as_the_machine_would():
    t = _Transport()
    sh, sent = shell(t)
    assert restarted(sh, sent) == []  # its generation's roster never came
    assert sh.client.link.away_since is None and sh.client.link.epoch == 1  # back at once
    sh, sent = shell(t)
    sh.client.link.welcomed(4, ["m0", "m1", "m2"])
    sh.client.link.forming = 5
    t.book.propose(3, 20, None)
    (msg,) = restarted(sh, sent)
    assert (msg.rank, msg.world_size, msg.forming) == (1, 3, 5)
    assert msg.members == ["m0", "m1", "m2"] and msg.failed == [] and msg.report == REP
    assert msg.sched == t.book.state().wire() == [3, 20, -1, -1]
    sh.tick(5.0 + rank.REJOIN_EVERY)  # not acknowledged: sent again
    assert sum(isinstance(m, protocol.Rejoin) for m in sent) == 2
    sh.received(protocol.Rejoined(generation=4), 6.5)
    assert sh.client.link.away_since is None and sh.client.link.epoch == 1
    sh.tick(7.5 + rank.REJOIN_EVERY)
    assert sum(isinstance(m, protocol.Rejoin) for m in sent) == 2  # acknowledged


def test_the_transports_failure_decides_what_it_says():
    t = _Transport(PeerTimeout("stalled", failed_ranks=[2], generation=4, rank=1))
    sh, sent = shell(t)
    sh.client.link.welcomed(4, ["m0", "m1", "m2"])
    (msg,) = restarted(sh, sent)
    assert msg.failed == [2]
    for failure, failed in (
        (PeerTimeout("earlier", failed_ranks=[0], generation=3, rank=1), []),  # another gen's
        (Evicted("out", failed_ranks=[1], rank=1), None),
        (CoordinatorLost("lost", rank=1), None),
    ):
        t = _Transport(failure)
        sh, sent = shell(t)
        sh.client.link.welcomed(4, ["m0", "m1", "m2"])
        got = restarted(sh, sent)
        assert (got[0].failed if got else None) == failed, failure
    sh, sent = shell(None)  # a joiner: its request is sent again instead
    assert restarted(sh, sent) == [] and sh.client.link.epoch == 1


def test_a_failure_set_by_someone_else_is_told_to_the_machine():
    """The transport raises for reasons the heartbeat side never saw (the op's own verdict):
    an eviction there makes a later eviction notice say nothing new."""
    t = _Transport()
    sh, _ = shell(t)
    sh.connection(True, 0.0)
    t.failure = Evicted("by the verdict", failed_ranks=[1], generation=4, rank=1)
    sh.received(protocol.Evicted(reason="stalled"), 0.1)
    assert t.raised == []


def test_a_ping_is_answered_with_the_progress_and_its_token():
    sh, sent = shell(_Transport())
    sh.received(protocol.Ping(token=7), 0.0)
    assert sent == [protocol.State(mid=MID, report=REP, token=7)]


def test_a_notice_makes_the_transport_raise_once():
    t = _Transport()
    sh, _ = shell(t)
    msg = protocol.Failure(generation=4, failed_ranks=[2], reason="died", op=None)
    sh.received(msg, 0.0)
    (err,) = t.raised
    assert type(err) is PeerFailure and err.failed_ranks == (2,) and "died" in str(err)
    sh.received(protocol.Failure(generation=4, failed_ranks=[0], reason="x", op=3), 0.1)
    assert type(t.raised[-1]) is PeerTimeout  # as the rank whose deadline fired raises
    sh.received(protocol.Failure(generation=3, failed_ranks=[0], reason="x", op=None), 0.2)
    assert len(t.raised) == 2  # another generation's
    sh.received(protocol.Evicted(reason="stalled"), 0.3)
    assert isinstance(t.raised[-1], Evicted) and t.raised[-1].failed_ranks == (1,)
    sh.received(protocol.Evicted(reason="again"), 0.4)
    assert len(t.raised) == 3  # said once
    joiner, _ = shell(None)
    joiner.received(msg, 0.0)  # no group to interrupt, nothing raised


def test_the_notice_rule_is_the_rank_machines(monkeypatch):
    """The heartbeat thread raises what the rank machine's rule (rank.notice_fault, the one the
    simulator runs) says a notice means: one rule, not a copy of it."""
    said = rank.Fault("PeerTimeout", "as the machine says", (0,), 4, 1, graceful=True)
    monkeypatch.setattr(rank, "notice_fault", lambda msg, group: said)
    t = _Transport()
    sh, _ = shell(t)
    sh.received(protocol.Failure(generation=9, failed_ranks=[], reason="", op=None), 0.0)
    (err,) = t.raised
    assert type(err) is PeerTimeout and str(err).startswith("as the machine says")
    assert err.failed_ranks == (0,) and err.graceful and err.peer == 0


def test_a_proposal_goes_to_the_book_and_its_answer_through_the_machine():
    t = _Transport()
    sh, sent = shell(t)
    sh.received(protocol.Schedule(generation=4, version=2, start=30, plan=None), 0.0)
    assert sent == [protocol.SchedAck(mid=MID, generation=4, version=2, ok=True)]
    assert t.book.state().pending_version == 2
    sh.received(protocol.SchedGo(generation=4, version=2), 0.1)
    assert t.book.state().current_version == 2 and len(sent) == 1  # a go: no answer
    sh.received(protocol.Schedule(generation=3, version=3, start=40, plan=None), 0.2)
    assert len(sent) == 1  # another generation's: no answer


def test_a_link_test_hands_this_ranks_frames_to_the_transport():
    t = _Transport()
    sh, sent = shell(t)
    links = [(1, 0), (2, 0), (0, 1)]  # rank 1 sends on 1->0 only
    sh.received(protocol.TestLinks(generation=4, token=3, links=links, bytes=1024, frames=4), 0.0)
    assert t.tests == [linktest.TestFrame(0, 1024, 3, 4)] and sent == []
    sh.received(protocol.TestLinks(generation=3, token=4, links=links, bytes=1024), 0.1)
    assert len(t.tests) == 1  # another generation's


def test_the_coordinator_away_past_the_grace_is_lost():
    t = _Transport()
    sh, _ = shell(t)
    sh.connection(True, 0.0)
    sh.connection(False, 1.0)
    sh.tick(10.9)
    assert t.raised == []  # within the grace (10 s)
    assert sh.machine.due() <= 11.0 + 1e-5  # the grace's end wakes the thread
    sh.tick(11.01)
    (err,) = t.raised
    assert isinstance(err, CoordinatorLost) and "rank 1" in str(err)
    assert err.generation == 4 and "longer than the grace" in str(err)


def test_an_op_waiting_on_an_undecided_proposal_ends_with_the_groups_failure():
    """The book is the group's, not the transport's: the heartbeat's Interrupt fails both, so
    an op waiting for a decision raises the failure at once, not at its deadline."""
    t = _Transport()
    sh, _ = shell(t)
    sh.received(protocol.Schedule(generation=4, version=2, start=30, plan=None), 0.0)
    got: list = []
    waiter = threading.Thread(
        target=lambda: got.append(_raised(lambda: t.book.for_op(30, time.monotonic() + 60))),
        daemon=True,
    )
    waiter.start()
    sh.received(protocol.Failure(generation=4, failed_ranks=[2], reason="died", op=None), 0.1)
    waiter.join(timeout=scaled(2))
    assert not waiter.is_alive(), "the op still waits for the decision"
    (err,) = got
    assert type(err) is PeerFailure and err is t.raised[-1]


def _raised(fn):
    try:
        fn()
    except Exception as exc:  # what the waiting op raises
        return exc
    return None
