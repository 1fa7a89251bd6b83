"""What the commit round costs in the single-port model, counted from commit.py's own calls.

Invariant: commit.commit's program on every rank, run through the port model that emulate.py
and the traces count in (costmodel's, alpha = 1, beta = 0), takes 2n-3 rounds for the
all-to-all (each rank sends to 0, 1, ... in turn and takes the messages in rank order, so they
reach a port staggered, as direct's do), ceil(log2 n) for the dissemination barrier past
ALL_TO_ALL_MAX ranks, and 2(n-1) for the star; the docs state those counts.
"""

from __future__ import annotations

import numpy as np
import pytest

from collectives.algorithms import commit as commit_alg
from collectives.algorithms import costmodel
from support.procs import ROOT

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]


class Recorder:
    """Just enough of a channel for commit(): it records the calls, in order."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size
        self.program: list[tuple[str, int, float]] = []

    def send(self, peer: int, arr: np.ndarray, **labels) -> None:
        self.program.append(("send", peer, 0.0))

    def recv_into(self, peer: int, arr: np.ndarray, **labels) -> None:
        self.program.append(("recv", peer, 0.0))


def commit_rounds(n: int, star: bool = False) -> int:
    programs = []
    for r in range(n):
        ch = Recorder(r, n)
        commit_alg.commit(ch, star=star)  # type: ignore[arg-type]
        programs.append(ch.program)
    unit = costmodel.LinkCosts(n, rate=1.0, alpha=1.0)
    return round(costmodel._port_model(n, programs, unit, costmodel.identity(n)))


def test_commit_rounds_in_the_port_model():
    for n in range(3, commit_alg.ALL_TO_ALL_MAX + 1):
        assert commit_rounds(n) == 2 * n - 3, n
    for n in range(commit_alg.ALL_TO_ALL_MAX + 1, 17):
        assert commit_rounds(n) == (n - 1).bit_length(), n
    for n in range(3, 17):
        assert commit_rounds(n, star=True) == 2 * (n - 1), n


def test_the_docs_state_those_counts():
    def flat(path: str) -> str:
        return " ".join((ROOT / path).read_text(encoding="utf-8").split())

    assert "takes `2n - 3` rounds of the model" in flat("docs/tutorial.md")
    assert "one empty message deep, `2n - 3` rounds of the single-port model" in flat(
        "docs/faults.md"
    )
    assert "2n-3 rounds in the single-port model" in flat("collectives/algorithms/commit.py")
