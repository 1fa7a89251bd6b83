"""The shells around fail-slow handling: the coordinator's part, and a member's two hooks.

Coordinator: transitions of the state machine (machine.py), functions over its State (the
Reroute of reroute.py, one per generation, held in state.FailSlow), an Outbox and the time:
fed from the beats and the members' answers, judged with the machine's Tick; what the
Reroute returns becomes effects -- a message to every member, a note, a rank declared
removed (where a spare takes its place, or under shrink where none does) -- and nothing here
does I/O.

Member: beat_links(t) is the link summary (transport/linkstats.py) a heartbeat carries;
on_notice(t, book, msg) hands a proposal or a decision to the group's schedule book
(group/schedbook.py: membership/lifecycle.py hands it to the heartbeat with the transport) and
returns the book's answer to a proposal (the rank machine sends it: rank.SchedAnswer);
on_test(t, msg) hands a link test's frames to the op thread (transport/linktest.py; the rank
machine's ToTests).

Messages (membership/protocol.py lists the rest):
  beat        {..., links: [[src, large_bytes, large_s, small_frames, small_s, late_s,
                           queued_frames, queued_s, tested_frames, tested_best_s], ...]}
  schedule    {generation, version, start, plan}  coordinator -> every member's heartbeat
  sched_ack   {mid, generation, version, ok}      member -> coordinator
  test_links  {generation, token, links, bytes, frames}  coordinator -> every member's
                                                  heartbeat (each link's sender posts a test
                                                  frame at each of its next `frames` ops)
  sched_go / sched_drop {generation, version}     coordinator -> every member
  rejoin      {..., sched: [pending version, pending start, current version, current start]}
              a member's schedule book, re-registering with a restarted coordinator
              (on_rejoin; decided by `resolve` once every member is back)
"""

from __future__ import annotations

import logging
from typing import Protocol

from ..algorithms.schedule import Plan
from ..transport.base import Transport
from ..transport.linkstats import LinkCounters
from ..transport.linktest import LinkTests, TestFrame
from ..group.schedbook import BookState, ScheduleBook
from .changes import declare
from .protocol import Beat as BeatMsg
from .protocol import FailSlowStatus, LinkRow, SchedAck, SchedDrop, SchedGo, Schedule, TestLinks
from .rank import SchedAnswer
from .reroute import Note as RerouteNote
from .reroute import Replace, Reroute, Shrink, ToAll, orphans
from .state import Ident, Mid, Outbox, State

log = logging.getLogger("collectives")
EVAL_EVERY = 0.2  # s between two judgements: the coordinator's loop ticks every few ms


def _for(s: State) -> Reroute:
    """The current generation's Reroute (a new one when the generation or its size moved),
    inheriting what the one before learnt (Reroute.handover): its slow links, renumbered
    through the member ids of both rosters, are not learnt again after every regroup."""
    members = list(s.members or ())
    r = s.failslow.reroute
    if r is None or r.generation != s.generation or r.size != len(members):
        fs = s.failslow
        carried = None if r is None else r.handover(renumbering(fs.roster, members))
        r = fs.reroute = Reroute(
            len(members),
            s.generation,
            fs.policy,
            version=fs.version_floor,
            unsure=fs.inherited,
            min_world=fs.min_world,
            spare_wait=fs.spare_wait,
            carried=carried,
        )
        fs.roster = members
        fs.inherited = False
    return r


def renumbering(before: list[Mid], after: list[Mid]) -> dict[int, int]:
    """Each rank of roster `before` whose member is in `after` -> its rank there."""
    rank = {m: i for i, m in enumerate(after)}
    return {i: rank[m] for i, m in enumerate(before) if m in rank}


def on_beat(s: State, rank: int, msg: BeatMsg, now: float) -> None:
    """A member's beat with link figures: fed to the detector."""
    if msg.report.generation != s.generation or len(s.members or ()) < 2:
        return
    rows = [c for c in map(LinkCounters.from_wire, msg.links) if c is not None]  # its checks
    _for(s).beat(rank, msg.report.seq, rows, now)


def on_sched_ack(s: State, out: Outbox, ident: Ident, msg: SchedAck, now: float) -> None:
    """`sched_ack {mid, generation, version, ok}`: a member's answer to a proposed schedule."""
    r = s.failslow.reroute
    rank = s.rank_of(msg.mid)
    if rank is not None and r is not None and r.generation == s.generation == msg.generation:
        r.ack(rank, msg.version, msg.ok)


def on_rejoin(s: State, out: Outbox, mid: Mid, sched: list[int], restarted: bool) -> None:
    """A member's schedule book, as it re-registers. With this coordinator restarted: kept,
    to decide its predecessor's proposals once every member is back (resolve). Else its
    connection came back: a decision on the proposal it holds, sent while it was down, is
    sent again."""
    book = BookState.from_wire(list(sched))
    if book is None:
        return
    if restarted:
        s.failslow.books[mid] = book
        return
    r = s.failslow.reroute
    beat = s.beats.get(mid)
    if r is None or r.generation != s.generation or beat is None or book.pending_version < 0:
        return
    go = r.decided(book.pending_version)
    if go is not None:
        decision = SchedGo if go else SchedDrop
        out.send(beat.ident, decision(generation=s.generation, version=book.pending_version))


def resolve(s: State, out: Outbox) -> None:
    """Once every member is back after a restart: every proposal of the old coordinator that
    a member holds undecided is decided (reroute.orphans), and this coordinator's proposals
    are numbered past every version reported."""
    fs = s.failslow
    live = s.live()
    books = [b for m, b in fs.books.items() if m in live]
    fs.books = {}
    for b in books:
        fs.version_floor = max(fs.version_floor, b.pending_version, b.current_version)
    # a member that applied one of the predecessor's proposals may run a plan this
    # coordinator never made: the next proposal (the default, where nothing is flagged)
    # says which schedule every rank runs
    inherited = any(b.current_version >= 0 or b.pending_version >= 0 for b in books)
    if fs.reroute is not None:
        fs.reroute.version = max(fs.reroute.version, fs.version_floor)
        fs.reroute.unsure = fs.reroute.unsure or inherited
    else:
        fs.inherited = inherited
    for o in orphans(books):
        decision = SchedGo if o.go else SchedDrop
        _to_all(s, out, decision(generation=s.generation, version=o.version))
        out.note(
            f"generation {s.generation}: the schedule proposed before the restart from op "
            f"#{o.start} "
            + ("holds: a member had applied it" if o.go else "is dropped: nobody applied it"),
            warn=True,
        )


def _to_all(s: State, out: Outbox, msg: SchedGo | SchedDrop | Schedule | TestLinks) -> None:
    for m in s.live():
        beat = s.beats.get(m)
        if beat is not None:
            out.send(beat.ident, msg)


def tick(s: State, out: Outbox, now: float) -> None:
    """Judge the links every EVAL_EVERY s, and carry out what the Reroute says: a message to
    every live member's heartbeat connection, a note, a rank replaced by a waiting spare.
    After a restart, nothing until every member is back; then the old proposals decided."""
    fs = s.failslow
    if s.recovering is not None:
        return
    if fs.books:
        resolve(s, out)
    r = fs.reroute
    if r is None or (fs.judged is not None and now - fs.judged < EVAL_EVERY):
        return
    fs.judged = now
    for e in r.tick(now, len(s.joiners)):  # every joiner is admitted at the next regroup
        if isinstance(e, ToAll):
            _to_all(s, out, e.msg)
        elif isinstance(e, RerouteNote):
            out.note(e.text, warn=True)
        elif isinstance(e, Replace) and s.members and 0 <= e.rank < len(s.members):
            out.note(f"replacing rank {e.rank}: {e.reason}", warn=True)
            declare(s, out, [s.members[e.rank]], e.reason)
        elif isinstance(e, Shrink) and s.members and 0 <= e.rank < len(s.members):
            out.note(f"removing rank {e.rank}: {e.reason}", warn=True)
            declare(s, out, [s.members[e.rank]], e.reason)


def status(s: State) -> FailSlowStatus | None:
    """What the status answer shows of the slow links (None: nothing judged yet)."""
    r = s.failslow.reroute
    return None if r is None else r.status()


# --- a member's side -----------------------------------------------------------------------------
def beat_links(t: Transport | None) -> list[LinkRow]:
    """What a heartbeat adds: this rank's inbound links, cumulative. Never raises: the beat
    matters more than its figures."""
    if t is None:
        return []
    try:
        return [row.wire() for row in t.linkstats.summary()]
    except Exception as exc:  # a bug here must not cost this rank its heartbeat
        log.debug("rank %s: no link figures for the heartbeat: %r", t.rank, exc)
        return []


class Member(Protocol):
    """What a member's hooks read of its group's transport (transport/base.py, Transport; the
    simulator's stand-in, collectives/simulation/world.py)."""

    @property
    def generation(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def linktests(self) -> LinkTests: ...


def on_notice(
    t: Member | None, book: ScheduleBook | None, msg: Schedule | SchedGo | SchedDrop
) -> SchedAnswer | None:
    """A proposal or decision from the coordinator, handed to the group's schedule book (the
    rank machine's ToBook); the book's answer to a proposal, which the machine sends
    (SchedAnswer -> SchedAck). `t` gives the group's size (to read a plan) and rank."""
    if t is None or book is None or not msg.generation == t.generation == book.generation:
        return None
    if isinstance(msg, Schedule):
        plan = None if msg.plan is None else Plan.from_wire(msg.plan, t.size)
        ok = msg.plan is None or plan is not None
        ok = ok and book.propose(msg.version, msg.start, plan)
        if ok:
            log.info(
                "rank %d: schedule %d from op #%d: %s",
                t.rank,
                msg.version,
                msg.start,
                "the default" if plan is None else plan.describe(),
            )
        return SchedAnswer(t.generation, msg.version, ok)
    book.decide(msg.version, isinstance(msg, SchedGo))
    return None


def on_test(t: Member | None, msg: TestLinks) -> None:
    """A test of links routed around: this rank's frames (it sends on those links), for the op
    thread to post at its next op."""
    if t is None or msg.generation != t.generation:
        return
    mine = [
        TestFrame(dst, msg.bytes, msg.token, msg.frames) for src, dst in msg.links if src == t.rank
    ]
    if mine:
        t.linktests.ask(mine)


__all__ = [
    "beat_links",
    "on_beat",
    "on_notice",
    "on_test",
    "on_rejoin",
    "on_sched_ack",
    "resolve",
    "status",
    "tick",
]
