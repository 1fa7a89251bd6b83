"""Ring all_reduce in Gloo's summation order: the same floats, bit for bit, as Gloo's ring.

Floating addition is not associative, so two rings give the same bits only if every element
is summed over the same ranks in the same order. Gloo's ring (gloo/allreduce.cc, the one
torch's ProcessGroupGloo runs for a CPU all_reduce) differs from ring.py in two ways:

  direction  each rank sends to rank r-1 and receives from r+1, so the chunk that rank c ends
             with is summed as x_c + (x_{c+1} + (x_{c+2} + ... + (x_{c-2} + x_{c-1}))):
             it starts at c-1 and picks up c-2, c-3, ... on its way down the ring;
  chunks     the buffer is cut into S = roundup(max(ceil(bytes / 1 MiB), 2n), n) segments of
             ceil(count / S) elements, and rank c owns segments c*S/n .. (c+1)*S/n - 1: the
             last ranks' chunks may be short or empty (ring.py cuts n near-equal chunks).

This file runs ring.py's schedule on a mirrored view of the ranks (rank r plays -r mod n, so
"send right" reaches r-1) with Gloo's chunk bounds; each hop still adds what arrives into the
local copy, as Gloo's does. The cost is ring.py's. At 2 ranks every order is the same; at 3
only the chunk bounds matter (addition commutes); from 4 ranks the direction matters too.
"""

from __future__ import annotations

import numpy as np

from ..common.channel import Channel
from ..common.ops import ReduceOp
from . import ring

GLOO_MAX_SEGMENT_BYTES = 1 << 20  # gloo::detail::AllreduceOptionsImpl::kMaxSegmentSize


def gloo_chunk_bounds(count: int, n: int, itemsize: int) -> list[tuple[int, int]]:
    """The elements rank c of Gloo's ring ends the reduce-scatter with, for c in range(n).

    >>> gloo_chunk_bounds(7, 3, 4)
    [(0, 4), (4, 7), (7, 7)]
    """
    nbytes = count * itemsize
    segs = max(-(-nbytes // GLOO_MAX_SEGMENT_BYTES), 2 * n)
    segs = -(-segs // n) * n  # a multiple of n
    seg = -(-count // segs)  # elements per segment
    per_rank = segs // n * seg
    return [(min(c * per_rank, count), min((c + 1) * per_rank, count)) for c in range(n)]


class _Mirrored:
    """The channel with ranks mirrored (r -> -r mod n): ring.py's right neighbour is r-1."""

    def __init__(self, ch: Channel):
        self._ch = ch
        self.size = ch.size
        self.rank = (-ch.rank) % ch.size
        self.segment_bytes = ch.segment_bytes
        self.link_segment_bytes = ch.link_segment_bytes
        self.leaders_min_bytes = ch.leaders_min_bytes

    def _peer(self, p: int) -> int:
        return (-p) % self.size

    def send(
        self, peer: int, buf: np.ndarray, *, phase: str = "", step: int = 0, chunk: int = 0
    ) -> None:
        self._ch.send(self._peer(peer), buf, phase=phase, step=step, chunk=chunk)

    def recv_into(
        self, peer: int, out: np.ndarray, *, phase: str = "", step: int = 0, chunk: int = 0
    ) -> None:
        self._ch.recv_into(self._peer(peer), out, phase=phase, step=step, chunk=chunk)

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
        self._ch.recv_reduce(self._peer(peer), out, op, phase=phase, step=step, chunk=chunk)


def all_reduce(ch: Channel, buf: np.ndarray, op: ReduceOp) -> None:
    """Reduce `buf` (1-D, contiguous) across all ranks, in place, in Gloo's order."""
    n = ch.size
    if n == 1:
        ring.all_reduce(ch, buf, op)
        return
    gloo = gloo_chunk_bounds(buf.size, n, buf.itemsize)
    # Mirrored rank v is real rank -v: the chunk it must end with is real rank -v's.
    bounds = [gloo[(-v) % n] for v in range(n)]
    ring.all_reduce(_Mirrored(ch), buf, op, bounds=bounds)
