"""Whether a frame may be used, decided once for every transport: functions of the op's
OpChannel (channel.py), which hands itself in for every frame it reads.

* a frame that does not parse, claims another sender than the one that sent it, is of an
  unknown type or from an unknown rank, or belongs to another generation or an older op is
  dropped and logged (rate-limited: base.py, _warn);
* a probe is compared with this op's descriptor if it is about this op, then dropped: a probe
  is never data;
* a frame of this op whose descriptor differs from ours means the ranks called different
  things (aborts.py, mismatch: every rank raises CollectiveMismatch);
* a frame of a later op, or of the other stream, is kept for whoever wants it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .aborts import mismatch, raise_abort
from .base import _warn
from .wire import (
    H_DESC,
    H_GEN,
    H_INDEX,
    H_PHASE,
    H_SEQ,
    H_SRC,
    H_STEP,
    H_TYPE,
    LINK_PROBE,
    PROBE,
    STREAM_OF,
    Descriptor,
    decode_header,
)

if TYPE_CHECKING:
    from .channel import OpChannel

log = logging.getLogger("collectives")


def check_taken(ch: OpChannel, peer, h, payload, out, want, phase, step):
    """The frame taken is the one this schedule expects, of the size it expects."""
    if h[H_TYPE] == ch.abort_type:
        raise_abort(ch, h)
    check_desc(ch, peer, h)
    if h[H_INDEX] != want:
        mismatch(
            ch,
            peer,
            f"rank {peer} sent message #{h[H_INDEX]} ({h[H_PHASE]} step "
            f"{h[H_STEP]}) where message #{want} ({phase} step {step}) was "
            "expected: the ranks run different schedules",
        )
    nbytes = memoryview(payload).nbytes
    if nbytes != out.nbytes:
        mismatch(
            ch,
            peer,
            f"rank {peer} sent {nbytes} bytes in {h[H_PHASE]} step "
            f"{h[H_STEP]}, rank {ch.rank} expected {out.nbytes}",
        )


def admit(ch: OpChannel, src, raw):
    """Parse and vet one frame; None if it must be dropped. Raises if it aborts this op."""
    h = decode_header(raw)
    if h is None:
        _warn(
            "malformed",
            "rank %d dropped a malformed frame (%d header bytes) from %s",
            ch.rank,
            len(raw) if raw is not None else 0,
            src,
        )
        return None
    if src is not None and h[H_SRC] != src:
        _warn(
            "claim",
            "rank %d dropped a frame claiming to be from rank %d but sent by %s",
            ch.rank,
            h[H_SRC],
            src,
        )
        return None
    if h[H_TYPE] not in STREAM_OF:
        _warn("type", "rank %d dropped a frame of unknown type %r", ch.rank, h[H_TYPE])
        return None
    if h[H_TYPE] == PROBE:
        # Compared if it is about our op, then dropped: a probe is never data. One for an
        # op we have not reached is dropped too; its sender repeats it while it waits.
        if (
            ch.stream == 0
            and h[H_SEQ] == ch.seq
            and h[H_GEN] == ch.t.generation
            and 0 <= h[H_SRC] < ch.size
        ):
            check_desc(ch, h[H_SRC], h)
        return None
    if h[H_TYPE] == LINK_PROBE:
        return None  # a probe round's (linkprobe.py) that this rank is not part of
    if not 0 <= h[H_SRC] < ch.size or h[H_SRC] == ch.rank:
        _warn("rank", "rank %d dropped a frame from unknown rank %r", ch.rank, h[H_SRC])
        return None
    if h[H_GEN] != ch.t.generation:
        _warn(
            "generation",
            "rank %d dropped a frame of generation %d (this group is generation %d)",
            ch.rank,
            h[H_GEN],
            ch.t.generation,
        )
        return None
    if STREAM_OF[h[H_TYPE]] != ch.stream:
        return h  # the other stream: kept for whoever wants it
    if ch.stream == 1 and h[H_SRC] != ch.p2p_peer:
        return h  # send/recv with another peer: kept for later
    if h[H_SEQ] < ch.seq:
        log.debug(
            "rank %d dropped a stale frame from rank %d (op #%d < #%d)",
            ch.rank,
            h[H_SRC],
            h[H_SEQ],
            ch.seq,
        )
        return None
    if h[H_SEQ] == ch.seq:
        if h[H_TYPE] == ch.abort_type:
            raise_abort(ch, h)
        check_desc(ch, h[H_SRC], h)
    return h


def check_desc(ch: OpChannel, src, h):
    theirs = h[H_DESC]
    if theirs != ch.desc:
        diffs = [
            f"{n} {a!r} vs {b!r}"
            for n, a, b in zip(
                Descriptor._fields, ch.desc or [], theirs if isinstance(theirs, list) else []
            )
            if a != b
        ]
        mismatch(
            ch,
            src,
            f"rank {ch.rank} and rank {src} called different operations "
            f"({'; '.join(diffs) or theirs}) at op #{ch.seq}",
            theirs=theirs,
        )
