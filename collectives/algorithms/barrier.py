"""Dissemination barrier (Hensgen, Finkel & Manber): ceil(log2 n) rounds of empty messages.

In round k rank r sends to (r + 2^k) mod n and waits for (r - 2^k) mod n. After round k each
rank has heard, directly or through others, from the 2^(k+1) - 1 ranks before it; after
ceil(log2 n) rounds, from everyone -- so nobody leaves before everybody has arrived.

Cost: T = ceil(log2 n) * alpha; no data.
"""

from __future__ import annotations

import numpy as np
from ..common.channel import Channel


def barrier(ch: Channel, phase: str = "barrier") -> None:
    n, r = ch.size, ch.rank
    token = np.empty(0, dtype=np.uint8)
    k, step = 1, 0
    while k < n:
        ch.send((r + k) % n, token, phase=phase, step=step)
        ch.recv_into((r - k) % n, token, phase=phase, step=step)
        k <<= 1
        step += 1
