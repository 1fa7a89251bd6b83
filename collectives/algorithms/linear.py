"""Linear gather and scatter: the root exchanges one block with every other rank directly.

Gather to root t: every rank p != t sends its block to t, which puts it in row p of its
output, taking the ranks in order 0, 1, ..., n-1; t's own block is copied locally. Scatter
from t is the same schedule run backwards: t sends row p of its input to rank p.

  n=4, root 0, blocks written by the rank they belong to:
      gather:   r1 -1-> r0,  r2 -2-> r0,  r3 -3-> r0          (depth 1, 3 rounds: r0 ends with 0 1 2 3)
      scatter:  r0 -1-> r1,  r0 -2-> r2,  r0 -3-> r3          (depth 1, 3 rounds)

Cost for blocks of M bytes (the root's buffer holds N = n*M), a depth of one message; in the
single-port model (docs/proofs.md) the root's port takes (or gives) one block a round:
    T = (n-1) * (alpha + M * beta)
The root's link carries every block one after another, which is also the least any schedule
can do: all (n-1) * M bytes must reach (or leave) the root. A binomial tree would cut the
latency term to ceil(log2 n) * alpha but route blocks through other ranks (more bytes moved in
all); at the world sizes this library runs (a few to a few dozen ranks) the linear schedule, of
depth one, is the clearer, and its root-bound cost is the same. Blocks larger than a segment
are cut into segments (chunks.py), each its own message.

Mismatches (rooted.py's confirm messages, empty, one hop): in a gather the root has seen every
rank's block -- each checked on arrival -- and then releases the others, who wait for it, so a
rank that differs is reported on every rank. In a scatter every rank first tells the root it
is here, and the root sends only once all have (with two ranks at once: the only receiver
checks what it gets itself).
"""

from __future__ import annotations

import numpy as np

from ..common.channel import Channel
from .chunks import segment_elems, segments
from .rooted import release

_EMPTY = np.empty(0, np.uint8)


def gather(ch: Channel, out: np.ndarray | None, buf: np.ndarray, root: int) -> None:
    """Rank p's `buf` lands in out[p*k:(p+1)*k] on `root` (k = buf.size); `out` is used on
    the root only."""
    n, r, k = ch.size, ch.rank, buf.size
    seg = segment_elems(ch, buf.itemsize)
    if r != root:
        for a, b in segments(0, k, seg):
            ch.send(root, buf[a:b], phase="gather", step=0, chunk=a)
    else:
        if out is None:
            raise ValueError(f"gather: the root, rank {root}, has no output buffer")
        out[r * k : (r + 1) * k] = buf  # the root's own block
        for p in range(n):
            if p != root:
                for a, b in segments(p * k, (p + 1) * k, seg):
                    ch.recv_into(p, out[a:b], phase="gather", step=0, chunk=a - p * k)
    release(ch, root)


def scatter(ch: Channel, out: np.ndarray, buf: np.ndarray | None, root: int) -> None:
    """Block p of the root's `buf` (k = out.size elements at p*k) lands in `out` on rank p;
    `buf` is used on the root only."""
    n, r, k = ch.size, ch.rank, out.size
    seg = segment_elems(ch, out.itemsize)
    if r != root:
        ch.send(root, _EMPTY, phase="confirm")
        for a, b in segments(0, k, seg):
            ch.recv_into(root, out[a:b], phase="scatter", step=0, chunk=a)
        return
    if buf is None:
        raise ValueError(f"scatter: the root, rank {root}, has no input buffer")
    others = [p for p in range(n) if p != root]
    if n > 2:
        for p in others:  # everyone is here: send
            ch.recv_into(p, _EMPTY, phase="confirm")
    for p in others:
        for a, b in segments(p * k, (p + 1) * k, seg):
            ch.send(p, buf[a:b], phase="scatter", step=0, chunk=a - p * k)
    out[...] = buf[r * k : (r + 1) * k]  # the root's own block
    if n == 2:
        ch.recv_into(others[0], _EMPTY, phase="confirm")
