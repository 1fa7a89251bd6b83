"""barrier.py and algorithms.md: after round k of the dissemination barrier each rank has heard,
directly or through others, from the 2^(k+1) - 1 ranks before it. Counted from the partners
barrier() itself sends to and waits for, recorded on a channel that never blocks."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from collectives.algorithms.barrier import barrier

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]


@dataclass
class RecordingChannel:
    """Just what barrier() uses of a Channel: it records whom each step waits for."""

    rank: int
    size: int
    waits_for: dict[int, int] = field(default_factory=dict)

    def send(self, peer: int, buf: np.ndarray, phase: str = "", step: int = 0) -> None:
        pass

    def recv_into(self, peer: int, buf: np.ndarray, phase: str = "", step: int = 0) -> None:
        self.waits_for[step] = peer


@pytest.mark.parametrize("n", range(2, 18))
def test_after_round_k_a_rank_has_heard_from_the_2_to_the_k_plus_1_minus_1_before_it(n):
    channels = [RecordingChannel(r, n) for r in range(n)]
    for ch in channels:
        barrier(ch)  # type: ignore[arg-type]
    rounds = len(channels[0].waits_for)
    assert rounds == (n - 1).bit_length()  # ceil(log2 n)
    heard: list[set[int]] = [set() for _ in range(n)]
    for k in range(rounds):
        heard = [
            (heard[r] | heard[ch.waits_for[k]] | {ch.waits_for[k]}) - {r}
            for r, ch in enumerate(channels)
        ]
        for r in range(n):
            before = {(r - d) % n for d in range(1, min(2 ** (k + 1) - 1, n - 1) + 1)}
            assert heard[r] == before, (n, k, r)
    assert all(h == set(range(n)) - {r} for r, h in enumerate(heard))
    text = " ".join(open("collectives/algorithms/barrier.py", encoding="utf-8").read().split())
    assert "from the 2^(k+1) - 1 ranks before it" in text
