"""Ring all_reduce: reduce-scatter, then all-gather (Patarasuk & Yuan; Baidu; Gloo; NCCL).

The buffer is cut into n chunks. Ranks sit on a ring; each sends only to its right neighbour
and receives only from its left one.

  reduce-scatter, n-1 steps: at step s rank r sends chunk (r-1-s) and receives chunk (r-2-s),
      adding what arrives into its own copy. Each chunk travels once round the ring, picking up
      one contribution per hop; after n-1 steps rank r holds chunk r fully reduced.
  all-gather, n-1 steps: rank r sends the finished chunk r; at step s it receives chunk (r-1-s)
      and, except at the last step, forwards it. After n-1 steps every rank has every chunk.

  n=3, chunks a b c (rank 0 ends with a, rank 1 with b, rank 2 with c):
      reduce-scatter step 0:  r0 -c-> r1,  r1 -a-> r2,  r2 -b-> r0
      reduce-scatter step 1:  r0 -b-> r1,  r1 -c-> r2,  r2 -a-> r0   (now r0:a r1:b r2:c final)
      all-gather step 0:      r0 -a-> r1,  r1 -b-> r2,  r2 -c-> r0
      all-gather step 1:      r0 -c-> r1,  r1 -a-> r2,  r2 -b-> r0

Cost for N bytes: 2(n-1) steps, each rank sends 2(n-1)/n * N bytes:
    T = 2(n-1) * alpha + 2(n-1)/n * N * beta  (+ (n-1)/n * N * gamma for the additions)
The bandwidth term is optimal, the latency term grows with n: use it for large buffers.

Every chunk is reduced once, by its owner, and then copied: all ranks end with the same bytes.
Large chunks are cut into segments and each segment is forwarded as soon as it is reduced, so
the links and the adder work at the same time (pipelining).
"""
from __future__ import annotations

import numpy as np

from ..core.ops import ReduceOp, finalize
from .chunks import chunk_bounds, segment_elems, segments


def _reduce_scatter(ch, buf: np.ndarray, op: ReduceOp, bounds) -> None:
    """After this, chunk ch.rank of `buf` holds the reduction over all ranks (in place)."""
    n, r = ch.size, ch.rank
    left, right = (r - 1) % n, (r + 1) % n
    seg = segment_elems(ch, buf.itemsize)

    def pieces(c):
        return segments(*bounds[c], seg)

    first = (r - 1) % n
    for a, b in pieces(first):                       # step 0: our own copy of chunk r-1
        ch.send(right, buf[a:b], phase="reduce-scatter", step=0, chunk=first)
    for s in range(n - 1):
        c = (r - 2 - s) % n                          # the chunk arriving at step s
        for a, b in pieces(c):
            ch.recv_reduce(left, buf[a:b], op, phase="reduce-scatter", step=s, chunk=c)
            if s < n - 2:                            # forward each piece as soon as it is summed
                ch.send(right, buf[a:b], phase="reduce-scatter", step=s + 1, chunk=c)


def _all_gather(ch, buf: np.ndarray, bounds) -> None:
    """Rank r starts with chunk r of `buf` final; after this every chunk is."""
    n, r = ch.size, ch.rank
    left, right = (r - 1) % n, (r + 1) % n
    seg = segment_elems(ch, buf.itemsize)
    for a, b in segments(*bounds[r], seg):            # step 0: the chunk we own
        ch.send(right, buf[a:b], phase="all-gather", step=0, chunk=r)
    for s in range(n - 1):
        c = (r - 1 - s) % n                          # the chunk arriving at step s
        for a, b in segments(*bounds[c], seg):
            ch.recv_into(left, buf[a:b], phase="all-gather", step=s, chunk=c)
            if s < n - 2:
                ch.send(right, buf[a:b], phase="all-gather", step=s + 1, chunk=c)


def all_reduce(ch, buf: np.ndarray, op: ReduceOp) -> None:
    """Reduce `buf` (1-D, contiguous) across all ranks, in place, on every rank."""
    n = ch.size
    if n == 1:
        finalize(op, buf, 1)
        return
    bounds = chunk_bounds(buf.size, n)
    _reduce_scatter(ch, buf, op, bounds)
    mine = buf[slice(*bounds[ch.rank])]
    finalize(op, mine, n)                            # AVG: divide once, by the owner
    _all_gather(ch, buf, bounds)


def reduce_scatter(ch, buf: np.ndarray, op: ReduceOp) -> None:
    """`buf` holds n equal chunks; afterwards chunk ch.rank is the reduction of everyone's
    chunk ch.rank (the rest of `buf` is scratch)."""
    n = ch.size
    bounds = chunk_bounds(buf.size, n)
    if n > 1:
        _reduce_scatter(ch, buf, op, bounds)
    finalize(op, buf[slice(*bounds[ch.rank])], n)


def all_gather(ch, buf: np.ndarray) -> None:
    """`buf` holds n equal chunks, chunk ch.rank filled in; afterwards all are."""
    if ch.size > 1:
        _all_gather(ch, buf, chunk_bounds(buf.size, ch.size))
