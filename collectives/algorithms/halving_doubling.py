"""Halving-doubling all_reduce: reduce-scatter by recursive halving, all-gather by recursive
doubling (Rabenseifner; Thakur, Rabenseifner and Gropp 2005; Gloo's allreduce_halving_doubling).

For p = 2^k ranks the buffer is cut into p chunks; rank v ends the reduce-scatter owning
chunk v. The ranks pair up across a distance that halves every step:

  reduce-scatter, k steps, distance d = p/2, p/4, ..., 1: v and its partner v XOR d share a
      range of chunks; v keeps the half whose chunks have bit d equal to v's, sends the other
      half to its partner and adds the partner's copy of its own half into it. The range
      halves every step, so after k steps v holds chunk v with all p contributions.
  all-gather, k steps, distance d = 1, 2, ..., p/2: v sends everything it holds to v XOR d
      and receives as much; the range doubles every step, to the whole buffer.

  p = 4, chunks a b c d (rank 0 ends the halving with a, 1 with b, 2 with c, 3 with d):
      halving  d=2:  r0 -cd-> r2, r2 -ab-> r0,  r1 -cd-> r3, r3 -ab-> r1
      halving  d=1:  r0 -b-> r1,  r1 -a-> r0,   r2 -d-> r3,  r3 -c-> r2   (a, b, c, d final)
      doubling d=1:  r0 -a-> r1,  r1 -b-> r0,   r2 -c-> r3,  r3 -d-> r2
      doubling d=2:  r0 -ab-> r2, r2 -cd-> r0,  r1 -ab-> r3, r3 -cd-> r1

When n is not a power of two (p the largest power of two below n, e = n - p), the first 2e
ranks fold first: even rank 2i sends its whole buffer to 2i+1, which adds it in and stands in
for both (as rank i of the p); ranks from 2e on are ranks r - e of the p. The p ranks run the
schedule above, and each 2i+1 sends the result back to 2i (the unfold).

Cost for N bytes, p = n a power of two: 2 log2 n steps; step j of the halving moves N/2^(j+1)
bytes each way, the doubling the same in reverse, so each rank sends 2(n-1)/n * N bytes:
    T = 2 log2 n * alpha + 2(n-1)/n * N * beta  (+ (n-1)/n * N * gamma for the additions)
the tree's latency term and the ring's bandwidth term together. Otherwise the fold and the
unfold add a step and N bytes each:
    T = (2 floor(log2 n) + 2) * alpha + (2(p-1)/p + 2) * N * beta
A step is one exchange: each rank sends one message and receives one, so in the single-port
model (docs/proofs.md) a step is a round. What it gives up: its partners are far apart (a
ring only ever talks to its neighbours, which matters where links are not all alike), its
messages shrink to N/n (each still pays alpha), and the fold puts N more bytes each way on
every rank 2i+1 that stands in for a pair, and both N-byte messages on the critical path.

Each chunk is completed once, by its owner at the end of the halving, and only copied from
there: every rank ends with the same bytes. Ranges are sent as segments (chunks.py) so that no
message is larger than the channel's segment.
"""

from __future__ import annotations

import numpy as np

from ..common.channel import Channel
from ..common.ops import ReduceOp, finalize
from .chunks import chunk_bounds, segment_elems, segments


def fold(n: int) -> tuple[int, int]:
    """(p, e): p the largest power of two <= n, e = n - p ranks fold into others.

    >>> fold(6)
    (4, 2)
    """
    p = 1 << (n.bit_length() - 1)
    return p, n - p


def virtual_rank(r: int, n: int) -> int | None:
    """Rank r's place among the p ranks that run the halving and doubling; None for an even
    rank below 2e, which hands its buffer to r+1 and waits for the result."""
    _, e = fold(n)
    if r < 2 * e:
        return r // 2 if r % 2 else None
    return r - e


def real_rank(v: int, n: int) -> int:
    """The rank that plays v among the p (the inverse of virtual_rank)."""
    _, e = fold(n)
    return 2 * v + 1 if v < e else v + e


def schedule(v: int, p: int) -> list[tuple[int, tuple[int, int], tuple[int, int]]]:
    """The halving steps of virtual rank v: (partner, chunks sent, chunks kept), chunk ranges
    as [lo, hi). The doubling runs them backwards, sending what was kept and receiving what
    was sent.

    >>> schedule(1, 4)
    [(3, (2, 4), (0, 2)), (0, (0, 1), (1, 2))]
    """
    steps, lo, hi, d = [], 0, p, p // 2
    while d:
        mid = lo + (hi - lo) // 2
        keep, give = ((lo, mid), (mid, hi)) if not v & d else ((mid, hi), (lo, mid))
        steps.append((v ^ d, give, keep))
        lo, hi = keep
        d //= 2
    return steps


def all_reduce(ch: Channel, buf: np.ndarray, op: ReduceOp) -> None:
    """Reduce `buf` (1-D, contiguous) across all ranks, in place, on every rank."""
    n, r = ch.size, ch.rank
    if n == 1:
        finalize(op, buf, 1)
        return
    seg = segment_elems(ch, buf.itemsize)
    p, _ = fold(n)
    v = virtual_rank(r, n)
    whole = segments(0, buf.size, seg)
    if v is None:  # fold: hand everything to r+1, then take the result back
        for a, b in whole:
            ch.send(r + 1, buf[a:b], phase="fold", step=0, chunk=0)
        for a, b in whole:
            ch.recv_into(r + 1, buf[a:b], phase="unfold", step=0, chunk=0)
        return
    folded = r < 2 * (n - p)  # this rank stands in for r-1 as well
    if folded:
        for a, b in whole:
            ch.recv_reduce(r - 1, buf[a:b], op, phase="fold", step=0, chunk=0)

    bounds = chunk_bounds(buf.size, p)

    def pieces(chunks: tuple[int, int]) -> list[tuple[int, int]]:
        lo, hi = chunks
        return segments(bounds[lo][0], bounds[hi - 1][1], seg)

    steps = schedule(v, p)
    for k, (partner, give, keep) in enumerate(steps):  # reduce-scatter by recursive halving
        peer = real_rank(partner, n)
        out, inc = pieces(give), pieces(keep)
        for i in range(max(len(out), len(inc))):
            if i < len(out):
                a, b = out[i]
                ch.send(peer, buf[a:b], phase="reduce-scatter", step=k, chunk=give[0])
            if i < len(inc):
                a, b = inc[i]
                ch.recv_reduce(peer, buf[a:b], op, phase="reduce-scatter", step=k, chunk=keep[0])
    a, b = bounds[v]
    finalize(op, buf[a:b], n)  # chunk v has every contribution: AVG divides once, here

    for k, (partner, give, keep) in enumerate(reversed(steps)):  # all-gather by doubling
        peer = real_rank(partner, n)
        out, inc = pieces(keep), pieces(give)
        for i in range(max(len(out), len(inc))):
            if i < len(out):
                a, b = out[i]
                ch.send(peer, buf[a:b], phase="all-gather", step=k, chunk=keep[0])
            if i < len(inc):
                a, b = inc[i]
                ch.recv_into(peer, buf[a:b], phase="all-gather", step=k, chunk=give[0])
    if folded:
        for a, b in whole:
            ch.send(r - 1, buf[a:b], phase="unfold", step=0, chunk=0)
