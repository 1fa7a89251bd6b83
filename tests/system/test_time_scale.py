"""The tests' time scale sees load that began a moment ago (tests/support/timing.py): with
two CPU-bound processes per CPU started just now, the runnable tasks it samples count them,
and the scale is above 1, whatever the 1-minute average still says."""

from __future__ import annotations

import sys

import pytest

from support import timing
from support.procs import clean_env

BURN = "print('ready', flush=True)\nwhile True: pass"


@pytest.mark.skipif(timing.read_running() is None, reason="no /proc/loadavg here")
@pytest.mark.timeout(60)
def test_a_scale_measured_now_counts_burners_started_now(procs):
    n = 2 * timing.cpus()
    for i in range(n):
        procs.spawn(f"burn{i}", [sys.executable, "-c", BURN], clean_env())
    for i in range(n):
        procs.wait_for_line(f"burn{i}", "^ready$", timeout=20)  # scaled there
    runnable = timing.runnable_now()
    assert runnable is not None and runnable >= n - 1, runnable  # one may be between slices
    assert timing.scale_for([runnable, 0.0], timing.cpus()) >= 1.5
