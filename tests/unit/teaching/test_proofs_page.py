"""docs/proofs.md's statements about rounds and depth, computed from traced runs.

Invariants: the page says where the single-port rounds and the depth (the longest chain of
messages) part -- never for ring and halving-doubling, for the tree exactly when n is not a
power of two, for naive and direct exactly when n > 2 -- and that direct, priced at 2n-3
rounds, takes fewer rounds than the tree exactly at n = 2 and 3. Each is counted here on the
trace of a real run (explain_run's theory-vs-run report), not taken from a formula.
"""

from __future__ import annotations

import pytest

from collectives.teaching import emulate
from collectives.teaching.explain import explain_run
from support.procs import ROOT

pytestmark = [pytest.mark.fast, pytest.mark.timeout(120)]

PROOFS = " ".join((ROOT / "docs" / "proofs.md").read_text(encoding="utf-8").split())
WORLDS = range(2, 10)


def rounds_and_depth(algorithm: str, n: int) -> tuple[int, int]:
    rows = explain_run(algorithm, n, 2 * n).report.rows
    run = {r[0].split(" ")[0]: r[3] for r in rows}
    return int(run["rounds"]), int(run["depth"])


def parts(algorithm: str) -> list[int]:
    """The world sizes at which the run's rounds and depth differ."""
    return [n for n in WORLDS if len(set(rounds_and_depth(algorithm, n))) > 1]


def test_rounds_and_depth_part_where_the_page_says():
    assert parts("ring") == [] and parts("halving_doubling") == []
    assert parts("tree") == [n for n in WORLDS if n & (n - 1)]
    assert parts("naive") == [n for n in WORLDS if n > 2]
    assert parts("direct") == [n for n in WORLDS if n > 2]
    assert "naive (depth 2, rounds `2(n-1)`; equal at `n = 2`)" in PROOFS
    assert "direct (depth 1, rounds `2n-3`; equal at `n = 2`)" in PROOFS
    assert "rounds `2 ceil(log2 n)`: equal when `n` is a power of two" in PROOFS


def test_direct_takes_fewer_rounds_than_the_tree_only_at_2_and_3():
    fewer = []
    for n in WORLDS:
        direct, tree = rounds_and_depth("direct", n)[0], rounds_and_depth("tree", n)[0]
        assert (direct, tree) == (emulate.cost("direct", n).rounds, emulate.cost("tree", n).rounds)
        if direct < tree:
            fewer.append((n, direct, tree))
    assert [n for n, _, _ in fewer] == [2, 3]
    (_, d2, t2), (_, d3, t3) = fewer
    assert f"at `n = 2` and `3` ({d2} and {d3} against {t2} and {t3})" in PROOFS


def test_the_depths_algorithms_md_sets_against_direct():
    """algorithms.md's direct section: one message deep against the ring's 2(n-1) and the
    tree's 2 floor(log2 n), each the traced run's depth."""
    for n in WORLDS:
        assert rounds_and_depth("direct", n)[1] == 1
        assert rounds_and_depth("ring", n)[1] == 2 * (n - 1)
        assert rounds_and_depth("tree", n)[1] == 2 * (n.bit_length() - 1)
    text = " ".join((ROOT / "docs" / "algorithms.md").read_text(encoding="utf-8").split())
    said = "Its depth is one message instead of the ring's 2(n-1) or the tree's 2·floor(log2 n)"
    assert said in text


def test_the_tree_saves_no_bytes_against_recursive_doubling():
    """Section 2's aside: recursive doubling with whole buffers (rank v exchanges everything
    with v XOR 2^k) meets the bound, log2 n rounds of N bytes; the tree takes twice the rounds
    and its root sends ceil(log2 n) N, what recursive doubling's every rank sends. The tree
    from its traced run (item 8 bytes: N = 16 n), recursive doubling through costmodel's port
    model."""
    from collectives.algorithms import costmodel as cm

    for n in WORLDS:
        k = (n - 1).bit_length()
        rows = {r[0].split(" ")[0]: r[3] for r in explain_run("tree", n, 2 * n).report.rows}
        assert int(rows["rounds"]) == 2 * k
        root = rows["bytes"].removesuffix(" each").split(",")[0]  # "32 each" at n = 2
        assert int(root) == k * 16 * n  # the root's, N = 2n int64
        if n & (n - 1):
            continue
        progs = [
            [(kind, v ^ (1 << j), 1.0) for j in range(k) for kind in ("send", "recv")]
            for v in range(n)
        ]
        order = cm.identity(n)
        rounds = cm._port_model(n, progs, cm.LinkCosts(n, rate=1e300, alpha=1.0), order)
        per_byte = cm._port_model(n, progs, cm.LinkCosts(n, rate=1.0, alpha=0.0), order)
        assert (round(rounds), per_byte) == (k, k)  # log2 n rounds, log2 n N through each rank
    assert "The tree takes twice that, `2 ceil(log2 n)(alpha + N beta)`, and saves no bytes" in (
        PROOFS
    )
    assert "its root sends and takes `ceil(log2 n) N`, as recursive doubling's every rank" in PROOFS


def test_naive_sends_the_fewest_messages_as_algorithms_md_says():
    """algorithms.md's naive: the fewest messages of all, 2(n-1), as few as the tree's, against
    direct's n(n-1); counted from the traced runs' messages row."""

    def total(algorithm: str, n: int) -> int:
        rows = {r[0].split(" ")[0]: r[3] for r in explain_run(algorithm, n, 2 * n).report.rows}
        per = rows["messages"]
        return int(per.split()[0]) * n if per.endswith("each") else sum(map(int, per.split(",")))

    for n in WORLDS:
        counts = {a: total(a, n) for a in ("naive", "tree", "direct", "ring", "halving_doubling")}
        assert counts["naive"] == counts["tree"] == 2 * (n - 1) == min(counts.values()), counts
        assert counts["direct"] == n * (n - 1)
    text = " ".join((ROOT / "docs" / "algorithms.md").read_text(encoding="utf-8").split())
    assert "(2(n-1), as few as the tree's, against direct's n(n-1))" in text
