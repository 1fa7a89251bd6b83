"""The reference all_reduce: everyone sends to rank 0, rank 0 reduces in rank order, sends back.

    step 1 (gather + reduce): rank r>0 sends its buffer to rank 0; rank 0 adds rank 1's, then
                              rank 2's, ... into its own, in that order.
    step 2 (broadcast):       rank 0 sends the result to every rank r>0.

Cost for N bytes: a depth of 2 messages, but rank 0 receives and sends (n-1)*N bytes, one
message after another in the single-port model (docs/proofs.md):
    T = 2 (n-1) * (alpha + N * beta)
Obviously correct, and the other algorithms are checked against it. Slow where every rank has
a core of its own (rank 0 does all the work while the others wait), but it sends the fewest
messages of all, 2(n-1) against direct's n(n-1): on a host crowded with 2+ ranks per core,
where the ranks take turns and every message costs the op its interpreter time, "auto" runs
it for small buffers (group/tuning.py, crowded).
"""

from __future__ import annotations

import numpy as np

from ..common.channel import Channel
from ..common.ops import ReduceOp, finalize


def all_reduce(ch: Channel, buf: np.ndarray, op: ReduceOp) -> None:
    if ch.rank == 0:
        for peer in range(1, ch.size):
            ch.recv_reduce(peer, buf, op, phase="reduce", step=peer - 1, chunk=0)
        finalize(op, buf, ch.size)
        for peer in range(1, ch.size):
            ch.send(peer, buf, phase="broadcast", step=0, chunk=0)
    else:
        ch.send(0, buf, phase="reduce", step=0, chunk=0)
        ch.recv_into(0, buf, phase="broadcast", step=0, chunk=0)
