"""The coordinator dying between a proposed schedule and its decision (group/schedbook.py
states the rule): a restarted coordinator decides every proposal the members hold undecided
from all of their books, once every member is back -- go where one applied it, else drop --
and numbers its own proposals past the old ones; a coordinator whose member's connection came
back sends that member the decision it missed. Every member then runs the proposal's start
op on one plan."""

from __future__ import annotations

import msgpack

from collectives.membership.protocol import SchedDrop, SchedGo, decode_reply
from collectives.membership.protocol import pack as pack_reply
from support.machine import wire

import pytest

from collectives.membership.reroute import Orphan, orphans
from collectives.group.schedbook import BookState, ScheduleBook
from support.ports import HOST

M = ["a" * 32, "b" * 32, "c" * 32, "d" * 32]


def wire_pack(msg: dict) -> bytes:
    """A request as the test writes it (progress fields flat), packed as it goes on the wire."""
    return msgpack.packb(wire(msg))


def as_wire(msg: object) -> dict:
    """A typed reply as it goes on the wire."""
    return msgpack.unpackb(pack_reply(msg))


def test_orphans_go_only_where_a_member_applied_the_proposal():
    held, applied, none = BookState(3, 20), BookState(-1, -1, 3, 20), BookState()
    # the old coordinator's go reached one member before it died: everyone applies it
    assert orphans([held, applied, held, held]) == [Orphan(3, 20, True)]
    # no go reached anyone (or it was a drop, or a member refused: it holds nothing)
    assert orphans([held, held, none, held]) == [Orphan(3, 20, False)]
    assert orphans([held, BookState(-1, -1, 2, 10), held, held]) == [Orphan(3, 20, False)]
    assert orphans([none, BookState(-1, -1, 2, 10)]) == []
    # one version from two starts is no proposal of one coordinator: dropped
    assert orphans([held, BookState(3, 25), BookState(-1, -1, 3, 20)]) == [Orphan(3, 20, False)]


def _rejoin(i, sched):
    return {
        "t": "rejoin",
        "mid": M[i],
        "rank": i,
        "world_size": 4,
        "generation": 0,
        "members": M,
        "failed": [],
        "forming": -1,
        "seq": 19,
        "in_op": True,
        "waiting_on": None,
        "sent": None,
        "recv": None,
        "sched": list(sched),
    }


def _restarted(books):
    """A fresh coordinator (a restart) that the four members re-register with; what it sent
    each of them, by ident, once every member was back and it ticked."""
    from collectives.membership.server import Coordinator

    c = Coordinator(HOST, 0, 4, heartbeat_interval=0.05, heartbeat_timeout=5.0, keys=None)
    sent = []
    c._send = lambda ident, msg: sent.append((ident, as_wire(msg)))
    try:
        for i, book in enumerate(books[:3]):
            c.handle([b"h%d" % i, wire_pack(_rejoin(i, book))])
        c.tick()
        early = [m for _, m in sent if m["t"] in ("sched_go", "sched_drop")]
        assert early == [], "decided before every member was back"
        c.handle([b"h3", wire_pack(_rejoin(3, books[3]))])
        c.tick()
        notes = [what for _, what in c.events]
        return c.state.failslow.version_floor, sent, notes
    finally:
        c.stop()


@pytest.mark.fast
@pytest.mark.timeout(20)
def test_a_restarted_coordinator_applies_a_proposal_one_member_applied():
    held, applied = BookState(3, 20), BookState(-1, -1, 3, 20)
    floor, sent, notes = _restarted([held, applied, held, held])
    got = {ident: m for ident, m in sent if m["t"].startswith("sched_")}
    assert got == {
        b"h%d" % i: {"t": "sched_go", "generation": 0, "version": 3} for i in range(4)
    }, sent
    assert floor == 3  # its own proposals are numbered 4 and on
    assert any("from op #20 holds" in n for n in notes), notes


@pytest.mark.fast
@pytest.mark.timeout(20)
def test_a_restarted_coordinator_drops_a_proposal_nobody_applied():
    held = BookState(3, 20)
    floor, sent, notes = _restarted([held, held, BookState(-1, -1, 2, 10), held])
    got = {ident: m for ident, m in sent if m["t"].startswith("sched_")}
    assert got == {
        b"h%d" % i: {"t": "sched_drop", "generation": 0, "version": 3} for i in range(4)
    }, sent
    assert any("from op #20 is dropped" in n for n in notes), notes


class Member:
    """What a member's heartbeat thread hands the coordinator's notices to (slowlinks.on_notice
    reads these of its transport): its generation, size, rank and schedule book."""

    def __init__(self, rank: int):
        self.rank, self.size, self.generation = rank, 4, 0
        self.schedules = ScheduleBook(0)


@pytest.mark.fast
@pytest.mark.timeout(20)
@pytest.mark.parametrize("reached", [[1], []])
def test_every_member_runs_the_start_op_on_one_plan_after_the_decision(reached):
    """Four members accepted proposal 3 from op 20; the old coordinator's go reached the
    members `reached` before it died. Their books go to a restarted coordinator with their
    re-registrations; what it sends each member is handed to that member's book as the
    member's heartbeat thread does (slowlinks.on_notice): then every book gives op 20 one
    plan, the proposal's where a member had applied it, else the default."""
    import time

    from collectives.membership import slowlinks

    members = [Member(r) for r in range(4)]
    for m in members:
        assert m.schedules.propose(3, 20, "AROUND")
    for r in reached:
        members[r].schedules.decide(3, True)
    _, sent, _ = _restarted([m.schedules.state() for m in members])
    decisions = [(ident, m) for ident, m in sent if m["t"] in ("sched_go", "sched_drop")]
    assert {ident for ident, _ in decisions} == {b"h%d" % i for i in range(4)}, sent
    for ident, wired in decisions:  # read as a member's heartbeat thread reads it
        msg = decode_reply(msgpack.packb(wired))
        assert isinstance(msg, (SchedGo, SchedDrop))
        member = members[int(ident[1:])]
        slowlinks.on_notice(member, member.schedules, msg)
    plans = {m.schedules.for_op(20, time.monotonic() + 1) for m in members}
    assert plans == ({"AROUND"} if reached else {None}), plans


def test_a_member_whose_connection_came_back_is_sent_the_decision_it_missed():
    """A coordinator that never died decided proposal 1 (go) while member 2's connection was
    down (a ROUTER socket drops what it cannot deliver): member 2's re-registration, holding
    proposal 1 undecided, is answered with the decision again; one holding nothing, or a
    proposal not decided yet, gets nothing."""
    from collectives.membership import slowlinks
    from collectives.membership.reroute import Reroute
    from collectives.membership.state import Beat, Outbox, State

    s = State(world_size=4, heartbeat_timeout=5.0, diagnose_window=1.0, members=list(M))
    s.beats = {m: Beat(b"h%d" % i, 0.0) for i, m in enumerate(M)}
    r = s.failslow.reroute = Reroute(4, 0)
    r.decisions[1] = True
    out = Outbox()
    slowlinks.feed(s, out, slowlinks.BookBack(M[2], BookState(1, 20).wire(), False), 0.0)
    assert [(e.to, as_wire(e.msg)) for e in out.sent()] == [
        (b"h2", {"t": "sched_go", "generation": 0, "version": 1})
    ]
    for book in (BookState(), BookState(2, 30)):
        out = Outbox()
        slowlinks.feed(s, out, slowlinks.BookBack(M[1], book.wire(), False), 0.0)
        assert out.sent() == []


@pytest.mark.fast
@pytest.mark.timeout(20)
def test_a_restarted_coordinator_agrees_the_schedule_again_where_a_plan_ran():
    """The members ran a plan of the old coordinator's (book: version 2 applied from op 10);
    the restarted one never made it, so nothing would ever retry or clear it. Once every
    member is back and beats, it proposes the schedule it wants (the default: nothing is
    flagged here) from a fresh op, numbered past version 2, and says so once decided."""
    from collectives.membership import slowlinks
    from collectives.membership.state import Beat, Outbox, State
    from support.reroute import notes, tick, told

    s = State(world_size=4, heartbeat_timeout=5.0, diagnose_window=1.0, members=list(M))
    s.beats = {m: Beat(b"h%d" % i, 0.0) for i, m in enumerate(M)}
    s.failslow.books = {m: BookState(-1, -1, 2, 10) for m in M}
    out = Outbox()
    slowlinks.feed(s, out, slowlinks.AllBack(), 0.0)
    assert out.sent() == []  # nothing undecided to decide
    r = slowlinks._for(s)
    assert r.unsure and r.version == 2
    for rank in range(4):
        r.seqs[rank] = 30
    proposed = told(tick(r, 1.0), "schedule")
    assert len(proposed) == 1 and proposed[0].plan is None, proposed
    assert proposed[0].version == 3 and proposed[0].start > 30
    for rank in range(4):
        r.ack(rank, 3, True)
    said = notes(tick(r, 1.5))
    assert any("back to the default schedule" in n for n in said), said
    assert not r.unsure
    assert not told(tick(r, 2.0), "schedule")


def test_a_coordinator_that_made_every_plan_proposes_nothing_unasked():
    from collectives.membership.reroute import Reroute
    from support.reroute import tick, told

    r = Reroute(4, 0)
    r.seqs = [30] * 4
    assert not told(tick(r, 1.0), "schedule")
