"""Deadlines and heartbeat settings for the tests, from one place, scaled to how busy the
machine is.

A test waits a bounded time for what it expects, and gives the jobs it starts a heartbeat
timeout after which a silent process is declared dead. On an idle machine the numbers the
tests are written with hold; on a loaded one (other jobs on the same cores) a live process can
go unscheduled for seconds, and a heartbeat timeout of 1 s declares it dead. So every such
number passes through `scaled()`: multiplied by SCALE, 1 on an idle machine, more on a busy one.
What a test asserts does not change; only how long it waits, and how long a live process may be
silent, grow with the load.

How SCALE is measured, and why so:

* TEST_TIME_SCALE, where set, is the scale, fixed for the whole session (a person who knows
  the machine better than a measurement does), within the same bounds as a measured one: at
  most MAX_SCALE, so that no latency bound grows past the fixed deadline it guards (bound()).
* Else it is the load per CPU, between 1 and MAX_SCALE, where the load is the larger of two
  readings that fail in opposite ways:
  - the runnable tasks now: /proc/loadavg's fourth field ("running/total"), read SAMPLES
    times SAMPLE_GAP apart and averaged, less the reader itself. It sees load that began a
    moment ago, which the kernel's averages take a minute to show (two CPU burners started
    with the suite read about 1 on the 1-minute average for the first ten seconds). One read
    alone is noise: a short burst or a lull; a tenth of a second of reads is steady enough.
  - the 1-minute load average (os.getloadavg). It remembers load that happens to pause while
    we sample (a neighbour's suite between two tests), which a short sample would miss.
  Taking the larger one can only make a test wait longer, never assert less; a scale too
  small is what makes a test flaky, one too large only slows a test that waits for a
  timeout to expire.
* It is measured again before each test (tests/conftest.py calls refresh()), not once per
  session: load that starts during a run of several minutes reaches the tests that follow.
  Within one test it does not change: the heartbeats given to its processes and the deadlines
  it waits with agree. A fresh sample is taken at most every REFRESH seconds, so that a run of
  unit tests of a few milliseconds each does not pay for a sample each; pytest-xdist's workers
  measure on their own, so two tests running side by side may hold different scales, each
  consistent in itself.

Measuring costs a tenth of a second of sleeping, once per REFRESH. The load counted is the
whole machine's, the suite's own processes included: a live process is unscheduled just as
long whoever's process took its CPU.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

ENV = "TEST_TIME_SCALE"
MAX_SCALE = 4.0
SAMPLES = 10  # reads of the runnable count, averaged ...
SAMPLE_GAP = 0.01  # ... this far apart (s): 0.1 s in all
REFRESH = 2.0  # s: a test within this long of the last measurement reuses it


def cpus() -> int:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def read_running(path: str = "/proc/loadavg") -> int | None:
    """The tasks runnable at this instant (the fourth field's numerator), the reader
    included; None where the file does not exist or reads otherwise."""
    try:
        with open(path) as f:
            return int(f.read().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return None


def runnable_now(
    read: Callable[[], int | None] = read_running,
    samples: int = SAMPLES,
    gap: float = SAMPLE_GAP,
    sleep: Callable[[float], None] = time.sleep,
) -> float | None:
    """The average runnable tasks other than the reader over `samples` reads `gap` s apart;
    None where they cannot be read."""
    seen = []
    for i in range(samples):
        if i:
            sleep(gap)
        n = read()
        if n is None:
            return None
        seen.append(max(0, n - 1))  # the reader is running while it reads
    return sum(seen) / len(seen)


def load_average() -> float | None:
    """The kernel's 1-minute load average; None where the platform has none."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def scale_for(loads: list[float | None], ncpus: int) -> float:
    """The scale for the largest of `loads` (None: not measured) on `ncpus` CPUs."""
    known = [x for x in loads if x is not None]
    load = max(known) if known else 0.0
    return round(min(MAX_SCALE, max(1.0, load / max(1, ncpus))), 2)


def override() -> float | None:
    """TEST_TIME_SCALE, where set: between 1 and MAX_SCALE, as a measured scale is. A larger
    one would stretch the latency bounds past the fixed deadlines they guard (bound())."""
    value = os.environ.get(ENV)
    return min(MAX_SCALE, max(1.0, float(value))) if value else None


def measure() -> float:
    """The scale for this machine now: ENV if set, else the load per CPU, in [1, MAX_SCALE]."""
    fixed = override()
    if fixed is not None:
        return fixed
    return scale_for([runnable_now(), load_average()], cpus())


SCALE = measure()
_measured_at = time.monotonic()


def refresh(now: float | None = None) -> float:
    """Measure SCALE again (before a test), unless it was measured within REFRESH s."""
    global SCALE, _measured_at
    now = time.monotonic() if now is None else now
    if now - _measured_at >= REFRESH:
        SCALE = measure()
        _measured_at = now
    return SCALE


def scaled(seconds: float) -> float:
    """`seconds` of waiting (a deadline, a heartbeat timeout, a latency bound) on this machine."""
    return seconds * SCALE


def bound(seconds: float, below: float, below_scaled: bool = False) -> float:
    """`seconds` scaled: a latency bound a test asserts ("each survivor learns of the death
    within 3 s") where the event would also come, later, from a deadline the job was given
    (a heartbeat timeout, an op timeout): `below`, unscaled, or scaled like the bound
    (below_scaled). A bound that reaches that deadline cannot fail -- the slow path meets it
    too -- so this checks, once for every such bound, that it stays below the deadline at
    the largest scale (MAX_SCALE; TEST_TIME_SCALE is capped at it too)."""
    worst = seconds * (1.0 if below_scaled else MAX_SCALE)
    if worst >= below:
        raise AssertionError(
            f"a bound of {seconds:g} s reaches {worst:g} s at the time scale's cap "
            f"({MAX_SCALE:g}), not below the {below:g} s deadline it guards: it could not fail"
        )
    return scaled(seconds)


def heartbeats(interval: float = 0.2, timeout: float = 1.0) -> dict[str, str]:
    """The environment variables of a job's heartbeats: `timeout` scaled, `interval` as given
    (a beat more often costs nothing; a timeout too short evicts a live process)."""
    return {
        "COLLECTIVES_HEARTBEAT_INTERVAL": f"{interval:g}",
        "COLLECTIVES_HEARTBEAT_TIMEOUT": f"{scaled(timeout):g}",
    }
