"""Many ranks on one host: the conformance of every collective, and a rank
SIGKILLed and the group reconstructed, at 8 and 16 real processes on this 2-core machine.

Kept lean (a few hundred checks, one kill) so that `make test` stays within its budget;
deadlines are generous because 16 processes share 2 cores, but every result is checked exactly:
each equals numpy's (exact for integers and MIN/MAX, within the rounding bound for floats) and
is bitwise identical on every rank; after the kill every survivor's sum is exactly
n(n+1)/2 at the new world size n. The curves at 2..64 ranks are bench/studies/scale.py's.
"""

from __future__ import annotations

import signal

import pytest

from test_zmq_processes import assert_clean, assert_identical, run_world
from support.cluster import Cluster
from support.timing import scaled


@pytest.mark.parametrize("n", (8, 16))
@pytest.mark.timeout(240)
def test_conformance_at_scale(procs, tmp_path, n):
    reports, runs = run_world(
        procs,
        n,
        "scale",
        tmp_path,
        host="coordinator",
        transport="auto",
        timeout=200,
        TEST_OP_TIMEOUT="60",
    )
    assert_clean(reports, runs)
    assert_identical(reports)
    assert all(rep["checks"] >= 60 for rep in reports), [rep["checks"] for rep in reports]
    for rep in reports:  # one host: every pair over ipc or shared memory, never tcp
        assert set(rep["info"]["routes"]) <= {"ipc", "shm"}, rep["info"]["routes"]


@pytest.mark.parametrize("n", (8, 16))
@pytest.mark.timeout(180)
def test_sigkill_and_reconstruct_at_scale(tmp_path, n):
    """n ranks all_reduce in a loop (rank r gives r+1); one is SIGKILLed mid-run. Every
    survivor notices (PeerFailure naming it, or a step at n-1 after its next reconstruct) and
    goes on with exact sums at world size n-1, all in the same new generation. Heartbeats are
    relaxed (0.5 s, a 5 s timeout, scaled like the op timeout) so that 16 processes on 2 busy
    cores are not taken for dead; the kill itself is seen from the dropped connections."""
    victim = n // 2 + 1
    c = Cluster(
        n,
        tmp_path,
        heartbeat_interval=0.5,
        heartbeat_timeout=scaled(5.0),
        worker_args=[
            *("--count", "20000", "--pause", "0.05"),
            *("--seconds", f"{scaled(120):g}", "--timeout", f"{scaled(30):g}"),
        ],
    )
    try:
        c.start()
        names = [f"w{r}" for r in range(n)]
        c.wait_steps(names, ws=n, timeout=90)
        killed = c.signal(f"w{victim}", signal.SIGKILL)
        survivors = [nm for nm in names if nm != f"w{victim}"]
        steps = []
        for _ in range(2):  # two correct steps each at the new size, after the kill
            steps = c.wait_steps(
                survivors, ws=n - 1, timeout=60, after=max([killed] + [s["t"] for s in steps])
            )
        assert all(s["ok"] for s in steps)
        assert len({s["gen"] for s in steps}) == 1 and steps[0]["gen"] >= 1, steps
        ranks = sorted(s["rank"] for s in steps)
        assert ranks == list(range(n - 1)), ranks  # dense ranks in the new group
        assert c.procs[f"w{victim}"].poll() == -signal.SIGKILL
    finally:
        c.close()
