"""The benchmark harness in parts, in-process: #wrong counts corrupted elements; sizes parse;
the alpha-beta fit recovers a known line; `costmodel --write` changes only the numbers in
tuning.py; the latency floor's patterns pair up; the copy floor's arithmetic. End to end with
real ranks: tests/system/test_bench_harness.py.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
if ROOT not in sys.path:  # bench/ is a repo-root tool, not part of the installed package
    sys.path.insert(0, ROOT)

from bench.harness import costmodel  # noqa: E402
from bench.harness.spec import Layout, Spec, parse_size, size_range  # noqa: E402


@pytest.mark.fast
@pytest.mark.parametrize(
    "collective",
    ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all"],
)
def test_layout_checks_catch_corruption(collective):
    spec = Spec(collective=collective, nproc=3, dtype="float32", op="sum")
    lay = Layout(spec, 96, rank=0)
    assert lay.nbytes == 96 and lay.count == 24
    good = lay.expected()
    assert lay.wrong(good) == 0
    bad = good.copy()
    bad[[0, 5]] += 1
    assert lay.wrong(bad) == 2


@pytest.mark.fast
def test_sizes_and_units():
    assert parse_size("64M") == 64 << 20 and parse_size("4") == 4 and parse_size("1KiB") == 1024
    assert size_range(4, 64, 4) == (4, 16, 64)
    with pytest.raises(ValueError):
        parse_size("lots")


@pytest.mark.fast
def test_fit_recovers_alpha_beta():
    sizes = [4 << k for k in range(0, 20, 2)]
    alpha, beta = costmodel.fit([(s, 100.0 + 0.002 * s) for s in sizes])
    assert alpha == pytest.approx(100.0, rel=1e-6) and beta == pytest.approx(0.002, rel=1e-6)
    # tree (low alpha, high beta) vs ring: equal cost at (200 - 50) / (0.004 - 0.001) = 50000 B
    assert costmodel.crossover((50.0, 0.004), (200.0, 0.001)) == pytest.approx(50000)


@pytest.mark.fast
def test_write_tuning_changes_only_numbers(tmp_path):
    src = open(os.path.join(ROOT, "collectives", "group", "tuning.py")).read()
    path = tmp_path / "tuning.py"
    path.write_text(src)
    changes = costmodel.write_tuning(3, 8 << 10, 128 << 10, str(path))
    assert len(changes) == 2
    new = path.read_text()
    assert "def all_reduce_algorithm(nbytes: int, world_size: int, hosts=None," in new
    assert len(new.splitlines()) == len(src.splitlines())
    spec = importlib.util.spec_from_file_location("tuning_copy", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.DIRECT_MAX_BYTES[3] == 8 << 10 and mod.TREE_MAX_BYTES == 128 << 10
    assert mod.all_reduce_algorithm(8 << 10, 3) == "direct"
    assert mod.all_reduce_algorithm(16 << 10, 3) == "tree"
    assert mod.all_reduce_algorithm(256 << 10, 3) == "ring"
    from collectives.group import tuning

    for k, v in tuning.DIRECT_MAX_BYTES.items():  # other world sizes untouched
        if k != 3:
            assert mod.DIRECT_MAX_BYTES[k] == v


@pytest.mark.fast
@pytest.mark.parametrize("n", [2, 3, 4, 7, 8])
@pytest.mark.parametrize("star", [False, True])
@pytest.mark.parametrize(
    "algorithm,collective",
    [
        ("direct", "all_reduce"),
        ("naive", "all_reduce"),
        ("ring", "all_reduce"),
        ("tree", "all_reduce"),
        ("ring", "all_gather"),
        ("pairwise", "all_to_all"),
    ],
)
def test_floor_patterns_pair_up(n, algorithm, collective, star):
    """The latency floor's pattern is a real exchange: in every step, each message rank r
    sends to p is one that p receives from r, of the same size (else the floor would hang or
    measure something else); 3+ ranks add the commit's empty messages (the star through
    rank 0 on a crowded host)."""
    from bench.floors.collective import pattern

    for commit in (False, True):
        plans = [pattern(collective, algorithm, r, n, 1024, commit, star) for r in range(n)]
        assert len({len(p) for p in plans}) == 1
        for k in range(len(plans[0])):
            sent = sorted((r, p, b) for r in range(n) for p, b in plans[r][k][0])
            got = sorted((p, r, b) for r in range(n) for p, b in plans[r][k][1])
            assert sent == got and sent
        if commit:  # the library's commit, message for message, in its order
            base = len(pattern(collective, algorithm, 0, n, 1024, False))
            for r in range(n):
                floor_sends = [p for sends, _ in plans[r][base:] for p, b in sends if b == 0]
                assert floor_sends == _commit_sends(r, n, star), (r, n)


@pytest.mark.fast
@pytest.mark.parametrize("n", range(2, 10))
def test_floor_steps_are_the_algorithms_depth(n):
    """A floor step is one message deep (every rank sends, then receives), so each pattern has
    as many steps as the library's algorithm is deep (invariants.expected's depth), not as
    many as the model's rounds; the tree's pattern is recursive doubling's exchange, one step
    per round of the binomial tree's (emulate.cost, invariants.expected's port rounds)."""
    from bench.floors.collective import pattern
    from collectives.teaching import emulate, invariants

    def steps(collective, algorithm):
        return len(pattern(collective, algorithm, 0, n, 1024, False))

    for algorithm in ("direct", "naive", "ring"):
        assert steps("all_reduce", algorithm) == invariants.expected(algorithm, n, 8, 4).depth
    assert steps("all_to_all", "pairwise") == invariants.expected("all_to_all", n, 8, 4).depth
    assert steps("all_reduce", "tree") == emulate.cost("tree", n).rounds
    assert steps("broadcast", "tree") == invariants.expected("broadcast", n, 8, 4).port_rounds


def _commit_sends(rank, n, star):
    """The peers algorithms/commit.py sends to from `rank`, in order (a recording channel)."""
    from collectives.algorithms.commit import commit

    class Recorder:
        size = n

        def __init__(self):
            self.rank, self.sends = rank, []

        def send(self, peer, buf, **tags):
            self.sends.append(peer)

        def recv_into(self, peer, buf, **tags):
            pass

    ch = Recorder()
    commit(ch, star=star)
    return ch.sends


@pytest.mark.fast
def test_copy_floor_work_and_mpi_column():
    """2-rank ring: 1.5x the buffer copied and 0.5x reduced per rank (the copy floor's arithmetic);
    the comparison prints xmpi = mpi time / time and /flr = time / the higher floor."""
    from bench.harness import report
    from bench.floors.collective import copy_work

    assert copy_work("ring", 2, 1 << 20) == (3 << 19, 1 << 19)
    assert copy_work("direct", 4, 100) == (500, 300)
    row = lambda b, t: {"backend": b, "size": 4, "time_us": t, "busbw_gbs": 4 / t / 1e3}
    text = report.comparison_table(
        [row("auto", 100.0), row("mpi", 50.0), row("floor", 80.0), row("copy", 5.0)],
        ["auto", "mpi", "floor", "copy"],
    )
    assert "xmpi" in text and "/flr" in text
    line = [ln for ln in text.splitlines() if ln.strip().startswith("4 |")][0]
    assert "0.50" in line and "1.25" in line  # 50/100 and 100/max(80, 5)


def test_stallmatrix_reads_a_verdicts_evidence_back_from_the_coordinators_line():
    """The coordinator notes each verdict as 'op #S of generation G judged: <repr>'
    (membership/verdicts.py); bench stallmatrix reads the evidence back from that line."""
    from bench.studies.stallmatrix import parse_judged
    from collectives.membership.diagnose import judge
    from collectives.transport.base import Progress

    def pic(seq: int, waiting_on: int | None, sent: tuple, recv: tuple) -> Progress:
        return Progress(0, seq, True, waiting_on, sent, recv)

    # rank 0 sent 1 a message rank 1 never took: the link 0->1 stalled
    states = {
        0: pic(3, None, (0, 1, 0), (0, 0, 0)),
        1: pic(3, 0, (0, 0, 0), (0, 0, 0)),
        2: pic(3, 1, (0, 0, 0), (0, 0, 0)),
    }
    j = judge(3, states, 3)
    got = parse_judged(f"coordinator: op #3 of generation 0 judged: {j!r}", 0.0)
    assert got is not None and got.decided_by == j.evidence.decided_by != ""
    assert [tuple(link) for link in got.stalled] == j.evidence.stalled == [(0, 1)]
