"""The Channel that algorithms talk to: one collective operation's view of the group.

Everything that decides whether a frame may be used lives in the channel, once, for every
transport; this file holds the op's life (begin, the waits, finish), vetting.py the checks a
frame passes, aborts.py the ways an op ends early (functions the channel calls with itself):

* every message carries (generation, op sequence, message index, phase, step, chunk) and the
  op's descriptor (kind, count, dtype, op, algorithm, root); see wire.py;
* a frame from another generation, an older op, or that does not parse is dropped and logged;
  a frame from a later op is kept until this rank gets there;
* a frame whose descriptor differs from ours means the ranks called different things: every
  rank is told (ABORT) and raises CollectiveMismatch naming the rank that differs;
* every wait has a deadline; on expiry the transport is asked whom to blame (diagnose.py) and
  every rank is told, so all raise CollectiveTimeout naming the same culprit;
* a collective of a group that survives failures ends with a commit round; a failure inside it
  is settled the same on every survivor (settle_failure, membership/diagnose.py's outcome).

`OpChannel` is the narrow interface every algorithm sees (algorithms/__init__.py): rank, size,
send, recv_into, recv_reduce.
Wrappers (tracing, fault injection) wrap an OpChannel and forward those five names.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from ..common.errors import CollectiveTimeout, Evicted, PeerFailure
from ..common.ops import ReduceOp, reduce_into
from .zmq.registered import may_lend
from .stash import take
from .base import (
    ABANDONED,
    COMPLETED,
    LACKED,
    PROBE_AFTER,
    PROBE_EVERY,
    TRACE,
    OpContext,
    Transport,
)
from . import aborts
from .linkprobe import probe_links
from .linkstats import FRESH
from .vetting import admit, check_taken

# (the header's field indices under the names OpChannel has always used)
from .wire import (
    ABORT,
    DATA,
    Descriptor,
    H_PHASE as _H_PHASE,
    H_SEQ as _H_SEQ,
    H_SENT as _H_SENT,
    H_STEP as _H_STEP,
    H_TYPE as _H_TYPE,
    P2P_ABORT,
    P2P_DATA,
    PROBE,
    STREAM_OF,
    encode_header,
)

log = logging.getLogger("collectives")


def _addr_range(arr: np.ndarray) -> tuple[int, int]:
    start = arr.__array_interface__["data"][0]
    return start, start + arr.nbytes


class OpChannel:
    """One collective operation's view of the group: the only thing an algorithm sees."""

    def __init__(
        self,
        transport: Transport,
        seq: int,
        desc: Descriptor | list | None,
        op_name: str,
        timeout: float,
        p2p_peer: int | None = None,
        p2p_send: bool = False,
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
        self.abort_peers = None if p2p_peer is None else ([p2p_peer] if p2p_send else [])
        self.rank = transport.rank
        self.size = transport.size
        self.segment_bytes = transport.segment_bytes
        self.leaders_min_bytes = transport.leaders_min_bytes
        self.link_segment_bytes = transport.link_segment_bytes
        self.seq = seq
        # What the op is (wire.py, Descriptor), and the list every header carries
        self.descriptor = None if desc is None else Descriptor(*desc)
        self.desc = None if self.descriptor is None else self.descriptor.wire()
        self.op_name = op_name
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.sent_index = [0] * self.size  # messages sent to each peer in this op
        self.recv_index = [0] * self.size  # messages taken from each peer in this op
        self.pending = []  # (start, end, tracker) of zero-copy sends in flight
        self.has_data = False  # this rank's result is in place (hold_result)
        self.lend = may_lend(self.descriptor)  # registered buffers may be lent (registered.py)
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
        self.step_label = ""

    # --- the channel interface --------------------------------------------------------------
    def send(self, peer: int, buf: np.ndarray, *, phase: str = "", step: int = 0, chunk: int = 0):
        """Start sending `buf` to `peer`. The buffer must not change until the op ends; a later
        receive into the same memory waits for this send first (see _guard)."""
        self._set_phase(phase, step)
        for piece in self._pieces(buf):
            header = encode_header(
                self.data_type,
                self.t.generation,
                self.seq,
                self.rank,
                self.sent_index[peer],
                phase,
                step,
                chunk,
                self.desc,
                time.time(),  # linkstats.py times the link from it
            )
            self.sent_index[peer] += 1
            if log.isEnabledFor(TRACE):
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
            zero_copy = piece.nbytes >= self.t.zero_copy_bytes
            tracker = self.t.post(peer, header, piece, zero_copy)
            if tracker is not None:
                start, end = _addr_range(piece)
                self.pending.append((start, end, tracker))

    def recv_into(
        self, peer: int, out: np.ndarray, *, phase: str = "", step: int = 0, chunk: int = 0
    ):
        """Block until `peer`'s next message arrives and copy it into `out`."""
        into = out if out.flags.c_contiguous else np.empty_like(out, order="C")
        for piece in self._pieces(into):
            payload = self._take(peer, piece, phase, step)
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
    ):
        """Block until `peer`'s next message arrives and reduce it into `out` (out = out op msg)."""
        into = out if out.flags.c_contiguous else np.ascontiguousarray(out)
        for piece in self._pieces(into):
            payload = self._take(peer, piece, phase, step)
            self._guard(piece)
            if piece.nbytes:
                reduce_into(op, piece, payload)
            self.t.release(payload)
        if into is not out:
            out[...] = into

    def _pieces(self, arr: np.ndarray):
        """A buffer as the messages that carry it: itself, or, when it is larger than a
        segment, segment-sized pieces in order. Ring and tree cut their buffers so already;
        this cuts the others' (direct, naive, send/recv, ...) the same way, so that no message
        is larger than a segment and a receiver can refuse any that is (transport/zmq/transport.py)."""
        if arr.nbytes <= self.segment_bytes:
            return (arr,)
        flat = arr.reshape(-1)  # a view: the caller gives a contiguous array
        n = max(1, self.segment_bytes // arr.itemsize)
        return [flat[a : a + n] for a in range(0, flat.size, n)]

    # --- op boundaries ------------------------------------------------------------------------
    def begin(self):
        t = self.t
        self.ctx.in_op = self.stream == 0
        t.begin_op(self.ctx)
        aborts.check_failure(self)
        # An ABORT for this op may have arrived while we were still in an earlier one.
        for (src, stream), stash in t.early.items():
            if not stash:
                continue
            if stream == 0 and self.stream == 0:
                # Frames left over from ops that ended early (an abort) are stale now; drop
                # them here, so their shared-memory slots go back to the senders (in any
                # order: stash.take).
                while (item := take(stash, lambda h: h[_H_SEQ] < self.seq)) is not None:
                    t.release(item[1])
            if stream == self.stream and (
                self.stream == 0 or (src == self.p2p_peer and not self.p2p_send)
            ):
                for h, _ in stash:
                    if h[_H_SEQ] == self.seq and h[_H_TYPE] == self.abort_type:
                        aborts.raise_abort(self, h)
        return self

    def hold_result(self):
        """This rank's result is in place: what follows is the commit round (see
        algorithms/commit.py). From here on a failure no longer simply aborts the op here:
        it is settled with the other survivors (settle_failure)."""
        self.has_data = True
        if self.stream == 0:
            self.ctx.has_data = True

    def finish(self):
        """Wait until no send references the caller's buffer any more; then the op is over."""
        for _, _, tracker in self.pending:
            self._wait_tracker(tracker)
        self.pending.clear()
        if self.stream == 0:
            self.t.record(self.seq, COMPLETED)
            self.ctx.in_op = False

    def settle_failure(self, exc: BaseException) -> bool:
        """After `exc` ended this op early: True if the op counts all the same. It does only
        where this rank held its result (the commit round) and the arbiter's verdict, the
        same on every survivor, is that every survivor holds it; the failure then shows at
        the next op. Otherwise the op is dropped here, and recorded so, so that the other
        survivors drop it too."""
        if self.stream != 0:
            return False
        # A mismatch is a programming error, and an evicted rank is no survivor: not settled.
        settles = isinstance(exc, (CollectiveTimeout, PeerFailure)) and not isinstance(exc, Evicted)
        if not self.has_data or not settles:
            self.t.record(self.seq, LACKED)
            return False
        verdict = self.t.settle(self.seq, self.timeout)
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

    def probe_links(self, token: int, peers, nbytes: int, window: float) -> dict:
        """This rank's side of a stall diagnosis' probe round (linkprobe.py)."""
        return probe_links(self, token, peers, nbytes, window)

    # --- internals ----------------------------------------------------------------------------
    def _set_phase(self, phase, step):
        self.phase = phase
        self.step_label = step

    def _wait_tracker(self, tracker):
        # In slices, so that a peer declared dead (its sends never complete) ends the wait.
        while not self.t.wait_sent(tracker, min(0.2, max(self.deadline - time.monotonic(), 0))):
            aborts.check_failure(self)
            if time.monotonic() >= self.deadline:
                aborts.timed_out(self, None, "waiting for a send to complete")

    def _guard(self, out: np.ndarray):
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

    def _take(self, peer: int, out: np.ndarray, phase: str, step):
        """Return the payload of the next message from `peer` in this op."""
        self._set_phase(phase, step)
        want = self.recv_index[peer]
        t = self.t
        early = t.early.get((peer, self.stream))
        found = None
        if early:
            # Frames that came before we got here; older ops' frames are stale and dropped.
            # This op's first frame may sit behind a later op's (stash.take).
            while early:
                h, payload = early[0]
                if h[_H_SEQ] < self.seq:
                    t.release(early.popleft()[1])
                    log.debug(
                        "rank %d dropped a stale frame from rank %d (op #%d < #%d)",
                        self.rank,
                        peer,
                        h[_H_SEQ],
                        self.seq,
                    )
                    continue
                if h[_H_SEQ] == self.seq:
                    found = early.popleft()
                elif len(early) > 1:
                    found = take(early, lambda h: h[_H_SEQ] == self.seq)
                break
        self.ctx.waiting_on = peer
        probe_at = time.monotonic() + PROBE_AFTER
        waiting_since = time.time()  # wall clock, as the headers' sent_at (linkstats.py)
        try:
            while found is None:
                now = time.monotonic()
                remaining = self.deadline - now
                if remaining <= 0:
                    aborts.timed_out(self, peer, f"waiting for rank {peer}")
                if self.stream == 0 and now >= probe_at:
                    self._probe()
                    probe_at = now + PROBE_EVERY
                called = time.time()
                got = t.next_frame(min(remaining, 0.5, max(probe_at - now, 0.001)))
                if got is None:
                    # A failure notice ends only a wait that is starved: frames that already
                    # arrived (say from a peer that sent its last message and then left) are
                    # still used, so an op that can finish does.
                    aborts.check_failure(self, starved=True)
                    continue
                src, raw, payload = got
                try:
                    h = admit(self, src, raw)
                except BaseException:
                    t.release(payload)
                    raise
                if h is None:
                    t.release(payload)
                    continue
                if h[_H_TYPE] == self.data_type:  # fail-slow: every data frame times its link
                    now_wall = time.time()
                    t.linkstats.arrived(
                        src,
                        memoryview(payload).nbytes,
                        h[_H_SENT],
                        now_wall,
                        waiting_since if src == peer else now_wall,
                        seen_arriving=now_wall - called >= FRESH,
                    )
                stream = STREAM_OF[h[_H_TYPE]]
                if stream != self.stream or h[_H_SEQ] > self.seq or src != peer:
                    current = self.seq if self.stream == 0 else t.collective.seq
                    try:
                        t.early.put(
                            self.rank,
                            src,
                            stream,
                            h,
                            payload,
                            h[_H_SEQ] - current if stream == 0 else None,
                            self.op_name,
                            t.generation,
                        )
                    except BaseException:
                        t.release(payload)
                        raise
                    continue
                found = (h, payload)
        finally:
            self.ctx.waiting_on = None
        h, payload = found
        try:
            check_taken(self, peer, h, payload, out, want, phase, step)
        except BaseException:
            t.release(payload)
            raise
        self.recv_index[peer] = want + 1  # counted only once taken: diagnosis reads this
        if log.isEnabledFor(TRACE):
            log.log(
                TRACE,
                "rank %d <- rank %d: %s op #%d %s step %s message #%d, %d B",
                self.rank,
                peer,
                self.op_name,
                self.seq,
                h[_H_PHASE],
                h[_H_STEP],
                want,
                memoryview(payload).nbytes,
            )
        return payload

    def _probe(self):
        """Tell every rank what this rank is waiting in (see PROBE)."""
        header = encode_header(
            PROBE, self.t.generation, self.seq, self.rank, 0, self.phase, 0, 0, self.desc
        )
        for peer in range(self.size):
            if peer != self.rank:
                try:
                    self.t.post(peer, header, b"", False)
                except Exception as exc:  # failure detection reports dead peers, not this
                    log.debug("rank %d could not probe rank %d: %s", self.rank, peer, exc)


__all__ = ["OpChannel"]
