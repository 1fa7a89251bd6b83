"""Pairwise-exchange all_to_all (MPI_Alltoall / Alltoallv; Thakur, Rabenseifner & Gropp).

Rank r holds one block for every rank p (block p of its input goes to rank p) and ends with
one block from every rank (block p of its output came from rank p). Its own block is copied
locally; the others move in n-1 steps, one partner each way per step:

    step s = 1 .. n-1:  rank r sends its block for rank (r+s) mod n to that rank,
                        and receives from rank (r-s) mod n the block that rank holds for r.

  n=3, input blocks written "source>destination":
      local:   r0 keeps 0>0, r1 keeps 1>1, r2 keeps 2>2
      step 1:  r0 -0>1-> r1,  r1 -1>2-> r2,  r2 -2>0-> r0
      step 2:  r0 -0>2-> r2,  r1 -1>0-> r0,  r2 -2>1-> r1

Every step is a permutation: each rank sends one block and receives one, so no link and no
receiver is asked to take two at once (an all-at-once exchange would have n-1 messages land on
every rank together). A rank enters step s+1 once step s's block has arrived.

Cost for N bytes of input per rank, in n equal blocks:
    T = (n-1) * alpha + (n-1)/n * N * beta
which is optimal in bandwidth (every byte that must leave a rank leaves it once); the latency
term grows with n. Blocks larger than a segment are cut into segments (chunks.py), each its
own message, so no message exceeds ch.segment_bytes.

Uneven blocks (Alltoallv): the block sizes are given per rank. Only rank p knows how much it
sends to r, and only r how much it expects from p, so a disagreement is found by the receiver
(its message has the wrong size) alone. `confirm=True` ends the exchange with an empty
message to every other rank and one from each, so that such a finding reaches every rank
before it returns (one message deep, the commit round's exchange: 2n - 3 rounds of the
single-port model on its own); with equal blocks the count travels in every header, and every rank checks every
other rank's directly.

Nothing is reduced: every byte arrives as it was sent, so the result is the same on any
transport and any run.
"""

from __future__ import annotations

import numpy as np

from ..common.channel import Channel
from .chunks import Bounds, segment_elems, segments

_EMPTY = np.empty(0, np.uint8)


def all_to_all(
    ch: Channel,
    out: np.ndarray,
    buf: np.ndarray,
    send_bounds: Bounds,
    recv_bounds: Bounds,
    confirm: bool = False,
) -> None:
    """buf[send_bounds[p][0]:send_bounds[p][1]] goes to rank p; what rank p sends lands in
    out[recv_bounds[p][0]:recv_bounds[p][1]]. Both 1-D; the caller checked that this rank's
    own block has the same size in both."""
    n, r = ch.size, ch.rank
    (a, b), (c, d) = send_bounds[r], recv_bounds[r]
    out[c:d] = buf[a:b]  # local: my block for myself
    seg = segment_elems(ch, buf.itemsize)
    for s in range(1, n):
        to, frm = (r + s) % n, (r - s) % n
        for a, b in segments(*send_bounds[to], seg):  # my block for rank r+s
            ch.send(to, buf[a:b], phase="exchange", step=s, chunk=a)
        for c, d in segments(*recv_bounds[frm], seg):  # rank r-s's block for me
            ch.recv_into(frm, out[c:d], phase="exchange", step=s, chunk=c)
    if confirm and n > 1:
        for p in range(n):
            if p != r:
                ch.send(p, _EMPTY, phase="confirm")
        for p in range(n):
            if p != r:
                ch.recv_into(p, _EMPTY, phase="confirm")
