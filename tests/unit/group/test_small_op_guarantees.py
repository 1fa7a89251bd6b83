"""Small all_reduces on a cached plan (group/collective.py, AllReducePlan; prebuilt headers,
transport/wire.py, HeaderForms) keep the op path's guarantees, over the in-process transport:

* a rank that stops calling is blamed by name by every other rank (the stall diagnosis reads
  the same progress counts the prebuilt path keeps), and the group's results before it were
  exact;
* a failure notice (what failure detection hands the transport for a dead peer) ends a wait
  of such an op at once as that PeerFailure, not at the deadline as a timeout.

Neither is timed: the deadline only bounds a wait that must fail."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from collectives.common.errors import CollectiveTimeout, PeerFailure
from support.timing import scaled

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]

WARM = 5  # ops on the same plan before the one that fails: the plan and its headers are kept


def _run(pgs, fn):
    """fn(rank, pg) on a thread per group; {rank: what it returned or raised}."""
    out: dict[int, object] = {}

    def one(pg):
        try:
            out[pg.rank] = fn(pg.rank, pg)
        except BaseException as exc:  # noqa: BLE001 -- the test reads it
            out[pg.rank] = exc

    threads = [threading.Thread(target=one, args=(pg,), daemon=True) for pg in pgs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(scaled(30))
    assert not any(t.is_alive() for t in threads), "an op never ended"
    return out


def _warm(pgs):
    def ops(rank, pg):
        sums = []
        for i in range(WARM):
            buf = np.array([rank + i], np.float32)  # 4 B: the small-op path
            pg.all_reduce(buf)
            sums.append(float(buf[0]))
        return sums

    n = len(pgs)
    want = [float(sum(range(n)) + n * i) for i in range(WARM)]
    assert _run(pgs, ops) == {r: want for r in range(n)}


def test_a_rank_that_stops_calling_is_blamed_by_every_other(inproc_world):
    world, pgs = inproc_world(3, timeout=scaled(1.0))
    _warm(pgs)
    live = pgs[:2]  # rank 2 stops calling
    got = _run(live, lambda r, pg: pg.all_reduce(np.ones(1, np.float32)))
    for r in (0, 1):
        exc = got[r]
        assert isinstance(exc, CollectiveTimeout), exc
        assert exc.peer == 2 and "rank 2" in str(exc), exc
    assert world.diagnoses and all(d[2] == [2] for d in world.diagnoses)


def test_a_failure_notice_ends_the_wait_as_that_failure(inproc_world):
    world, pgs = inproc_world(2, timeout=scaled(20.0))
    _warm(pgs)
    failure = PeerFailure("rank 1 died", op="all_reduce", rank=0, peer=1, failed_ranks=[1])
    entered = threading.Event()

    def waits(rank, pg):
        entered.set()
        return pg.all_reduce(np.ones(1, np.float32))  # rank 1 never sends its part

    caller = threading.Thread(target=lambda: got.update(_run(pgs[:1], waits)), daemon=True)
    got: dict[int, object] = {}
    caller.start()
    assert entered.wait(scaled(10))
    pgs[0].transport.interrupt(failure)  # what failure detection does for a dead peer
    caller.join(scaled(15))  # well before the op's own deadline
    assert not caller.is_alive(), "the wait did not end on the failure notice"
    assert got[0] is failure


def _nan(payload: int) -> np.float32:
    return np.array([0x7FC00000 | payload], np.uint32).view(np.float32)[0]


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("op", ["min", "sum"])
def test_the_small_path_reduces_in_rank_order_to_the_same_bytes(n, op):
    """The small-op path's direct all_reduce (group/smallop.py) gives every rank the bytes of
    the reduction in rank order, x0 op x1 op ..., as direct.all_reduce does: with values
    whose result depends on the order of the operands (MIN of -0.0 and 0.0, of two NaNs of
    different payloads; a float SUM that cancels), not only the same value."""
    import functools

    import collectives as cl

    rows = [
        np.array([-0.0, _nan(r + 1), 0.0, 1e8 if r == 0 else (1.0 if r == 1 else -1e8)], np.float32)
        for r in range(n)
    ]
    rows[1][0], rows[1][2] = 0.0, -0.0  # rank 1 holds the other zero

    def body(pg):
        x = rows[pg.rank].copy()
        pg.all_reduce(x, op=op, algorithm="direct")
        return x.tobytes()

    ufunc = np.minimum if op == "min" else np.add
    want = functools.reduce(lambda a, b: ufunc(a, b), rows).tobytes()
    got = cl.simulate(n, body, timeout=20)
    assert got == [want] * n
