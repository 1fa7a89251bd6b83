"""The per-link estimate (transport/linkstats.py) and the schedule book (schedbook.py).

Invariants: a frame's transit starts when it was posted or when its predecessor on the same
link arrived, whichever is later, so a late sender (a compute straggler) and a queue behind
a predecessor are not charged to the link; the book gives every op the plan decided for it,
and an op at a proposal's start waits for the decision."""

import threading
import time

import pytest

from collectives.common.errors import CollectiveTimeout
from collectives.transport.linkstats import LARGE_BYTES, LinkCounters, LinkStats
from collectives.group.schedbook import ScheduleBook

MB = 1 << 20


def test_transit_is_charged_from_the_later_of_post_and_predecessor():
    s = LinkStats(3)
    # two 1 MiB frames posted together at t=10; the link takes 0.5 s each
    s.arrived(1, MB, 10.0, 10.5, 10.0)
    s.arrived(1, MB, 10.0, 11.0, 10.0)
    (row,) = s.summary()
    assert row.src == 1 and row.large_bytes == 2 * MB
    assert row.large_seconds == pytest.approx(1.0)  # not 0.5 + 1.0


def test_a_late_sender_is_not_a_slow_link():
    s = LinkStats(2)
    # the receiver waited from t=0; the sender posted only at t=2 (it was computing); the
    # frame arrived 1 ms later
    s.arrived(1, MB, 2.0, 2.001, 0.0)
    (row,) = s.summary()
    assert row.large_seconds == pytest.approx(0.001)
    assert row.late_seconds == pytest.approx(2.0)


def test_a_frame_found_queued_is_not_measured():
    s = LinkStats(2)
    # the receiver was busy (a straggler computing) for 2 s: the frame waited in its queue
    s.arrived(1, MB, 10.0, 12.0, 12.0, seen_arriving=False)
    s.arrived(1, MB, 12.0, 12.01, 12.0)  # the next one came in while it waited
    (row,) = s.summary()
    assert row.large_bytes == MB and row.large_seconds == pytest.approx(0.01)


def test_a_small_frame_found_queued_counts_as_keeping_up_with_its_bound():
    """Small ops' frames on a healthy link are nearly all found queued: each is counted as a
    frame that kept up, with the bound its finding gives, never as a timed one."""
    s = LinkStats(2)
    s.arrived(1, 100, 10.0, 10.004, 10.004, seen_arriving=False)  # found 4 ms after posting
    s.arrived(1, 100, 10.01, 10.012, 10.01)  # the next one came in while it waited
    s.arrived(1, MB, 10.02, 10.5, 10.5, seen_arriving=False)  # a large one: no latency bound
    (row,) = s.summary()
    assert (row.queued_frames, row.small_frames) == (1, 1)
    assert row.queued_seconds == pytest.approx(0.004)
    assert row.small_seconds == pytest.approx(0.002) and row.large_bytes == 0
    back = LinkCounters.from_wire(row.wire())
    assert back is not None and (back.queued_frames, back.queued_seconds) == (1, 0.004)


def test_a_test_frame_is_counted_apart_and_times_its_link():
    """A link routed around is tested (linktest.py): its test frames count in the tested
    counters only, never in the ops' figures, the next frame queues behind one, and the
    fastest of a test's frames is kept (a new test starts afresh)."""
    s = LinkStats(2)
    s.tested(1, 10.0, 10.21, 3)  # 1 MiB at 40 Mbit/s
    s.arrived(1, 100, 10.2, 10.212, 10.2)  # the commit message queued behind it
    s.tested(1, 11.0, 11.06, 3)  # a quicker one of the same test
    (row,) = s.summary()
    assert row.tested_frames == 2 and row.tested_best == pytest.approx(0.06)
    assert row.small_frames == 1 and row.small_seconds == pytest.approx(0.002)
    assert row.large_bytes == 0
    back = LinkCounters.from_wire(row.wire())
    assert back is not None and (back.tested_frames, back.tested_best) == (2, 0.06)
    s.tested(1, 12.0, 12.1, 4)  # the next test: its own frames only
    assert s.summary()[0].tested_best == pytest.approx(0.1)
    # a predecessor taken late (its receiver busy elsewhere) does not shorten a test frame's
    # transit: it counts from its posting
    s.arrived(1, 100, 12.2, 12.3, 12.3, seen_arriving=False)
    s.tested(1, 12.25, 12.31, 5)
    assert s.summary()[0].tested_best == pytest.approx(0.06)


def test_a_test_frame_crosses_an_op_timed_and_dropped():
    """A test frame posted as an op begins (linktest.py) reaches its receiver inside the op:
    timed in its tested counters, never taken for the op's data."""
    import threading

    import numpy as np

    from collectives.algorithms import ring
    import collectives as cl
    from collectives.transport.channel import OpChannel
    from collectives.transport.inproc import InprocWorld
    from collectives.transport.linktest import TestFrame

    world = InprocWorld(2)
    ts = [world.transport(r) for r in range(2)]
    ts[0].linktests.ask([TestFrame(1, 4096, 7)])
    errors = []

    def body(r):
        try:
            buf = np.full(16, r + 1, np.int64)
            desc = ["all_reduce", 16, "<i8", "sum", "ring", None]
            ch = OpChannel(ts[r], 0, desc, "all_reduce", 10.0).begin()
            ring.all_reduce(ch, buf, cl.ReduceOp.SUM)
            ch.finish()
            assert (buf == 3).all()
        except BaseException as exc:  # reported below, with the rank
            errors.append((r, exc))

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(20)
    assert not errors, errors
    rows = {row.src: row for row in ts[1].linkstats.summary()}
    assert rows[0].tested_frames == 1
    assert not ts[0].linkstats.summary() or ts[0].linkstats.summary()[0].tested_frames == 0


def test_small_frames_give_latency_and_bad_input_is_ignored():
    s = LinkStats(2)
    s.arrived(0, 100, 5.0, 5.002, 5.0)
    s.arrived(7, MB, 5.0, 6.0, 5.0)  # no such rank
    s.arrived(0, MB, 0.0, 6.0, 5.0)  # not stamped
    s.arrived(0, LARGE_BYTES, 7.0, 6.9, 7.0)  # sender's clock ahead: zero, never negative
    (row,) = s.summary()
    assert row.small_frames == 1 and row.small_seconds == pytest.approx(0.002)
    assert row.large_bytes == LARGE_BYTES and row.large_seconds == 0.0
    back = LinkCounters.from_wire(row.wire())
    assert back is not None and back.src == row.src and back.large_bytes == row.large_bytes
    assert back.small_seconds == pytest.approx(row.small_seconds, abs=1e-6)
    for bad in (
        None,
        [1, 2],
        [0, 1, 1.0, 1, 1.0, 0.0],  # a row without the queued frames
        [0, 1, 1.0, 1, 1.0, 0.0, 0, 0.0],  # a row without the test frames
        ["0", 1, 1.0, 1, 1.0, 0.0, 0, 0.0, 0, 0.0],
        [0, -1, 1.0, 1, 1.0, 0.0, 0, 0.0, 0, 0.0],
        [0, 1, 1.0, 1, 1.0, 0.0, 0, -1.0, 0, 0.0],
        [0, 1, 1.0, 1, 1.0, 0.0, 0, 0.0, 1, -1.0],
    ):
        assert LinkCounters.from_wire(bad) is None


def test_the_book_gives_each_op_its_plan():
    b = ScheduleBook(0)
    assert b.for_op(0, time.monotonic() + 1) is None
    assert b.propose(1, 3, "A")
    b.decide(1, True)
    assert [b.for_op(s, time.monotonic() + 1) for s in (1, 2, 3, 4)] == [None, None, "A", "A"]
    assert not b.propose(2, 4, "B")  # op 4 was asked for already: refused
    assert b.propose(3, 7, "C")
    b.decide(3, False)
    assert b.for_op(7, time.monotonic() + 1) == "A"


def test_an_op_at_the_start_waits_for_the_decision():
    b = ScheduleBook(0)
    assert b.propose(1, 2, "A")
    got = []
    op = threading.Thread(target=lambda: got.append(b.for_op(2, time.monotonic() + 10)))
    op.start()
    op.join(0.05)  # no decision yet: nothing may end its wait
    assert op.is_alive() and not got
    b.decide(1, True)
    op.join(5)
    assert got == ["A"]
    assert b.propose(2, 5, "B")
    with pytest.raises(CollectiveTimeout, match="no decision"):
        b.for_op(5, time.monotonic() + 0.05)


def test_the_ops_before_a_new_plans_start_keep_the_plan_before_it():
    b = ScheduleBook(0)
    assert b.propose(1, 2, "AROUND")
    b.decide(1, True)
    got = [b.for_op(s, time.monotonic() + 1) for s in range(1, 4)]
    assert b.propose(2, 6, None)  # back to the default from op 6
    b.decide(2, True)
    got += [b.for_op(s, time.monotonic() + 1) for s in range(4, 8)]
    assert got == [None, "AROUND", "AROUND", "AROUND", "AROUND", None, None]


def test_a_lost_coordinator_ends_the_wait_for_its_decision_at_once():
    """An op at the start of a proposal whose coordinator is gone for good: the transport's
    failure (CoordinatorLost, after the grace) ends its wait at once, not at its deadline."""
    from collectives.common.errors import CoordinatorLost

    b = ScheduleBook(0)
    assert b.propose(1, 2, "A")
    got = []

    def op():
        try:
            b.for_op(2, time.monotonic() + 60)
        except CoordinatorLost as exc:
            got.append((exc, time.monotonic()))

    t = threading.Thread(target=op)
    t.start()
    t.join(0.05)
    assert t.is_alive()
    lost = time.monotonic()
    b.interrupt(CoordinatorLost("rank 0: the coordinator is gone"))
    t.join(5)
    assert got and got[0][1] - lost < 2.0, got


def test_the_book_says_what_it_holds_for_a_restarted_coordinator():
    from collectives.group.schedbook import BookState

    b = ScheduleBook(0)
    assert b.state() == BookState(-1, -1, -1, -1)
    assert b.propose(4, 9, "A")
    assert b.state() == BookState(4, 9, -1, -1)
    b.decide(4, True)
    assert b.propose(5, 12, "B")
    assert b.state() == BookState(5, 12, 4, 9)
    assert BookState.from_wire(b.state().wire()) == b.state()
    for bad in (None, [1, 2, 3], [1, 2, 3, "4"], [1, 2, 3, -2]):
        assert BookState.from_wire(bad) is None


def test_a_test_sends_one_frame_an_op_for_as_many_ops_as_asked():
    """Test frames go one at each op's start (linktest.py): no op waits behind more than one
    on a slow link; a frame to itself or to no such rank is never sent."""
    from collectives.transport.linktest import LinkTests, TestFrame
    from collectives.transport.wire import LINK_TEST, decode_header

    class Posts:
        rank, size, generation = 0, 3, 5

        def __init__(self):
            self.sent = []

        def post(self, peer, header, payload, zero_copy):
            self.sent.append((peer, decode_header(header), len(payload)))

    t, tests = Posts(), LinkTests()
    tests.ask([TestFrame(1, 4096, 9, ops=3), TestFrame(0, 10, 9), TestFrame(7, 10, 9)])
    for _ in range(5):
        tests.post_due(t)
    assert [(p, n) for p, _, n in t.sent] == [(1, 4096)] * 3
    assert all(h.type == LINK_TEST and h.number == 9 and h.sent > 0 for _, h, _ in t.sent)
