"""The Channel that algorithms talk to: one collective operation's view of the group.

Everything that decides whether a frame may be used lives in the channel, once, for every
transport. OpChannel holds an op's whole life: its begin, its sends and waits, the checks every
frame passes, the ways it ends early, and its finish.

* every message carries (generation, op sequence, message index, phase, step, chunk) and the
  op's descriptor (kind, count, dtype, op, algorithm, root); see wire.py;
* a frame that does not parse, claims another sender than the one that sent it, is of an
  unknown type or from an unknown rank, or belongs to another generation or an older op is
  dropped and logged (rate-limited: base.py, warn_frame); a frame from a later op, or of the other
  stream, is kept until this rank gets there (stash.py);
* a probe is compared with this op's descriptor if it is about this op, then dropped;
* a frame whose descriptor differs from ours means the ranks called different things: every
  peer is told (ABORT, with both descriptors, so that each names the rank whose call differs
  from its own) and every rank raises CollectiveMismatch;
* every wait has a deadline; on expiry a collective stops and reports the stall to the op's
  runner (Stalled, stall.py), which has it judged above the transport (group/core.py) and hands
  the verdict back (fail_stalled): every peer is told, so all raise CollectiveTimeout naming the
  same culprit, or the PeerTimeout / PeerFailure / Evicted that the verdict calls for. A
  point-to-point receive that starves blames the sender it waited on, judged by nobody;
* the group's failure notice (Transport.failure) is raised at the next wait;
* a collective of a group that survives failures ends with a commit round; a failure inside it
  is settled the same on every survivor (settle_failure, with the verdict its runner asked for).

OpChannel is a Channel (common/channel.py): what every algorithm sees. Wrappers (tracing, fault
injection) wrap it and forward what wrapper.py lists.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

import numpy as np

from ..common.errors import (
    CollectiveError,
    CollectiveMismatch,
    CollectiveTimeout,
    Evicted,
    PeerFailure,
    PeerTimeout,
)
from ..common.ops import ReduceOp, reduce_into
from .base import (
    ABANDONED,
    COMPLETED,
    LACKED,
    LEAVE_GRACE,
    PROBE_AFTER,
    PROBE_EVERY,
    TRACE,
    Frame,
    OpContext,
    Transport,
    warn_frame,
)
from .lending import may_lend
from .linkprobe import StalledOp, probe_links
from .linkstats import FRESH
from .stall import Blame, Stall, Stalled
from .stash import take
from .wire import (
    ABORT,
    DATA,
    LINK_PROBE,
    LINK_TEST,
    P2P_ABORT,
    P2P_DATA,
    PROBE,
    STREAM_OF,
    Abort,
    Descriptor,
    Header,
    HeaderForms,
    decode_header,
    encode_header,
)

log = logging.getLogger("collectives")

# A small receive whose frame is not there yet waits this long on the awaited peer's link
# (Transport.wait_peer) before the general wait takes over, with its probes (PROBE_AFTER) from
# then on: a healthy peer's small frame comes well within it.
SMALL_WAIT = 0.02  # s


def _addr_range(arr: np.ndarray) -> tuple[int, int]:
    start: int = arr.ctypes.data  # the first byte's address
    return start, start + arr.nbytes


Tracker = Any  # what Transport.post returns for a zero-copy send (its completion), or None


class OpChannel:
    """One collective operation's view of the group: the only thing an algorithm sees."""

    def __init__(
        self,
        transport: Transport,
        seq: int,
        desc: Descriptor | Sequence[Any] | None,
        op_name: str,
        timeout: float,
        p2p_peer: int | None = None,
        p2p_send: bool = False,
        headers: HeaderForms | None = None,
    ):
        self.t = transport
        # A collective uses the group's op sequence; send/recv a per-pair one (stream 1).
        self.stream = 0 if p2p_peer is None else 1
        self.data_type = DATA if p2p_peer is None else P2P_DATA
        self.abort_type = ABORT if p2p_peer is None else P2P_ABORT
        # Point to point: frames from A to B are only A's sends to B, numbered by A's send
        # counter (= B's receive counter), so each direction is its own monotone sequence. A
        # receiver therefore never writes back to its sender (no acknowledgement, no abort):
        # that frame would land in the other direction's sequence and be taken for data.
        self.p2p_peer = p2p_peer
        self.p2p_send = p2p_send
        self.abort_peers: list[int] | None = (
            None if p2p_peer is None else ([p2p_peer] if p2p_send else [])
        )
        self.rank: int = transport.rank
        self.size: int = transport.size
        self.segment_bytes: int = transport.segment_bytes
        self.leaders_min_bytes: int = transport.leaders_min_bytes
        self.link_segment_bytes: int | None = transport.link_segment_bytes
        self.seq = seq
        # what the op is (wire.py): every header carries it
        self.descriptor = desc if desc is None or type(desc) is Descriptor else Descriptor(*desc)
        # its data headers prebuilt (wire.py), kept by its plan across its ops; None: built
        # per frame (an op without a plan: forms made for one op would cost more than they save)
        self.headers = headers
        self.op_name = op_name
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.sent_index = [0] * self.size  # messages sent to each peer in this op
        self.sent_clock = transport.sent_clock  # when each peer was last sent a frame
        self.linkstats = transport.linkstats  # every inbound link's figures (fail-slow)
        self.recv_index = [0] * self.size  # messages taken from each peer in this op
        self.pending: list[tuple[int, int, Tracker]] = []  # zero-copy sends in flight
        self.has_data = False  # this rank's result is in place (hold_result)
        self.tracing = log.isEnabledFor(TRACE)  # every frame logged (asked once per op)
        # The op still owes its commit round (algorithms/commit.py; set by the group's core,
        # core.py, submit) and whether that round is the star. The small-op path
        # (group/smallop.py) runs the all-to-all round itself, right after its data, and
        # clears it; otherwise the core runs it after the algorithm.
        self.commit_owed = False
        self.commit_star = False
        # how long a small receive may read its peer's link before it sleeps in a poll
        # (Transport.wait_peer), and whether it gives its CPU away between reads; set by the
        # group's core (core.py, submit): where a host has fewer CPUs than ranks it yields,
        # as a rank that kept its CPU would take the one its peer needs to send
        self.spin = 0.0
        self.spin_yields = False
        self.lend = may_lend(self.descriptor)  # registered buffers may be lent (lending.py)
        # what the transport reads of this op (base.py, OpContext); handed over in begin()
        self.ctx = OpContext(
            self.stream,
            seq,
            self.deadline,
            self.lend,
            self.sent_index if self.stream == 0 else None,
            self.recv_index if self.stream == 0 else None,
        )
        self.phase = "start"
        self.step_label: int | str = ""

    # --- the channel interface --------------------------------------------------------------
    def send(
        self, peer: int, buf: np.ndarray, *, phase: str = "", step: int = 0, chunk: int = 0
    ) -> None:
        """Start sending `buf` to `peer`. The buffer must not change until the op ends; a later
        receive into the same memory waits for this send first (see _guard)."""
        self.phase = phase
        self.step_label = step
        for piece in (buf,) if buf.nbytes <= self.segment_bytes else self._pieces(buf):
            # sent_at: linkstats.py times the link from it
            header = self._header(peer, phase, step, chunk)
            # counted as sent from here: its age starts now (a picture taken before post()
            # returns must not date this frame by the one before it), and again once handed
            self.sent_clock[peer] = time.monotonic()
            self.sent_index[peer] += 1
            if self.tracing:
                log.log(
                    TRACE,
                    "rank %d -> rank %d: %s op #%d %s step %s chunk %d, %d B",
                    self.rank,
                    peer,
                    self.op_name,
                    self.seq,
                    phase,
                    step,
                    chunk,
                    piece.nbytes,
                )
            if piece.nbytes < self.t.zero_copy_bytes:
                self.t.post_small(peer, header, piece)  # copied as it goes: nothing to track
                self.sent_clock[peer] = time.monotonic()
                continue
            tracker = self.t.post(peer, header, piece, True)
            self.sent_clock[peer] = time.monotonic()
            if tracker is not None:
                start, end = _addr_range(piece)
                self.pending.append((start, end, tracker))

    def recv_into(
        self, peer: int, out: np.ndarray, *, phase: str = "", step: int = 0, chunk: int = 0
    ) -> None:
        """Block until `peer`'s next message arrives and copy it into `out`."""
        into = out if out.flags.c_contiguous else np.empty_like(out, order="C")
        one = into.nbytes <= self.segment_bytes
        take = self.take_small if one and self.stream == 0 else self._take
        for piece in (into,) if one else self._pieces(into):
            payload = take(peer, piece, phase, step)
            if self.pending:
                self._guard(piece)
            if piece.nbytes:
                piece[...] = np.frombuffer(payload, dtype=piece.dtype).reshape(piece.shape)
            self.t.release(payload)  # a payload in a peer's shared memory: its slot is free
        if into is not out:
            out[...] = into

    def recv_reduce(
        self,
        peer: int,
        out: np.ndarray,
        op: ReduceOp,
        *,
        phase: str = "",
        step: int = 0,
        chunk: int = 0,
    ) -> None:
        """Block until `peer`'s next message arrives and reduce it into `out` (out = out op msg)."""
        into = out if out.flags.c_contiguous else np.ascontiguousarray(out)
        one = into.nbytes <= self.segment_bytes
        take = self.take_small if one and self.stream == 0 else self._take
        for piece in (into,) if one else self._pieces(into):
            payload = take(peer, piece, phase, step)
            if self.pending:
                self._guard(piece)
            if piece.nbytes:
                reduce_into(op, piece, payload)
            self.t.release(payload)
        if into is not out:
            out[...] = into

    def _pieces(self, arr: np.ndarray) -> Iterable[np.ndarray]:
        """A buffer as the messages that carry it: itself, or, when it is larger than a
        segment, segment-sized pieces in order. Ring and tree cut their buffers so already;
        this cuts the others' (direct, naive, send/recv, ...) the same way, so that no message
        is larger than a segment and a receiver can refuse any that is (zmq/transport.py)."""
        if arr.nbytes <= self.segment_bytes:
            return (arr,)
        flat = arr.reshape(-1)  # a view: the caller gives a contiguous array
        n = max(1, self.segment_bytes // arr.itemsize)
        return [flat[a : a + n] for a in range(0, flat.size, n)]

    # --- op boundaries ------------------------------------------------------------------------
    def begin(self) -> OpChannel:
        t = self.t
        self.ctx.in_op = self.stream == 0
        t.begin_op(self.ctx)
        if t.failure is not None:
            self.check_failure()  # raises
        # An ABORT for this op may have arrived while we were still in an earlier one.
        for (src, stream), stash in t.early.items():
            if not stash:
                continue
            if stream == 0 and self.stream == 0:
                # Frames left over from ops that ended early (an abort) are stale now; drop
                # them here, so their shared-memory slots go back to the senders (in any
                # order: stash.take).
                while (item := take(stash, lambda h: h.seq < self.seq)) is not None:
                    t.release(item[1])
            if stream == self.stream and (
                self.stream == 0 or (src == self.p2p_peer and not self.p2p_send)
            ):
                for h, _ in stash:
                    if h.seq == self.seq and h.type == self.abort_type:
                        self._raise_abort(h)
        if self.stream == 0:
            t.linktests.post_due(t)  # a slow link's test asked for (linktest.py)
        return self

    def hold_result(self) -> None:
        """This rank's result is in place: what follows is the commit round (see
        algorithms/commit.py). From here on a failure no longer simply aborts the op here:
        it is settled with the other survivors (settle_failure)."""
        self.has_data = True
        if self.stream == 0:
            self.ctx.has_data = True

    def finish(self) -> None:
        """Wait until no send references the caller's buffer any more; then the op is over."""
        for _, _, tracker in self.pending:
            self._wait_tracker(tracker)
        self.pending.clear()
        if self.stream == 0:
            self.t.record(self.seq, COMPLETED)
            self.ctx.in_op = False

    def owes_outcome(self, exc: BaseException) -> bool:
        """Whether how this op ends after `exc` is for the arbiter to say (its runner asks,
        group/core.py): a collective in which this rank held its result (the commit round),
        ended by a timeout or a peer's failure. A mismatch is a programming error, and an
        evicted rank is no survivor: neither is settled."""
        settles = isinstance(exc, (CollectiveTimeout, PeerFailure)) and not isinstance(exc, Evicted)
        return self.stream == 0 and self.has_data and settles

    def settle_failure(self, exc: BaseException, verdict: str | None) -> bool:
        """After `exc` ended this op early: True if the op counts all the same. It does only
        where this rank held its result (owes_outcome) and the arbiter's `verdict`, the same
        on every survivor, is 'commit' (every survivor holds it); the failure then shows at
        the next op. Otherwise the op is dropped here, and recorded so (a failed end the
        runner publishes), so that the other survivors drop it too. verdict: 'commit',
        'abort', or None where nobody could tell (no arbiter, or no answer in time)."""
        if self.stream != 0:
            return False
        if not self.owes_outcome(exc):
            self.t.record(self.seq, LACKED)
            return False
        if verdict != "commit":
            if verdict is None:
                log.warning(
                    "rank %d: no verdict on op #%d after %s; dropping it here",
                    self.rank,
                    self.seq,
                    exc,
                )
            self.t.record(self.seq, ABANDONED)
            return False
        log.info(
            "rank %d: op #%d counts although %s (every survivor holds its result)",
            self.rank,
            self.seq,
            exc,
        )
        self.t.record(self.seq, COMPLETED)
        if isinstance(exc, PeerFailure) and self.t.failure is None:
            self.t.interrupt(exc)  # the group is broken: the next op raises at once
        return True

    def abandon(self) -> None:
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

    def probe_links(
        self, token: int, peers: Iterable[int], nbytes: int, window: float
    ) -> dict[int, float | None]:
        """This rank's side of a stall diagnosis' probe round (linkprobe.py)."""
        op = StalledOp(self.rank, self.size, self.seq, self.op_name)
        return probe_links(self.t, op, token, peers, nbytes, window)

    # --- the checks a frame passes ------------------------------------------------------------
    def admit(self, src: int | None, raw: Any) -> Header | None:
        """Parse and vet one frame; None if it must be dropped. Raises if it aborts this op."""
        h = decode_header(raw)
        if h is None:
            warn_frame(
                "malformed",
                "rank %d dropped a malformed frame (%d header bytes) from %s",
                self.rank,
                len(raw) if raw is not None else 0,
                src,
            )
            return None
        if src is not None and h.src != src:
            warn_frame(
                "claim",
                "rank %d dropped a frame claiming to be from rank %d but sent by %s",
                self.rank,
                h.src,
                src,
            )
            return None
        if h.type not in STREAM_OF:
            warn_frame("type", "rank %d dropped a frame of unknown type %r", self.rank, h.type)
            return None
        if h.type == PROBE:
            # Compared if it is about our op, then dropped: a probe is never data. One for an
            # op we have not reached is dropped too; its sender repeats it while it waits.
            if (
                self.stream == 0
                and h.seq == self.seq
                and h.generation == self.t.generation
                and 0 <= h.src < self.size
            ):
                self._check_desc(h.src, h)
            return None
        if h.type == LINK_PROBE:
            return None  # a probe round's (linkprobe.py) that this rank is not part of
        if not 0 <= h.src < self.size or h.src == self.rank:
            warn_frame("rank", "rank %d dropped a frame from unknown rank %r", self.rank, h.src)
            return None
        if h.generation != self.t.generation:
            warn_frame(
                "generation",
                "rank %d dropped a frame of generation %d (this group is generation %d)",
                self.rank,
                h.generation,
                self.t.generation,
            )
            return None
        if h.type == LINK_TEST:
            return h  # timed and dropped by the wait that took it (_take)
        if STREAM_OF[h.type] != self.stream:
            return h  # the other stream: kept for whoever wants it
        if self.stream == 1 and h.src != self.p2p_peer:
            return h  # send/recv with another peer: kept for later
        if h.seq < self.seq:
            log.debug(
                "rank %d dropped a stale frame from rank %d (op #%d < #%d)",
                self.rank,
                h.src,
                h.seq,
                self.seq,
            )
            return None
        if h.seq == self.seq:
            if h.type == self.abort_type:
                self._raise_abort(h)
            self._check_desc(h.src, h)
        return h

    def _check_taken(
        self,
        peer: int,
        h: Header,
        payload: Any,
        out: np.ndarray,
        want: int,
        phase: str,
        step: int | str,
        desc_checked: bool = False,
    ) -> None:
        """The frame taken is the one this schedule expects, of the size it expects."""
        if h.type == self.abort_type:
            self._raise_abort(h)
        if not desc_checked:
            self._check_desc(peer, h)
        if h.number != want:
            self._mismatch(
                peer,
                f"rank {peer} sent message #{h.number} ({h.phase} step "
                f"{h.step}) where message #{want} ({phase} step {step}) was "
                "expected: the ranks run different schedules",
            )
        nbytes = memoryview(payload).nbytes
        if nbytes != out.nbytes:
            self._mismatch(
                peer,
                f"rank {peer} sent {nbytes} bytes in {h.phase} step "
                f"{h.step}, rank {self.rank} expected {out.nbytes}",
            )

    def _check_desc(self, src: int, h: Header) -> None:
        theirs = h.desc
        if theirs != self.descriptor:
            diffs = [
                f"{n} {a!r} vs {b!r}"
                for n, a, b in zip(Descriptor._fields, self.descriptor or (), theirs or ())
                if a != b
            ]
            self._mismatch(
                src,
                f"rank {self.rank} and rank {src} called different operations "
                f"({'; '.join(diffs) or theirs}) at op #{self.seq}",
                theirs=theirs,
            )

    # --- how an op ends early -----------------------------------------------------------------
    def check_failure(self, starved: bool = False) -> None:
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

    def _tell_peers(self, abort: Abort) -> None:
        """Tell the op's peers (ABORT) that it ends here, and why."""
        header = encode_header(
            self.abort_type, self.t.generation, self.seq, self.rank, 0, self.phase, 0, 0, abort
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

    def _mismatch(
        self, peer: int | None, message: str, theirs: Descriptor | None = None
    ) -> NoReturn:
        """The ranks called different things: every peer is told, and this rank raises."""
        # Both descriptors travel, so that each rank told can name whichever of the two
        # differs from *its own* call (see _raise_abort).
        both = theirs is not None
        self._tell_peers(
            Abort(
                "mismatch",
                peer,
                message,
                self.descriptor if both else None,
                theirs if both else None,
            )
        )
        self.abandon()
        raise CollectiveMismatch(
            f"{self.op_name}: {message}",
            op=self.op_name,
            rank=self.rank,
            peer=peer,
            phase=self.phase,
            generation=self.t.generation,
        )

    def _timed_out(self, peer: int | None, what: str) -> NoReturn:
        """The op's deadline passed while it was `what` (waiting on `peer`, or None). A
        collective stops here and reports the stall to its runner (Stalled), still inside the
        op and waiting on `peer`, so that the judgement reads it so; the runner hands back the
        verdict (fail_stalled). send/recv numbers its messages per pair of ranks: the group's
        op sequence says nothing about it, so a receive that starves blames the sender it
        waited on."""
        self.check_failure()  # evicted or told of a failure meanwhile: that is the news
        self.ctx.waiting_on = peer
        stall = Stall(self.seq, peer, what, self.where(), self.t.progress())
        if self.stream == 0:
            raise Stalled(stall)
        self.fail_stalled(stall, Blame.waited_on(stall))

    def fail_stalled(self, stall: Stall, blame: Blame) -> NoReturn:
        """End this op, which stalled (`stall`, from _timed_out), as `blame` calls for: tell
        the peers and raise CollectiveTimeout naming the culprit, or PeerTimeout / Evicted /
        PeerFailure where the culprits were evicted."""
        culprits = list(blame.culprits)
        culprit = culprits[0] if culprits else stall.peer
        why = f"; rank {', '.join(map(str, culprits))} {blame.why}" if culprits else ""
        message = (
            f"rank {self.rank} timed out after {self.timeout:g} s {stall.what} in {stall.where} "
            f"(op #{stall.seq}){why}"
        )
        kw: dict[str, Any] = dict(
            op=self.op_name,
            rank=self.rank,
            peer=culprit,
            phase=self.phase,
            generation=self.t.generation,
        )
        self.abandon()
        if blame.evicted and culprits:
            # The coordinator removed the culprits; everyone else hears it from there.
            if self.rank in culprits:
                raise Evicted(message + "; this rank was evicted", failed_ranks=culprits, **kw)
            if blame.evicted == "failed":  # removed before this stall (dead, left): announced so
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
            self._tell_peers(Abort("timeout", culprit, message))
        raise CollectiveTimeout(message, **kw)

    def _raise_abort(self, h: Header) -> NoReturn:
        """A peer's ABORT for this op (header `h`): raised here as the peer's error."""
        info = h.abort or Abort("", h.src, "no reason given")
        message = f"{self.op_name} on rank {self.rank} aborted by rank {h.src}: {info.message}"
        culprit = info.culprit
        if culprit is not None and not 0 <= culprit < self.size:
            culprit = h.src  # what a frame claims is checked like everything else in it
        if (
            info.kind == "mismatch"
            and info.culprit_desc == self.descriptor
            and info.desc != self.descriptor
        ):
            # The rank that found the mismatch is the one whose call differs from ours (the
            # odd rank itself found it, naming a rank that called what we called).
            culprit = h.src
        if info.kind == "mismatch" and culprit is not None and culprit != self.rank:
            message += f" [rank {culprit} called something different from rank {self.rank}]"
        self.abandon()
        cls: type[CollectiveError] = (
            CollectiveMismatch if info.kind == "mismatch" else CollectiveTimeout
        )
        raise cls(
            message,
            op=self.op_name,
            rank=self.rank,
            peer=culprit,
            phase=self.phase,
            generation=self.t.generation,
        )

    # --- internals ----------------------------------------------------------------------------
    def _set_phase(self, phase: str, step: int | str) -> None:
        self.phase = phase
        self.step_label = step

    def _wait_tracker(self, tracker: Tracker) -> None:
        # In slices, so that a peer declared dead (its sends never complete) ends the wait.
        while not self.t.wait_sent(tracker, min(0.2, max(self.deadline - time.monotonic(), 0))):
            self.check_failure()
            if time.monotonic() >= self.deadline:
                self._timed_out(None, "waiting for a send to complete")

    def _guard(self, out: np.ndarray) -> None:
        """Before writing into `out`, wait for zero-copy sends that still read that memory."""
        if not self.pending or not out.nbytes:
            return
        start, end = _addr_range(out)
        keep = []
        for item in self.pending:
            s, e, tracker = item
            if s < end and start < e:
                self._wait_tracker(tracker)
            else:
                keep.append(item)
        self.pending = keep

    def _header(self, peer: int, phase: str, step: int, chunk: int) -> bytes:
        """The next data frame's header to `peer`, stamped now (linkstats.py times the link
        from it): prebuilt forms where the plan has them, else encoded whole."""
        if self.headers is not None:
            return self.headers.encode(
                self.data_type,
                self.t.generation,
                self.seq,
                self.rank,
                self.sent_index[peer],
                phase,
                step,
                chunk,
                time.time(),
            )
        return encode_header(
            self.data_type,
            self.t.generation,
            self.seq,
            self.rank,
            self.sent_index[peer],
            phase,
            step,
            chunk,
            self.descriptor,
            time.time(),
        )

    def send_small(self, peer: int, buf: np.ndarray, phase: str, step: int, chunk: int) -> None:
        """send() of a buffer that is one message and never zero-copy (group/smallop.py checks:
        nbytes below both segment_bytes and the transport's zero_copy_bytes): the same frame,
        the same counts and clock, without the loop over pieces."""
        self.phase = phase
        self.step_label = step
        header = self._header(peer, phase, step, chunk)
        clock = self.sent_clock
        clock[peer] = time.monotonic()  # counted as sent from here, as in send()
        self.sent_index[peer] += 1
        if self.tracing:
            log.log(
                TRACE,
                "rank %d -> rank %d: %s op #%d %s step %s chunk %d, %d B",
                self.rank,
                peer,
                self.op_name,
                self.seq,
                phase,
                step,
                chunk,
                buf.nbytes,
            )
        self.t.small_post(peer, header, buf)
        clock[peer] = time.monotonic()

    def take_small(
        self,
        peer: int,
        out: np.ndarray,
        phase: str,
        step: int,
        chunk: int | None = None,
        sent_step: int | None = None,
    ) -> Any:
        """_take() of a one-message receive of a collective (recv_into, recv_reduce, and the
        small-op path, group/smallop.py): the calling thread reads `peer`'s own
        link first (Transport.take_now) and, when the frame there is this op's next data
        message from `peer` -- every check admit() and _check_taken() make, passed -- takes it
        with no wait loop. chunk: the chunk `peer` sends it as, where the caller knows it: a
        header that is byte for byte what the plan's prebuilt forms make of this op's next
        message from `peer` in (phase, step, chunk) is taken without decoding it
        (HeaderForms.sent_at; sent_step: the step the sender labels it with, where that is
        not this rank's label); one that is not is decoded and checked. Anything else (nothing
        there yet, a stash, another frame) goes the general way, the frame already read
        included."""
        t = self.t
        if t.early.get((peer, self.stream)):
            return self._take(peer, out, phase, step)
        called = time.time()  # wall clock, as the headers' sent_at (linkstats.py)
        got = t.take_now(peer)
        if got is None:
            # Not there yet: wait on that link alone first (Transport.wait_peer: the ROUTER
            # too, so a failure's wake-up or another frame ends it at once, past the spin of
            # at most self.spin), for a slice within the deadline; the general wait takes
            # over after it, or at once where the transport has no such link.
            remaining = self.deadline - time.monotonic()
            if remaining > 0:
                self.phase = phase
                self.step_label = step
                ctx = self.ctx
                ctx.waiting_on = peer  # what a stall diagnosis reads meanwhile
                got = t.wait_peer(peer, min(remaining, SMALL_WAIT), self.spin, self.spin_yields)
                ctx.waiting_on = None
            if got is None:
                return self._take(peer, out, phase, step, chunk=chunk, sent_step=sent_step)
        src, raw, payload = got
        want = self.recv_index[peer]
        forms = self.headers
        if (
            chunk is not None
            and forms is not None
            and src == peer
            and memoryview(payload).nbytes == out.nbytes
        ):  # _form_sent, written out: once per small receive
            sent = forms.sent_at(
                raw,
                self.data_type,
                t.generation,
                self.seq,
                peer,
                want,
                phase,
                step if sent_step is None else sent_step,
                chunk,
            )
            if sent is not None:
                return self._took(peer, out, phase, step, want, sent, called, called, payload)
        h = decode_header(raw)
        if (
            h is None
            or h.type != self.data_type
            or src != peer
            or h.src != peer
            or h.generation != t.generation
            or h.seq != self.seq
            or h.number != want
            or h.desc != self.descriptor
            or memoryview(payload).nbytes != out.nbytes
        ):
            return self._take(peer, out, phase, step, first=got)
        return self._took(peer, out, phase, step, want, h.sent, called, called, payload)

    def _form_sent(
        self, got: Frame, peer: int, nbytes: int, want: int, phase: str, step: int, chunk: int
    ) -> float | None:
        """The sent_at of the frame `got` if it is `peer`'s message #want of this op, `nbytes`
        long, with a header that is byte for byte the plan's prebuilt form of that message in
        (phase, step, chunk) (HeaderForms.sent_at): such a frame passes every check admit()
        and _check_taken() make, and is taken without decoding. None: decode and check it
        (or no plan's forms)."""
        forms = self.headers
        src, raw, payload = got
        if forms is None or src != peer or memoryview(payload).nbytes != nbytes:
            return None
        return forms.sent_at(
            raw, self.data_type, self.t.generation, self.seq, peer, want, phase, step, chunk
        )

    def _took(
        self,
        peer: int,
        out: np.ndarray,
        phase: str,
        step: int,
        want: int,
        sent: float,
        since: float,
        called: float,
        payload: Any,
    ) -> Any:
        """A frame from `peer` that passed every check, taken: time its link (waited for
        since `since`; the read that found it began at `called`), count it, return its
        payload."""
        self.phase = phase
        self.step_label = step
        now = time.time()
        # fail-slow: a frame found queued (read in less than FRESH) is counted apart
        self.linkstats.arrived(
            peer, out.nbytes, sent, now, since, seen_arriving=now - called >= FRESH
        )
        self.recv_index[peer] = want + 1  # counted only once taken: diagnosis reads this
        if self.tracing:
            self._trace_taken(peer, phase, step, want, out.nbytes)
        return payload

    def _take(
        self,
        peer: int,
        out: np.ndarray,
        phase: str,
        step: int,
        first: Frame | None = None,
        chunk: int | None = None,
        sent_step: int | None = None,
    ) -> Any:
        """Return the payload of the next message from `peer` in this op. first: a frame
        already read from the transport (take_small), handled before any wait; chunk and
        sent_step: as take_small's, a frame from `peer` whose header matches the plan's form of the one
        awaited is taken without decoding it."""
        self._set_phase(phase, step)
        want = self.recv_index[peer]
        t = self.t
        match_step = step if sent_step is None else sent_step
        early = t.early.get((peer, self.stream))
        found: tuple[Header, Any] | None = None
        if early:
            # Frames that came before we got here; older ops' frames are stale and dropped.
            # This op's first frame may sit behind a later op's (stash.take).
            while early:
                h, payload = early[0]
                if h.seq < self.seq:
                    t.release(early.popleft()[1])
                    log.debug(
                        "rank %d dropped a stale frame from rank %d (op #%d < #%d)",
                        self.rank,
                        peer,
                        h.seq,
                        self.seq,
                    )
                    continue
                if h.seq == self.seq:
                    found = early.popleft()
                elif len(early) > 1:
                    found = take(early, self._is_this_op)
                break
        stashed = found is not None  # admitted when it came, perhaps for a later op
        self.ctx.waiting_on = peer
        probe_at = time.monotonic() + PROBE_AFTER
        waiting_since = time.time()  # wall clock, as the headers' sent_at (linkstats.py)
        try:
            while found is None:
                got: Frame | None
                if first is not None:  # read already (take_small): handled as if just come
                    called = waiting_since
                    got, first = first, None
                else:
                    now = time.monotonic()
                    remaining = self.deadline - now
                    if remaining <= 0:
                        self._timed_out(peer, f"waiting for rank {peer}")
                    if self.stream == 0 and now >= probe_at:
                        self._probe()
                        probe_at = now + PROBE_EVERY
                    called = time.time()
                    got = t.next_frame(min(remaining, 0.5, max(probe_at - now, 0.001)))
                if got is None:
                    # A failure notice ends only a wait that is starved: frames that already
                    # arrived (say from a peer that sent its last message and then left) are
                    # still used, so an op that can finish does.
                    self.check_failure(starved=True)
                    continue
                src, raw, payload = got
                if chunk is not None:
                    sent = self._form_sent(got, peer, out.nbytes, want, phase, match_step, chunk)
                    if sent is not None:  # what admit() and _check_taken() would pass
                        self.ctx.waiting_on = None
                        return self._took(
                            peer, out, phase, step, want, sent, waiting_since, called, payload
                        )
                try:
                    admitted = self.admit(src, raw)
                except BaseException:
                    t.release(payload)
                    raise
                if admitted is None:
                    t.release(payload)
                    continue
                if admitted.type == LINK_TEST:  # a slow link's test (linktest.py): timed only
                    t.linkstats.tested(src, admitted.sent, time.time(), admitted.number)
                    t.release(payload)
                    continue
                if admitted.type == self.data_type:  # fail-slow: every data frame times its link
                    now_wall = time.time()
                    t.linkstats.arrived(
                        src,
                        memoryview(payload).nbytes,
                        admitted.sent,
                        now_wall,
                        waiting_since if src == peer else now_wall,
                        seen_arriving=now_wall - called >= FRESH,
                    )
                stream = STREAM_OF[admitted.type]
                if stream != self.stream or admitted.seq > self.seq or src != peer:
                    current = self.seq if self.stream == 0 else t.collective.seq
                    try:
                        t.early.put(
                            self.rank,
                            src,
                            stream,
                            admitted,
                            payload,
                            admitted.seq - current if stream == 0 else None,
                            self.op_name,
                            t.generation,
                        )
                    except BaseException:
                        t.release(payload)
                        raise
                    continue
                found = (admitted, payload)
        except Stalled:
            raise  # still waiting on `peer` while the op's runner judges the stall (stall.py)
        except BaseException:
            self.ctx.waiting_on = None
            raise
        self.ctx.waiting_on = None
        assert found is not None
        h, payload = found
        try:
            # a frame taken in the loop above had its descriptor checked by admit()
            self._check_taken(peer, h, payload, out, want, phase, step, desc_checked=not stashed)
        except BaseException:
            t.release(payload)
            raise
        self.recv_index[peer] = want + 1  # counted only once taken: diagnosis reads this
        if self.tracing:
            self._trace_taken(peer, h.phase, h.step, want, memoryview(payload).nbytes)
        return payload

    def _trace_taken(self, peer: int, phase: str, step: int, want: int, nbytes: int) -> None:
        log.log(
            TRACE,
            "rank %d <- rank %d: %s op #%d %s step %s message #%d, %d B",
            self.rank,
            peer,
            self.op_name,
            self.seq,
            phase,
            step,
            want,
            nbytes,
        )

    def _is_this_op(self, h: Header) -> bool:
        return h.seq == self.seq

    def _probe(self) -> None:
        """Tell every rank what this rank is waiting in (see PROBE)."""
        header = encode_header(
            PROBE, self.t.generation, self.seq, self.rank, 0, self.phase, 0, 0, self.descriptor
        )
        for peer in range(self.size):
            if peer != self.rank:
                try:
                    self.t.post(peer, header, b"", False)
                except Exception as exc:  # failure detection reports dead peers, not this
                    log.debug("rank %d could not probe rank %d: %s", self.rank, peer, exc)


__all__ = ["OpChannel"]
