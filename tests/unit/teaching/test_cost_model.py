"""One cost model, four witnesses: for every all_reduce with a closed form and every world
size n = 2..16, the closed form (emulate.cost), crossover_bytes, the emulator's virtual clock
(emulate.LinkModel) and the trace's round count (invariants.port_rounds, and check's expected
row) give the same numbers.

Invariants: with alpha = 1 and beta = 0 the emulated time is the formula's rounds, and so is
the trace's single-port round count; with alpha = 0 and beta = 1 it is the formula's bytes
factor times N (N a multiple of n, so that every chunk is equal); at crossover_bytes ring and
tree cost the same, and the emulator finds the tree faster at half that size and the ring at
twice it; where crossover_bytes is None the ring is never slower. The hierarchical all_reduce's
T in algorithms.md is costmodel.hierarchical_time's price, and the emulator's figures quoted
beside it are the emulated run's.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import collectives as cl
from collectives.teaching import emulate, invariants
from collectives.teaching.trace import Tracer

pytestmark = [pytest.mark.fast, pytest.mark.timeout(120)]

WORLDS = range(2, 17)
BIG_SEGMENT = 1 << 30  # one segment per message: the closed forms are unpipelined


def emulated(algorithm, n, count, alpha, beta, tracer=None):
    model = emulate.LinkModel(alpha, beta)
    wrappers = [model.wrap] + ([tracer.wrap] if tracer else [])
    cl.simulate(
        n,
        lambda pg: pg.all_reduce(np.ones(count, np.float32), algorithm=algorithm),
        wrappers=wrappers,
        segment_bytes=BIG_SEGMENT,
    )
    return model.makespan()


@pytest.mark.parametrize("algorithm", emulate.COSTED)
@pytest.mark.parametrize("n", WORLDS)
def test_formula_emulator_and_trace_agree(algorithm, n):
    c = emulate.cost(algorithm, n)
    count = 16 * n  # float32: N = 64 n bytes, a multiple of n and of every power of two <= n
    tracer = Tracer()
    assert emulated(algorithm, n, count, 1.0, 0.0, tracer) == pytest.approx(c.rounds)
    assert invariants.port_rounds(invariants.data_events(tracer.events)) == c.rounds
    report = invariants.check(tracer.events, algorithm, world_size=n, count=count, itemsize=4)
    assert report.ok, str(report)
    assert report.rows[0][0].startswith("rounds") and report.rows[0][2] == c.rounds
    nbytes = count * 4
    assert emulated(algorithm, n, count, 0.0, 1.0) == pytest.approx(c.per_byte * nbytes)


@pytest.mark.parametrize("n", WORLDS)
def test_crossover_bytes_agrees_with_the_emulator(n):
    alpha, beta = 50e-6, 1e-9
    star = emulate.crossover_bytes(n, alpha, beta)

    def faster(nbytes):
        count = max(1, round(nbytes / 4 / n)) * n
        ring = emulated("ring", n, count, alpha, beta)
        tree = emulated("tree", n, count, alpha, beta)
        return "ring" if ring <= tree else "tree"

    if star is None:
        # n = 2, 3: ring and tree take as many rounds and the ring moves fewer bytes
        assert emulate.cost("ring", n).rounds == emulate.cost("tree", n).rounds
        assert faster(64) == faster(1 << 20) == "ring"
        return
    assert emulate.ring_time(star, n, alpha, beta) == pytest.approx(
        emulate.tree_time(star, n, alpha, beta)
    )
    assert faster(star / 2) == "tree" and faster(2 * star) == "ring"


@pytest.mark.parametrize("n", WORLDS)
def test_halving_doubling_has_both_terms_at_powers_of_two(n):
    """The tree's rounds and the ring's bytes together where n is a power of two; the fold
    costs two rounds and 2 N beta otherwise."""
    hd, ring, tree = (emulate.cost(a, n) for a in ("halving_doubling", "ring", "tree"))
    if n & (n - 1) == 0:
        assert hd.rounds == tree.rounds and hd.per_byte == pytest.approx(ring.per_byte)
    else:
        p = 1 << (n.bit_length() - 1)
        assert hd.rounds == 2 * (p.bit_length() - 1) + 2
        assert hd.per_byte == pytest.approx(2 * (p - 1) / p + 2)


@pytest.mark.parametrize("n", [4, 6])
def test_halving_doubling_on_the_stepper(n):
    """The stepper lets one event happen at a time: halving-doubling ends with the same sum
    everywhere (rank r contributes 2^r: the sum is 2^n - 1), in 2 log2 p messages each way
    per rank of the p, plus the fold pairs' four."""

    def fn(pg):
        x = np.full(6, 1 << pg.rank, np.int64)
        pg.all_reduce(x, algorithm="halving_doubling")
        return x

    s = cl.simulate(n, fn, step=True)
    try:
        events = list(s)
        results = s.results()
    finally:
        s.close()
    assert all((r == (1 << n) - 1).all() for r in results)
    p = 1 << (n.bit_length() - 1)
    sends = [e for e in events if e["kind"] == "send"]
    assert len(sends) == 2 * (p.bit_length() - 1) * p + 2 * (n - p)


def test_segments_only_add_alphas_in_this_model():
    """--segment-bytes cuts messages, it does not change a schedule: on 8 ranks at 4 MiB every
    algorithm is slower emulated with 64 KiB segments than its one-message formula, by the
    figures the tutorial prints."""
    from collectives.teaching.explain.run import crossover
    from support.procs import ROOT

    tutorial = " ".join((ROOT / "docs" / "tutorial.md").read_text(encoding="utf-8").split())
    [(nbytes, row)] = crossover(50e-6, 1e-9, 8, [4 << 20], segment_bytes=65536)
    assert nbytes == 4 << 20
    for alg, (model, emulated_s) in row.items():
        assert emulated_s > model, alg
        said = f"{alg.replace('_', '-')} {emulated_s * 1e6:,.0f} us against {model * 1e6:,.0f} us"
        assert said in tutorial, said


def emulated_segmented(algorithm, n, count, segment_bytes, alpha, beta, tracer=None):
    model = emulate.LinkModel(alpha, beta)
    wrappers = [model.wrap] + ([tracer.wrap] if tracer else [])
    cl.simulate(
        n,
        lambda pg: pg.all_reduce(np.ones(count, np.float32), algorithm=algorithm),
        wrappers=wrappers,
        segment_bytes=segment_bytes,
    )
    return model.makespan()


@pytest.mark.parametrize("segments", [1, 3, 8])
@pytest.mark.parametrize("n", WORLDS)
def test_double_tree_formula_emulator_and_trace_agree(n, segments):
    """Three sizes: each half of N in 1, 3 or 8 segments of 64 B. The formula R(n, S) (alpha +
    s beta) counts double_tree.program's steps through costmodel's port model; the emulator
    runs the real schedule on threads, and the trace counts the rounds of what ran."""
    c = emulate.cost("double_tree", n, segments)
    seg_elems = 16  # float32: 64 B a segment
    count = 2 * segments * seg_elems
    nbytes = count * 4
    tracer = Tracer()
    assert emulated_segmented("double_tree", n, count, 64, 1.0, 0.0, tracer) == c.rounds
    assert invariants.port_rounds(invariants.data_events(tracer.events)) == c.rounds
    assert emulated_segmented("double_tree", n, count, 64, 0.0, 1.0) == pytest.approx(
        c.per_byte * nbytes
    )
    alpha, beta = 50e-6, 1e-9
    assert emulated_segmented("double_tree", n, count, 64, alpha, beta) == pytest.approx(
        c.time(nbytes, alpha, beta)
    )
    assert c.time(nbytes, alpha, beta) == pytest.approx(c.rounds * (alpha + 64 * beta))


@pytest.mark.parametrize("n", WORLDS)
def test_double_tree_ranks_are_interior_in_at_most_one_tree(n):
    from collectives.algorithms import double_tree

    for r in range(n):
        interior = [bool(double_tree.node(r, n, t).children) for t in (0, 1)]
        assert sum(interior) <= 1, (r, n)


def test_double_tree_rounds_are_the_busiest_port_plus_a_fill():
    """The tutorial's R(n, S) = 4S + fill: the busiest port's messages per segment are counted
    from the two trees (one per child and one to the parent, in each tree, each way), and the
    port model's rounds are that times S plus a fill of 1 to 10 rounds for n = 4..16; at n = 2
    and 3 the busiest ranks are roots and carry 2 and 3 (R = 2S, and 3S + 3 from S = 2)."""
    from collectives.algorithms import double_tree
    from support.procs import ROOT

    def busiest_per_segment(n: int) -> int:
        def load(r: int) -> int:
            nodes = [double_tree.node(r, n, t) for t in (0, 1)]
            return sum(len(x.children) + (x.parent is not None) for x in nodes)

        return max(load(r) for r in range(n))

    assert [busiest_per_segment(n) for n in (2, 3)] == [2, 3]
    fills = []
    for n in range(2, 17):
        for s in range(1, 13):
            fill = emulate.double_tree_rounds(n, s) - busiest_per_segment(n) * s
            if n == 2:
                assert fill == 0, (n, s)
            elif n == 3 and s >= 2:
                assert fill == 3, (n, s)
            elif n >= 4:
                assert busiest_per_segment(n) == 4, n
                fills.append(fill)
    assert (min(fills), max(fills)) == (1, 10)
    text = " ".join((ROOT / "docs" / "tutorial.md").read_text(encoding="utf-8").split())
    assert "plus a fill of 1 to 10 rounds from `n = 4` to 16" in text
    assert "`R` is `2S` and `3S + 3` (`S >= 2`)" in text


def test_double_tree_against_halving_doubling_as_algorithms_md_says():
    """algorithms.md: never faster than halving-doubling at a power of two, but faster than its
    fold elsewhere from about 1 MiB (so the qualifier is needed)."""
    from support.procs import ROOT

    alpha, beta = 50e-6, 1e-9

    def faster(n: int, size: int) -> bool:
        s = emulate.best_double_tree_segments(n, size, alpha, beta)
        dt = emulate.cost("double_tree", n, s).time(size, alpha, beta)
        return dt < emulate.cost("halving_doubling", n).time(size, alpha, beta)

    # 8, 16 and 32 ranks: test_the_pipelining_section_figures
    assert not any(faster(n, size) for n in (2, 4) for size in (64 << 10, 1 << 20, 4 << 20))
    assert all(faster(n, 1 << 20) and faster(n, 4 << 20) for n in (5, 6))
    text = " ".join((ROOT / "docs" / "algorithms.md").read_text(encoding="utf-8").split())
    assert "never beats halving-doubling at a power of two (elsewhere, from about 1 MiB" in text


def test_the_pipelining_section_figures():
    """The tutorial's pipelining section: the binomial tree's root floor under segments, and
    where the model puts the double tree against the ring, computed here."""
    from collectives.teaching.explain.run import DEFAULT_SIZES, crossover
    from support.procs import ROOT

    text = " ".join((ROOT / "docs" / "tutorial.md").read_text(encoding="utf-8").split())
    alpha, beta, n, nbytes = 50e-6, 1e-9, 8, 4 << 20
    floor = 2 * ((n - 1).bit_length()) * nbytes * beta
    [(_, row)] = crossover(alpha, beta, n, [nbytes], ("tree",), segment_bytes=65536)
    emulated_s = row["tree"][1]
    assert emulated_s > floor
    assert f"says {emulated_s * 1e6:,.0f} us, over that floor of {floor * 1e6:,.0f} us" in text
    mib = 1 << 20
    dt = emulate.cost("double_tree", 32, emulate.best_double_tree_segments(32, mib, alpha, beta))
    ring = emulate.cost("ring", 32)
    assert dt.time(mib, alpha, beta) < ring.time(mib, alpha, beta)
    said = f"on 32 ranks still at 1 MiB ({dt.time(mib, alpha, beta) * 1e6:,.0f} us against "
    assert said + f"{ring.time(mib, alpha, beta) * 1e6:,.0f}" in text
    for m in (2, 4, 8, 16, 32):  # never faster than halving-doubling at a power of two
        for size in (64, 64 << 10, mib, 4 * mib):
            s = emulate.best_double_tree_segments(m, size, alpha, beta)
            hd = emulate.cost("halving_doubling", m).time(size, alpha, beta)
            t = emulate.cost("double_tree", m, s).time(size, alpha, beta)
            assert t == pytest.approx(hd) if m == 2 else t > hd, (m, size)
    assert "At a power of two halving-doubling is never slower (at 2 ranks the two tie)" in text

    def at8(alg, size):
        s = emulate.best_double_tree_segments(n, size, alpha, beta) if alg == "double_tree" else 1
        return emulate.cost(alg, n, s).time(size, alpha, beta)

    # on 8 ranks it passes the ring exactly at the crossover table's sizes up to some size
    passes = [size for size in DEFAULT_SIZES if at8("double_tree", size) < at8("ring", size)]
    assert passes == [size for size in DEFAULT_SIZES if size <= passes[-1]]
    assert f"on 8 ranks up to {passes[-1] >> 10} KiB in the table" in text
    small = DEFAULT_SIZES[0]
    said = f"({at8('double_tree', small) * 1e6:,.1f} us against {at8('ring', small) * 1e6:,.1f}"
    assert said + f" at {small} B)" in text


@pytest.mark.parametrize("n", WORLDS)
def test_auto_never_takes_double_tree_where_the_model_does_not(n):
    """group/tuning.py's rule: auto takes an algorithm only where it is predicted and measured
    faster. The model never prices double_tree (at its best segment count) under all of ring,
    tree and halving-doubling at 2..16 ranks, 64 B .. 64 MiB (it passes ring and tree at
    some, e.g. 6 ranks at 64 KiB, where halving-doubling is faster still); so auto must not
    pick it at any of them."""
    from collectives.group import tuning

    alpha, beta = 50e-6, 1e-9
    for size in (64 << (2 * i) for i in range(11)):
        s = emulate.best_double_tree_segments(n, size, alpha, beta)
        dt = emulate.cost("double_tree", n, s).time(size, alpha, beta)
        best_other = min(
            emulate.cost(a, n).time(size, alpha, beta) for a in ("ring", "tree", "halving_doubling")
        )
        assert dt >= best_other * (1 - 1e-12), (n, size)
        assert tuning.all_reduce_algorithm(size, n) != "double_tree"


def test_double_tree_height_is_floor_log2_n_as_the_tutorial_says():
    """The tutorial: each binary tree is floor(log2 n) levels deep, so a segment goes up and
    down its tree in at most 2 floor(log2 n) messages. Counted from double_tree.node's parent
    links, in both trees, for n = 2..64."""
    from collectives.algorithms import double_tree
    from support.procs import ROOT

    def levels(r: int, n: int, t: int) -> int:
        up = 0
        while (p := double_tree.node(r, n, t).parent) is not None:
            r, up = p, up + 1
        return up

    for n in range(2, 65):
        height = max(levels(r, n, t) for r in range(n) for t in (0, 1))
        assert height == n.bit_length() - 1, n  # floor(log2 n)
    text = " ".join((ROOT / "docs" / "tutorial.md").read_text(encoding="utf-8").split())
    assert "each of its binary trees is `floor(log2 n)` levels deep" in text
    assert "up and down in at most `2 floor(log2 n)` messages" in text


def _hosts(h, m):
    return [host for host in range(h) for _ in range(m)]


@pytest.mark.parametrize("h,m", [(2, 2), (2, 3), (3, 2), (2, 4), (3, 3)])
@pytest.mark.parametrize("k", [1, 2])
def test_hierarchical_formula_is_the_cost_model(h, m, k):
    """algorithms.md's T for the hierarchical all_reduce is costmodel.hierarchical_time's
    price, term for term, with different figures within and across hosts."""
    from collectives.algorithms.costmodel import LinkCosts, LinkFigure, hierarchical_time

    hosts = _hosts(h, m)
    n = len(hosts)
    a_l, r_l, a_x, r_x = 3e-6, 8e9, 70e-6, 1e9
    cross = tuple(
        LinkFigure(s, d, r_x, a_x) for s in range(n) for d in range(n) if hosts[s] != hosts[d]
    )
    c = LinkCosts(n, r_l, a_l, cross)
    nbytes = float(1 << 20)
    b_l, b_x = 1 / r_l, 1 / r_x
    if k == 1:
        lg = (m - 1).bit_length()
        t = 2 * lg * (a_l + nbytes * b_l) + 2 * (h - 1) * (a_x + nbytes / h * b_x)
    else:
        t = 2 * (m - 1) * (a_l + nbytes / k * b_l) + 2 * (h - 1) * (a_x + nbytes / (k * h) * b_x)
    assert hierarchical_time(list(range(n)), nbytes, c, hosts, leaders_k=k) == pytest.approx(t)
    from support.procs import ROOT

    text = " ".join((ROOT / "docs" / "algorithms.md").read_text(encoding="utf-8").split())
    assert "T = 2(m-1)·(alpha_l + N/k·beta_l) + 2(H-1)·(alpha_x + N/(kH)·beta_x)" in text
    assert "T = 2·ceil(log2 m)·(alpha_l + N·beta_l) + 2(H-1)·(alpha_x + N/H·beta_x)" in text


def test_hierarchical_emulated_as_algorithms_md_says():
    """What the emulator gives the code at 2 hosts x 2 ranks (k = 2), each term alone, against
    the cost model's sum, as algorithms.md quotes them."""
    from collectives.algorithms.costmodel import LinkCosts, LinkFigure, hierarchical_time
    from support.procs import ROOT

    hosts, count = _hosts(2, 2), 192
    nbytes = count * 4

    def emulated(a_l, b_l, a_x, b_x):
        links = {
            (s, d): (a_l, b_l) if hosts[s] == hosts[d] else (a_x, b_x)
            for s in range(4)
            for d in range(4)
            if s != d
        }
        model = emulate.LinkModel(links=links)
        cl.simulate(
            4,
            lambda pg: pg.all_reduce(np.ones(count, np.float32), algorithm="hierarchical"),
            wrappers=[model.wrap],
            hosts=hosts,
            segment_bytes=BIG_SEGMENT,
        )
        return model.makespan()

    got = [
        emulated(1, 0, 0, 0),
        emulated(0, 0, 1, 0),
        emulated(0, 1, 0, 0) / nbytes,
        emulated(0, 0, 0, 1) / nbytes,
    ]

    def priced(a_l, b_l, a_x, b_x):  # tiny stand-ins for 0: LinkCosts takes no free link
        cross = tuple(
            LinkFigure(s, d, 1 / b_x, a_x)
            for s in range(4)
            for d in range(4)
            if hosts[s] != hosts[d]
        )
        return hierarchical_time(
            list(range(4)), nbytes, LinkCosts(4, 1 / b_l, a_l, cross), hosts, 2
        )

    tiny = 1e-12
    summed = [
        priced(1, tiny, tiny, tiny),
        priced(tiny, tiny, 1, tiny),
        priced(tiny, 1, tiny, tiny) / nbytes,
        priced(tiny, tiny, tiny, 1) / nbytes,
    ]

    def said(terms):
        a_l, a_x, b_l, b_x = (Fraction(round(x, 6)).limit_denominator(16) for x in terms)
        per_byte = [f"{'' if b == 1 else f'{b} '}N beta_{s}" for b, s in ((b_l, "l"), (b_x, "x"))]
        return f"{a_l} alpha_l + {a_x} alpha_x + {per_byte[0]} + {per_byte[1]}"

    text = " ".join((ROOT / "docs" / "algorithms.md").read_text(encoding="utf-8").split())
    assert f"runs 2 hosts x 2 ranks in {said(got)}, against the sum's {said(summed)}" in text
    assert got[1] > summed[1] and got[3] > summed[3]  # the code pays more than the sum


def test_the_tutorials_crossover_table_is_explain_crossover_now(capsys):
    """`explain crossover` (8 ranks, 50 us, 1 GB/s) prints the table the tutorial quotes, with
    double_tree's model and emulated columns beside ring, tree and halving-doubling."""
    from collectives.teaching.explain import main
    from support.procs import ROOT

    assert main(["crossover", "--alpha", "50us", "--beta", "1GB/s", "--no-plot"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[1].split()
    for alg in ("ring", "tree", "halving_doubling", "double_tree"):
        assert header.count(alg) == 2, header  # its model and its emulated column
    assert out.strip() in (ROOT / "docs" / "tutorial.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("n", [4, 8])
def test_double_tree_measured_as_the_tutorial_says(n):
    """The kept bench runs (ring, tree, halving-doubling and double_tree at 4 and 8 ranks):
    the sizes where double_tree measured fastest of the four are the ones the tutorial names
    (4 ranks, 1 MiB: its time against the tree's and the ring's; 8 ranks: none), and auto
    takes the double tree at none of the sizes measured."""
    import json

    from collectives.group import tuning
    from support.procs import ROOT

    run = ROOT / "bench" / "results" / "all_reduce" / f"double_tree_{n}ranks.json"
    results = json.loads(run.read_text(encoding="utf-8"))["results"]
    times: dict = {}
    for r in results:
        times.setdefault(r["size"], {})[r["backend"]] = r["time_us"]
    won = [size for size, t in sorted(times.items()) if min(t, key=t.get) == "double_tree"]
    text = " ".join((ROOT / "docs" / "tutorial.md").read_text(encoding="utf-8").split())
    if n == 4:
        assert won == [1 << 20]
        t = times[1 << 20]
        said = (
            f"fastest only at 4 ranks and 1 MiB ({t['double_tree']:,.0f} us against the "
            f"tree's {t['tree']:,.0f} and the ring's {t['ring']:,.0f}"
        )
        assert said in text
    else:
        assert won == [] and "and at 8 ranks never" in text
    assert all(tuning.all_reduce_algorithm(size, n) != "double_tree" for size in times)
