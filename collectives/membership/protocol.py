"""The coordinator's wire protocol: msgpack dicts over a ZeroMQ ROUTER (server.py) and the
DEALERs of its clients (client.py), keyed by their type "t". On the coordinator's side each
request is checked field by field (validate.py) and decoded into its typed record (`decode`,
the records below): the state machine (machine.py) sees only records.

One coordinator serves a job. `python -m collectives.launch` hosts it; otherwise rank 0 starts
one in-process when nothing is listening at MASTER_ADDR:MASTER_PORT (then rank 0's death cannot
be survived). Every process is a *member* with a random id (`mid`); its rank is its position in
the current generation's member list.

  join        {rank, world_size, mid, info}   -> welcome {generation 0, infos} once all joined
  status      {}                              -> status {missing, generation, world_size,
                                              failslow}
  join_request {mid, spare}                   a replacement waits; admitted at the next regroup
                                              (a spare only into an empty place: formation.py);
                                              before generation 0: regroup {generation 0, rank}
                                              into the place of a rank that died
  beat/state  {mid, generation, seq, in_op, waiting_on, sent, recv, sent_age}   (heartbeat
              thread); a beat also {links}: its inbound links' figures (slowlinks.py); a
              state answering a diagnosis's ping {token} also: the ping's token
  diagnose    {mid, generation, seq, ..., timeout, probe}
                                              -> verdict {culprits, why, evicted, stall,
                                              evidence}; culprits are evicted. Where the
                                              stall's picture ties, first
                                              -> probe {seq, token, peers, bytes, window}:
                                              the asker probes its links (linkprobe.py) and
              probed {mid, generation, seq, token, heard, elapsed}   reports (probing.py)
  outcome     {mid, generation, seq, state}   -> outcome {seq, verdict: commit | abort | None}
                                              of an op that failed while the asker held its
                                              result; the same for every survivor
                                              (diagnose.outcome)
  progress    {mid, generation, seq, state}   a rank's op ended in failure: its state now
  leave       {mid}                           preemption: the others are told at once (-> bye)
  reconstruct {mid, generation, exclude}      a barrier of the live members, then either
              -> unchanged                    nobody failed, nobody waits to join, and the
                                              last attempt to form a generation did not fail
              -> regroup {generation, rank, world_size}; each answers
                 address {mid, generation, info} -> welcome {generation, infos}
                 or, when one of them vanishes first,
                                -> unformed {generation, from_generation, failed_ranks, reason}
                 (the members call reconstruct again; the joiners that are still there wait
                 for that next attempt, which gets a fresh generation number)
              exclude: ranks (of this generation) the asker drops (dist.shrink_group):
              once every live member outside it has asked with the same list, the live
              ones in it are removed at once (they get evicted); askers whose lists
              differ all get an error naming the lists
  rejoin      {mid, rank, world_size, generation, members, failed, forming, progress}
                                              the coordinator restarted: re-registration
              -> rejoined {generation} | evicted {reason}     (recovery.py, restart.py)
  exited      {proc, code}                    a launcher reaped this worker (liveness.py)
  sched_ack   {mid, generation, version, ok}  a member's answer to a proposed schedule
                                              (fail-slow: slowlinks.py, reroute.py)
  any request -> error {message}              the request cannot be served

Sent to a member's heartbeat thread: ping {token?} (answered with `state`, the token echoed), failure {generation,
failed_ranks, reason, graceful, op} (its current and next operations raise PeerFailure, or
PeerTimeout where `op` names the op whose stall removed them),
evicted {reason} (it was removed), and the fail-slow schedule's schedule {generation,
version, start, plan}, sched_go and sched_drop {generation, version} (slowlinks.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Union

import msgpack

# Requests a coordinator serves (machine.HANDLERS, and `exited` for the witnesses); anything
# else is dropped.
REQUESTS = (
    "join",
    "status",
    "beat",
    "state",
    "leave",
    "diagnose",
    "join_request",
    "reconstruct",
    "address",
    "outcome",
    "progress",
    "rejoin",
    "probed",
    "exited",
    "sched_ack",
)


def pack(msg: dict[str, Any]) -> bytes:
    return msgpack.packb(msg)


def unpack(raw: bytes) -> dict[str, Any] | None:
    """The message as a dict, or None if these bytes are not one of ours."""
    try:
        msg = msgpack.unpackb(raw)
    except Exception:
        return None
    return msg if isinstance(msg, dict) and isinstance(msg.get("t"), str) else None


# --- the requests, as the coordinator's handlers get them ------------------------------------
@dataclass
class Report:
    """A rank's progress as it reports it (in a beat, a ping's answer, a diagnosis, a
    progress message, a re-registration): what diagnose.py judges a stall and an op's outcome
    from."""

    generation: int  # -1: a joiner, not in a generation yet
    seq: int  # the last op it entered (-1: none yet)
    in_op: bool  # inside that op now
    waiting_on: int | None  # the peer it waits on, if any
    sent: list[int] | None  # messages of that op sent to each rank
    recv: list[int] | None  # and taken from each rank
    has_data: bool = False  # it holds op seq's result (in its commit round)
    done: tuple[tuple[int, int], ...] = ()  # (seq, how it ended) of its last ops
    # per rank, seconds since it last sent that rank a frame, at this picture (None: never,
    # or not said): transport/base.py's Progress.sent_age
    sent_age: list[float | None] | None = None

    @classmethod
    def of(cls, msg: dict[str, Any]) -> Report:
        return cls(
            msg["generation"],
            msg["seq"],
            msg["in_op"],
            msg["waiting_on"],
            msg.get("sent"),
            msg.get("recv"),
            msg.get("has_data", False),
            tuple(msg.get("done") or ()),
            msg.get("sent_age"),
        )

    def picture(self, world_size: int) -> dict[str, Any]:
        """The stall picture diagnose.judge reads, made to fit the group it is about: a
        waiting_on that names no rank, and counts that are not one per rank, are absent."""
        waiting = self.waiting_on
        if waiting is not None and not 0 <= waiting < world_size:
            waiting = None

        def fitted(v: list[Any] | None) -> list[Any] | None:
            return v if v is not None and len(v) == world_size else None

        return {
            "seq": self.seq,
            "in_op": self.in_op,
            "waiting_on": waiting,
            "sent": fitted(self.sent),
            "recv": fitted(self.recv),
            "sent_age": fitted(self.sent_age),
        }

    def as_outcome_state(self) -> dict[str, Any]:
        """What diagnose.holds_result reads."""
        return {"seq": self.seq, "has_data": self.has_data, "done": list(self.done)}


@dataclass(frozen=True)
class Join:
    t: ClassVar[str] = "join"
    mid: str
    rank: int
    world_size: int
    info: dict[str, Any]  # its transport address (validate._info)


@dataclass(frozen=True)
class Status:
    t: ClassVar[str] = "status"


@dataclass(frozen=True)
class Beat:
    """beat (the heartbeat), state (a ping's answer), progress (an op ended in failure)."""

    t: str
    mid: str
    report: Report
    # a beat's inbound link figures, rows as transport/linkstats.LinkCounters.wire writes
    # them (validate._link_rows checked their shape; each is read again by from_wire)
    links: tuple[list[Any], ...] = ()
    # a state's: the diagnosis ping it answers (verdicts.take_state), None: another ping's
    token: int | None = None


@dataclass(frozen=True)
class SchedAck:
    """A member's answer to a proposed schedule (slowlinks.py)."""

    t: ClassVar[str] = "sched_ack"
    mid: str
    generation: int
    version: int
    ok: bool


@dataclass(frozen=True)
class Diagnose:
    t: ClassVar[str] = "diagnose"
    mid: str
    report: Report  # its seq is the op that stalled
    timeout: float  # the op's (0: not said)
    probe: bool  # the asker can probe its links


@dataclass(frozen=True)
class Probed:
    t: ClassVar[str] = "probed"
    mid: str
    generation: int
    seq: int
    token: int
    heard: list[float | None]  # per rank: s until its probe arrived, or None
    elapsed: float  # s since the instruction arrived


@dataclass(frozen=True)
class Outcome:
    t: ClassVar[str] = "outcome"
    mid: str
    report: Report
    timeout: float


@dataclass(frozen=True)
class Leave:
    t: ClassVar[str] = "leave"
    mid: str
    pid: int | None


@dataclass(frozen=True)
class JoinRequest:
    t: ClassVar[str] = "join_request"
    mid: str
    pid: int | None
    proc: str | None  # its process key (liveness.process_key)
    spare: bool


@dataclass(frozen=True)
class Reconstruct:
    t: ClassVar[str] = "reconstruct"
    mid: str
    generation: int
    timeout: float
    seq: int | None  # the last op it ran (None: it did not say)
    exclude: tuple[int, ...] = ()  # ranks to drop now, sorted (validate: distinct, in range)


@dataclass(frozen=True)
class Address:
    t: ClassVar[str] = "address"
    mid: str
    generation: int
    info: dict[str, Any]


@dataclass(frozen=True)
class Rejoin:
    t: ClassVar[str] = "rejoin"
    mid: str
    report: Report
    rank: int
    world_size: int
    members: list[str]
    failed: list[int]
    forming: int
    # its schedule book's state (transport/schedbook.BookState.wire): a proposal held
    # undecided, the last one applied; () from a member that has no transport's book
    sched: tuple[int, ...] = ()


@dataclass(frozen=True)
class Exited:
    t: ClassVar[str] = "exited"
    proc: str
    code: int | None


Request = Union[
    Join,
    Status,
    Beat,
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


def decode(m: dict[str, Any]) -> Request:
    """The typed record of a message that validate.check passed (it raises Invalid on
    anything else, so every field read here is there and of its type)."""
    t = m["t"]
    if t in ("beat", "state", "progress"):
        return Beat(t, m["mid"], Report.of(m), tuple(m.get("links") or ()), m.get("token"))
    if t == "join":
        return Join(m["mid"], m["rank"], m["world_size"], m["info"])
    if t == "status":
        return Status()
    if t == "diagnose":
        return Diagnose(m["mid"], Report.of(m), m.get("timeout") or 0.0, m.get("probe", False))
    if t == "probed":
        return Probed(m["mid"], m["generation"], m["seq"], m["token"], m["heard"], m["elapsed"])
    if t == "outcome":
        return Outcome(m["mid"], Report.of(m), m["timeout"])
    if t == "leave":
        return Leave(m["mid"], m.get("pid"))
    if t == "join_request":
        return JoinRequest(m["mid"], m.get("pid"), m.get("proc"), m.get("spare", False))
    if t == "reconstruct":
        return Reconstruct(
            m["mid"], m["generation"], m["timeout"], m.get("seq"), tuple(m.get("exclude", ()))
        )
    if t == "address":
        return Address(m["mid"], m["generation"], m["info"])
    if t == "rejoin":
        return Rejoin(
            m["mid"],
            Report.of(m),
            m["rank"],
            m["world_size"],
            m["members"],
            m["failed"],
            m["forming"],
            tuple(m.get("sched") or ()),
        )
    if t == "exited":
        return Exited(m["proc"], m.get("code"))
    if t == "sched_ack":
        return SchedAck(m["mid"], m["generation"], m["version"], m["ok"])
    raise ValueError(f"no record for message type {t!r}")
