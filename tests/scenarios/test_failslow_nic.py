"""A NIC slower than its peers but not crawling: every link of rank 2 held by tc htb to about
half the rate a healthy link measured on this machine under load (tests/support/failslow_runs.py
runs the job: 4 workers on network-namespace hosts, an 8 MiB all_reduce per step).

Invariants: the coordinator names rank 2's NIC behind its peers (membership/slownic.py) and
hands out the ring with its chunks sized by bandwidth (algorithms/schedule.py plan_for_nics)
within WITHIN s (bound()); from then on a step takes less than any ring with equal chunks can
at that rate (each of rank 2's two ring links carries 1.5 N: RING_FLOOR), which only a schedule
that sends less through rank 2 achieves; every rank ends with the same model, in generation 0.
The speed kept is printed, not bounded: what a healthy link measures here moves with the
machine's load (380 Mbit/s to 2 Gbit/s), so the same tc rate is a half or a tenth of it; the
bench reports each run's ratio (bench/results/failslow/README.md).
`make test-failslow` runs it; it skips where the machine has no namespaces or was too busy to
compare the step rates (fails under CI=true: ci_must_run)."""

from __future__ import annotations

import os
import shutil

import pytest

from support.failslow_runs import NotMeasured, Run, Speed, check_identical, nic, run, speed
from support.netns import Hosts, Refused
from support.timing import bound

# bench/studies/failslow.py RATES: about half of what a healthy link measured here under load
HALF, HALF_BYTES_S = "190mbit", 190e6 / 8
NBYTES = 4 * ((2 << 20) + 1)  # the worker's all_reduce: 8 MiB and its stop flag
RING_FLOOR = 1.5 * NBYTES / HALF_BYTES_S  # s: rank 2's ring links carry 1.5 N each at HALF
WITHIN = 15.0  # s from the slowdown to the adapted window: judged (3 s window, 3 s sustain), agreed
NET = 82
# the workers' op timeout (failslow_worker.py FAILSLOW_TIMEOUT): an op slowed past it would end
# the job, so the schedule must come well before it
OP_TIMEOUT = 120.0
pytestmark = [pytest.mark.ci_must_run, pytest.mark.failslow_matrix]


@pytest.fixture
def hosts5():
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "tc", "nsenter")):
        pytest.skip("needs root, iproute2 (ip, tc) and nsenter for network namespaces")
    try:
        h = Hosts(5, NET, tag="fn")
    except Refused as exc:  # pragma: no cover - a kernel without namespaces
        pytest.skip(str(exc))
    with h:
        yield h


def _speed(r: Run, within: float) -> Speed:
    try:
        return speed(r, within)
    except NotMeasured as exc:
        if exc.whole[1] >= RING_FLOOR * 1.5:  # no load explains a step half as slow again
            pytest.fail(f"adapted steps of {exc.whole[1]:.3f} s (not quiet): {exc}")
        pytest.skip(f"the step rates were not measured: {exc}")


@pytest.mark.timeout(300)
def test_a_nic_at_half_speed_gets_a_ring_sized_around_it(hosts5, procs):
    within = bound(WITHIN, below=OP_TIMEOUT)
    r = run(
        procs,
        hosts5,
        4,
        nic(2, 4),
        rate=HALF,
        after=within,
        adapted_from=within,
        extra_env={"FAILSLOW_TIMEOUT": f"{OP_TIMEOUT:g}"},
    )
    check_identical(r, 4)
    assert "rank 2's NIC runs behind its peers" in r.log, r.log
    assert "chunks sized by bandwidth" in r.log, r.log
    s = _speed(r, within)
    print(s, f"kept {s.kept:.0%}; equal chunks take at least {RING_FLOOR * 1e3:.0f} ms a step")
    assert s.adapted < RING_FLOOR, (s, r.log)
