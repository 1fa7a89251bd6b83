"""The one clock membership/ reads. Its shells -- the coordinator (server.py) and its crash
witnesses (liveness.py), the client, its heartbeat thread and re-registration (client.py,
heartbeat.py, restart.py), a process's groups (lifecycle.py) -- take a Clock, the real one by
default; the machines (machine.py and the parts it names) take time only from the events they
are fed. So a test or a simulator that hands every shell one clock of its own drives the
whole failure side in its time (tests/unit/docs/test_one_clock.py keeps it so)."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back: deadlines, ages, timeouts."""
        ...

    def time(self) -> float:
        """Seconds since the epoch: for the records a person reads (the coordinator's events)."""
        ...


class RealClock:
    """The process's own clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()


REAL: Clock = RealClock()
