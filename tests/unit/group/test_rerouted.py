"""all_reduce under a plan around slow links (group/rerouted.py), in process.

Invariant: with the same plan in force on every rank from the same op, ring and tree
all_reduce over the plan's order give every rank the same bytes, the sum of the contributions
(rank r contributes r + 1 + i/1000 at element i), before, during and after the plan; and
pg.rerouted names the plan in force."""

import numpy as np
import pytest

import collectives as cl
from collectives.algorithms.schedule import plan_around


def _run(n, plan, algorithm, count=10_000):
    def body(pg):
        book = pg._core.transport.schedules  # the coordinator's part, played by the test
        assert book.propose(1, 2, plan, None)
        book.decide(1, True)
        outs, named = [], []
        for _ in range(4):  # ops 0 and 1 on the default schedule, 2 and 3 on the plan
            buf = np.arange(count, dtype=np.float32) / 1000 + pg.rank + 1
            pg.all_reduce(buf, algorithm=algorithm)
            outs.append(buf)
            named.append(pg.rerouted)
        return outs, named

    return cl.simulate(n, body, segment_bytes=8 << 10)


@pytest.mark.parametrize(
    "n,slow,algorithm",
    [(4, [(0, 1), (1, 0)], "ring"), (3, [(0, 1), (1, 2)], "ring"), (3, [(0, 1), (1, 0)], "tree")],
)
def test_every_rank_gets_the_same_sum_under_the_plan(n, slow, algorithm):
    plan = plan_around(n, slow)
    assert plan is not None and plan.avoids and plan.tree == (algorithm == "tree")
    results = _run(n, plan, algorithm)
    want = sum(np.arange(10_000, dtype=np.float64) / 1000 + r + 1 for r in range(n))
    for op in range(4):
        first = results[0][0][op]
        for outs, _ in results:
            assert outs[op].tobytes() == first.tobytes()  # bitwise, every rank
        np.testing.assert_allclose(first, want, rtol=1e-5)
    for _, named in results:
        assert named[:2] == [None, None]
        assert named[2] == named[3] == plan.describe() and "avoiding" in named[2]
