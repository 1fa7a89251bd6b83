"""What explain's pictures draw is what the algorithms do, computed from the run, not from
the drawing: the columns are the single-port model's rounds (the emulator's count with alpha = 1,
beta = 0, hierarchical included), the last column is every rank's buffer as its op returned
it, and the ranks drawn as scratch copies are exactly those that summed into one (a tree
reduce's interior ranks: they receive and also send on).
"""

from __future__ import annotations

import numpy as np
import pytest

from collectives.teaching.emulate import LinkModel
from collectives.teaching.explain.run import (
    ALL_REDUCE,
    ROOTED,
    default_hosts,
    explain_run,
    initial,
    make_fn,
)
from collectives.teaching.simulate import simulate

pytestmark = pytest.mark.timeout(120)

CASES = [(a, n) for a in ALL_REDUCE + ROOTED for n in (2, 3, 4, 5, 8)]


@pytest.mark.parametrize("algorithm,n", CASES)
def test_the_columns_are_the_models_rounds(algorithm, n):
    count = 2 * n
    ex = explain_run(algorithm, n, count)
    hosts = default_hosts(n) if algorithm == "hierarchical" else None
    model = LinkModel(alpha=1.0, beta=0.0)
    simulate(
        n,
        make_fn(algorithm, initial(algorithm, n, count)),
        wrappers=[model.wrap],
        hosts=hosts,
    )
    if algorithm in ROOTED:
        # the emulator also counts the rooted ops' empty confirm messages, which the
        # pictures leave out: their rounds are the binomial tree's ceil(log2 n)
        assert ex.rounds == (n - 1).bit_length()
    else:
        assert ex.rounds == round(model.makespan()), (ex.rounds, model.makespan())


@pytest.mark.parametrize("algorithm,n", CASES)
def test_the_last_column_is_what_each_op_returned(algorithm, n):
    ex = explain_run(algorithm, n, 2 * n)
    for r in range(n):
        assert np.array_equal(ex.states[-1][r], ex.finals[r]), r
    interior = set()
    if algorithm == "reduce":
        for r in range(1, n):  # the root sums into the buffer it returns
            kinds = {e["kind"] for e in ex.events if e["rank"] == r}
            if "send" in kinds and "reduce" in kinds:
                interior.add(r)
    assert set(ex.scratch) == interior


def test_the_reduce_picture_returns_rank_2_unchanged():
    """The tutorial's picture: rank 2 sums 2+3 in a scratch copy, sends it, and its own
    buffer comes back as it went in."""
    ex = explain_run("reduce", 4, 4)
    assert ex.scratch == [2]
    assert [int(v) for v in ex.states[1][2]] == [0b1100] * 4  # the copy: ranks 2 and 3
    assert [int(v) for v in ex.states[-1][2]] == [0b0100] * 4  # its own: rank 2 alone
    assert [int(v) for v in ex.states[-1][0]] == [0b1111] * 4


def test_the_hierarchical_paragraph_is_the_trace():
    """The tutorial's hierarchical paragraph, from the traced run of its picture: 7 rounds, 4
    deep; every rank sends host, ring, host message in rounds 1, 2, 3; the ring message is
    taken in round 4; no message is taken in round 2."""
    from support.procs import ROOT

    ex = explain_run("hierarchical", 4, 8)
    depth = next(r[3] for r in ex.report.rows if r[0].startswith("depth"))
    # ex.rounds: the model's rounds (test_the_columns_are_the_models_rounds holds it there)
    sends = {
        r: [
            (e["round"], e["phase"].split(" ")[0])
            for e in ex.events
            if e["rank"] == r and e["kind"] == "send" and "reduce-scatter" in e["phase"]
        ]
        for r in range(4)
    }
    assert all(s == [(1, "host"), (2, "leaders"), (3, "host")] for s in sends.values()), sends
    # a receive's "arrival": the round its port took the message in (rounds.port_rounds)
    ring_taken = {
        e["arrival"]
        for e in ex.events
        if e["kind"] == "reduce" and e["phase"].startswith("leaders")
    }
    taken = {e["arrival"] for e in ex.events if e["kind"] in ("reduce", "recv")}
    text = " ".join((ROOT / "docs" / "tutorial.md").read_text(encoding="utf-8").split())
    said = f"prices it at {ex.rounds} rounds where its longest chain of messages is {depth} deep"
    assert said in text
    assert (
        "sends one host message (round 1), then its ring message (round 2), "
        "then its second host message (round 3)" in text
    )
    assert ring_taken == {4} and 2 not in taken
    assert (
        "waits at the other leader's port until round 4, and round 2 takes no message at all"
        in text
    )
