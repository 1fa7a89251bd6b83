"""Ring all_reduce: reduce-scatter, then all-gather (Patarasuk & Yuan; Baidu; Gloo; NCCL).

The buffer is cut into n chunks. Ranks sit on a ring; each sends only to its right neighbour
and receives only from its left one.

  reduce-scatter, n-1 steps: at step s rank r sends chunk (r-1-s) and receives chunk (r-2-s),
      adding what arrives into its own copy. Each chunk travels once round the ring, picking up
      one contribution per hop; after n-1 steps rank r holds chunk r fully reduced.
  all-gather, n-1 steps: rank r sends the finished chunk r; at step s it receives chunk (r-1-s)
      and, except at the last step, forwards it. After n-1 steps every rank has every chunk.
      (Each piece of chunk r goes out as soon as the reduce-scatter's last step completes it:
      the two phases overlap by one step.)

  n=3, chunks a b c (rank 0 ends with a, rank 1 with b, rank 2 with c):
      reduce-scatter step 0:  r0 -c-> r1,  r1 -a-> r2,  r2 -b-> r0
      reduce-scatter step 1:  r0 -b-> r1,  r1 -c-> r2,  r2 -a-> r0   (now r0:a r1:b r2:c final)
      all-gather step 0:      r0 -a-> r1,  r1 -b-> r2,  r2 -c-> r0
      all-gather step 1:      r0 -c-> r1,  r1 -a-> r2,  r2 -b-> r0

Cost for N bytes: 2(n-1) steps, each rank sends 2(n-1)/n * N bytes:
    T = 2(n-1) * alpha + 2(n-1)/n * N * beta  (+ (n-1)/n * N * gamma for the additions)
The bandwidth term is optimal, the latency term grows with n: use it for large buffers.

Every chunk is reduced n-1 times in all, once at each rank it passes (that rank adds its own
contribution to what arrives), and completed once, at its owner; from there it is only copied,
never recomputed: all ranks end with the same bytes.
Large chunks are cut into segments and each segment is forwarded as soon as it is reduced, so
the links and the adder work at the same time (pipelining).

A composed schedule (hierarchical.py) can hook into all_reduce: ready(a, b) is called just
before the ring first reads buf[a:b] (sends it, or adds into it), final(a, b) as soon as
buf[a:b] holds its result; the pieces are the segments of the chunks, in touch_order().
"""

from __future__ import annotations

import numpy as np

from ..common.channel import Channel
from ..common.ops import ReduceOp, finalize
from .chunks import Bounds, OnPiece, chunk_bounds, segment_elems, segments


def touch_order(r: int, n: int) -> tuple[list[int], list[int]]:
    """The chunks rank r first reads, in order (its own copy of r-1 goes out at step 0, then
    the chunk arriving at each reduce-scatter step), and the order in which they become final
    (its own chunk r after the reduce-scatter, then the one arriving at each all-gather step).

    >>> touch_order(0, 3)
    ([2, 1, 0], [0, 2, 1])
    """
    return ([(r - 1 - s) % n for s in range(n)], [(r - s) % n for s in range(n)])


def _reduce_scatter(
    ch: Channel,
    buf: np.ndarray,
    op: ReduceOp,
    bounds: Bounds,
    ready: OnPiece | None = None,
    complete: OnPiece | None = None,
) -> None:
    """After this, chunk ch.rank of `buf` holds the reduction over all ranks (in place).
    complete(a, b) is called for each piece of it as soon as that piece has every
    contribution (in the last step)."""
    n, r = ch.size, ch.rank
    left, right = (r - 1) % n, (r + 1) % n
    seg = segment_elems(ch, buf.itemsize)
    order = touch_order(r, n)[0]

    def pieces(c: int) -> Bounds:
        return segments(*bounds[c], seg)

    first = order[0]  # r-1
    for a, b in pieces(first):  # step 0: our own copy of chunk r-1
        if ready:
            ready(a, b)
        ch.send(right, buf[a:b], phase="reduce-scatter", step=0, chunk=first)
    for s in range(n - 1):
        c = order[s + 1]  # r-2-s: the chunk arriving at step s
        for a, b in pieces(c):
            if ready:
                ready(a, b)
            ch.recv_reduce(left, buf[a:b], op, phase="reduce-scatter", step=s, chunk=c)
            if s < n - 2:  # forward each piece as soon as it is summed
                ch.send(right, buf[a:b], phase="reduce-scatter", step=s + 1, chunk=c)
            elif complete:  # the last step: our own chunk, done
                complete(a, b)


def _all_gather(
    ch: Channel,
    buf: np.ndarray,
    bounds: Bounds,
    final: OnPiece | None = None,
    own_sent: bool = False,
) -> None:
    """Rank r starts with chunk r of `buf` final; after this every chunk is. own_sent: step 0
    (sending chunk r) was done already, piece by piece, as the reduce-scatter completed it."""
    n, r = ch.size, ch.rank
    left, right = (r - 1) % n, (r + 1) % n
    seg = segment_elems(ch, buf.itemsize)
    order = touch_order(r, n)[1]
    for a, b in () if own_sent else segments(*bounds[r], seg):  # step 0: the chunk we own
        ch.send(right, buf[a:b], phase="all-gather", step=0, chunk=r)
    for s in range(n - 1):
        c = order[s + 1]  # r-1-s: the chunk arriving at step s
        for a, b in segments(*bounds[c], seg):
            ch.recv_into(left, buf[a:b], phase="all-gather", step=s, chunk=c)
            if s < n - 2:
                ch.send(right, buf[a:b], phase="all-gather", step=s + 1, chunk=c)
            if final:
                final(a, b)


def all_reduce(
    ch: Channel,
    buf: np.ndarray,
    op: ReduceOp,
    *,
    ready: OnPiece | None = None,
    final: OnPiece | None = None,
    divide_by: int | None = None,
    bounds: Bounds | None = None,
) -> None:
    """Reduce `buf` (1-D, contiguous) across all ranks, in place, on every rank.

    ready / final: see the module's docstring. divide_by: what AVG divides by (default: the
    ring's size; a ring of hosts' leaders divides by the whole world's). bounds: the chunk
    each rank ends the reduce-scatter with (default: chunk_bounds, n near-equal ones;
    gloo_ring.py passes Gloo's)."""
    n = ch.size
    if n == 1:
        pieces = segments(0, buf.size, segment_elems(ch, buf.itemsize))
        if ready is not None:
            for a, b in pieces:
                ready(a, b)
        finalize(op, buf, divide_by or 1)
        if final is not None:
            for a, b in pieces:
                final(a, b)
        return
    r = ch.rank
    bounds = bounds or chunk_bounds(buf.size, n)

    def complete(
        a: int, b: int
    ) -> None:  # a piece of our chunk r holds every contribution: it is final
        finalize(op, buf[a:b], divide_by or n)  # AVG: divide once, by the owner
        ch.send((r + 1) % n, buf[a:b], phase="all-gather", step=0, chunk=r)  # all-gather, at once
        if final:
            final(a, b)

    _reduce_scatter(ch, buf, op, bounds, ready, complete)
    _all_gather(ch, buf, bounds, final, own_sent=True)


def reduce_scatter(ch: Channel, buf: np.ndarray, op: ReduceOp) -> None:
    """`buf` holds n equal chunks; afterwards chunk ch.rank is the reduction of everyone's
    chunk ch.rank (the rest of `buf` is scratch)."""
    n = ch.size
    bounds = chunk_bounds(buf.size, n)
    if n > 1:
        _reduce_scatter(ch, buf, op, bounds)
    finalize(op, buf[slice(*bounds[ch.rank])], n)


def all_gather(ch: Channel, buf: np.ndarray) -> None:
    """`buf` holds n equal chunks, chunk ch.rank filled in; afterwards all are."""
    if ch.size > 1:
        _all_gather(ch, buf, chunk_bounds(buf.size, ch.size))
