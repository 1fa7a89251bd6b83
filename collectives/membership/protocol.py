"""The coordinator's wire protocol: msgpack dicts over a ZeroMQ ROUTER (server.py) and the
DEALERs of its clients (client.py), keyed by their type "t".

One coordinator serves a job. `python -m collectives.launch` hosts it; otherwise rank 0 starts
one in-process when nothing is listening at MASTER_ADDR:MASTER_PORT (then rank 0's death cannot
be survived). Every process is a *member* with a random id (`mid`); its rank is its position in
the current generation's member list.

  join        {rank, world_size, mid, info}   -> welcome {generation 0, infos} once all joined
  status      {}                              -> status {missing, generation, world_size}
  join_request {mid, spare}                   a replacement waits; admitted at the next regroup
                                              (a spare only into an empty place: formation.py);
                                              before generation 0: regroup {generation 0, rank}
                                              into the place of a rank that died
  beat/state  {mid, generation, seq, in_op, waiting_on, sent, recv}   (heartbeat thread)
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
  reconstruct {mid, generation}               a barrier of the live members, then either
              -> unchanged                    nobody failed, nobody waits to join, and the
                                              last attempt to form a generation did not fail
              -> regroup {generation, rank, world_size}; each answers
                 address {mid, generation, info} -> welcome {generation, infos}
                 or, when one of them vanishes first,
                                -> unformed {generation, from_generation, failed_ranks, reason}
                 (the members call reconstruct again; the joiners that are still there wait
                 for that next attempt, which gets a fresh generation number)
  rejoin      {mid, rank, world_size, generation, members, failed, forming, progress}
                                              the coordinator restarted: re-registration
              -> rejoined {generation} | evicted {reason}     (recovery.py, restart.py)
  exited      {proc, code}                    a launcher reaped this worker (liveness.py)
  sched_ack   {mid, generation, version, ok}  a member's answer to a proposed schedule
                                              (fail-slow: slowlinks.py, reroute.py)
  any request -> error {message}              the request cannot be served

Sent to a member's heartbeat thread: ping (answered with `state`), failure {generation,
failed_ranks, reason, graceful, op} (its current and next operations raise PeerFailure, or
PeerTimeout where `op` names the op whose stall removed them),
evicted {reason} (it was removed), and the fail-slow schedule's schedule {generation,
version, start, plan}, sched_go and sched_drop {generation, version} (slowlinks.py).
"""

from __future__ import annotations

import msgpack

# Requests a coordinator serves (Coordinator.handlers); anything else is dropped.
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


def pack(msg: dict) -> bytes:
    return msgpack.packb(msg)


def unpack(raw: bytes):
    """The message as a dict, or None if these bytes are not one of ours."""
    try:
        msg = msgpack.unpackb(raw)
    except Exception:
        return None
    return msg if isinstance(msg, dict) and isinstance(msg.get("t"), str) else None


def state_of(msg):
    """A rank's progress as diagnose.blame reads it, from a beat, state or diagnose message."""
    return {
        "seq": msg["seq"],
        "in_op": msg["in_op"],
        "waiting_on": msg["waiting_on"],
        "sent": msg.get("sent"),
        "recv": msg.get("recv"),
    }
