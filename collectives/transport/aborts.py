"""How an op ends early, the same way on every rank it reaches: functions of the op's
OpChannel (channel.py), which calls them where a wait fails and hands itself in.

* a mismatch (two ranks called different things): every peer is told (ABORT) with both
  descriptors, so that each names the rank whose call differs from its own;
* a deadline that expires: the transport is asked whom to blame (membership/diagnose.py,
  with a probe round of linkprobe.py where the picture ties) and every peer is told, so that
  all raise CollectiveTimeout naming the same culprit, or the PeerTimeout / PeerFailure /
  Evicted that the coordinator's verdict calls for;
* an ABORT that arrives from a peer: raised here as the peer's error;
* the group's failure notice (Transport.failure): raised at the next wait.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from ..common.errors import CollectiveMismatch, CollectiveTimeout, Evicted, PeerFailure, PeerTimeout
from .base import LEAVE_GRACE
from .wire import H_DESC, H_SRC, encode_header

if TYPE_CHECKING:
    from .channel import OpChannel

log = logging.getLogger("collectives")


def check_failure(ch: OpChannel, starved: bool = False):
    """Raise the group's failure notice, if the transport has one."""
    f = ch.t.failure
    if f is None:
        return
    if (
        starved
        and isinstance(f, PeerFailure)
        and f.graceful
        and time.monotonic() - ch.t.failure_at < LEAVE_GRACE
    ):
        return  # a rank that left on purpose sent its last frames first: let them land
    raise f


def broadcast(ch: OpChannel, kind: str, culprit, message: str, theirs=None):
    """Tell the op's peers (ABORT) that it ends here, and why."""
    info = {"kind": kind, "culprit": culprit, "message": message}
    if theirs is not None:
        # Both descriptors travel, so that each rank told can name whichever of the two
        # differs from *its own* call (see raise_abort).
        info["desc"], info["culprit_desc"] = ch.desc, theirs
    header = encode_header(ch.abort_type, ch.t.generation, ch.seq, ch.rank, 0, ch.phase, 0, 0, info)
    peers = ch.abort_peers if ch.abort_peers is not None else range(ch.size)
    for peer in peers:
        if peer != ch.rank:
            try:
                ch.t.post(peer, header, b"", False)
            except Exception as exc:  # a dead peer must not hide the real error
                log.debug("rank %d could not tell rank %d of the abort: %s", ch.rank, peer, exc)


def mismatch(ch: OpChannel, peer, message, theirs=None):
    """The ranks called different things: every peer is told, and this rank raises."""
    broadcast(ch, "mismatch", peer, message, theirs)
    ch.abandon()
    raise CollectiveMismatch(
        f"{ch.op_name}: {message}",
        op=ch.op_name,
        rank=ch.rank,
        peer=peer,
        phase=ch.phase,
        generation=ch.t.generation,
    )


def timed_out(ch: OpChannel, peer, what):
    """The op's deadline passed while it was `what` (waiting on `peer`, or None): find whom
    to blame, tell the peers, and raise what the verdict calls for."""
    check_failure(ch)  # evicted or told of a failure meanwhile: that is the news
    where = ch.where()
    ch.ctx.waiting_on = peer
    if ch.stream == 0:
        culprits, why, evicted = ch.t.diagnose(
            ch.seq, peer, prober=ch.probe_links, timeout=ch.timeout
        )
    else:
        # send/recv numbers its messages per pair of ranks: the group's op sequence says
        # nothing about it. A receive that starves blames the sender it waited on.
        culprits, why, evicted = ([peer] if peer is not None else []), "sent nothing", False
    culprit = culprits[0] if culprits else peer
    blame = f"; rank {', '.join(map(str, culprits))} {why}" if culprits else ""
    message = (
        f"rank {ch.rank} timed out after {ch.timeout:g} s {what} in {where} (op #{ch.seq}){blame}"
    )
    kw: dict[str, Any] = dict(
        op=ch.op_name,
        rank=ch.rank,
        peer=culprit,
        phase=ch.phase,
        generation=ch.t.generation,
    )
    ch.abandon()
    if evicted and culprits:
        # The coordinator removed the culprits; everyone else hears it from there.
        if ch.rank in culprits:
            raise Evicted(message + "; this rank was evicted", failed_ranks=culprits, **kw)
        if evicted == "failed":  # removed before this stall (dead, left): announced so
            raise PeerFailure(
                message + "; removed already, call reconstruct() to go on",
                failed_ranks=culprits,
                **kw,
            )
        raise PeerTimeout(
            message + "; evicted, call reconstruct() to go on", failed_ranks=culprits, **kw
        )
    if not ch.has_data:
        # A rank in the commit round holds its result; whether the op counts is for the
        # arbiter to settle (settle_failure), so it must not abort it for the others.
        broadcast(ch, "timeout", culprit, message)
    raise CollectiveTimeout(message, **kw)


def raise_abort(ch: OpChannel, h):
    """A peer's ABORT for this op (header `h`): raised here as the peer's error."""
    info = h[H_DESC] if isinstance(h[H_DESC], dict) else {}
    src = h[H_SRC]
    message = (
        f"{ch.op_name} on rank {ch.rank} aborted by rank {src}: "
        f"{info.get('message', 'no reason given')}"
    )
    culprit = info.get("culprit", src)
    if culprit is not None and (type(culprit) is not int or not 0 <= culprit < ch.size):
        culprit = src  # what a frame claims is checked like everything else in it
    if (
        info.get("kind") == "mismatch"
        and info.get("culprit_desc") == ch.desc
        and info.get("desc") != ch.desc
    ):
        # The rank that found the mismatch is the one whose call differs from ours (the
        # odd rank itself found it, naming a rank that called what we called).
        culprit = src
    if info.get("kind") == "mismatch" and culprit is not None and culprit != ch.rank:
        message += f" [rank {culprit} called something different from rank {ch.rank}]"
    ch.abandon()
    cls = CollectiveMismatch if info.get("kind") == "mismatch" else CollectiveTimeout
    raise cls(
        message,
        op=ch.op_name,
        rank=ch.rank,
        peer=culprit,
        phase=ch.phase,
        generation=ch.t.generation,
    )
