"""The scaling and coordinator-load benchmarks (bench/studies/scale.py, bench/studies/coordinator_load.py) in
miniature, so that they keep working between full runs.

Invariants: the growth fit tells log n from n on made-up curves and calls a flat one constant;
a 3-world scale run (2..4 ranks) checks every result and writes its table, JSON and plot with a
detection after the kill and well inside the op deadline (the kernel's witnesses find a SIGKILL
within milliseconds, about as soon as a 4-byte all_reduce ends, so the two are not compared);
the coordinator-load driver forms a group of 60 simulated members, sees no false alarm, and detects a silenced member
within heartbeat_timeout + 1 s (its exit status says so).
"""

from __future__ import annotations

import json
import math
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.studies import scale  # noqa: E402
from support.procs import clean_env  # noqa: E402

NS = [2, 4, 8, 16, 32, 64]


def test_fit_tells_log_n_from_n_and_flat():
    assert scale.fit(NS, [0.001 + 0.002 * math.log2(n) for n in NS])["better"] == "log n"
    f = scale.fit(NS, [0.001 + 0.0005 * n for n in NS])
    assert f["better"] == "n" and abs(f["n"]["b"] - 0.0005) < 1e-12
    assert scale.fit(NS, [5.0 + 0.01 * (-1) ** n for n in NS])["better"] == "constant"


@pytest.mark.long  # make test keeps the fit (above) and the coordinator's load (below)
@pytest.mark.timeout(150)
def test_scale_bench_small(procs, tmp_path):
    out = tmp_path / "scale"
    procs.spawn(
        "scale",
        [
            sys.executable,
            "-m",
            "bench",
            "scale",
            "--worlds",
            "2,3,4",
            "--iters",
            "2",
            "--reps",
            "1",
            "--heartbeat-interval",
            "0.2",
            "--heartbeat-timeout",
            "1",
            "--deadline",
            "60",
            "--out",
            out,
        ],
        clean_env(),
        merge_stderr=True,
    )
    (run,) = procs.wait("scale", 140)
    assert run.code == 0, run.output[-3000:]
    data = json.loads(out.with_suffix(".json").read_text())
    assert [r["n"] for r in data["rows"]] == [2, 3, 4]
    for r in data["rows"]:
        assert 0 < r["4 B"] and 0 < r["detect"] and 0 < r["reconstruct"], r
        # found (by the kernel's witnesses within ms, else by the 1 s heartbeat timeout), and
        # well before the 60 s op deadline: bench recovery measures how soon
        assert r["detect"] < 5.0, r
    assert (
        "grows like" in out.with_suffix(".txt").read_text()
        or "constant" in out.with_suffix(".txt").read_text()
    )
    assert out.with_suffix(".png").stat().st_size > 10_000


@pytest.mark.timeout(90)
def test_coordinator_load_small(procs, tmp_path):
    out = tmp_path / "load.json"
    procs.spawn(
        "load",
        [
            sys.executable,
            "-m",
            "bench",
            "coordinator_load",
            "--members",
            "60",
            "--seconds",
            "1",
            "--silence",
            "2",
            "--heartbeat-interval",
            "0.2",
            "--heartbeat-timeout",
            "1",
            "--json",
            out,
        ],
        clean_env(),
        merge_stderr=True,
    )
    (run,) = procs.wait("load", 80)
    assert run.code == 0, run.output[-3000:]
    data = json.loads(out.read_text())
    assert data["ok"] and data["false_alarms"] == 0 and len(data["detection_s"]) == 2
    assert all(1.0 <= d <= 2.0 for d in data["detection_s"]), data["detection_s"]
    assert 0 < data["coordinator_cpu_share"] < 1.0
