"""The coordinator's state as typed records, and what a transition may do (machine.py).

Everything the coordinator knows of a job lives in one `State`: the current generation, its
members and the ones removed from it, every member's last beat, the waiting replacements, a
reconstruct round, a generation being formed, the stalls under diagnosis and the judgements
given, a restart's recovery. The parts that change it (formation, regroup, recovery,
verdicts, the machine) are functions over a State, an `Outbox` and the time `now`, which the
caller passes in: none of them holds a socket, a thread, a clock or a pidfd.

What a transition does outside the state it returns as effects, in the Outbox (effects.py,
whose names this module gives too): a message to send (`Send`), a process to watch
(`Watch`), a line for the log (`Note`), a halt (`Halt`). The I/O shell (server.py) carries
them out.

Invariants (checked after every event by tests/unit/membership/test_machine_properties.py):

  I1  generations only grow: `generation` never decreases, and `tried` >= `generation`.
  I2  a rank is in at most one generation's roster at a time: a member id holds at most one
      rank of the current generation (`members` has no duplicates), a live member does not
      also wait to join, and a generation being formed takes a fresh number (> `generation`).
  I3  every member of a generation is told the same roster: the welcomes of one generation
      carry one member list, the same as `members` once it is installed.
  I4  one verdict per stalled op: the verdict on (generation, seq) never changes once given.
  I5  a member id removed from a generation (evicted, failed, left) is never admitted into a
      later one: its join request is refused (`removed`); a process that was removed joins
      again under a new member id (a new coordinator link).
  I6  no table keyed by what arrives grows without bound (tables.py names each bound), and
      once the job goes quiet past every deadline, nothing is left pending.
  I7  one schedule per version: a proposed schedule (the slow links' reroute) keeps its
      version number, each member is told it once, and only a proposed version is decided.
  I8  a live rank that every other live member excludes from a reconstruction (shrink_group)
      is in no roster of the generation that round forms.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..group.schedbook import BookState
from .diagnose import Placed, States
from .effects import Effect, Halt, Ident, Mid, Note, Outbox, Send, Watch
from .hostlinks import HostLinks
from .protocol import Info, Report, Verdict
from .reroute import Reroute

Key = tuple[int, int]  # (generation, op sequence number): one op of one generation


@dataclass
class Beat:
    """The last sign of life of a member or joiner."""

    ident: Ident  # its heartbeat connection; b"" until its first beat
    at: float  # when (the caller's monotonic clock), moved on by a coordinator's pause
    report: Report | None = None  # its last progress report (None: none yet)


@dataclass
class Joined:
    """A rank that joined generation 0 (or, after a restart, one re-registered)."""

    ident: Ident  # where its welcome goes
    mid: Mid
    info: Info  # its transport address


@dataclass
class Round:
    """A reconstruct() barrier of the live members in progress."""

    asked: dict[Mid, Ident]  # who called reconstruct(), and where its answer goes
    seqs: dict[Mid, int | None]  # the last op each asker ran (None: it did not say)
    timeout: float  # s: the askers' reconstruct() timeout
    start: float  # when the first asked
    deadline: float  # when the ones that did not ask are declared
    # the ranks each asker excludes (reconstruct's `exclude`), kept only where it excludes
    # some: a plain reconstruct is absent, read as ()
    exclude: dict[Mid, tuple[int, ...]] = field(default_factory=dict)


@dataclass
class Forming:
    """A new generation collecting its members' addresses."""

    generation: int  # its fresh number (state.tried)
    members: list[Mid]  # by new rank: the survivors, then the admitted joiners
    idents: dict[Mid, Ident]  # where each one's answer goes
    infos: dict[Mid, Info]  # the addresses in so far
    deadline: float  # when a missing address makes it fail
    gone: dict[Mid, str] = field(default_factory=dict)  # joiners gone meanwhile, and how
    # regroup._vanished: before this moment no member can be quiet past the heartbeat
    # timeout, nor the deadline come (-inf: not looked yet)
    calm_until: float = float("-inf")
    roster: frozenset[Mid] = field(init=False, default=frozenset())  # members, as a set

    def __post_init__(self) -> None:
        self.roster = frozenset(self.members)


@dataclass
class ProbeRound:
    """The probe instruction of one diagnosis (probing.py)."""

    token: int  # names this round in the reports
    ranks: list[int]  # the askers that probe
    window: float  # s: how long each listens
    sent_at: float
    until: float  # when the reports stop being waited for
    # rank -> (when its window began on the coordinator's clock, {peer: s or None})
    reports: dict[int, tuple[float, dict[int, float | None]]] = field(default_factory=dict)


@dataclass
class Diagnosis:
    """A stalled op under diagnosis: the states gathered, the askers waiting for the verdict."""

    until: float  # the state window ends
    first: float  # when the first rank asked
    askers: list[tuple[Ident, int]] = field(default_factory=list)  # (socket, op it asked)
    states: States = field(default_factory=dict)  # rank -> picture (None: silent)
    timeout: float = 0.0  # the askers' op timeout: bounds the whole diagnosis
    ranks: dict[int, Ident] = field(default_factory=dict)  # rank -> the socket it waits on
    asked: dict[int, int] = field(default_factory=dict)  # rank -> the op it asked about
    can_probe: dict[int, bool] = field(default_factory=dict)
    probe: ProbeRound | None = None
    # the pictures placed in time (diagnose.Placed): the ping round that opened the
    # diagnosis is named `token`, and went to each rank at pinged[rank]
    token: int = 0
    pinged: dict[int, float] = field(default_factory=dict)
    placed: dict[int, Placed] = field(default_factory=dict)
    # rank -> when its diagnose request arrived: it took no frame of the op after that, so
    # a picture it gives later is placed no later than this (verdicts.take_state)
    asked_at: dict[int, float] = field(default_factory=dict)


@dataclass
class OutcomeAsk:
    """An op of the current generation whose outcome was asked (diagnose.outcome)."""

    until: float
    askers: list[Ident] = field(default_factory=list)
    held: dict[int, bool] = field(default_factory=dict)  # rank -> holds its result
    mids: list[Mid] = field(default_factory=list)  # the askers' member ids (as askers)


@dataclass
class Judgements:
    """The diagnoses pending and given, and the outcomes (verdicts.py)."""

    diagnoses: dict[Key, Diagnosis] = field(default_factory=dict)
    given: dict[Key, Verdict] = field(default_factory=dict)  # the verdict message sent
    # a stall of op seq that waits on an earlier op is judged with it: key -> earlier key
    merged: dict[Key, Key] = field(default_factory=dict)
    # member id -> bad links earlier stalls found it on (a tie's first breaker)
    link_history: dict[Mid, int] = field(default_factory=dict)
    outcome_asks: dict[int, OutcomeAsk] = field(default_factory=dict)  # seq -> ask
    outcomes: dict[int, str] = field(default_factory=dict)  # seq -> "commit" | "abort"
    # member id -> when the coordinator last answered its diagnose or outcome request (inf:
    # not answered yet). Time a rank spends waiting on our answer about one op is not its
    # absence from the next (diagnose.judge's `excused`).
    answered: dict[Mid, float] = field(default_factory=dict)


@dataclass
class FailSlow:
    """The slow links' handling (slowlinks.py): the policy, and one Reroute (reroute.py: the
    detector and the schedule agreed around what it flags) for the current generation, made
    from what the one before learnt (its roster renumbers the links)."""

    policy: str = "reroute"  # report | reroute | replace | shrink (config.failslow_policy)
    min_world: int = 1  # a rank removed without a spare never leaves fewer (config)
    spare_wait: float | None = None  # replace: s a slow NIC waits for a spare, then shrinks
    reroute: Reroute | None = None  # made at the first beat with link figures
    roster: list[Mid] = field(default_factory=list)  # the members it was made for, by rank
    judged: float | None = None  # when it last judged (slowlinks.EVAL_EVERY)
    # a restart: the schedule books the members' re-registrations reported, decided once
    # every member is back (slowlinks.on_all_back), and the versions a new Reroute numbers past
    books: dict[Mid, BookState] = field(default_factory=dict)
    version_floor: int = 0
    inherited: bool = False  # the members may run a plan of the predecessor's: Reroute.unsure
    # each member's host (its address's), recorded as a generation forms, kept while the
    # roster above names it; and the flagged links whose end left, by host (hostlinks.py)
    hosts: dict[Mid, str] = field(default_factory=dict)
    by_host: HostLinks = field(default_factory=HostLinks)


@dataclass(frozen=True)
class Down:
    """A member's heartbeat connection that closed (connections.py)."""

    ident: Ident  # the routing id it had
    since: float


@dataclass
class Connections:
    """What the shell's witness saw of the members' connections (connections.py judges it)."""

    down: dict[Mid, Down] = field(default_factory=dict)  # closed, not back yet
    accepted: dict[int, float] = field(default_factory=dict)  # fd -> when; nobody's yet
    pid_watched: set[Mid] = field(default_factory=set)  # their pidfd tells, not the connection


@dataclass
class State:
    """Everything the coordinator knows of its job."""

    world_size: int  # the job's
    heartbeat_timeout: float  # s: a member silent this long is declared dead
    diagnose_window: float  # s: how long a diagnosis gathers states
    min_world_size: int | None = None  # generation 0 may form without ranks dead before it
    generation: int = 0  # the current generation's number
    tried: int = 0  # the highest generation number handed out (a failed attempt's too)
    # The last attempt to form a generation failed: the members have closed their groups,
    # so the next round must form a new generation even if nobody else changed.
    dissolved: bool = False
    joined: dict[int, Joined] = field(default_factory=dict)  # generation 0: rank -> joined
    members: list[Mid] | None = None  # the current generation, by rank; None before it forms
    failed: dict[Mid, str] = field(default_factory=dict)  # removed from it, and why
    beats: dict[Mid, Beat] = field(default_factory=dict)
    joiners: dict[Mid, Ident] = field(default_factory=dict)  # replacements waiting, in order
    spares: frozenset[Mid] = frozenset()  # the waiting joiners that only fill empty places
    pre_dead: dict[int, str] = field(default_factory=dict)  # died before generation 0 formed
    round: Round | None = None
    forming: Forming | None = None
    judgements: Judgements = field(default_factory=Judgements)
    # a restart's recovery (recovery.py): members listed but not re-registered yet
    recovering: set[Mid] | None = None
    lost_forming: set[int] = field(default_factory=set)  # generations forming at the crash
    last_tick: float | None = None  # when the periodic work last ran
    probe_tokens: int = 0  # the last token handed out (a probe round, a diagnosis ping round)
    # every member id ever removed from a generation, kept for invariant I5 (bounded: the
    # members of the last MAX_REMOVED removals; tables.py)
    removed: dict[Mid, None] = field(default_factory=dict)
    failslow: FailSlow = field(default_factory=FailSlow)
    connections: Connections = field(default_factory=Connections)

    # rank by member id of `members`, made again whenever `members` is another list (it is
    # only ever replaced, never changed in place): a beat's lookup must not cost O(members)
    _ranks: dict[Mid, int] = field(default_factory=dict, repr=False, compare=False)
    _ranked: list[Mid] | None = field(default=None, repr=False, compare=False)

    def rank_of(self, mid: Mid) -> int | None:
        if self._ranked is not self.members:
            self._ranked = self.members
            self._ranks = {m: r for r, m in enumerate(self.members or ())}
        return self._ranks.get(mid)

    def ranks_of(self, mids: list[Mid]) -> list[int]:
        """The current ranks of members of the current generation, sorted."""
        return sorted(r for r in map(self.rank_of, mids) if r is not None)

    def live(self) -> list[Mid]:
        """The members of the current generation not removed from it, by rank."""
        return [m for m in (self.members or []) if m not in self.failed]

    def forming_has(self, mid: Mid) -> bool:
        return self.forming is not None and mid in self.forming.roster

    def known(self) -> set[Mid]:
        """Every member id the job needs: members, joiners, ranks that joined, forming."""
        known = set(self.members or ()) | set(self.joiners) | {j.mid for j in self.joined.values()}
        if self.forming is not None:
            known |= set(self.forming.members)
        return known

    def is_known(self, mid: Mid) -> bool:
        """Whether `mid` is in known(): O(1) for a member, a joiner or one forming (a
        connection's owner, looked up at every tick while it is down: connections.gone)."""
        return (
            self.rank_of(mid) is not None
            or mid in self.joiners
            or self.forming_has(mid)
            or any(j.mid == mid for j in self.joined.values())
        )

    def owner_of(self, ident: Ident) -> Mid | None:
        """Whose heartbeat connection this is; before generation 0 forms, whose only
        connection (a rank that joined)."""
        owner = next((m for m, b in self.beats.items() if b.ident == ident), None)
        if owner is None and self.members is None:
            owner = next((j.mid for j in self.joined.values() if j.ident == ident), None)
        return owner


__all__ = [
    "Beat",
    "Connections",
    "Diagnosis",
    "Down",
    "Effect",
    "FailSlow",
    "Forming",
    "Halt",
    "Ident",
    "Joined",
    "Judgements",
    "Key",
    "Mid",
    "Note",
    "OutcomeAsk",
    "Outbox",
    "ProbeRound",
    "Round",
    "Send",
    "State",
    "Watch",
]
