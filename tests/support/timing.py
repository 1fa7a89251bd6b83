"""Deadlines and heartbeat settings for the tests, from one place, scaled to how busy the
machine is.

A test waits a bounded time for what it expects, and gives the jobs it starts a heartbeat
timeout after which a silent process is declared dead. On an idle machine the numbers the
tests are written with hold; on a loaded one (other jobs on the same cores) a live process can
go unscheduled for seconds, and a heartbeat timeout of 1 s declares it dead. So every such
number passes through `scaled()`: multiplied by SCALE, 1 on an idle machine, more on a busy one.
What a test asserts does not change; only how long it waits, and how long a live process may be
silent, grow with the load.

SCALE is TEST_TIME_SCALE where set; else it is measured once, when the test session
starts (tests/conftest.py, which exports it so that pytest-xdist's workers use the same value):
the runnable processes per CPU over the last minute (os.getloadavg), between 1 and MAX_SCALE.
"""

from __future__ import annotations

import os

ENV = "TEST_TIME_SCALE"
MAX_SCALE = 4.0


def measure() -> float:
    """The scale for this machine now: ENV if set, else the load per CPU, in [1, MAX_SCALE]."""
    if os.environ.get(ENV):
        return max(1.0, float(os.environ[ENV]))
    try:
        load = os.getloadavg()[0]
    except OSError:  # not measured on this platform
        return 1.0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return round(min(MAX_SCALE, max(1.0, load / max(1, cpus or 1))), 2)


SCALE = measure()


def scaled(seconds: float) -> float:
    """`seconds` of waiting (a deadline, a heartbeat timeout, a latency bound) on this machine."""
    return seconds * SCALE


def heartbeats(interval: float = 0.2, timeout: float = 1.0) -> dict[str, str]:
    """The environment variables of a job's heartbeats: `timeout` scaled, `interval` as given
    (a beat more often costs nothing; a timeout too short evicts a live process)."""
    return {
        "COLLECTIVES_HEARTBEAT_INTERVAL": f"{interval:g}",
        "COLLECTIVES_HEARTBEAT_TIMEOUT": f"{scaled(timeout):g}",
    }
