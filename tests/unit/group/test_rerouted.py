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
        book = pg._core.schedules  # the coordinator's part, played by the test
        assert book.propose(1, 2, plan)
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


# --- the small-message path under a plan, on an emulated slow link ----------------------------
# Invariant: under a plan whose figures say 0 <-> 1 runs at 40 Mbit/s against 2 Gbit/s, an
# "auto" all_reduce that would go "direct" over every link is predicted, and emulated with the
# same figures (teaching/emulate.py), faster on the schedule the model picks, which uses
# neither direction of the pair; a 4 B one stays direct (the slow link adds nothing to it);
# every rank ends with the same bytes, the sum.
SLOW = {(0, 1): 5e6, (1, 0): 5e6}  # bytes/s: 40 Mbit/s
HEALTHY, ALPHA = 250e6, 100e-6


def _emulated(n, count, plan, hosts=None, algorithm="auto", slow=SLOW):
    from collectives.teaching.emulate import LinkModel
    from collectives.teaching.trace import Tracer

    links = {k: (ALPHA, 1 / r) for k, r in slow.items()}
    model = LinkModel(ALPHA, 1 / HEALTHY, links=links)
    tracer = Tracer()

    def body(pg):
        if plan is not None:
            book = pg._core.schedules
            assert book.propose(1, 0, plan)
            book.decide(1, True)
        buf = np.arange(count, dtype=np.float32) / 1000 + pg.rank + 1
        pg.all_reduce(buf, algorithm=algorithm)
        return buf

    outs = cl.simulate(
        n, body, wrappers=[model.wrap, tracer.wrap], segment_bytes=1 << 22, hosts=hosts
    )
    used = {(e["rank"], e["peer"]) for e in tracer.events if e["kind"] == "send"}
    return outs, model.makespan(), used


def _plan(n):
    from collectives.algorithms.costmodel import LinkCosts

    costs = LinkCosts.of(n, SLOW, rate=HEALTHY, alpha=ALPHA)
    plan = plan_around(n, list(SLOW), costs)
    assert plan is not None and plan.avoids
    return plan


@pytest.mark.parametrize("n", [3, 4])
def test_a_small_auto_all_reduce_leaves_the_slow_pair_where_it_pays(n):
    count = (32 << 10) // 4  # auto runs direct at this size (group/tuning.py)
    plan = _plan(n)
    outs, t_plan, used = _emulated(n, count, plan)
    _, t_default, used_default = _emulated(n, count, None)
    assert set(SLOW) <= used_default  # direct: every link
    assert not used & set(SLOW), used
    assert t_plan < 0.5 * t_default, (t_plan, t_default)
    want = sum(np.arange(count, dtype=np.float64) / 1000 + r + 1 for r in range(n))
    for o in outs:
        assert o.tobytes() == outs[0].tobytes()
    np.testing.assert_allclose(outs[0], want, rtol=1e-5)
    # 4 B: all latency; direct as it was
    outs, t_tiny, used = _emulated(n, 1, plan)
    assert set(SLOW) <= used
    assert outs[0][0] == sum(r + 1 for r in range(n))


def test_naive_and_hierarchical_asked_by_name_are_reordered_off_the_slow_pair():
    plan = _plan(4)
    outs, t, used = _emulated(4, 8 << 10, plan, algorithm="naive")
    assert not used & set(SLOW), used  # the star rooted at 2
    assert all(o.tobytes() == outs[0].tobytes() for o in outs)
    hosts = [0, 1, 0, 0]  # leaders 0 and 1: the pair is their ring; 2 leads its host instead
    _, t_default, used_default = _emulated(4, 8 << 10, None, hosts, "hierarchical")
    outs, t, used = _emulated(4, 8 << 10, plan, hosts, "hierarchical")
    assert set(SLOW) <= used_default and not used & set(SLOW), used
    assert t < t_default
    want = sum(np.arange(8 << 10, dtype=np.float64) / 1000 + r + 1 for r in range(4))
    assert all(o.tobytes() == outs[0].tobytes() for o in outs)
    np.testing.assert_allclose(outs[0], want, rtol=1e-5)


# --- 8 MiB, the fail-slow scenario's step, traced ------------------------------------------
# Invariant: under the plan the coordinator makes from figures like the scenario's (the slow
# links at 40 Mbit/s, the others at 2 Gbit/s: tests/scenarios/test_failslow.py), an 8 MiB
# all_reduce -- ring or tree asked by name, or auto as the scenario's workers run it -- puts
# not one byte on a slowed link, where the default schedule puts megabytes on one; every
# rank ends with the same bytes, the sum. (pg.rerouted naming the plan is the code describing
# itself; the trace is what was sent.)
BIG = (8 << 20) // 4


def _bytes_per_link(n, slow, plan, algorithm):
    from collectives.teaching.trace import Tracer

    tracer = Tracer()

    def body(pg):
        if plan is not None:
            book = pg._core.schedules
            assert book.propose(1, 0, plan)
            book.decide(1, True)
        buf = np.full(BIG, pg.rank + 1, np.float32)
        pg.all_reduce(buf, algorithm=algorithm)
        return buf

    outs = cl.simulate(n, body, wrappers=[tracer.wrap])
    sent: dict[tuple[int, int], int] = {}
    for e in tracer.events:
        if e["kind"] == "send":
            link = (e["rank"], e["peer"])
            sent[link] = sent.get(link, 0) + e["nbytes"]
    for o in outs:
        assert o.tobytes() == outs[0].tobytes()
    assert np.all(outs[0] == sum(r + 1 for r in range(n)))
    return sent


@pytest.mark.parametrize(
    "n,slow,algorithm",
    [
        (4, [(0, 1), (1, 0)], "ring"),
        (4, [(0, 1), (1, 0)], "auto"),
        (3, [(0, 1), (1, 2)], "ring"),
        (3, [(0, 1), (1, 2)], "auto"),
        (3, [(0, 1), (1, 0)], "tree"),
        (3, [(0, 1), (1, 0)], "auto"),
    ],
)
def test_an_8_mib_all_reduce_under_the_plan_sends_nothing_on_a_slow_link(n, slow, algorithm):
    from collectives.algorithms.costmodel import LinkCosts

    costs = LinkCosts.of(n, {link: 5e6 for link in slow}, rate=HEALTHY, alpha=ALPHA)
    plan = plan_around(n, slow, costs)
    assert plan is not None and plan.avoids
    default = _bytes_per_link(n, slow, None, algorithm)
    assert any(default.get(link, 0) >= 1 << 20 for link in slow), default  # the trace sees it
    rerouted = _bytes_per_link(n, slow, plan, algorithm)
    assert {link: rerouted.get(link, 0) for link in slow} == dict.fromkeys(slow, 0), rerouted
    assert sum(rerouted.values()) >= sum(default.values()) / 2  # the data went another way


# --- a NIC at half speed: the ring with chunks sized by bandwidth ------------------------------
# Invariant: under the plan the coordinator makes for rank 2's NIC at half the healthy pace
# (algorithms/schedule.py plan_for_nics), an 8 MiB all_reduce, ring or auto, gives every rank
# the same bytes, the sum; rank 2 owns most of the buffer, so its two ring links carry about N
# where the equal ring puts 1.5 N on them, and the emulated makespan on the same figures (teaching/emulate.py) is the
# model's: shorter than the equal ring's by at least the 10 % the plan was made for.
@pytest.mark.parametrize("algorithm", ["ring", "auto"])
def test_a_ring_sized_around_a_half_speed_nic_sums_alike_and_runs_faster(algorithm):
    from collectives.algorithms.costmodel import LinkCosts
    from collectives.algorithms.schedule import plan_for_nics
    from collectives.teaching.emulate import LinkModel

    nic = [(2, p) for p in (0, 1, 3)] + [(p, 2) for p in (0, 1, 3)]
    costs = LinkCosts.of(4, {link: HEALTHY / 2 for link in nic}, rate=HEALTHY, alpha=ALPHA)
    plan = plan_for_nics(4, [2], costs)
    assert plan is not None and plan.weights[2] >= 0.9
    sent = {None: _bytes_per_link(4, nic, None, algorithm)}
    sent[plan] = _bytes_per_link(4, nic, plan, algorithm)
    assert sent[None][(1, 2)] == sent[None][(2, 3)] == 6 * BIG  # 1.5 N, N = 4 * BIG bytes
    for link in ((1, 2), (2, 3)):
        assert 4 * BIG <= sent[plan][link] <= 4.5 * BIG  # about N
    t = {}
    for p in (None, plan):
        model = LinkModel(ALPHA, 1 / HEALTHY, links={k: (ALPHA, 2 / HEALTHY) for k in nic})

        def body(pg, p=p):
            if p is not None:
                book = pg._core.schedules
                assert book.propose(1, 0, p)
                book.decide(1, True)
            pg.all_reduce(np.full(BIG, pg.rank + 1, np.float32), algorithm=algorithm)

        cl.simulate(4, body, wrappers=[model.wrap])
        t[p] = model.makespan()
    assert t[plan] <= 0.9 * t[None], t


# --- direct and naive asked by name, where no order of theirs keeps off the slow links -------
# Invariant: with both diagonals of a 4-rank ring slow (0 <-> 2 and 1 <-> 3 at 40 Mbit/s
# against 2 Gbit/s), every star has a slow link and direct uses them all; a 1 MiB all_reduce
# asked as "direct" or "naive" runs under the plan a schedule of another kind that puts
# nothing on them, emulated with the same figures at least twice as fast as the default; a
# 4 B "direct" stays direct (all latency); every rank ends with the same bytes, the sum.
DIAGONALS = {(0, 2): 5e6, (2, 0): 5e6, (1, 3): 5e6, (3, 1): 5e6}


def _emulated_diagonals(count, plan, algorithm):
    """_emulated with both diagonals slow; every rank's bytes the same, the sum."""
    outs, makespan, used = _emulated(4, count, plan, algorithm=algorithm, slow=DIAGONALS)
    for o in outs:
        assert o.tobytes() == outs[0].tobytes()
    want = sum(np.arange(count, dtype=np.float64) / 1000 + r + 1 for r in range(4))
    np.testing.assert_allclose(outs[0], want, rtol=1e-5)
    return makespan, used


@pytest.mark.parametrize("algorithm", ["direct", "naive"])
def test_direct_and_naive_asked_by_name_leave_for_a_schedule_off_the_slow_links(algorithm):
    from collectives.algorithms.costmodel import LinkCosts

    costs = LinkCosts.of(4, DIAGONALS, rate=HEALTHY, alpha=ALPHA)
    plan = plan_around(4, list(DIAGONALS), costs)
    assert plan is not None and plan.avoids
    count = (1 << 20) // 4
    t_default, used_default = _emulated_diagonals(count, None, algorithm)
    t_plan, used = _emulated_diagonals(count, plan, algorithm)
    assert used_default & set(DIAGONALS)
    assert not used & set(DIAGONALS), used
    assert t_plan < 0.5 * t_default, (t_plan, t_default)
    if algorithm == "direct":
        _, used_tiny = _emulated_diagonals(1, plan, "direct")
        assert set(DIAGONALS) <= used_tiny  # 4 B: direct as asked
