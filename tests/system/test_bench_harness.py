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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:  # bench/ is a repo-root tool, not part of the installed package
    sys.path.insert(0, ROOT)

from bench.harness.spec import busbw_factor  # noqa: E402
from support.procs import clean_env  # noqa: E402

HAS_TORCH = importlib.util.find_spec("torch") is not None


def run_bench(procs, args, timeout=150):
    """Run `python -m bench` (in its own session: a hang kills its rank processes too)."""
    procs.spawn("bench", [sys.executable, "-m", "bench", *args], clean_env(), merge_stderr=True)
    (run,) = procs.wait("bench", timeout)
    return run.code, run.output


@pytest.mark.timeout(180)
def test_end_to_end_json(procs, tmp_path):
    out_json = tmp_path / "r.json"
    backends = "ring,direct" + (",gloo" if HAS_TORCH else "") + ",nccl"
    rc, out = run_bench(
        procs,
        [
            "--nproc",
            "2",
            "--backends",
            backends,
            "--min-bytes",
            "4",
            "--max-bytes",
            "4K",
            "--step",
            "4",
            "--iters",
            "3",
            "--warmup",
            "1",
            "--repeats",
            "3",
            "--no-progress",
            "--json",
            str(out_json),
        ],
    )
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
    # limit rows: the raw ring, the latency floor and the copy floor (bench/floors/collective.py)
    expected = {"ring", "direct", "limit", "floor", "copy"} | ({"gloo"} if HAS_TORCH else set())
    assert expected <= measured, (measured, result["skipped"])
    fields = {
        "backend",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "iters",
        "time_us",
        "time_us_min",
        "time_us_max",
        "times_us",
        "algbw_gbs",
        "busbw_gbs",
        "wrong",
    }
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
            assert r["wrong"] is None  # nothing is computed, nothing claimed
        else:
            assert r["wrong"] == 0, r
    assert "# comparison" in out and "out of bounds values: 0 OK" in out


@pytest.mark.timeout(120)
def test_broadcast_skips_algorithms_it_lacks(procs, tmp_path):
    """ring has no broadcast: it must be reported as skipped, with tree measured and correct."""
    out_json = tmp_path / "b.json"
    rc, out = run_bench(
        procs,
        [
            "--collective",
            "broadcast",
            "--backends",
            "ring,tree",
            "--no-limit",
            "--min-bytes",
            "64",
            "--max-bytes",
            "64",
            "--iters",
            "2",
            "--warmup",
            "0",
            "--repeats",
            "1",
            "--no-progress",
            "--json",
            str(out_json),
        ],
    )
    assert rc == 0, out
    result = json.loads(out_json.read_text())
    assert "ring" in result["skipped"] and "ring skipped" in out
    (row,) = result["results"]
    assert row["backend"] == "tree" and row["root"] == 0 and row["wrong"] == 0


@pytest.mark.long
@pytest.mark.timeout(150)
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_all_to_all_beside_gloo_through_torch(procs, tmp_path):
    """all_to_all on 3 ranks: auto (the pairwise exchange), the library through
    torch.distributed and Gloo, every row checked (#wrong 0); ring, which all_to_all does not
    have, is skipped with the reason; busbw = algbw x (n-1)/n. `make test-long`: make test
    keeps the harness end to end (test_end_to_end_json) and a skipped algorithm's report
    (test_broadcast_skips_algorithms_it_lacks)."""
    out_json = tmp_path / "a.json"
    rc, out = run_bench(
        procs,
        [
            "--collective",
            "all_to_all",
            "--nproc",
            "3",
            "--backends",
            "auto,ring,torch-collectives,gloo",
            "--no-limit",
            "--min-bytes",
            "12",
            "--max-bytes",
            "12K",
            "--step",
            "4",
            "--iters",
            "2",
            "--warmup",
            "1",
            "--repeats",
            "2",
            "--no-progress",
            "--no-model",
            "--json",
            str(out_json),
        ],
    )
    assert rc == 0, out
    result = json.loads(out_json.read_text())
    assert "pairwise" in result["skipped"]["ring"], result["skipped"]
    rows = result["results"]
    assert {r["backend"] for r in rows} == {"auto", "torch-collectives", "gloo"}
    for r in rows:
        assert r["wrong"] == 0, r
        assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * 2 / 3)


@pytest.mark.timeout(60)
def test_pyfloor_measures_both_ways():
    """bench.floors.pyfloor's raw exchange runs in both modes and reports positive times, the
    median inside its min-max."""
    from bench.floors.pyfloor import measure

    for mode in ("socket", "shm"):
        med, lo, hi, cpu = measure(1024, mode, 2, 20)
        assert 0 < lo <= med <= hi and cpu > 0, (mode, med, lo, hi, cpu)
