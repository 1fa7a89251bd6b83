"""Whether the process at the coordinator's address is this job's coordinator, from what a
client's handshakes with it showed (common/security.py, HandshakeWatch), and what to
say when it is not, or when it answers nothing (client.py).

A process that holds the port but not the job's secret -- a squatter on MASTER_PORT, a job
with another secret, one that runs insecure while this one is keyed or the other way round --
cannot complete a handshake: the request fails at once with an error that says which, instead
of handing it this rank's address or waiting for its answers.
"""

from __future__ import annotations


from ..common.errors import CollectiveError
from ..common import security

HANDSHAKE_STUCK = 5.0  # s: a server that accepted TCP but completed no handshake is not ours
PROBE_FOR = 10.0  # s: how long a server that failed handshakes is asked its mechanism
STUCK = (
    "either it is not this job's coordinator (another program holds the port: "
    "MASTER_PORT taken?), or the coordinator's process is out of file descriptors, flooded "
    "with connections that never authenticate (too many unauthenticated connections; its "
    "log says so)"
)


def check(
    h: security.HandshakeWatch | None,
    keyed: bool,
    address: str,
    rank: int | None,
    op: str,
    now: float,
) -> None:
    """Raise if the server at `address` has shown it is not this job's coordinator. h: the
    client socket's handshakes (None: not watched); keyed: whether this process holds a job
    secret; rank: this process's, for the error; now: the client's monotonic clock."""
    if h is None:
        return  # not watched: nothing to go by
    problem = h.problem(HANDSHAKE_STUCK)
    if problem and not h.mismatch and h.failures:
        # a server may close before saying why: ask it (a loaded one may not answer in
        # time: ask again at the next look, for a while, before calling it a stranger)
        if h.probe(address) is None and now - (h.first_failure or 0.0) < PROBE_FOR:
            return
    if problem and h.mismatch:
        if keyed:
            why = (
                "either it is not this job's coordinator (another program holds the "
                "port: MASTER_PORT taken?), or the coordinator runs insecure "
                "(COLLECTIVES_INSECURE=1, or --insecure) while this process is keyed "
                "with a job secret"
            )
        else:
            why = (
                "the coordinator is keyed with a job secret while this process runs "
                "insecure (COLLECTIVES_INSECURE=1)"
            )
        raise CollectiveError(
            f"{op}: rank {rank}: the process listening at "
            f"{address} {security.mismatch(keyed)}"
            f": {why}; set "
            "COLLECTIVES_INSECURE=1 on every process of the job or on "
            "none",
            op=op,
            rank=rank,
        )
    if problem and problem.startswith("it accepted a connection but"):
        raise CollectiveError(
            f"{op}: rank {rank}: the process listening at {address} {problem[3:]}"
            f": {security.flood_note() or STUCK}",
            op=op,
            rank=rank,
        )
    if problem:
        # A server that closed our handshakes and never answered the probe may be ours,
        # out of file descriptors under a flood: it drops connections before it can say why.
        flooded = (
            "; or it is this job's coordinator, out of file descriptors and dropping "
            "connections, flooded with connections that never authenticate (too many "
            "unauthenticated connections; its log says so)"
            if h.failures and not h.mismatch
            else ""
        )
        raise CollectiveError(
            f"{op}: the process listening at {address} is not this job's coordinator: "
            f"{problem}. It cannot prove it holds this job's secret: another program "
            "holds the port (MASTER_PORT taken?), or it runs with another "
            "COLLECTIVES_JOB_SECRET, or insecure (COLLECTIVES_INSECURE=1 must be set on "
            f"every process or none){flooded}",
            op=op,
            rank=rank,
        )


def why_silent(h: security.HandshakeWatch | None) -> str:
    """What may keep the coordinator from answering, from what this process saw."""
    here = security.flood_note()
    if here:  # this process hosts it, and it ran out of file descriptors
        return here
    if h is not None:
        h.poll()
    if h is not None and h.connected_at is not None:
        return "it accepted a connection but completed no handshake: " + STUCK
    return (
        "is MASTER_ADDR/MASTER_PORT right, and is rank 0 or the launcher running? Or "
        "is the coordinator flooded with connections that never authenticate (too many "
        "unauthenticated connections; its log says so)?"
    )
