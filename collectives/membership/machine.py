"""The membership state machine: typed events in, effects out, no I/O.

The coordinator (server.py) is a shell around one Machine: it receives and checks a message,
feeds it in as an `Arrived` event, and carries out the effects the machine returns (messages
to send, processes to watch, notes); it runs the timers (`Tick`) and the crash witnesses,
whose reports come in as `Died`. Everything the machine knows is its `state` (state.py, where
the invariants are written); every transition is one function, named in `HANDLERS` by the
request it serves or called from `feed` for the other events:

  join                    formation.on_join        generation 0's ranks
  join_request            regroup.on_join_request  a replacement waits
  reconstruct, address    regroup                  the next generation forms
  diagnose, probed        verdicts                 a stall's verdict
  outcome, progress       verdicts                 a half-finished op's outcome
  rejoin                  recovery.on_rejoin       a restarted coordinator rebuilds
  sched_ack               on_failslow              a member's answer to a schedule
  beat, state, leave,     here                     heartbeats, pings' answers, departures
  status
  Tick                    here: heartbeat clocks, then each part's periodic work (PERIODIC)
  Died                    here: a certain witness (a pidfd, a launcher) saw a process end
  Connection, PidWatch    connections.py: what the socket monitor saw; a connection that
                          stays closed is a death, judged on the machine's clock

The fail-slow side has a table of its own (slowlinks.HANDLERS), fed through slowlinks.feed:
a beat's link figures (on_beat), a `sched_ack` (on_failslow), a re-registration's schedule
book (recovery.on_rejoin), and at a Tick the judgement due (slowlinks.tick); its effects are
this machine's (a Send, a Note, declare).

New events and requests extend the same way: a record here, a line in HANDLERS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Union

from . import connections, formation, recovery, regroup, slowlinks, tables, verdicts
from .changes import declare, failure_notice
from .protocol import (
    Address,
    AnyRequest,
    Beat as BeatMsg,
    Bye,
    Diagnose,
    Evicted,
    Join,
    JoinRequest,
    Leave,
    Outcome,
    Probed,
    Progress,
    Reconstruct,
    Rejoin,
    SchedAck,
    State as StateMsg,
    Status,
    StatusAnswer,
)
from .state import Beat, Effect, Halt, Ident, Mid, Outbox, State


@dataclass(frozen=True)
class Arrived:
    """A request arrived from the client at routing id `ident`, checked field by field
    (protocol.decode_request) and bound to the member id its connection proved
    (protocol.speaks_for_itself)."""

    ident: Ident
    msg: AnyRequest


@dataclass(frozen=True)
class Tick:
    """The clock moved: the periodic work. `sweep`: the work that costs O(members) too --
    the heartbeat clocks, the tables' pruning -- which the shell does less often than it ticks
    (the shell does that less often than it ticks: server.HEARTBEAT_CHECK_EVERY)."""

    sweep: bool = True


@dataclass(frozen=True)
class Died:
    """A crash witness (liveness.py: a pidfd, a launcher's report, a closed connection) saw
    the process of member `mid` end."""

    mid: Mid
    why: str


@dataclass(frozen=True)
class Connection:
    """The shell's witness saw a connection of the coordinator's socket (liveness.py):
    `opened` (accepted, nobody's yet), `spoke` (a message came on it), `closed` (ident: the
    routing id of its last message). connections.py judges what a closed one means."""

    fd: int
    what: Literal["opened", "spoke", "closed"]
    ident: Ident | None = None


@dataclass(frozen=True)
class PidWatch:
    """The shell watches (on) or no longer watches member `mid`'s process through a pidfd."""

    mid: Mid
    on: bool


Event = Union[Arrived, Tick, Died, Connection, PidWatch]
# A request's transition: (state, outbox, where its answer goes, the request, now). Typed by
# the record it takes (protocol.py); HANDLERS keys each by the record's type.
Handler = Callable[[State, Outbox, Ident, Any, float], None]


def on_status(s: State, out: Outbox, ident: Ident, msg: Status, now: float) -> None:
    out.send(
        ident,
        StatusAnswer(
            missing=[r for r in range(s.world_size) if r not in s.joined],
            generation=s.generation,
            world_size=len(s.members or []),
            failslow=slowlinks.status(s),
        ),
    )


def on_beat(s: State, out: Outbox, ident: Ident, msg: BeatMsg | StateMsg, now: float) -> None:
    """`beat {mid, generation, seq, ...}`: a member's heartbeat, with its progress."""
    mid = msg.mid
    before = s.beats.get(mid)
    if (before is None or not before.ident) and s.failed and mid in s.live():
        # its first beat may come after a declaration that could not be sent to it (a death
        # within a few ms of generation 0 forming, before its connection was known)
        out.send(ident, failure_notice(s, list(s.failed), next(iter(s.failed.values()))))
    report = msg.report
    connections.beat(s, out, mid, ident, now)  # on a new connection: a closed one came back
    s.beats[mid] = Beat(ident, now, report)
    verdicts.learn(s, mid, report)  # of the ops whose outcome is asked
    if s.judgements.diagnoses:
        verdicts.ping_late(s, out, mid, ident, now)
    if (
        s.members is not None
        and s.rank_of(mid) is None
        and mid not in s.joiners
        and not s.forming_has(mid)
    ):
        out.send(ident, Evicted(reason=f"not a member of generation {s.generation}"))
    elif mid in s.failed:
        out.send(ident, Evicted(reason=s.failed[mid]))
    elif isinstance(msg, BeatMsg) and msg.links and (rank := s.rank_of(mid)) is not None:
        slowlinks.feed(s, out, slowlinks.LinkRows(rank, msg), now)  # for the judgement


def on_state(s: State, out: Outbox, ident: Ident, msg: StateMsg, now: float) -> None:
    """`state`: a member's answer to a ping; a beat, and a picture for the stalls."""
    on_beat(s, out, ident, msg, now)
    rank = s.rank_of(msg.mid)
    if rank is not None:
        verdicts.take_state(s, rank, msg.report, msg.token, now)


def on_leave(s: State, out: Outbox, ident: Ident, msg: Leave, now: float) -> None:
    """`leave {mid}`: preemption, a destroy, or a joiner that withdraws."""
    mid = msg.mid
    if mid in s.joiners:
        del s.joiners[mid]
        out.note(f"a waiting replacement worker withdrew (pid {msg.pid})")
    elif s.forming is not None and mid in s.forming.members and mid not in s.live():
        # an admitted joiner that gives up before the generation formed: the formation fails
        # now, not at a heartbeat timeout
        s.forming.gone[mid] = "left"
    else:
        declare(s, out, [mid], "left the group", graceful=True)
    out.send(ident, Bye())


def on_failslow(s: State, out: Outbox, ident: Ident, msg: SchedAck, now: float) -> None:
    """A request the fail-slow side serves: its own table (slowlinks.HANDLERS)."""
    slowlinks.feed(s, out, msg, now)


HANDLERS: dict[type[AnyRequest], Handler] = {
    Join: formation.on_join,
    Status: on_status,
    BeatMsg: on_beat,
    StateMsg: on_state,
    Leave: on_leave,
    Diagnose: verdicts.on_diagnose,
    Probed: verdicts.on_probed,
    Outcome: verdicts.on_outcome,
    Progress: verdicts.on_progress,
    JoinRequest: regroup.on_join_request,
    Reconstruct: regroup.on_reconstruct,
    Address: regroup.on_address,
    Rejoin: recovery.on_rejoin,
    SchedAck: on_failslow,
}


def check_heartbeats(s: State, out: Outbox, now: float) -> None:
    """Declare the members silent past the heartbeat timeout; forget such joiners."""
    if s.members is None:
        return

    # a look at every member's clock, every sweep: one comprehension, no call per member
    # (10,000 members: bench/studies/membership_scale.py)
    beats, timeout = s.beats, s.heartbeat_timeout
    quiet = [m for m, b in beats.items() if now - b.at > timeout]
    if not quiet:
        return
    silent = set(quiet)
    dead = [m for m in s.live() if m in silent]
    if dead:
        declare(s, out, dead, f"sent no heartbeat for {s.heartbeat_timeout:g} s")
    for m in [m for m in s.joiners if m in silent]:
        del s.joiners[m]
        out.note("a waiting replacement worker went quiet and was forgotten")


def died(s: State, out: Outbox, mid: Mid, why: str, now: float) -> None:
    """A witness saw member `mid`'s process end: a member is removed from its generation (the
    others raise PeerFailure), a joiner whose generation forms makes that formation fail now,
    a waiting joiner is forgotten, a rank that joined before generation 0 formed gives its
    place up (formation.py)."""
    if mid in s.live():
        declare(s, out, [mid], why)
    elif s.forming is not None and mid in s.forming.members and mid not in (s.members or ()):
        s.forming.gone[mid] = why
        out.note(f"a joiner admitted to generation {s.forming.generation} is gone: {why}")
    elif mid in s.joiners:
        del s.joiners[mid]
        out.note(f"a waiting replacement worker is gone: {why}")
    elif s.members is None:
        formation.lost_before_formation(s, out, mid, why, now)


def _prune(s: State, out: Outbox, now: float) -> None:
    known = s.known()  # O(members): once for both
    tables.prune(s, now, known)
    connections.prune(s, known)


def check_connections(s: State, out: Outbox, now: float) -> None:
    """Declare the members whose heartbeat connection stayed closed past its grace."""
    for mid, why in connections.gone(s, now):
        died(s, out, mid, why, now)


def _end_recovery(s: State, out: Outbox, now: float) -> None:
    recovery.end_recovery(s, out)


# The periodic work of every tick, in order (a sweep adds check_heartbeats first and _prune
# last).
PERIODIC: tuple[Callable[[State, Outbox, float], None], ...] = (
    check_connections,
    verdicts.finish_diagnoses,
    verdicts.finish_outcomes,
    regroup.check_round,
    _end_recovery,
    slowlinks.tick,
)


@dataclass(frozen=True)
class Halted:
    """The machine's declared error state. A transition raised while it applied an event:
    its state may hold half a change, so the machine keeps none of that event's effects
    (no send, no watch, no note of it leaves) and refuses every later event with a note. A
    snapshot per event to roll back to would cost O(state) each time (a deepcopy: 89 ms at
    1,000 members); the shell starts the coordinator afresh instead (server.py), and the
    members rebuild it as after a crash (recovery.py)."""

    during: str  # the event, or the piece of the periodic work, that raised
    error: Exception

    @property
    def reason(self) -> str:
        return f"{self.during} raised {self.error!r}"


def _what(event: Event) -> str:
    """An event, named for a note."""
    if isinstance(event, Arrived):
        return f"a {event.msg.kind!r} request"
    return f"a {type(event).__name__} event"


class Machine:
    """The coordinator's state and its transitions: feed(event, now) -> effects."""

    def __init__(self, state: State):
        self.state = state
        self.halted: Halted | None = None
        self._during = ""  # what the event being applied is doing now: for Halted

    def stranger(self, msg: AnyRequest) -> bool:
        """A restarted coordinator cannot place this member's request yet: the shell drops it
        (its sender re-registers, then sends it again)."""
        return recovery.stranger(self.state, msg)

    def feed(self, event: Event, now: float) -> list[Effect]:
        """Apply one event at time `now` (the caller's clock, carried by the event's feed);
        what to do outside. A transition that raises halts the machine (Halted): the only
        effect is a Halt, and every later event is refused with a note."""
        if self.halted is not None:
            out = Outbox()
            out.note(f"refused {_what(event)}: halted ({self.halted.reason})", detail=True)
            return out.effects
        out = Outbox()
        self._during = _what(event)
        try:
            self._apply(event, out, now)
        except Exception as exc:
            self.halted = Halted(self._during, exc)
            return [Halt(self._during, exc)]  # the event's other effects never leave
        return out.effects

    def _apply(self, event: Event, out: Outbox, now: float) -> None:
        s = self.state
        if isinstance(event, Arrived):
            handler = HANDLERS.get(type(event.msg))
            if handler is not None:
                handler(s, out, event.ident, event.msg, now)
        elif isinstance(event, Died):
            died(s, out, event.mid, event.why, now)
        elif isinstance(event, Connection):
            if event.what == "opened":
                connections.opened(s, event.fd, now)
            elif event.what == "spoke":
                connections.spoke(s, event.fd)
            else:
                connections.closed(s, event.fd, event.ident, now)
        elif isinstance(event, PidWatch):
            connections.watched(s, event.mid, event.on)
        elif isinstance(event, Tick):
            recovery.forgive_pause(s, out, now)  # a coordinator's pause is nobody's death
            work = (check_heartbeats, *PERIODIC, _prune) if event.sweep else PERIODIC
            for piece in work:
                self._during = f"the periodic work {piece.__name__}"
                piece(s, out, now)
