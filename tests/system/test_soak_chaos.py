"""The soak and the chaos benchmarks in miniature (bench/stress/soak.py, bench/stress/chaos.py), marked `soak`
(`pytest -m soak` runs just these): the same code paths as the 30-minute runs, shorter.

Invariants. Soak: at 4 ranks, every op of the seeded mixed sequence (every collective, every
algorithm, numpy and torch buffers, up to 4 MiB) gives the numpy result, and no rank's fds,
threads, private memory, shared-memory slots, arenas, ipc or /dev/shm files grow past their
bounds from the middle to the end. Chaos: 8 workers under SIGKILL, SIGSTOP/SIGCONT, SIGTERM and
delayed and dropped links for 2 minutes: no hang (watchdogs), no wrong sum, every survivor ends
with the same parameters, every exit explained by a fault, and every fault recovered from.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from support.procs import clean_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

pytestmark = pytest.mark.soak


def _run(procs, tmp_path, name: str, minutes: str, nproc: str, timeout: float) -> dict:
    """Run `python -m bench NAME` to its end (exit status 0) and return its JSON record."""
    out = tmp_path / name
    procs.spawn(
        name,
        [sys.executable, "-m", "bench", name, "--minutes", minutes, "--nproc", nproc, "--out", out],
        clean_env(),
        merge_stderr=True,
    )
    (res,) = procs.wait(name, timeout)
    assert res.code == 0, res.output
    return json.loads(out.with_suffix(".json").read_text())


@pytest.mark.timeout(150)
def test_soak_one_minute(procs, tmp_path):
    rec = _run(procs, tmp_path, "soak", "0.6", "4", 140)
    assert rec["wrong"] == 0 and not rec["failures"], rec["failures"]
    assert rec["ops"] >= 100, rec  # 10,000 in the full run
    assert len(rec["kinds"]) == 10, rec["kinds"]  # every kind of op came up
    assert rec["rejoins"] >= 2 and rec["generation"] >= 2, rec  # the last rank left and rejoined
    assert sorted(rec["samples"]) == ["0", "1", "2", "3"]
    assert all(set(s) == {"start", "middle", "end"} for s in rec["samples"].values())


@pytest.mark.timeout(300)
def test_chaos_two_minutes(procs, tmp_path):
    rec = _run(procs, tmp_path, "chaos", "2", "8", 290)
    assert not rec["hangs"] and rec["wrong"] == 0 and not rec["crashes"], rec
    assert rec["identical_params"] and rec["finals"] >= 3, rec
    injected = {k: v["count"] for k, v in rec["faults"].items() if k != "all"}
    assert rec["faults"]["all"]["count"] >= 10, injected
    assert sum(1 for c in injected.values() if c) >= 4, injected  # most kinds came up
    # every fault injected was recovered from (a detect time each)
    assert len(rec["faults"]["all"]["detect"]) == rec["faults"]["all"]["count"], rec["faults"]


@pytest.mark.timeout(150)
def test_chaos_ends_when_the_coordinator_is_lost_for_good(procs, tmp_path):
    """A grace shorter than the coordinator's restart (its 1 s pause alone): every member's
    calls raise CoordinatorLost from then on. The workers say so and end -- none retries in
    a loop -- and the run fails at once with that reason, not with a hang after its window."""
    out = tmp_path / "chaos"
    argv = ["--minutes", "1", "--nproc", "3", "--kinds", "coordinator", "--every", "2"]
    procs.spawn(
        "chaos",
        [sys.executable, "-m", "bench", "chaos", *argv, "--coordinator-grace", "0.3"]
        + ["--out", out],
        clean_env(),
        merge_stderr=True,
    )
    (res,) = procs.wait("chaos", 140)
    assert res.code == 1, res.output
    rec = json.loads(out.with_suffix(".json").read_text())
    assert "longer than the grace of 0.3 s" in rec["lost"][0], rec["lost"]
    assert any(f.startswith("coordinator lost for good") for f in rec["failures"]), rec
    assert not rec["hangs"] and not rec["crashes"], rec
    # ended at the loss, well before its minute of faults
    assert rec["window_s"] < 0.8 * 60 * rec["minutes"], rec["window_s"]
    assert rec["error_events"] < 20, rec["error_events"]  # not a worker retrying in a loop
