"""How an op ends early, the same way on every rank it reaches (a part of OpChannel, channel.py).

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

from ..common.errors import CollectiveMismatch, CollectiveTimeout, Evicted, PeerFailure, PeerTimeout
from .base import LEAVE_GRACE, OpContext, Transport
from .linkprobe import probe_links
from .wire import H_DESC, H_SRC, encode_header

log = logging.getLogger("collectives")


class OpAborts:
    """Mixed into OpChannel (through FrameVetting): the ways an op ends early. Uses the
    channel's transport, identity (rank, size, seq, op_name, desc), progress (phase,
    step_label, pending, has_data) and context (ctx)."""

    t: Transport
    rank: int
    size: int
    seq: int
    stream: int
    op_name: str
    timeout: float
    desc: list | None
    abort_type: int
    abort_peers: list[int] | None
    phase: str
    step_label: object
    pending: list
    has_data: bool
    ctx: OpContext

    def abandon(self):
        """The op ends here unfinished: nothing of it is waited for any more."""
        self.pending.clear()
        if self.stream == 0:
            self.ctx.in_op = False
        self.ctx.waiting_on = None

    def where(self) -> str:
        """The op and the phase this rank is in, as an error names them."""
        return f"{self.op_name}, {self.phase}" + (
            f" step {self.step_label}" if self.step_label != "" else ""
        )

    def _check_failure(self, starved: bool = False):
        """Raise the group's failure notice, if the transport has one."""
        f = self.t.failure
        if f is None:
            return
        if (
            starved
            and isinstance(f, PeerFailure)
            and f.graceful
            and time.monotonic() - self.t.failure_at < LEAVE_GRACE
        ):
            return  # a rank that left on purpose sent its last frames first: let them land
        raise f

    def _broadcast_abort(self, kind: str, culprit, message: str, theirs=None):
        info = {"kind": kind, "culprit": culprit, "message": message}
        if theirs is not None:
            # Both descriptors travel, so that each rank told can name whichever of the two
            # differs from *its own* call (see _raise_abort).
            info["desc"], info["culprit_desc"] = self.desc, theirs
        header = encode_header(
            self.abort_type, self.t.generation, self.seq, self.rank, 0, self.phase, 0, 0, info
        )
        peers = self.abort_peers if self.abort_peers is not None else range(self.size)
        for peer in peers:
            if peer != self.rank:
                try:
                    self.t.post(peer, header, b"", False)
                except Exception as exc:  # a dead peer must not hide the real error
                    log.debug(
                        "rank %d could not tell rank %d of the abort: %s", self.rank, peer, exc
                    )

    def _mismatch(self, peer, message, theirs=None):
        self._broadcast_abort("mismatch", peer, message, theirs)
        self.abandon()
        raise CollectiveMismatch(
            f"{self.op_name}: {message}",
            op=self.op_name,
            rank=self.rank,
            peer=peer,
            phase=self.phase,
            generation=self.t.generation,
        )

    def _timeout(self, peer, what):
        self._check_failure()  # evicted or told of a failure meanwhile: that is the news
        where = self.where()
        self.ctx.waiting_on = peer
        if self.stream == 0:
            culprits, why, evicted = self.t.diagnose(
                self.seq, peer, prober=self.probe_links, timeout=self.timeout
            )
        else:
            # send/recv numbers its messages per pair of ranks: the group's op sequence says
            # nothing about it. A receive that starves blames the sender it waited on.
            culprits, why, evicted = ([peer] if peer is not None else []), "sent nothing", False
        culprit = culprits[0] if culprits else peer
        blame = f"; rank {', '.join(map(str, culprits))} {why}" if culprits else ""
        message = (
            f"rank {self.rank} timed out after {self.timeout:g} s {what} in "
            f"{where} (op #{self.seq}){blame}"
        )
        kw = dict(
            op=self.op_name,
            rank=self.rank,
            peer=culprit,
            phase=self.phase,
            generation=self.t.generation,
        )
        self.abandon()
        if evicted and culprits:
            # The coordinator removed the culprits; everyone else hears it from there.
            if self.rank in culprits:
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
        if not self.has_data:
            # A rank in the commit round holds its result; whether the op counts is for the
            # arbiter to settle (settle_failure), so it must not abort it for the others.
            self._broadcast_abort("timeout", culprit, message)
        raise CollectiveTimeout(message, **kw)

    def probe_links(self, token: int, peers, nbytes: int, window: float) -> dict:
        """This rank's side of a stall diagnosis' probe round (linkprobe.py)."""
        return probe_links(self, token, peers, nbytes, window)

    def _raise_abort(self, h):
        info = h[H_DESC] if isinstance(h[H_DESC], dict) else {}
        src = h[H_SRC]
        message = (
            f"{self.op_name} on rank {self.rank} aborted by rank {src}: "
            f"{info.get('message', 'no reason given')}"
        )
        culprit = info.get("culprit", src)
        if culprit is not None and (type(culprit) is not int or not 0 <= culprit < self.size):
            culprit = src  # what a frame claims is checked like everything else in it
        if (
            info.get("kind") == "mismatch"
            and info.get("culprit_desc") == self.desc
            and info.get("desc") != self.desc
        ):
            # The rank that found the mismatch is the one whose call differs from ours (the
            # odd rank itself found it, naming a rank that called what we called).
            culprit = src
        if info.get("kind") == "mismatch" and culprit is not None and culprit != self.rank:
            message += f" [rank {culprit} called something different from rank {self.rank}]"
        self.abandon()
        cls = CollectiveMismatch if info.get("kind") == "mismatch" else CollectiveTimeout
        raise cls(
            message,
            op=self.op_name,
            rank=self.rank,
            peer=culprit,
            phase=self.phase,
            generation=self.t.generation,
        )
