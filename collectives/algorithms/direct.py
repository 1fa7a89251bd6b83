"""Direct all_reduce: every rank sends its whole buffer to every other rank (a depth of one message), then
each rank reduces the n contributions itself, in rank order 0, 1, ..., n-1.

    depth 1: rank r sends its buffer to every rank p != r, and receives theirs.
    local:   result = ((b0 op b1) op b2) ... op b(n-1), the same order on every rank.

Cost for N bytes: a depth of one message; in the single-port model (docs/proofs.md) each
rank's n-1 sends and n-1 receives go one after another, T = (2n-3) * (alpha + N * beta), plus
(n-1) reductions on every rank.
One message deep instead of the ring's 2(n-1) or the tree's 2 floor(log2 n), so for a few bytes it
is the fastest; its traffic grows as n^2, so it is only for small buffers. Every rank applies the same
elementwise operations to the same operands in the same order, so every rank gets the same bytes.
"""

from __future__ import annotations

import numpy as np

from ..common.channel import Channel
from ..common.ops import ReduceOp, finalize, reduce_into


def all_reduce(ch: Channel, buf: np.ndarray, op: ReduceOp) -> None:
    n, r = ch.size, ch.rank
    for peer in range(n):
        if peer != r:
            ch.send(peer, buf, phase="exchange", step=0, chunk=r)
    mine = buf  # rank 0's is where the sum starts: never added in again
    if r != 0:
        mine = buf.copy()  # added in at its place in rank order
        ch.recv_into(0, buf, phase="exchange", step=0, chunk=0)  # start from rank 0's buffer
    for peer in range(1, n):
        if peer == r:
            reduce_into(op, buf, mine)
        else:
            ch.recv_reduce(peer, buf, op, phase="exchange", step=0, chunk=peer)
    finalize(op, buf, n)
