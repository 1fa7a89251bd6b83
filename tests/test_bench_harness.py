"""The benchmark harness, end to end and in parts.

Invariants: `python -m bench ... --json` with 2 real rank processes produces one row per
(backend, size) with nccl-tests fields, busbw = algbw x 2(n-1)/n for all_reduce, median within
[min, max], #wrong == 0, and the loopback limit as its own row; #wrong counts corrupted
elements; the alpha-beta fit recovers a known line; `costmodel --write` changes only the numbers
in tuning.py, which still imports and picks algorithms from them.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:   # bench/ is a repo-root tool, not part of the installed package
    sys.path.insert(0, ROOT)

from bench import costmodel  # noqa: E402
from bench.spec import Layout, Spec, busbw_factor, parse_size, size_range  # noqa: E402
from support.procs import clean_env  # noqa: E402
HAS_TORCH = importlib.util.find_spec("torch") is not None


def run_bench(procs, args, timeout=150):
    """Run `python -m bench` (in its own session: a hang kills its rank processes too)."""
    procs.spawn("bench", [sys.executable, "-m", "bench", *args], clean_env(),
                merge_stderr=True)
    (run,) = procs.wait("bench", timeout)
    return run.code, run.output


@pytest.mark.timeout(180)
def test_end_to_end_json(procs, tmp_path):
    out_json = tmp_path / "r.json"
    backends = "ring,direct" + (",gloo" if HAS_TORCH else "") + ",nccl"
    rc, out = run_bench(procs, ["--nproc", "2", "--backends", backends, "--min-bytes", "4",
                         "--max-bytes", "4K", "--step", "4", "--iters", "3", "--warmup", "1",
                         "--repeats", "3", "--no-progress", "--json", str(out_json)])
    assert rc == 0, out
    result = json.loads(out_json.read_text())
    assert set(result) == {"meta", "results", "skipped"}
    meta = result["meta"]
    assert meta["nproc"] == 2 and meta["collective"] == "all_reduce"
    assert meta["sizes"] == [4, 16, 64, 256, 1024, 4096]
    rows = result["results"]
    measured = {r["backend"] for r in rows}
    # NCCL is either measured (2+ GPUs) or named as skipped with a reason: never silent.
    assert ("nccl" in measured) != ("nccl" in result["skipped"])
    assert "nccl skipped" in out or "nccl" in measured
    # limit rows: the raw ring, the latency floor and the copy floor (bench/floors.py)
    expected = {"ring", "direct", "limit", "floor", "copy"} | ({"gloo"} if HAS_TORCH else set())
    assert expected <= measured, (measured, result["skipped"])
    fields = {"backend", "size", "count", "type", "redop", "root", "iters", "time_us",
              "time_us_min", "time_us_max", "times_us", "algbw_gbs", "busbw_gbs", "wrong"}
    for b in measured:
        assert sorted(r["size"] for r in rows if r["backend"] == b) == meta["sizes"]
    for r in rows:
        assert fields <= set(r), r
        assert r["count"] == r["size"] // 4 and r["type"] == "float32" and r["root"] == -1
        assert len(r["times_us"]) == 3
        assert r["time_us_min"] <= r["time_us"] <= r["time_us_max"]
        assert r["algbw_gbs"] == pytest.approx(r["size"] / r["time_us"] / 1e3)
        assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * busbw_factor("all_reduce", 2))
        if r["backend"] in ("limit", "floor", "copy"):
            assert r["wrong"] is None      # nothing is computed, nothing claimed
        else:
            assert r["wrong"] == 0, r
    assert "# comparison" in out and "out of bounds values: 0 OK" in out


@pytest.mark.timeout(120)
def test_broadcast_skips_algorithms_it_lacks(procs, tmp_path):
    """ring has no broadcast: it must be reported as skipped, with tree measured and correct."""
    out_json = tmp_path / "b.json"
    rc, out = run_bench(procs, ["--collective", "broadcast", "--backends", "ring,tree", "--no-limit",
                         "--min-bytes", "64", "--max-bytes", "64", "--iters", "2",
                         "--warmup", "0", "--repeats", "1", "--no-progress",
                         "--json", str(out_json)])
    assert rc == 0, out
    result = json.loads(out_json.read_text())
    assert "ring" in result["skipped"] and "ring skipped" in out
    (row,) = result["results"]
    assert row["backend"] == "tree" and row["root"] == 0 and row["wrong"] == 0


@pytest.mark.timeout(150)
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_all_to_all_beside_gloo_through_torch(procs, tmp_path):
    """all_to_all on 3 ranks: auto (the pairwise exchange), the library through
    torch.distributed and Gloo, every row checked (#wrong 0); ring, which all_to_all does not
    have, is skipped with the reason; busbw = algbw x (n-1)/n."""
    out_json = tmp_path / "a.json"
    rc, out = run_bench(procs, ["--collective", "all_to_all", "--nproc", "3", "--backends",
                         "auto,ring,torch-collectives,gloo", "--no-limit", "--min-bytes", "12",
                         "--max-bytes", "12K", "--step", "4", "--iters", "2", "--warmup", "1",
                         "--repeats", "2", "--no-progress", "--no-model",
                         "--json", str(out_json)])
    assert rc == 0, out
    result = json.loads(out_json.read_text())
    assert "pairwise" in result["skipped"]["ring"], result["skipped"]
    rows = result["results"]
    assert {r["backend"] for r in rows} == {"auto", "torch-collectives", "gloo"}
    for r in rows:
        assert r["wrong"] == 0, r
        assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * 2 / 3)


@pytest.mark.fast
@pytest.mark.parametrize("collective", ["all_reduce", "broadcast", "reduce", "all_gather",
                                        "reduce_scatter", "all_to_all"])
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
    src = open(os.path.join(ROOT, "collectives", "core", "tuning.py")).read()
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
    from collectives.core import tuning
    for k, v in tuning.DIRECT_MAX_BYTES.items():   # other world sizes untouched
        if k != 3:
            assert mod.DIRECT_MAX_BYTES[k] == v


@pytest.mark.fast
@pytest.mark.parametrize("n", [2, 3, 4, 7, 8])
@pytest.mark.parametrize("star", [False, True])
@pytest.mark.parametrize("algorithm,collective", [("direct", "all_reduce"),
                                                  ("naive", "all_reduce"),
                                                  ("ring", "all_reduce"),
                                                  ("tree", "all_reduce"),
                                                  ("ring", "all_gather"),
                                                  ("pairwise", "all_to_all")])
def test_floor_patterns_pair_up(n, algorithm, collective, star):
    """The latency floor's pattern is a real exchange: in every round, each message rank r
    sends to p is one that p receives from r, of the same size (else the floor would hang or
    measure something else); 3+ ranks add the commit round of empty messages (the star
    through rank 0 on a crowded host)."""
    from bench.floors import pattern
    for commit in (False, True):
        plans = [pattern(collective, algorithm, r, n, 1024, commit, star) for r in range(n)]
        assert len({len(p) for p in plans}) == 1
        for k in range(len(plans[0])):
            sent = sorted((r, p, b) for r in range(n) for p, b in plans[r][k][0])
            got = sorted((p, r, b) for r in range(n) for p, b in plans[r][k][1])
            assert sent == got and sent
        if commit:      # the library's commit round, message for message, in its order
            base = len(pattern(collective, algorithm, 0, n, 1024, False))
            for r in range(n):
                floor_sends = [p for sends, _ in plans[r][base:] for p, b in sends if b == 0]
                assert floor_sends == _commit_sends(r, n, star), (r, n)


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
    """2-rank ring: 1.5x the buffer copied and 0.5x reduced per rank (issue 16's arithmetic);
    the comparison prints xmpi = mpi time / time and /flr = time / the higher floor."""
    from bench import report
    from bench.floors import copy_work
    assert copy_work("ring", 2, 1 << 20) == (3 << 19, 1 << 19)
    assert copy_work("direct", 4, 100) == (500, 300)
    row = lambda b, t: {"backend": b, "size": 4, "time_us": t, "busbw_gbs": 4 / t / 1e3}
    text = report.comparison_table([row("auto", 100.0), row("mpi", 50.0), row("floor", 80.0),
                                    row("copy", 5.0)], ["auto", "mpi", "floor", "copy"])
    assert "xmpi" in text and "/flr" in text
    line = [ln for ln in text.splitlines() if ln.strip().startswith("4 |")][0]
    assert "0.50" in line and "1.25" in line     # 50/100 and 100/max(80, 5)


@pytest.mark.timeout(60)
def test_pyfloor_measures_both_ways():
    """bench.pyfloor's raw exchange runs in both modes and reports positive times, the
    median inside its min-max."""
    from bench.pyfloor import measure
    for mode in ("socket", "shm"):
        med, lo, hi, cpu = measure(1024, mode, 2, 20)
        assert 0 < lo <= med <= hi and cpu > 0, (mode, med, lo, hi, cpu)
