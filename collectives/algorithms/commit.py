"""Commit round: after an operation's data has moved, every rank learns that every rank holds
its result, and only then returns.

Why: without it a rank can finish an op whose last message to another rank is lost with a
failing peer. If one survivor returns and another raises, the two count their operations
differently from then on and silently pair up different ones (gradients of training step k
averaged with those of training step k+1). With it, a rank returns only when all hold their result; a failure
inside the round is settled by the coordinator, the same on every survivor (diagnose.outcome).

    n <= ALL_TO_ALL_MAX: every rank sends an empty message to every other and waits for theirs
    (a depth of one message; 2n-3 rounds in the single-port model, as direct.py's exchange:
    each rank sends to 0, 1, ... in turn and takes the messages in rank order, so they reach a
    port staggered).
    larger n: a dissemination barrier (barrier.py), ceil(log2 n) rounds.
    star (on a crowded host, group/tuning.py): every rank sends rank 0 an empty message; once
    rank 0 has them all, it sends each an empty message back.

Cost in the single-port model: T = (2n - 3) alpha (n - 1 empty sends per rank, staggered), or
ceil(log2 n) * alpha for large n; no data. The star has a depth of two messages (2(n-1)
rounds: rank 0 takes and gives them one at a time) but only 2(n - 1) messages in all, against
n(n - 1) or n ceil(log2 n): where ranks share cores and take turns, the total count is what costs.
Skipped where nobody could disagree: groups that cannot change membership (cl.simulate), whose
failures nobody survives, and a group of one. A group of two runs it too: a stall whose verdict
evicts nobody (a rank that came late, short of CPU) leaves both, and without the round one of
them may have returned the op's result while the other timed out without it (the simulator
found it: tests/unit/simulation). Its price there (`python -m bench smallop --nproc 2`, CURVE
on, an idle machine: bench/results/smallop/2ranks_commit_round.txt): a 4 B all_reduce took 54
us without the round and 80 us with it; a 64 KiB one 112 and 115 us. A small direct or naive
all_reduce runs this round itself, right after its data, with these messages in this order
(group/smallop.py; its price now: bench/results/smallop/README.md).
"""

from __future__ import annotations

import numpy as np

from ..common.channel import Channel
from .barrier import barrier

# Up to this many ranks one all-to-all exchange (depth one); beyond, dissemination. Measured at 2 ranks per
# core (python -m bench smallop --nproc N, 4 B-16 KiB, two interleaved pairs each, an otherwise
# idle machine): 4 ranks, all-to-all 0-13 % faster; 6 ranks, even; 8 ranks, dissemination 3-23 %
# faster (24 messages in 3 rounds against 56 of depth one: per message interpreter time dominates).
# The 8-rank harness run with it: bench/results/floors/8ranks_dissemination_commit.txt.
ALL_TO_ALL_MAX = 6
SKIP_AT_MOST = 1  # ranks; see above
TOKEN = np.empty(0, dtype=np.uint8)  # what each message of the round carries: nothing


def commit(ch: Channel, star: bool = False) -> None:
    n, r = ch.size, ch.rank
    if star:
        if r == 0:
            for peer in range(1, n):
                ch.recv_into(peer, TOKEN, phase="commit")
            for peer in range(1, n):
                ch.send(peer, TOKEN, phase="commit")
        else:
            ch.send(0, TOKEN, phase="commit")
            ch.recv_into(0, TOKEN, phase="commit")
        return
    if n > ALL_TO_ALL_MAX:
        barrier(ch, phase="commit")
        return
    for peer in range(n):
        if peer != r:
            ch.send(peer, TOKEN, phase="commit")
    for peer in range(n):
        if peer != r:
            ch.recv_into(peer, TOKEN, phase="commit")
