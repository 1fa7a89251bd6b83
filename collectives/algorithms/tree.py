"""Binomial tree reduce and broadcast; tree all_reduce = reduce to rank 0, then broadcast.

Ranks are renumbered relative to the root (v = (rank - root) mod n). In a binomial tree the
parent of v is v with its lowest set bit cleared, and v's children are v + 2^k for every 2^k
below v's lowest set bit. For n = 8:

        0                        round 1: 0->4          (broadcast order; reduce runs it backwards)
      / | \\                      round 2: 0->2, 4->6
     4  2  1                     round 3: 0->1, 2->3, 4->5, 6->7
    / \\  \\
   6   5  3
   |
   7

Cost for N bytes: ceil(log2 n) rounds each way (the root sends to its children one after
another: its k-th send is round k).
    reduce or broadcast:  T = ceil(log2 n) * (alpha + N * beta)
    all_reduce:           T = 2 ceil(log2 n) * (alpha + N * beta)   (+ reductions)
The latency term grows only with log n, the bandwidth term is about log2 n times ring's
(n ceil(log2 n) / (n-1); the total on the wire is the ring's, the root's share
n ceil(log2 n) / (2(n-1)), about log2 n / 2, times the ring's per rank, and the reduce and
the broadcast run one after the other): use it for small buffers or many ranks. Large
buffers are cut into segments that stream down (or up) the tree one after another, so a rank
forwards segment j while segment j+1 is still on its way.

Each internal rank adds its children's contributions in a fixed order and the root's result is
broadcast, so every rank ends with the root's bytes.
"""

from __future__ import annotations

import numpy as np

from ..common.channel import Channel
from ..common.ops import ReduceOp, finalize
from .chunks import segment_elems, segments


def parent_of(v: int) -> int | None:
    return None if v == 0 else v & (v - 1)


def children_of(v: int, n: int) -> list[int]:
    """Children in broadcast order: the largest subtree first, so it starts earliest."""
    low = (v & -v) if v else 1 << max(n - 1, 0).bit_length()
    kids, k = [], 1
    while k < low and v + k < n:
        kids.append(v + k)
        k <<= 1
    return kids[::-1]


def _relatives(ch: Channel, root: int) -> tuple[int | None, list[int]]:
    n = ch.size
    v = (ch.rank - root) % n
    p = parent_of(v)
    parent = None if p is None else (p + root) % n
    children = [(c + root) % n for c in children_of(v, n)]
    return parent, children


def reduce(
    ch: Channel, buf: np.ndarray, op: ReduceOp, root: int = 0, keep_input: bool = True
) -> None:
    """Reduce `buf` from every rank into `buf` on `root`. With keep_input, a non-root rank's
    buffer is left untouched (an internal rank sums into a scratch copy)."""
    parent, children = _relatives(ch, root)
    if children and parent is not None and keep_input:
        buf = buf.copy()
    seg = segment_elems(ch, buf.itemsize)
    for a, b in segments(0, buf.size, seg):
        for c in reversed(children):  # smallest subtree first: it finishes first
            ch.recv_reduce(c, buf[a:b], op, phase="reduce", step=0, chunk=a)
        if parent is not None:
            ch.send(parent, buf[a:b], phase="reduce", step=0, chunk=a)
    if parent is None:
        finalize(op, buf, ch.size)


def broadcast(ch: Channel, buf: np.ndarray, root: int = 0) -> None:
    """Copy `buf` from `root` to every rank, down the tree, segment by segment."""
    parent, children = _relatives(ch, root)
    seg = segment_elems(ch, buf.itemsize)
    for a, b in segments(0, buf.size, seg):
        if parent is not None:
            ch.recv_into(parent, buf[a:b], phase="broadcast", step=0, chunk=a)
        for c in children:
            ch.send(c, buf[a:b], phase="broadcast", step=0, chunk=a)


def all_reduce(ch: Channel, buf: np.ndarray, op: ReduceOp) -> None:
    """Reduce up the tree to rank 0 (in place), then broadcast the result down."""
    reduce(ch, buf, op, root=0, keep_input=False)
    broadcast(ch, buf, root=0)
