"""A coordinator that dies before generation 0 formed, with some ranks joined already, and is
started again at the same address (as the elastic launcher does): the ranks that joined the
dead one send their join again once their connection is made again (membership/client.py,
join), so generation 0 forms on the new one when the last rank arrives, and the job runs to
its end with the same result on every rank; no rank waits out its init timeout.
"""

import sys
import time

import pytest

from collectives.membership.server import Coordinator
from collectives.common.security import JobKeys
from support.ports import HOST
from support.procs import clean_env
from support.timing import scaled
from test_coordinator_restart import SECRET, WORKER, finals, hb

N = 3


@pytest.mark.timeout(90)
def test_a_coordinator_dead_before_generation_0_forms(procs):
    def start(port=0):
        return Coordinator(
            HOST,
            port,
            N,
            heartbeat_interval=0.2,
            heartbeat_timeout=scaled(1.5),  # as hb() gives the workers
            keys=JobKeys(SECRET.encode()),
        ).start()

    first = start()
    second = None
    try:
        env = dict(hb(), COLLECTIVES_COORDINATOR=first.address, WORLD_SIZE=N, STEPS=10)
        for r in (0, 1):
            procs.spawn(f"w{r}", [sys.executable, WORKER], clean_env(**env, RANK=r))
        deadline = time.monotonic() + 30
        while len(first.joined) < 2:
            assert time.monotonic() < deadline, "ranks 0 and 1 did not join"
            time.sleep(0.02)
        first.stop()  # its socket closes, as a killed process's does
        second = start(first.port)
        procs.spawn("w2", [sys.executable, WORKER], clean_env(**env, RANK=2))
        ends = finals(procs, ["w0", "w1", "w2"], timeout=60)
        assert len({e["sha"] for e in ends.values()}) == 1, ends
        assert all(e["sha"] == e["expected"] for e in ends.values()), ends
    finally:
        first.stop()
        if second is not None:
            second.stop()
