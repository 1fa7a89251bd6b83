"""The coordinator's protocol, both directions, written once: every message is a msgspec
Struct below, and the types, ranges and lengths in its annotations are the checks. One
definition gives the record the code reads, the codec (msgpack) and the validation: a request
that does not decode into its record is dropped (`Invalid` says which field and why) before any
handler sees it, and a member reads the coordinator's answers as records too.

The coordinator (server.py) serves a ROUTER; each member (client.py, heartbeat.py) talks to it
over DEALERs. The tag `t` names each message on the wire.

One coordinator serves a job. `python -m collectives.launch` hosts it; otherwise rank 0 starts
one in-process when nothing is listening at MASTER_ADDR:MASTER_PORT (then rank 0's death cannot
be survived). Every process is a *member* with an id (`mid`, the hash of its own CURVE key:
identity.py); its rank is its position in the current generation's member list.

  join        {rank, world_size, mid, info}   -> welcome {generation 0, infos, members} once
                                              all joined
  status      {}                              -> status {missing, generation, world_size,
                                              failslow}
  join_request {mid, pid, proc, spare}        a replacement waits; admitted at the next
                                              regroup (a spare only into an empty place:
                                              formation.py); before generation 0: regroup
                                              {generation 0, rank} into a dead rank's place
  beat        {mid, report, links}            the heartbeat: its progress (Report) and its
                                              inbound links' figures (slowlinks.py)
  state       {mid, report, token}            the answer to a ping; `token` names the
                                              diagnosis whose ping it answers (verdicts.py)
  progress    {mid, report}                   its op ended in failure: its state now
  diagnose    {mid, report, timeout, probe}   -> verdict {seq, culprits, why, evicted, stall,
                                              evidence}; culprits are evicted. Where the
                                              stall's picture ties, first
                                              -> probe {seq, token, peers, bytes, window}:
                                              the asker probes its links (linkprobe.py) and
              probed {mid, generation, seq, token, heard, elapsed}   reports (probing.py)
  outcome     {mid, report, timeout}          -> outcome {seq, verdict: commit | abort | None}
                                              of an op that failed while the asker held its
                                              result; the same for every survivor
  leave       {mid, pid}                      preemption: the others are told at once (-> bye)
  reconstruct {mid, generation, timeout, seq, exclude}
                                              a barrier of the live members, then either
              -> unchanged {generation}       nobody failed, nobody waits to join, and the
                                              last attempt to form a generation did not fail
              -> regroup {generation, rank, world_size}; each answers
                 address {mid, generation, info} -> welcome {generation, infos, members}
                 or, when one of them vanishes first,
                                -> unformed {generation, from_generation, failed_ranks, reason}
              exclude: ranks (of this generation) the asker drops (dist.shrink_group)
  rejoin      {mid, report, rank, world_size, members, failed, forming, sched}
                                              the coordinator restarted: re-registration
              -> rejoined {generation} | evicted {reason}     (recovery.py, restart.py)
  exited      {proc, code}                    a launcher reaped this worker (liveness.py)
  sched_ack   {mid, generation, version, ok}  a member's answer to a proposed schedule
  any request -> error {message}              the request cannot be served

Sent to a member's heartbeat connection: ping {token} (answered with `state`), failure
{generation, failed_ranks, reason, graceful, op} (its current and next operations raise
PeerFailure, or PeerTimeout where `op` names the op whose stall removed them), evicted
{reason}, and the fail-slow schedule's schedule {generation, version, start, plan},
sched_go and sched_drop {generation, version} (slowlinks.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Union, get_args

import msgspec
from msgspec import Meta, Struct

from ..transport.address import RankAddress
from ..transport.base import Progress as Picture  # a rank's progress, as the judge reads it

MAX_RANKS = 1 << 20  # world sizes and rank numbers
MAX_SEQ = 1 << 62  # op sequence numbers
MAX_GENERATION = 1 << 31
MID_CHARS = 64  # a member id is 32 hex characters
MAX_TIMEOUT = 1e7  # seconds a request may ask the coordinator to wait
MAX_AGE = 1e7  # s: a send's age (Progress.sent_age); a process up for months stays under it
MAX_STR = 512  # an address, a host id, an arena's name, a reason
MAX_TEXT = 1 << 16  # a reason or an error message the coordinator writes
MAX_DONE = 64  # ops a progress report may say how they ended

Rank = Annotated[int, Meta(ge=0, le=MAX_RANKS)]
Size = Annotated[int, Meta(ge=1, le=MAX_RANKS)]
Seq = Annotated[int, Meta(ge=0, le=MAX_SEQ)]
SeqOrNone = Annotated[int, Meta(ge=-1, le=MAX_SEQ)]  # -1: no op yet
Gen = Annotated[int, Meta(ge=0, le=MAX_GENERATION)]
GenOrNone = Annotated[int, Meta(ge=-1, le=MAX_GENERATION)]  # -1: a joiner's, none forming
MemberId = Annotated[str, Meta(min_length=1, max_length=MID_CHARS)]
Text = Annotated[str, Meta(max_length=MAX_STR)]
Name = Annotated[str, Meta(min_length=1, max_length=MAX_STR)]
Reason = Annotated[str, Meta(max_length=MAX_TEXT)]
Seconds = Annotated[float, Meta(gt=0, le=MAX_TIMEOUT)]
Elapsed = Annotated[float, Meta(ge=0, le=MAX_TIMEOUT)]
Count = Annotated[int, Meta(ge=0, le=MAX_SEQ)]
Pid = Annotated[int, Meta(ge=0, le=1 << 31)]
Counts = Annotated[list[Count], Meta(max_length=MAX_RANKS)]
Ranks = Annotated[list[Rank], Meta(max_length=MAX_RANKS)]
Figure = Annotated[float, Meta(ge=0, lt=1e15)]
Big = Annotated[int, Meta(ge=0, lt=10**15)]
# a beat's inbound link: transport/linkstats.LinkCounters.wire (read again by its from_wire)
LinkRow = tuple[Big, Big, Figure, Big, Figure, Figure, Big, Figure, Big, Figure]
How = Annotated[int, Meta(ge=0, le=8)]  # how an op ended (transport/base.py: COMPLETED, ...)
Done = tuple[SeqOrNone, How]
Age = Annotated[float, Meta(ge=0, le=MAX_AGE)]
Heard = Annotated[float, Meta(ge=0, le=MAX_TIMEOUT)]
BookWire = Annotated[list[Annotated[int, Meta(ge=-1, le=MAX_SEQ)]], Meta(max_length=4)]


class Invalid(ValueError):
    """A message that is not what its type says it is: which field, and why."""


# --- the records both directions share ----------------------------------------------------------
class Report(Struct, frozen=True, kw_only=True):
    """A rank's progress as it reports it (in a beat, a ping's answer, a diagnosis, a
    progress message, a re-registration): what diagnose.py judges a stall and an op's outcome
    from. transport/base.py's Progress, as sent."""

    generation: GenOrNone  # -1: a joiner, not in a generation yet
    seq: SeqOrNone  # the last op it entered (-1: none yet)
    in_op: bool  # inside that op now
    waiting_on: Rank | None = None  # the peer it waits on, if any
    sent: Counts | None = None  # messages of that op sent to each rank
    recv: Counts | None = None  # and taken from each rank
    has_data: bool = False  # it holds op seq's result (in its commit round)
    done: Annotated[list[Done], Meta(max_length=MAX_DONE)] = []  # (seq, how) of its last ops
    # per rank, seconds since it last sent that rank a frame, at this picture (None: never)
    sent_age: Annotated[list[Age | None], Meta(max_length=MAX_RANKS)] | None = None

    def picture(self, world_size: int) -> Picture:
        """The stall picture diagnose.judge reads (the rank's Progress as it reported it),
        made to fit the group it is about: a waiting_on that names no rank, and lists that
        are not one per rank, are absent."""
        waiting = self.waiting_on
        if waiting is not None and not 0 <= waiting < world_size:
            waiting = None

        def fitted(v: list[Any] | None) -> tuple[Any, ...] | None:
            return tuple(v) if v is not None and len(v) == world_size else None

        return Picture(
            generation=self.generation,
            seq=self.seq,
            in_op=self.in_op,
            waiting_on=waiting,
            sent=fitted(self.sent),
            recv=fitted(self.recv),
            has_data=self.has_data,
            done=tuple(self.done),
            sent_age=fitted(self.sent_age),
        )


NO_REPORT = Report(generation=-1, seq=-1, in_op=False)  # a joiner's: no transport yet


# A rank's transport address, handed to every member of its generation in the welcome: the
# transport's own record (a rank checks the addresses it is given again before it connects).
Info = RankAddress


# --- requests: a member -> the coordinator -------------------------------------------------------
class Request(Struct, frozen=True, kw_only=True, tag_field="t"):
    """What every request is; `kind` is its tag on the wire."""

    @property
    def kind(self) -> str:
        tag = type(self).__struct_config__.tag
        return str(tag)


class Join(Request, frozen=True, tag="join"):
    mid: MemberId
    rank: Rank
    world_size: Size
    info: Info


class Status(Request, frozen=True, tag="status"):
    pass


class Beat(Request, frozen=True, tag="beat"):
    """The heartbeat, with this rank's progress and its inbound links' figures."""

    mid: MemberId
    report: Report
    links: Annotated[list[LinkRow], Meta(max_length=MAX_RANKS)] = []


class State(Request, frozen=True, tag="state"):
    """The answer to a ping; token: the diagnosis's ping it answers (None: another's)."""

    mid: MemberId
    report: Report
    token: Seq | None = None


class Progress(Request, frozen=True, tag="progress"):
    """An op ended in failure here: this rank's state now, before the next beat."""

    mid: MemberId
    report: Report


class Diagnose(Request, frozen=True, tag="diagnose"):
    mid: MemberId
    report: Report  # its seq is the op that stalled
    timeout: Seconds | None = None  # the op's (None: not said)
    probe: bool = False  # the asker can probe its links
    # s since it first asked (sent again once a restarted coordinator is back): it took no
    # frame of the op since then, whenever the request arrives
    waited: Elapsed = 0.0


class Probed(Request, frozen=True, tag="probed"):
    mid: MemberId
    generation: Gen
    seq: Seq
    token: Seq
    heard: Annotated[list[Heard | None], Meta(max_length=MAX_RANKS)]  # per rank: s, or None
    elapsed: Elapsed  # s since the instruction arrived


class Outcome(Request, frozen=True, tag="outcome"):
    mid: MemberId
    report: Report
    timeout: Seconds


class Leave(Request, frozen=True, tag="leave"):
    mid: MemberId
    pid: Pid | None = None


class JoinRequest(Request, frozen=True, tag="join_request"):
    mid: MemberId
    pid: Pid | None = None
    proc: Name | None = None  # its process key (liveness.process_key)
    spare: bool = False


class Reconstruct(Request, frozen=True, tag="reconstruct"):
    mid: MemberId
    generation: Gen
    timeout: Seconds
    seq: SeqOrNone | None = None  # the last op it ran (None: it did not say)
    exclude: Ranks = []  # ranks to drop now: distinct, sorted by decode()


class Address(Request, frozen=True, tag="address"):
    mid: MemberId
    generation: Gen
    info: Info


class Rejoin(Request, frozen=True, tag="rejoin"):
    mid: MemberId
    report: Report
    rank: Rank
    world_size: Size
    members: Annotated[list[MemberId], Meta(min_length=1, max_length=MAX_RANKS)]
    failed: Ranks
    forming: GenOrNone
    # its schedule book's state (group/schedbook.BookState.wire), [] from a member
    # that has no transport's book
    sched: BookWire = []
    # the host its address names (transport/zmq/addresses.py, host_id): a restarted
    # coordinator keeps slow links by host (hostlinks.py); None from a member that never gave one
    host: Text | None = None


class Exited(Request, frozen=True, tag="exited"):
    proc: Name
    code: Annotated[int, Meta(ge=-255, le=255)] | None = None


class SchedAck(Request, frozen=True, tag="sched_ack"):
    """A member's answer to a proposed schedule (slowlinks.py)."""

    mid: MemberId
    generation: Gen
    version: Seq
    ok: bool


AnyRequest = Union[
    Join,
    Status,
    Beat,
    State,
    Progress,
    Diagnose,
    Probed,
    Outcome,
    Leave,
    JoinRequest,
    Reconstruct,
    Address,
    Rejoin,
    Exited,
    SchedAck,
]
# Requests a coordinator serves (machine.HANDLERS, and `exited` for the witnesses).
REQUESTS: tuple[str, ...] = tuple(str(r.__struct_config__.tag) for r in get_args(AnyRequest))


# --- replies and notices: the coordinator -> a member --------------------------------------------
class Reply(Struct, frozen=True, kw_only=True, tag_field="t"):
    """What every message to a member is; `kind` is its tag on the wire."""

    @property
    def kind(self) -> str:
        return str(type(self).__struct_config__.tag)


class Welcome(Reply, frozen=True, tag="welcome"):
    generation: Gen
    infos: Annotated[list[Info], Meta(max_length=MAX_RANKS)]
    members: Annotated[list[MemberId], Meta(max_length=MAX_RANKS)]


class Regroup(Reply, frozen=True, tag="regroup"):
    generation: Gen
    rank: Rank
    world_size: Size


class Unformed(Reply, frozen=True, tag="unformed"):
    generation: Gen
    from_generation: Gen
    failed_ranks: Ranks
    reason: Reason


class Unchanged(Reply, frozen=True, tag="unchanged"):
    generation: Gen


class Evidence(Struct, frozen=True, kw_only=True):
    """What decided a stall's verdict (diagnose.Judgement.evidence): for the error message,
    the demo's event line and `explain stall`."""

    decided_by: Text = ""
    stalled: list[tuple[Rank, Rank]] = []  # the links proven stalled
    unproven: list[tuple[Rank, Rank]] = []  # stalled as pictured, not proven in time
    bad: list[tuple[Rank, Rank]] = []
    cleared: list[tuple[Rank, Rank]] = []
    probes: list[tuple[Rank, Rank, Heard | None]] = []  # (sender, receiver, s or None)
    judged_op: Seq | None = None


class Verdict(Reply, frozen=True, tag="verdict"):
    seq: SeqOrNone
    culprits: Ranks
    why: Reason
    evicted: bool
    stall: bool = False
    evidence: Evidence = Evidence()


class Probe(Reply, frozen=True, tag="probe"):
    seq: Seq
    token: Seq
    peers: Ranks
    bytes: Annotated[int, Meta(ge=0, le=1 << 30)]
    window: Elapsed


class OutcomeAnswer(Reply, frozen=True, tag="outcome"):
    seq: SeqOrNone
    verdict: Text | None  # "commit", "abort", or None: nobody can tell
    why: Reason = ""


class Ping(Reply, frozen=True, tag="ping"):
    token: Seq | None = None  # a diagnosis's ping: echoed in the state


class Failure(Reply, frozen=True, tag="failure"):
    generation: Gen
    failed_ranks: Ranks
    reason: Reason
    graceful: bool = False
    op: Seq | None = None  # the op whose stall removed them: PeerTimeout, else PeerFailure


class Evicted(Reply, frozen=True, tag="evicted"):
    reason: Reason


class Schedule(Reply, frozen=True, tag="schedule"):
    """A proposed schedule around slow links (reroute.py), from op `start`; plan: the
    algorithms' schedule.Plan.wire (read again by its from_wire), None: the default."""

    generation: Gen
    version: Seq
    start: Seq
    plan: list[Any] | None = None


class TestLinks(Reply, frozen=True, tag="test_links"):
    """Test links routed around as slow (reroute.py, transport/linktest.py): each sender of a
    link of `links` ([src, dst]) posts a frame of `bytes` to its receiver at each of its next
    `frames` ops."""

    generation: Gen
    token: Seq
    links: Annotated[list[tuple[Rank, Rank]], Meta(max_length=MAX_RANKS)]
    bytes: Annotated[int, Meta(ge=0, le=1 << 30)]
    frames: Annotated[int, Meta(ge=1, le=64)] = 1  # one at each of so many ops


class SchedGo(Reply, frozen=True, tag="sched_go"):
    generation: Gen
    version: Seq


class SchedDrop(Reply, frozen=True, tag="sched_drop"):
    generation: Gen
    version: Seq


class FailSlowStatus(Struct, frozen=True, kw_only=True):
    """What the status answer shows of the slow links (reroute.Reroute.status)."""

    policy: Text
    flagged: list[Reason]
    nics: Ranks
    schedule: Reason | None
    replaced: Ranks


class StatusAnswer(Reply, frozen=True, tag="status"):
    missing: Ranks
    generation: Gen
    world_size: Annotated[int, Meta(ge=0, le=MAX_RANKS)]
    failslow: FailSlowStatus | None = None


class Rejoined(Reply, frozen=True, tag="rejoined"):
    generation: Gen


class Bye(Reply, frozen=True, tag="bye"):
    pass


class Error(Reply, frozen=True, tag="error"):
    message: Reason


AnyReply = Union[
    Welcome,
    Regroup,
    Unformed,
    Unchanged,
    Verdict,
    Probe,
    OutcomeAnswer,
    Ping,
    Failure,
    Evicted,
    Schedule,
    SchedGo,
    SchedDrop,
    TestLinks,
    StatusAnswer,
    Rejoined,
    Bye,
    Error,
]
Notice = Union[Ping, Failure, Evicted, Schedule, SchedGo, SchedDrop, TestLinks]


# --- the codec -----------------------------------------------------------------------------------
_encoder = msgspec.msgpack.Encoder()
_requests = msgspec.msgpack.Decoder(AnyRequest)
_replies = msgspec.msgpack.Decoder(AnyReply)


def pack(msg: Request | Reply) -> bytes:
    return _encoder.encode(msg)


def decode_request(raw: bytes, max_ranks: int = MAX_RANKS) -> AnyRequest:
    """The record of a request as it arrived, every field checked; Invalid otherwise.
    max_ranks: the most entries a per-rank list may hold (tables.max_ranks: the largest
    group this job can have, whatever MAX_RANKS allows)."""
    try:
        msg = _requests.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise Invalid(_named(request_kind(raw), exc)) from None
    for name, n in _per_rank(msg):
        if n > max_ranks:
            raise Invalid(
                f"{msg.kind}.{name} has {n} entries, more than the {max_ranks} "
                "ranks this job can have"
            )
    if isinstance(msg, Reconstruct):
        if len(set(msg.exclude)) != len(msg.exclude):
            raise Invalid(f"reconstruct.exclude names a rank twice: {msg.exclude}")
        msg = msgspec.structs.replace(msg, exclude=sorted(msg.exclude))
    return msg


class _Tag(Struct):
    t: Annotated[str, Meta(max_length=32)] = ""


_tags = msgspec.msgpack.Decoder(_Tag)


def request_kind(raw: bytes) -> str | None:
    """The type a message says it is, whatever else it holds (to answer an invalid request
    that waits for an answer); None if not even that can be read."""
    try:
        return _tags.decode(raw).t
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


def _named(kind: str | None, exc: Exception) -> str:
    """msgspec's error, naming the field as `kind.path` ('join.mid: Expected `str`, ...')."""
    text = str(exc)
    what, _, where = text.partition(" - at `$")
    path = where.rstrip("`").lstrip(".")
    name = ".".join(x for x in (kind or "message", path) if x)
    return f"{name}: {what}"


def decode_reply(raw: bytes) -> AnyReply:
    """The record of a message from the coordinator, every field checked; Invalid otherwise
    (a member trusts its coordinator's answers no further than their types)."""
    try:
        return _replies.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise Invalid(_named(request_kind(raw), exc)) from None


def _report_lists(r: Report) -> list[tuple[str, int]]:
    return [
        (f"report.{name}", len(v))
        for name, v in (("sent", r.sent), ("recv", r.recv), ("sent_age", r.sent_age))
        if v is not None
    ]


def _per_rank(msg: AnyRequest) -> list[tuple[str, int]]:
    """(field, length) of every list with one entry per rank (or fewer)."""
    sizes: list[tuple[str, int]] = []
    if isinstance(msg, (Beat, State, Progress, Diagnose, Outcome, Rejoin)):
        sizes += _report_lists(msg.report)
    if isinstance(msg, Beat):
        sizes.append(("links", len(msg.links)))
    if isinstance(msg, Probed):
        sizes.append(("heard", len(msg.heard)))
    if isinstance(msg, Reconstruct):
        sizes.append(("exclude", len(msg.exclude)))
    if isinstance(msg, Rejoin):
        sizes += [("members", len(msg.members)), ("failed", len(msg.failed))]
    return sizes


def speaks_for_itself(msg: AnyRequest, proved: bytes | None) -> bool:
    """Whether a request may name the member id it names: `proved` is the User-Id of its
    connection, or None where nothing was proved (insecure, or a caller in this process); a
    request that names no member id (status, exited) names nobody else either."""
    if proved is None or isinstance(msg, (Status, Exited)):
        return True
    return proved == msg.mid.encode()


__all__ = [
    "REQUESTS",
    "AnyReply",
    "AnyRequest",
    "Invalid",
    "Notice",
    "Report",
    "decode_reply",
    "decode_request",
    "pack",
    "request_kind",
    "speaks_for_itself",
]
