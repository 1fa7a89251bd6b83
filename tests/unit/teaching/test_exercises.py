"""The tutorial's exercises: every folded answer states what the library computes.

Each test reads one answer from docs/tutorial.md and computes its figures with the library
(emulate, explain, invariants, failures, evidence, tuning): the figure in the text and the one
computed must be the same, so a change to either shows here. Invariant: the doc's answer N
contains every figure the library gives for exercise N.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import collectives as cl
from collectives.group import tuning
from collectives.membership.evidence import min_covers
from collectives.teaching import emulate, failures
from collectives.teaching.explain import explain_run
from support.procs import ROOT

pytestmark = [pytest.mark.fast, pytest.mark.timeout(120)]

TUTORIAL = (ROOT / "docs" / "tutorial.md").read_text(encoding="utf-8")
ALPHA, BETA = 50e-6, 1e-9


def answer(k: int) -> str:
    m = re.search(
        rf"<details><summary>Answer {k}</summary>(.*?)</details>", TUTORIAL, flags=re.DOTALL
    )
    assert m, f"the tutorial has no folded answer {k}"
    return " ".join(m.group(1).split())  # one line: figures may sit across a line break


def row(report, name: str):
    return next(r for r in report.rows if r[0].startswith(name))


def test_there_are_at_least_ten_exercises_each_with_a_folded_answer():
    asked = re.findall(r"\*\*Exercise (\d+)\.\*\*", TUTORIAL)
    assert len(asked) >= 10
    for k in asked:
        answer(int(k))


def test_1_crossover_on_16_ranks():
    star = emulate.crossover_bytes(16, ALPHA, BETA)
    assert f"**{star:,.0f} B**" in answer(1)


def test_2_messages_on_5_ranks():
    a = answer(2)
    ring = explain_run("ring", 5, 5).report
    tree = explain_run("tree", 5, 5).report
    assert row(ring, "messages")[3] == "8 each" and "**8 each**" in a
    assert row(tree, "messages")[3] == "3,1,2,1,1" and "**3,1,2,1,1**" in a


def test_3_the_trees_busiest_rank():
    got = row(explain_run("tree", 8, 8).report, "bytes")[3]
    sent = [int(v) for v in got.split(",")]
    busiest = [r for r, b in enumerate(sent) if b == max(sent)]
    assert busiest == [0, 4] and "Ranks **0 and 4**" in answer(3) and got in answer(3)


def test_4_naive_rounds_and_depth():
    rep = explain_run("naive", 8, 8).report
    assert row(rep, "rounds")[3] == 14 and row(rep, "depth")[3] == 2
    assert "**14 rounds**" in answer(4) and "**depth of 2**" in answer(4)


def test_5_three_ranks_the_ring_always():
    assert emulate.crossover_bytes(3, ALPHA, BETA) is None
    ring = emulate.ring_time(1024, 3, ALPHA, BETA)
    assert ring < emulate.tree_time(1024, 3, ALPHA, BETA)
    assert "**The ring**" in answer(5) and "**None**" in answer(5)


def test_6_halving_doubling_on_6_ranks():
    c = emulate.cost("halving_doubling", 6)
    star = emulate.crossover_bytes(6, ALPHA, BETA, small="halving_doubling", large="ring")
    assert c.rounds == 6 and "**6 rounds**" in answer(6)
    assert f"**{star:,.0f} B**" in answer(6)


def test_7_a_slow_link_off_the_trees_path():
    def run(algorithm, slow):
        model = emulate.LinkModel(ALPHA, BETA, links=slow)
        cl.simulate(
            8,
            lambda pg: pg.all_reduce(np.ones(1024, np.float32), algorithm=algorithm),
            wrappers=[model.wrap],
        )
        return model.makespan()

    slow = {(5, 6): (10 * ALPHA, 10 * BETA)}
    assert run("ring", slow) == pytest.approx(10 * run("ring", None))
    assert run("tree", slow) == pytest.approx(run("tree", None))
    assert "**10 times**" in answer(7) and "**the same time**" in answer(7)


def test_8_a_stall_and_its_culprit():
    st = failures.stepped_stall(3, culprit=2)
    assert sorted(st.stalled) == [(1, 2), (2, 0)] and st.blamed == [2]
    assert "Links **1->2 and 2->0**" in answer(8) and "rank **2**" in answer(8)


def test_9_the_fewest_ranks_on_every_bad_link():
    assert min_covers([(0, 1), (1, 2), (1, 3)]) == [(1,)]
    ties = min_covers([(0, 1), (2, 3)])
    assert "**rank 1**" in answer(9)
    assert "**" + ", ".join(str(c) for c in ties) + "**" in answer(9)


def test_10_commit_or_drop():
    c = failures.stepped_crash(3, victim=1, after=5)
    assert c.held == {0: True, 2: False} and c.outcome == "abort"
    assert "Rank **0 holds it and rank 2 does not**" in answer(10) and "**dropped**" in answer(10)


def test_11_what_auto_runs():
    picks = [tuning.all_reduce_algorithm(b, 4) for b in (64, 1 << 20, 64 << 20)]
    assert ", ".join(f"**{p}**" for p in picks[:2]) + f" and **{picks[2]}**" in answer(11)
    # the crossovers the answer names: the last size each of direct and tree is picked at
    sizes = [1 << k for k in range(6, 27)]
    last = {
        alg: max(s for s in sizes if tuning.all_reduce_algorithm(s, 4) == alg)
        for alg in ("direct", "tree")
    }
    assert f"crossover ({last['direct'] >> 10} KiB at 4 ranks)" in answer(11)
    assert f"up to {last['tree'] >> 20} MiB" in answer(11)


def test_12_reductions_of_direct_and_ring(monkeypatch):
    """The report counts the additions of what arrives; direct's ranks > 0 also add their own
    buffer in locally (direct.reduce_into): counted here by wrapping it."""
    from collectives.algorithms import direct as direct_alg

    local = []
    real = direct_alg.reduce_into

    def counting(op, out, x):
        local.append(out.size)
        real(op, out, x)

    monkeypatch.setattr(direct_alg, "reduce_into", counting)
    wire = int(row(explain_run("direct", 4, 4).report, "reductions")[3])
    per_element = wire + len(local)  # each local addition covers the whole buffer
    ring = row(explain_run("ring", 4, 4).report, "reductions")[3]
    text = answer(12)
    assert f"**{per_element}**" in text and f"**{wire}**" in text and f"**{ring}**" in text


def chain_time(n, nbytes, segments, alpha, beta):
    """A pipelined chain broadcast 0 -> 1 -> ... -> n-1, priced by costmodel's port model."""
    from collectives.algorithms import costmodel as cm

    seg = nbytes / segments
    progs = (
        [[("send", 1, seg)] * segments]
        + [[("recv", i - 1, seg), ("send", i + 1, seg)] * segments for i in range(1, n - 1)]
        + [[("recv", n - 2, seg)] * segments]
    )
    costs = cm.LinkCosts(n, rate=1 / beta, alpha=alpha)
    return cm._port_model(n, progs, costs, cm.identity(n))


def test_13_best_segment_of_a_pipelined_chain():
    n, nbytes = 8, 4 << 20
    # the formula, and the port model at every segment count: the best count is the
    # formula's N/s* rounded, its time the formula's T*
    s_star = (nbytes * ALPHA / ((n - 2) * BETA)) ** 0.5
    t_star = ((n - 2) * ALPHA) ** 0.5 + (nbytes * BETA) ** 0.5
    t_star *= t_star
    times = {S: chain_time(n, nbytes, S, ALPHA, BETA) for S in range(1, 64)}
    best = min(times, key=times.get)
    assert best == round(nbytes / s_star)
    assert times[best] == pytest.approx(t_star, rel=1e-4)
    text = answer(13)
    assert f"**{s_star:,.0f} B**" in text and f"**{t_star * 1e6:,.0f} us**" in text
    assert f"**{times[1] * 1e6:,.0f} us**" in text and f"at {best} segments" in text


def test_14_double_tree_bytes_against_tree_and_ring():
    from collectives.teaching import invariants

    n, count, item = 8, 8, 8
    nbytes = count * item
    factor = {
        alg: max(invariants.expected(alg, n, count, item).nbytes) / nbytes
        for alg in ("double_tree", "tree", "ring")
    }
    text = answer(14)
    for alg, f in factor.items():
        assert f"**{f:g}N**" in text, (alg, f)
    sent = list(map(int, row(explain_run("double_tree", n, count).report, "bytes")[3].split(",")))
    busiest = max(sent)
    assert f"{busiest} B of {nbytes}" in text
    # the busiest are the ranks with a parent and two children in one tree; the roots send less
    from collectives.algorithms import double_tree

    def full(r):
        return any(
            x.parent is not None and len(x.children) == 2
            for x in (double_tree.node(r, n, t) for t in (0, 1))
        )

    ranks = [r for r in range(n) if sent[r] == busiest]
    assert ranks == [r for r in range(n) if full(r)]
    assert f"ranks **{ranks[0]} to {ranks[-1]}** here" in text and ranks == list(
        range(ranks[0], ranks[-1] + 1)
    )
    roots = [r for r in range(n) if any(double_tree.node(r, n, t).parent is None for t in (0, 1))]
    kids = {len(double_tree.node(r, n, t).children) for r in roots for t in (0, 1)} - {0}
    assert kids == {1} and sent[roots[0]] == sent[roots[1]] == nbytes  # 2 messages of N/2
    messages = sent[roots[0]] // (nbytes // 2)
    said = f"the two roots, {roots[0]} and {roots[1]}, each with one child, send {messages}"
    assert f"{said} messages, `N`" in text


def test_15_where_double_tree_passes_the_binomial_tree():
    from collectives.teaching.explain.run import crossover

    sizes = [64 << 10, 256 << 10]
    rows = crossover(ALPHA, BETA, 8, sizes, algorithms=("tree", "double_tree"))
    (_, small), (_, large) = rows
    assert small["tree"][1] < small["double_tree"][1]
    assert large["double_tree"][1] < large["tree"][1]
    segs = emulate.best_double_tree_segments(8, 256 << 10, ALPHA, BETA)
    text = answer(15)
    assert f"**{segs}** segments" in text and "**256 KiB**" in text
    for nb, r in rows:
        assert f"{r['double_tree'][1] * 1e6:,.1f}" in text and f"{r['tree'][1] * 1e6:,.1f}" in text
