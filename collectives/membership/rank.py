"""The rank's side of membership as a state machine: typed events in, effects out, no I/O.

The coordinator is a machine (machine.py); this is its counterpart in every member, with the
behaviour of a member: its requests (join, diagnosis, probes, outcome, reconstruct, address,
admission), its beats, what a notice means, and re-registration (link.py: the coordinator
gone, back, lost). A shell -- the client's op thread (client.py, _exchange) and its heartbeat
thread (heartbeat.py, Shell), each with a machine of its own over one LinkState, or the
simulator (collectives/simulation/) -- reads its sockets and its transport, feeds what
happened as an event with the time `now`, and carries out the effects. Every message either
way is a record of protocol.py; the machine reads no clock and logs nothing (notes are effects).

Events in                                   Effects out
  NewGroup    a generation's transport        Send       a request (protocol.py's records)
  OpStalled   an op passed its deadline       Blame      whom the waiting op blames
  OpFailed    an op ended in failure          RunProbes  this rank's side of a probe round
  Ask*        the op thread asks (outcome,    Replied    the answer to the thread's request
              reconstruct, address, join, ...) Failed     the thread's request raises (Fault)
  Received    a message from the coordinator  Interrupt  the transport's current and later
  ProbesDone  the probe round's results                  waits raise (Fault)
  SchedAnswer the schedule book's answer      ToBook     a schedule notice for the book
  Gone/Back   the heartbeat connection        ToTests    a link test's notice for the
  Tick        the clock moved                            transport's link tests
                                              Note       a line for the log
  Waiting     the op thread, waiting for its request's answer, looks at the clock
  Resume      the coordinator knows this member again: the waiting request is asked again
  Abandoned   the op thread gave its request up (abandon_join: a signal)

Every event that may need this rank's progress carries it (`report`), and a tick the inbound
links' figures a beat carries (`links`): the shell reads them from its transport when it feeds
the event, so the machine holds no transport.

A transition that raises leaves the machine in its declared error state (`RankMachine.error`
says why): its effects are dropped, later events are refused with a Note, and the shell fails
the request its op thread waits for, if any (a `Failed` effect, then nothing more).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Literal, Union

import msgspec

from .link import LinkState
from .protocol import (
    MAX_TIMEOUT,
    NO_REPORT,
    Address,
    AnyReply,
    Beat,
    Diagnose,
    Error,
    Evicted,
    Failure,
    Info,
    Join,
    LinkRow,
    JoinRequest,
    Outcome,
    OutcomeAnswer,
    Ping,
    Probe,
    Probed,
    Progress,
    Reconstruct,
    Regroup,
    Rejoin,
    Rejoined,
    Report,
    Request,
    SchedAck,
    SchedDrop,
    SchedGo,
    Schedule,
    State,
    Status,
    StatusAnswer,
    TestLinks,
    Unchanged,
    Unformed,
    Verdict,
    Welcome,
)

Via = Literal["heartbeat", "request"]  # the socket a message came on or goes out on
REJOIN_EVERY = 1.0  # s: a re-registration not acknowledged is sent again (restart.py)
MAX_PROBE_BYTES = 1 << 20  # what a coordinator may ask of a probe round (client._run_probes)
MAX_PROBE_WINDOW = 10.0
BookNotice = Union[Schedule, SchedGo, SchedDrop]


# --- events ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NewGroup:
    """A generation's transport is in place (start_heartbeat), or what it raises changed:
    this rank's progress is its. `failure`: what the transport raises now, whoever made it
    raise (a notice, the op's own verdict, a peer's closing) -- it decides whether a notice
    says anything new and what a re-registration says."""

    generation: int
    rank: int
    size: int
    failure: Fault | None = None


@dataclass(frozen=True)
class OpStalled:
    """Op `seq` passed its deadline waiting on `waiting_on` (group/judge.py, blame)."""

    seq: int
    waiting_on: int | None
    report: Report
    timeout: float  # the op's (0: none said)
    can_probe: bool  # the transport can run this rank's side of a probe round


@dataclass(frozen=True)
class OpFailed:
    """An op ended in failure here (group/judge.py, settle): the progress is published at once."""

    report: Report


@dataclass(frozen=True)
class AskOutcome:
    seq: int
    report: Report
    timeout: float


@dataclass(frozen=True)
class AskReconstruct:
    generation: int
    report: Report
    timeout: float
    exclude: tuple[int, ...] = ()


@dataclass(frozen=True)
class AskAddress:
    generation: int
    info: Info
    timeout: float


@dataclass(frozen=True)
class AskJoin:
    rank: int
    world_size: int
    info: Info
    timeout: float


@dataclass(frozen=True)
class AskAdmission:
    """A replacement waits to be admitted (join_request)."""

    pid: int | None
    proc: str | None
    timeout: float
    spare: bool = False


@dataclass(frozen=True)
class AskStatus:
    """A join that timed out asks who is missing (the coordinator's status)."""

    timeout: float


@dataclass(frozen=True)
class Received:
    """A message from the coordinator, on the heartbeat socket or the request socket."""

    msg: AnyReply
    via: Via
    report: Report


@dataclass(frozen=True)
class ProbesDone:
    """This rank's side of probe round `token` ended: per peer, seconds until its probe
    arrived, or None; `elapsed`: seconds since the instruction arrived."""

    token: int
    heard: tuple[float | None, ...]
    elapsed: float


@dataclass(frozen=True)
class SchedAnswer:
    """The schedule book's answer to a proposal (slowlinks.on_notice)."""

    generation: int
    version: int
    ok: bool


@dataclass(frozen=True)
class Gone:
    """The heartbeat connection to the coordinator closed."""


@dataclass(frozen=True)
class Back:
    """A handshake with the coordinator succeeded (the first one too)."""

    report: Report
    sched: tuple[int, ...] = ()  # the schedule book's state, as Tick's


@dataclass(frozen=True)
class Tick:
    """The clock moved. `report`, `links` (this rank's inbound links' figures,
    transport/linkstats.py, as a beat carries them: the fail-slow detector's input) and
    `sched` (the schedule book's state, group/schedbook.BookState.wire: a re-registration
    carries it, so that a restarted coordinator decides a proposal held undecided) are read
    by the shell as it feeds the tick, so the machine holds no transport."""

    report: Report
    links: tuple[LinkRow, ...] = ()
    sched: tuple[int, ...] = ()


@dataclass(frozen=True)
class Waiting:
    """The op thread waits for its request's answer and looks at the clock: the request
    fails once the coordinator is lost, or its deadline passed while the coordinator is there
    (a Tick does the same, besides beating). A shell whose beats run elsewhere (the client,
    whose heartbeat thread beats) feeds this instead of a Tick."""


@dataclass(frozen=True)
class Resume:
    """The coordinator came back and knows this member again, as a shell whose heartbeat
    side re-registered saw it (the link's epoch grew): the request it may have lost is asked
    again, with the whole timeout."""


@dataclass(frozen=True)
class Abandoned:
    """The op thread gave its request up (client.abandon_join, from a signal handler, say):
    the request fails with `why`."""

    why: str


Event = Union[
    NewGroup,
    OpStalled,
    OpFailed,
    AskOutcome,
    AskReconstruct,
    AskAddress,
    AskJoin,
    AskAdmission,
    AskStatus,
    Received,
    ProbesDone,
    SchedAnswer,
    Gone,
    Back,
    Tick,
    Waiting,
    Resume,
    Abandoned,
]


# --- effects -----------------------------------------------------------------------------------
FaultKind = Literal[
    "PeerFailure", "PeerTimeout", "Evicted", "CoordinatorLost", "CollectiveError", "Timeout"
]


@dataclass(frozen=True)
class Fault:
    """An error to raise, described (the shell builds the exception: common/errors.py)."""

    kind: FaultKind
    message: str
    failed_ranks: tuple[int, ...] = ()
    generation: int | None = None
    rank: int | None = None
    graceful: bool = False


@dataclass(frozen=True)
class Send:
    request: Request
    via: Via


@dataclass(frozen=True)
class Interrupt:
    fault: Fault


@dataclass(frozen=True)
class Blame:
    """The answer to a diagnosis: culprits, why, and whether they were evicted -- False,
    "stalled" (this stall removed them) or "failed" (removed before: dead, gone)."""

    seq: int
    culprits: tuple[int, ...]
    why: str
    evicted: Literal[False, "stalled", "failed"]


@dataclass(frozen=True)
class RunProbes:
    seq: int
    token: int
    peers: tuple[int, ...]
    nbytes: int
    window: float


@dataclass(frozen=True)
class Replied:
    """The answer the op thread's request waited for (welcome, regroup, unchanged, unformed,
    outcome)."""

    request: str
    reply: AnyReply


@dataclass(frozen=True)
class Failed:
    """The op thread's request raises: no answer in time, an error, an eviction, the
    coordinator lost. For a diagnosis, the transport then blames whom it waited on."""

    request: str
    fault: Fault


@dataclass(frozen=True)
class ToBook:
    notice: BookNotice


@dataclass(frozen=True)
class ToTests:
    """A test of links routed around, for the transport's link tests. Which frames this
    rank posts (those on its own links, for the notice's generation) is the transport's rule
    alone (slowlinks.on_test): it knows the rank and generation it runs now, which this
    machine's Group may lag."""

    notice: TestLinks


@dataclass(frozen=True)
class Note:
    what: str
    warn: bool = False


Effect = Union[Send, Interrupt, Blame, RunProbes, Replied, Failed, ToBook, ToTests, Note]


# --- state -------------------------------------------------------------------------------------
@dataclass
class Pending:
    """The request the op thread waits on (client._exchange): its answer is one of `want`
    (with `seq`, when given); sent again, with the whole timeout, when the coordinator
    comes back."""

    name: str  # diagnose, outcome, reconstruct, address, join, join_request
    request: Request
    want: tuple[type, ...]
    deadline: float
    timeout: float
    seq: int | None = None
    probe: bool = False  # a diagnosis that can run a probe round
    final: float = 0.0  # a diagnosis: the deadline the probe's report waits under
    sent_at: float = 0.0  # when it was first sent
    # a hard end (a join's timeout): asked again, or the coordinator away, it waits no longer
    until: float | None = None


@dataclass
class Group:
    """This rank's generation, as its transport has it (None in RankState: a joiner)."""

    generation: int
    rank: int
    size: int
    failure: Fault | None = None  # what the transport raises now (Interrupt)


@dataclass
class RankState:
    mid: str
    heartbeat_interval: float
    heartbeat_timeout: float
    link: LinkState
    link_probes: bool = True
    group: Group | None = None
    pending: Pending | None = None
    next_beat: float = 0.0
    seen: bool = False  # the first handshake happened (Back)
    rejoin_due: float | None = None
    pid: int | None = None  # added to the addresses this member gives
    proc: str | None = None


def _rank(s: RankState) -> int | None:
    """This member's rank: its generation's, or the one it joins generation 0 as."""
    if s.group is not None:
        return s.group.rank
    request = s.pending.request if s.pending is not None else None
    return request.rank if isinstance(request, Join) else None


def _who(s: RankState) -> str:
    rank = _rank(s)
    return f"rank {rank}" if rank is not None else "a joiner"


def _progress(s: RankState, report: Report) -> Report:
    """A joiner's report has no generation (client.report(None))."""
    return NO_REPORT if s.group is None else report


def _with_proc(s: RankState, info: Info) -> Info:
    return msgspec.structs.replace(
        info, pid=s.pid if s.pid is not None else info.pid, proc=s.proc or info.proc
    )


def _seq_of(msg: AnyReply) -> int | None:
    """The op an answer is about, for the answers that name one."""
    if isinstance(msg, (Verdict, Probe, OutcomeAnswer)):
        return msg.seq
    return None


# --- transitions -------------------------------------------------------------------------------
class Out:
    def __init__(self) -> None:
        self.effects: list[Effect] = []

    def add(self, e: Effect) -> None:
        self.effects.append(e)

    def send(self, request: Request, via: Via = "request") -> None:
        self.effects.append(Send(request, via))

    def note(self, what: str, warn: bool = False) -> None:
        self.effects.append(Note(what, warn))


def on_new_group(s: RankState, out: Out, e: NewGroup, now: float) -> None:
    s.group = Group(e.generation, e.rank, e.size, e.failure)


def _ask(s: RankState, out: Out, p: Pending) -> None:
    s.pending = p
    out.send(p.request)


def on_stalled(s: RankState, out: Out, e: OpStalled, now: float) -> None:
    """client.diagnose: ask whom to blame; the coordinator's bound (probing.py) is under two
    op timeouts past its state window."""
    probe = e.can_probe and s.link_probes
    report = msgspec.structs.replace(_progress(s, e.report), seq=e.seq, waiting_on=e.waiting_on)
    wait = max(2.0, 4 * s.heartbeat_interval) + 2 * e.timeout
    msg = Diagnose(mid=s.mid, report=report, timeout=e.timeout or None, probe=probe)
    _ask(
        s,
        out,
        Pending(
            "diagnose",
            msg,
            (Verdict, Probe),
            now + wait,
            wait,
            seq=e.seq,
            probe=probe,
            final=now + wait,
            sent_at=now,
        ),
    )


def on_op_failed(s: RankState, out: Out, e: OpFailed, now: float) -> None:
    """client.publish: this rank's state now, not at the next beat."""
    out.send(Progress(mid=s.mid, report=_progress(s, e.report)), "heartbeat")


def on_ask_outcome(s: RankState, out: Out, e: AskOutcome, now: float) -> None:
    report = msgspec.structs.replace(_progress(s, e.report), seq=e.seq)
    wait = e.timeout + 5.0
    msg = Outcome(mid=s.mid, report=report, timeout=e.timeout)
    _ask(s, out, Pending("outcome", msg, (OutcomeAnswer,), now + wait, wait, seq=e.seq))


def on_ask_reconstruct(s: RankState, out: Out, e: AskReconstruct, now: float) -> None:
    seq = _progress(s, e.report).seq
    msg = Reconstruct(
        mid=s.mid,
        generation=e.generation,
        timeout=e.timeout,
        seq=seq,
        exclude=sorted(e.exclude),
    )
    wait = e.timeout + 5.0
    _ask(s, out, Pending("reconstruct", msg, (Unchanged, Regroup), now + wait, wait))


def on_ask_address(s: RankState, out: Out, e: AskAddress, now: float) -> None:
    s.link.forming = e.generation
    s.link.host = e.info.host or s.link.host
    msg = Address(mid=s.mid, generation=e.generation, info=_with_proc(s, e.info))
    wait = e.timeout + 35.0
    _ask(s, out, Pending("address", msg, (Welcome, Unformed), now + wait, wait))


def on_ask_join(s: RankState, out: Out, e: AskJoin, now: float) -> None:
    """Generation 0's rendezvous: it waits for every rank, within its timeout whatever the
    coordinator does (a coordinator restarted before it formed is asked again)."""
    s.link.host = e.info.host or s.link.host
    msg = Join(mid=s.mid, rank=e.rank, world_size=e.world_size, info=_with_proc(s, e.info))
    end = now + e.timeout
    _ask(s, out, Pending("join", msg, (Welcome,), end, e.timeout, until=end))


def on_ask_status(s: RankState, out: Out, e: AskStatus, now: float) -> None:
    end = now + e.timeout
    _ask(s, out, Pending("status", Status(), (StatusAnswer,), end, e.timeout, until=end))


def on_ask_admission(s: RankState, out: Out, e: AskAdmission, now: float) -> None:
    msg = JoinRequest(mid=s.mid, pid=e.pid, proc=e.proc, spare=e.spare)
    _ask(s, out, Pending("join_request", msg, (Regroup,), now + e.timeout, e.timeout))


def on_received(s: RankState, out: Out, e: Received, now: float) -> None:
    if e.via == "request":
        _on_reply(s, out, e.msg, now)
        return
    # the heartbeat socket: a re-registration's answer first
    if s.rejoin_due is not None and isinstance(e.msg, (Rejoined, Evicted)):
        _back(s, out, now)
        if isinstance(e.msg, Rejoined):
            return
    _on_notice(s, out, e.msg, e.report)


def _on_reply(s: RankState, out: Out, msg: AnyReply, now: float) -> None:
    """client._exchange: the answer the op thread waits for; anything else is skipped."""
    p = s.pending
    if p is None:
        return  # nobody waits: the next request skips it (answers are matched)
    if isinstance(msg, Error):
        where = f"coordinator at {s.link.address}"
        _fail(s, out, "CollectiveError", f"{p.name}: {_who(s)}: {where}: {msg.message}")
        return
    if isinstance(msg, Evicted):
        rank = _rank(s)
        _fail(
            s,
            out,
            "Evicted",
            f"{p.name}: rank {rank} was removed from the group: {msg.reason}",
            failed=(rank,) if rank is not None else (),
        )
        return
    if not isinstance(msg, p.want):
        return
    if p.seq is not None and _seq_of(msg) != p.seq:
        return  # an answer to an earlier ask
    if p.name == "diagnose":
        _on_diagnosis(s, out, p, msg, now)
        return
    s.pending = None
    if p.name == "address":
        s.link.forming = -1
    if isinstance(msg, Welcome):
        s.link.welcomed(msg.generation, list(msg.members))  # a re-registration names it
    out.add(Replied(p.name, msg))


def _on_diagnosis(s: RankState, out: Out, p: Pending, msg: AnyReply, now: float) -> None:
    if isinstance(msg, Probe) and p.probe and Probe in p.want:
        size = s.group.size if s.group is not None else 0
        peers = tuple(q for q in msg.peers[:size] if 0 <= q < size)
        nbytes = min(max(msg.bytes, 0), MAX_PROBE_BYTES)
        window = min(max(msg.window, 0.0), MAX_PROBE_WINDOW)
        p.want = ()  # the probe round runs; its report waits for the verdict (on_probes_done)
        out.add(
            RunProbes(p.seq if p.seq is not None else msg.seq, msg.token, peers, nbytes, window)
        )
        return
    if not isinstance(msg, Verdict):
        _fail(s, out, "Timeout", f"diagnose: {_who(s)}: no verdict from the coordinator")
        return
    s.pending = None
    evicted: Literal[False, "stalled", "failed"] = False
    if msg.evicted:
        evicted = "stalled" if msg.stall else "failed"
    out.add(Blame(msg.seq, tuple(msg.culprits), msg.why, evicted))


def on_probes_done(s: RankState, out: Out, e: ProbesDone, now: float) -> None:
    """client._run_probes ran the round: report, then wait for the verdict until the diagnosis' deadline."""
    p = s.pending
    if p is None or p.name != "diagnose" or p.want:
        return
    g = s.group
    size = g.size if g is not None else 0
    heard = [e.heard[q] if q < len(e.heard) else None for q in range(size)]
    report = Probed(
        mid=s.mid,
        generation=g.generation if g is not None else 0,
        seq=p.seq if p.seq is not None else 0,
        token=e.token,
        heard=heard,
        elapsed=max(0.0, e.elapsed),
    )
    wait = max(0.1, p.final - now)
    _ask(s, out, replace(p, request=report, want=(Verdict,), deadline=now + wait, timeout=wait))


def _fail(
    s: RankState,
    out: Out,
    kind: FaultKind,
    message: str,
    failed: tuple[int, ...] = (),
) -> None:
    p = s.pending
    if p is None:
        return
    s.pending = None
    if p.name == "address":
        s.link.forming = -1
    g = s.group
    out.add(
        Failed(
            p.name,
            Fault(
                kind,
                message,
                failed,
                g.generation if g is not None else None,
                g.rank if g is not None else None,
            ),
        )
    )


def _on_notice(s: RankState, out: Out, msg: AnyReply, report: Report) -> None:
    """A message on the heartbeat socket: a ping is answered with this member's state (and
    its token), a schedule goes to the book, a link test to the transport's link tests, a
    failure or this rank's eviction interrupts the transport."""
    if isinstance(msg, Ping):
        out.send(State(mid=s.mid, report=_progress(s, report), token=msg.token), "heartbeat")
        return
    if isinstance(msg, (Schedule, SchedGo, SchedDrop)):
        out.add(ToBook(msg))
        return
    if isinstance(msg, TestLinks):
        out.add(ToTests(msg))
        return
    fault = notice_fault(msg, s.group)
    if fault is not None and s.group is not None:
        s.group.failure = fault
        out.add(Interrupt(fault))


def notice_fault(msg: AnyReply, g: Group | None) -> Fault | None:
    """What the transport must raise for a notice, or None (another generation's, or
    nothing new)."""
    if g is None:
        return None
    if isinstance(msg, Failure) and msg.generation == g.generation:
        ranks = tuple(msg.failed_ranks)
        return Fault(
            "PeerTimeout" if msg.op is not None else "PeerFailure",
            f"rank(s) {', '.join(map(str, ranks))} of generation {g.generation} "
            f"{msg.reason}; call reconstruct() to go on without them",
            ranks,
            g.generation,
            g.rank,
            msg.graceful,
        )
    if isinstance(msg, Evicted) and (g.failure is None or g.failure.kind != "Evicted"):
        return Fault(
            "Evicted",
            f"rank {g.rank} of generation {g.generation} was removed from the group: {msg.reason}",
            (g.rank,),
            g.generation,
            g.rank,
        )
    return None


def on_sched_answer(s: RankState, out: Out, e: SchedAnswer, now: float) -> None:
    msg = SchedAck(mid=s.mid, generation=e.generation, version=e.version, ok=e.ok)
    out.send(msg, "heartbeat")


def on_gone(s: RankState, out: Out, e: Gone, now: float) -> None:
    s.rejoin_due = None
    if s.link.went_away(now):
        out.note(
            f"{_who(s)}: lost the coordinator at {s.link.address}; collectives go on without "
            f"it, waiting up to {s.link.grace:g} s for it to come back",
            warn=True,
        )


def on_back(s: RankState, out: Out, e: Back, now: float) -> None:
    if s.seen and s.link.away_since is not None:
        s.rejoin_due = now
    if s.seen:
        s.next_beat = now  # connected again: beat at once (liveness.GRACE)
    s.seen = True
    _tick(s, out, e.report, now, (), e.sched)


def rejoin_of(
    mid: str, g: Group | None, link: LinkState, report: Report, sched: tuple[int, ...] = ()
) -> Rejoin | None:
    """A member's re-registration with a restarted coordinator, or None where it has none to
    make: a joiner (its request is simply sent again), a member evicted or lost already, or
    one that never got its generation's roster. `sched`: its schedule book's state (a
    proposal held undecided: the restarted coordinator decides it, slowlinks.on_book_back).
    It names the host the member's last address named (link.host)."""
    if g is None or (g.failure is not None and g.failure.kind in ("Evicted", "CoordinatorLost")):
        return None
    members = link.members.get(g.generation)
    if not members:
        return None
    f = g.failure
    failed = (
        list(f.failed_ranks)
        if f is not None
        and f.kind in ("PeerFailure", "PeerTimeout")
        and f.generation in (None, g.generation)
        else []
    )
    return Rejoin(
        mid=mid,
        report=report,
        rank=g.rank,
        world_size=g.size,
        members=list(members),
        failed=failed,
        forming=link.forming,
        sched=list(sched),
        host=link.host,
    )


def _back(s: RankState, out: Out, now: float) -> None:
    away = s.link.came_back(now)
    if away is not None:
        out.note(
            f"{_who(s)}: the coordinator at {s.link.address} is back after {away:.1f} s",
            warn=True,
        )
    s.rejoin_due = None
    _ask_again(s, out, now)


def _ask_again(s: RankState, out: Out, now: float) -> None:
    """The coordinator is back: the request it may have died with is sent again, with the
    whole timeout; a diagnosis says how long it has waited (the coordinator's state window
    counts from the first ask)."""
    p = s.pending
    if p is not None:
        p.deadline = max(p.deadline, now + p.timeout)
        if p.until is not None:
            p.deadline = min(p.deadline, p.until)
        request = p.request
        if isinstance(request, Diagnose):
            waited = min(MAX_TIMEOUT, max(0.0, now - p.sent_at))
            request = msgspec.structs.replace(request, waited=waited)
        out.send(request)


def on_resume(s: RankState, out: Out, e: Resume, now: float) -> None:
    _ask_again(s, out, now)


def _tick(
    s: RankState,
    out: Out,
    report: Report,
    now: float,
    links: tuple[LinkRow, ...],
    sched: tuple[int, ...] = (),
) -> None:
    if s.rejoin_due is not None and now >= s.rejoin_due:
        msg = rejoin_of(s.mid, s.group, s.link, report, sched)
        if msg is None:
            _back(s, out, now)
        else:
            out.send(msg, "heartbeat")
            s.rejoin_due = now + REJOIN_EVERY
    lost = s.link.overdue(now)
    if lost is not None:
        out.note(f"{_who(s)}: {lost}", warn=True)
        if s.group is not None:
            fault = Fault(
                "CoordinatorLost", f"{_who(s)}: {lost}", (), s.group.generation, s.group.rank
            )
            s.group.failure = fault
            out.add(Interrupt(fault))
    _fail_if_lost(s, out)
    if now >= s.next_beat:
        out.send(Beat(mid=s.mid, report=_progress(s, report), links=list(links)), "heartbeat")
        s.next_beat = now + s.heartbeat_interval
    _expire(s, out, now)


def _fail_if_lost(s: RankState, out: Out) -> None:
    """The waiting request fails once the coordinator is lost (its grace ran out)."""
    if s.link.lost is not None and s.pending is not None:
        _fail(s, out, "CoordinatorLost", f"{s.pending.name}: {_who(s)}: {s.link.lost}")


def _expire(s: RankState, out: Out, now: float) -> None:
    """The waiting request fails at its deadline -- not while the coordinator is away, unless
    the request has a hard end (a join)."""
    p = s.pending
    hard = p is not None and p.until is not None and now >= p.until
    if p is not None and now >= p.deadline and (s.link.away_since is None or hard):
        # while the coordinator is away, a request waits past its deadline: the grace bounds it
        if p.name == "diagnose":
            _fail(s, out, "Timeout", f"diagnose: {_who(s)}: no verdict from the coordinator")
        else:
            _fail(
                s,
                out,
                "Timeout",
                f"{p.name}: {_who(s)}: no answer from the coordinator within {p.timeout:g} s",
            )


def on_tick(s: RankState, out: Out, e: Tick, now: float) -> None:
    _tick(s, out, e.report, now, e.links, e.sched)


def on_abandoned(s: RankState, out: Out, e: Abandoned, now: float) -> None:
    if s.pending is not None:
        _fail(s, out, "CollectiveError", f"{s.pending.name}: {_who(s)}: {e.why}")


def on_waiting(s: RankState, out: Out, e: Waiting, now: float) -> None:
    _fail_if_lost(s, out)
    _expire(s, out, now)


# A transition: (state, outbox, the event, now); HANDLERS keys each by its event's type.
Handler = Callable[[RankState, Out, Any, float], None]
HANDLERS: dict[type, Handler] = {
    NewGroup: on_new_group,
    OpStalled: on_stalled,
    OpFailed: on_op_failed,
    AskOutcome: on_ask_outcome,
    AskReconstruct: on_ask_reconstruct,
    AskAddress: on_ask_address,
    AskJoin: on_ask_join,
    AskAdmission: on_ask_admission,
    AskStatus: on_ask_status,
    Received: on_received,
    ProbesDone: on_probes_done,
    SchedAnswer: on_sched_answer,
    Gone: on_gone,
    Back: on_back,
    Tick: on_tick,
    Waiting: on_waiting,
    Resume: on_resume,
    Abandoned: on_abandoned,
}


@dataclass
class Stopped:
    """The declared error state: a transition raised; what it was, and why."""

    event: str
    why: str


class RankMachine:
    """A member's state and its transitions: feed(event, now) -> effects."""

    def __init__(self, state: RankState):
        self.state = state
        self.error: Stopped | None = None  # set once a transition raised

    def due(self) -> float:
        """When this machine next needs a Tick: its next beat, a re-registration to send
        again, the grace's end while the coordinator is away, the deadline of the request the
        op thread waits on -- but not while the coordinator is away: then the request waits
        for it (or for the grace), and a Tick at a deadline already past would be fed again
        and again at the same instant (the simulator's sweep once never ended so)."""
        s = self.state
        due = [s.next_beat]
        if s.rejoin_due is not None:
            due.append(s.rejoin_due)
        if s.link.away_since is not None:
            if s.link.lost is None:
                due.append(s.link.away_since + s.link.grace + 1e-6)
        elif s.pending is not None:
            due.append(s.pending.deadline)
        if s.pending is not None and s.pending.until is not None:
            due.append(s.pending.until)
        return min(due)

    def feed(self, event: Event, now: float) -> list[Effect]:
        if self.error is not None:
            why = f"{self.error.event} raised {self.error.why}"
            return [Note(f"{_who(self.state)}: membership machine stopped: {why}", True)]
        out = Out()
        try:
            HANDLERS[type(event)](self.state, out, event, now)
        except Exception as exc:  # the declared error state, not a half-done transition
            self.error = Stopped(type(event).__name__, repr(exc))
            p = self.state.pending
            self.state.pending = None
            what = f"{_who(self.state)}: {self.error.event} raised {self.error.why}"
            effects: list[Effect] = [Note(what, True)]
            if p is not None:
                effects.append(Failed(p.name, Fault("CollectiveError", f"{p.name}: {what}")))
            return effects
        return out.effects


def machine(
    mid: str,
    address: str,
    heartbeat_interval: float,
    heartbeat_timeout: float,
    grace: float,
    link_probes: bool = True,
    pid: int | None = None,
    proc: str | None = None,
) -> RankMachine:
    """A member's machine as client.CoordinatorClient sets one up."""
    state = RankState(
        mid,
        heartbeat_interval,
        heartbeat_timeout,
        LinkState(address, grace),
        link_probes,
        pid=pid,
        proc=proc,
    )
    return RankMachine(state)
