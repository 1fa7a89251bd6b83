"""The slow links' handling: the coordinator's fail-slow side as a handler table, and a
member's two hooks.

Coordinator: every fail-slow event reaches one handler of `HANDLERS` (`feed`), a transition
of the state machine (machine.py) over its State, an Outbox and the time, as the machine's
own HANDLERS serve the arrivals. The effects are the machine's own and nothing else: a message
to every live member's heartbeat (`Outbox.send`), a note (`Outbox.note`), a rank removed
(changes.declare). What the handlers act on is one Reroute per generation (reroute.py, held
in state.FailSlow; it reaches the members through `Roster`), whose judgements are data: the
links flagged and their figures (failslow.py), the NICs behind (slownic.py).

  event (where the machine feeds it)      handler        effects
  LinkRows   a beat's link figures        on_link_rows   none: the figures, for the next
             (machine.on_beat)                           judgement (a new generation's first:
                                                         its Reroute, inheriting the last one's)
  SchedAck   a member's answer            on_sched_ack   none: the proposal's answers
             (machine.on_failslow)
  BookBack   a re-registration with a     on_book_back   Send(SchedGo | SchedDrop): a decision
             schedule book (recovery.py)                 it missed; after a restart, kept
  AllBack    every member back after a    on_all_back    Send(SchedGo | SchedDrop) to all: the
             restart (a Tick: `tick`)                    old proposals decided; Note
  Judge      the judgement due, every     on_judge       Send(Schedule | SchedGo | SchedDrop |
             EVAL_EVERY s (a Tick: `tick`)               TestLinks) to all; Note; declare (a slow
                                                         NIC's rank, under replace or shrink)

A member gone has no handler here: a proposal it does not answer is dropped after ACK_WAIT,
and its links leave with it when the next generation's Reroute is made (on_link_rows,
Reroute.handover).

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
              (on_book_back; decided by on_all_back once every member is back)
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Union

from ..algorithms.schedule import Plan
from ..transport.base import Transport
from ..transport.linkstats import LinkCounters
from ..transport.linktest import LinkTests, TestFrame
from ..group.schedbook import BookState, ScheduleBook
from .protocol import Beat as BeatMsg
from .protocol import FailSlowStatus, LinkRow, SchedAck, SchedDrop, SchedGo, Schedule, TestLinks
from .changes import declare
from .rank import SchedAnswer
from .reroute import Carried, Reroute, orphans, to_all
from .state import Ident, Mid, Outbox, State

log = logging.getLogger("collectives")
EVAL_EVERY = 0.2  # s between two judgements: the coordinator's loop ticks every few ms


# --- the events ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LinkRows:
    """Member `rank`'s beat carried its inbound links' figures (`beat.links`)."""

    rank: int
    beat: BeatMsg


@dataclass(frozen=True)
class BookBack:
    """Member `mid` re-registered (protocol.Rejoin) holding a schedule book (`sched`, as the
    wire carries it); `restarted`: with a coordinator that restarted, not a connection back."""

    mid: Mid
    sched: list[int]
    restarted: bool


@dataclass(frozen=True)
class AllBack:
    """Every member is back after a restart, and some reported a schedule book."""


@dataclass(frozen=True)
class Judge:
    """The links' judgement is due (every EVAL_EVERY s); `spares`: the joiners waiting, each
    admitted at the next regroup."""

    spares: int


Event = Union[LinkRows, SchedAck, BookBack, AllBack, Judge]
# A fail-slow transition: (state, outbox, the event, now). HANDLERS keys each by its event.
Handler = Callable[[State, Outbox, Any, float], None]


@dataclass(frozen=True)
class Roster:
    """The members a Reroute reaches (reroute.Members), over the machine's State, for the
    event whose effects go into `out`."""

    s: State
    out: Outbox

    def heartbeats(self) -> list[Ident]:
        s = self.s
        return [beat.ident for m in s.live() if (beat := s.beats.get(m)) is not None]

    def size(self) -> int:
        return len(self.s.members or ())

    def remove(self, rank: int, reason: str) -> None:
        declare(self.s, self.out, [(self.s.members or [])[rank]], reason)


# --- the handlers --------------------------------------------------------------------------------
def _for(s: State) -> Reroute:
    """The current generation's Reroute (a new one when the generation or its size moved),
    inheriting what the one before learnt (Reroute.handover): its slow links, renumbered
    through the member ids of both rosters, are not learnt again after every regroup."""
    members = list(s.members or ())
    r = s.failslow.reroute
    if r is None or r.generation != s.generation or r.size != len(members):
        fs = s.failslow
        carried = None
        if r is not None:
            ranks = renumbering(fs.roster, members)
            carried = r.handover(ranks)
            fs.by_host.remember(r.leaving(ranks), fs.roster, fs.hosts)
        # a new member on the host of one that left: that one's slow links (hostlinks.py)
        adopted = fs.by_host.adopt(members, fs.hosts, set(fs.roster))
        if adopted:
            base = carried if carried is not None else Carried()
            carried = dataclasses.replace(base, links=base.links + tuple(adopted))
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


def on_link_rows(s: State, out: Outbox, ev: LinkRows, now: float) -> None:
    """A member's beat with link figures: kept for the next judgement (the generation's
    Reroute made at its first)."""
    msg = ev.beat
    if msg.report.generation != s.generation or len(s.members or ()) < 2:
        return
    rows = [c for c in map(LinkCounters.from_wire, msg.links) if c is not None]  # its checks
    _for(s).beat(ev.rank, msg.report.seq, rows, now)


def on_sched_ack(s: State, out: Outbox, msg: SchedAck, now: float) -> None:
    """`sched_ack {mid, generation, version, ok}`: a member's answer to a proposed schedule,
    counted for the decision (on_judge)."""
    r = s.failslow.reroute
    rank = s.rank_of(msg.mid)
    if rank is not None and r is not None and r.generation == s.generation == msg.generation:
        r.ack(rank, msg.version, msg.ok)


def on_book_back(s: State, out: Outbox, ev: BookBack, now: float) -> None:
    """A member's schedule book, as it re-registers. With this coordinator restarted: kept,
    to decide its predecessor's proposals once every member is back (on_all_back). Else its
    connection came back: a decision on the proposal it holds, sent while it was down, is
    sent again."""
    book = BookState.from_wire(list(ev.sched))
    if book is None:
        return
    if ev.restarted:
        s.failslow.books[ev.mid] = book
        return
    r = s.failslow.reroute
    beat = s.beats.get(ev.mid)
    if r is None or r.generation != s.generation or beat is None or book.pending_version < 0:
        return
    go = r.decided(book.pending_version)
    if go is not None:
        decision = SchedGo if go else SchedDrop
        out.send(beat.ident, decision(generation=s.generation, version=book.pending_version))


def on_all_back(s: State, out: Outbox, ev: AllBack, now: float) -> None:
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
        to_all(out, Roster(s, out), decision(generation=s.generation, version=o.version))
        out.note(
            f"generation {s.generation}: the schedule proposed before the restart from op "
            f"#{o.start} "
            + ("holds: a member had applied it" if o.go else "is dropped: nobody applied it"),
            warn=True,
        )


def on_judge(s: State, out: Outbox, ev: Judge, now: float) -> None:
    """The judgement due: the generation's Reroute judges the links and says what it does --
    a message to every live member's heartbeat connection, a note, a rank removed (replaced
    by a waiting spare, or under shrink by none) -- in the machine's effects. Only the
    current generation's: an older one's ranks name other members in the new roster (its
    rank 2 may be a healthy member now), and its messages carry a generation the members
    ignore. The new generation's Reroute is made at its first beat with figures (_for)
    and inherits what the old one learnt."""
    r = s.failslow.reroute
    if r is not None and r.generation == s.generation and r.size == len(s.members or ()):
        s.failslow.judged = now
        r.tick(out, Roster(s, out), now, ev.spares)


HANDLERS: dict[type, Handler] = {
    LinkRows: on_link_rows,
    SchedAck: on_sched_ack,
    BookBack: on_book_back,
    AllBack: on_all_back,
    Judge: on_judge,
}


def feed(s: State, out: Outbox, event: Event, now: float) -> None:
    """Apply one fail-slow event: its handler (HANDLERS) writes its effects into `out`."""
    HANDLERS[type(event)](s, out, event, now)


def tick(s: State, out: Outbox, now: float) -> None:
    """The machine's Tick (its PERIODIC work): the fail-slow events it makes due. After a
    restart, none until every member is back; then the old proposals decided (AllBack); the
    links judged every EVAL_EVERY s (Judge)."""
    fs = s.failslow
    if s.recovering is not None:
        return
    if fs.books:
        feed(s, out, AllBack(), now)
    if fs.reroute is not None and (fs.judged is None or now - fs.judged >= EVAL_EVERY):
        feed(s, out, Judge(len(s.joiners)), now)  # every joiner is admitted at the next regroup


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
    "AllBack",
    "BookBack",
    "HANDLERS",
    "Judge",
    "LinkRows",
    "Roster",
    "beat_links",
    "feed",
    "on_all_back",
    "on_book_back",
    "on_judge",
    "on_link_rows",
    "on_notice",
    "on_sched_ack",
    "on_test",
    "status",
    "tick",
]
