"""ring vs tree vs direct all_reduce on threads (cl.simulate): schedule cost without sockets.

Each round includes starting and joining the rank threads (a fixed cost for all algorithms),
so compare algorithms with each other, not with the socket benchmarks.
"""

import numpy as np
import pytest

import collectives as cl


@pytest.mark.parametrize("nbytes", [1 << 10, 1 << 20])
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("algorithm", ["ring", "tree", "direct"])
def test_inproc_all_reduce(benchmark, algorithm, world, nbytes):
    bufs = [np.ones(nbytes // 4, np.float32) for _ in range(world)]

    def body(pg):
        for _ in range(10):
            pg.all_reduce(bufs[pg.rank], algorithm=algorithm)

    benchmark.pedantic(cl.simulate, args=(world, body), rounds=5, iterations=1)
    assert np.all(bufs[0] == bufs[-1])
