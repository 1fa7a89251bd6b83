"""Whether a frame may be used, decided once for every transport (a part of OpChannel,
channel.py).

* a frame that does not parse, claims another sender than the one that sent it, is of an
  unknown type or from an unknown rank, or belongs to another generation or an older op is
  dropped and logged (rate-limited: base.py, _warn);
* a probe is compared with this op's descriptor if it is about this op, then dropped: a probe
  is never data;
* a frame of this op whose descriptor differs from ours means the ranks called different
  things (aborts.py: every rank raises CollectiveMismatch);
* a frame of a later op, or of the other stream, is kept for whoever wants it.
"""

from __future__ import annotations

import logging

from .aborts import OpAborts
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

log = logging.getLogger("collectives")


class FrameVetting(OpAborts):
    """Mixed into OpChannel: the checks every frame passes before an algorithm sees it. A
    frame that aborts the op raises through OpAborts."""

    p2p_peer: int | None

    def _check_taken(self, peer, h, payload, out, want, phase, step):
        """The frame taken is the one this schedule expects, of the size it expects."""
        if h[H_TYPE] == self.abort_type:
            self._raise_abort(h)
        self._check_desc(src=peer, h=h)
        if h[H_INDEX] != want:
            self._mismatch(
                peer,
                f"rank {peer} sent message #{h[H_INDEX]} ({h[H_PHASE]} step "
                f"{h[H_STEP]}) where message #{want} ({phase} step {step}) was "
                "expected: the ranks run different schedules",
            )
        nbytes = memoryview(payload).nbytes
        if nbytes != out.nbytes:
            self._mismatch(
                peer,
                f"rank {peer} sent {nbytes} bytes in {h[H_PHASE]} step "
                f"{h[H_STEP]}, rank {self.rank} expected {out.nbytes}",
            )

    def _admit(self, src, raw):
        """Parse and vet one frame; None if it must be dropped. Raises if it aborts this op."""
        h = decode_header(raw)
        if h is None:
            _warn(
                "malformed",
                "rank %d dropped a malformed frame (%d header bytes) from %s",
                self.rank,
                len(raw) if raw is not None else 0,
                src,
            )
            return None
        if src is not None and h[H_SRC] != src:
            _warn(
                "claim",
                "rank %d dropped a frame claiming to be from rank %d but sent by %s",
                self.rank,
                h[H_SRC],
                src,
            )
            return None
        if h[H_TYPE] not in STREAM_OF:
            _warn("type", "rank %d dropped a frame of unknown type %r", self.rank, h[H_TYPE])
            return None
        if h[H_TYPE] == PROBE:
            # Compared if it is about our op, then dropped: a probe is never data. One for an
            # op we have not reached is dropped too; its sender repeats it while it waits.
            if (
                self.stream == 0
                and h[H_SEQ] == self.seq
                and h[H_GEN] == self.t.generation
                and 0 <= h[H_SRC] < self.size
            ):
                self._check_desc(h[H_SRC], h)
            return None
        if h[H_TYPE] == LINK_PROBE:
            return None  # a probe round's (linkprobe.py) that this rank is not part of
        if not 0 <= h[H_SRC] < self.size or h[H_SRC] == self.rank:
            _warn("rank", "rank %d dropped a frame from unknown rank %r", self.rank, h[H_SRC])
            return None
        if h[H_GEN] != self.t.generation:
            _warn(
                "generation",
                "rank %d dropped a frame of generation %d (this group is generation %d)",
                self.rank,
                h[H_GEN],
                self.t.generation,
            )
            return None
        if STREAM_OF[h[H_TYPE]] != self.stream:
            return h  # the other stream: kept for whoever wants it
        if self.stream == 1 and h[H_SRC] != self.p2p_peer:
            return h  # send/recv with another peer: kept for later
        if h[H_SEQ] < self.seq:
            log.debug(
                "rank %d dropped a stale frame from rank %d (op #%d < #%d)",
                self.rank,
                h[H_SRC],
                h[H_SEQ],
                self.seq,
            )
            return None
        if h[H_SEQ] == self.seq:
            if h[H_TYPE] == self.abort_type:
                self._raise_abort(h)
            self._check_desc(h[H_SRC], h)
        return h

    def _check_desc(self, src, h):
        theirs = h[H_DESC]
        if theirs != self.desc:
            diffs = [
                f"{n} {a!r} vs {b!r}"
                for n, a, b in zip(
                    Descriptor._fields, self.desc, theirs if isinstance(theirs, list) else []
                )
                if a != b
            ]
            self._mismatch(
                src,
                f"rank {self.rank} and rank {src} called different operations "
                f"({'; '.join(diffs) or theirs}) at op #{self.seq}",
                theirs=theirs,
            )
