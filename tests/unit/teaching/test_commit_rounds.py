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


class DataRecorder(Recorder):
    """Recorder that also takes an algorithm's reducing receives (direct's, naive's)."""

    def recv_reduce(self, peer: int, arr: np.ndarray, op, **labels) -> None:
        self.program.append(("recv", peer, 0.0))


def op_and_commit_rounds(algorithm: str, n: int, star: bool) -> int:
    """One all_reduce of `algorithm` followed by its commit, on every rank, as one program
    each, through the port model (alpha = 1, beta = 0): what algorithms.md compares."""
    from collectives.algorithms import direct, naive
    from collectives.common.ops import ReduceOp

    run = {"direct": direct.all_reduce, "naive": naive.all_reduce}[algorithm]
    programs = []
    for r in range(n):
        ch = DataRecorder(r, n)
        run(ch, np.ones(4, np.float32), ReduceOp.SUM)  # type: ignore[arg-type]
        commit_alg.commit(ch, star=star)  # type: ignore[arg-type]
        programs.append(ch.program)
    unit = costmodel.LinkCosts(n, rate=1.0, alpha=1.0)
    return round(costmodel._port_model(n, programs, unit, costmodel.identity(n)))


def test_direct_and_its_commit_against_naive_and_the_star_as_algorithms_md_says():
    """algorithms.md, "Choosing an algorithm": with a core per rank, direct plus its all-to-all
    commit (two messages deep) against naive plus the star (four deep), priced by the model at
    4 ranks; the model puts the star's schedule behind, though it is deeper only in messages."""
    n = 4
    assert n <= commit_alg.ALL_TO_ALL_MAX
    fast = op_and_commit_rounds("direct", n, star=False)
    crowded = op_and_commit_rounds("naive", n, star=True)
    assert fast < crowded
    text = " ".join((ROOT / "docs" / "algorithms.md").read_text(encoding="utf-8").split())
    assert f"prices the two at {fast} and {crowded} rounds at {n} ranks" in text
