"""A SIGKILL at the two moments of a reconstruct() where only a witness of the death, not a
heartbeat timeout or the formation deadline, can end the formation in time: a member killed
once told its rank in the next generation (before it sends its address), and a joiner killed
at the same point of its admission. With heartbeats at 30 s and a 20 s reconstruct timeout,
only the kernel's witnesses (membership/liveness.py) can end the formation in time: the others get a working group of
those left (a sum that is right) within FOUND s of the kill (scaled, and below the formation
deadline, scaled alike).
"""

import pytest

from support.ports import coordinator
from support.procs import ProcessSet
from support.timing import bound, scaled
from test_formation import Job

FOUND = 5.0  # s, scaled: from the kill to the others' working group
FORMATION = 20.0  # s, scaled: the members' reconstruct timeout, which would also end it


def found() -> float:
    return bound(FOUND, below=FORMATION, below_scaled=True)


class SlowHeartbeatJob(Job):
    def __init__(self, world_size, tmp_path):
        ProcessSet.__init__(
            self, tmp_path, coordinator(world_size, heartbeat_interval=0.2, heartbeat_timeout=30.0)
        )
        self.world_size = world_size


@pytest.fixture
def slow_job(tmp_path):
    yield from SlowHeartbeatJob.factory(tmp_path)


@pytest.mark.timeout(90)
def test_a_joiner_killed_during_its_admission(slow_job):
    j = slow_job(2)
    j.members(expect_ws=2, RECONSTRUCT_TIMEOUT=f"{scaled(FORMATION):g}")
    j.spawn("ghost", "joiner", "kill")
    told = j.event("ghost", "told", 30)
    for r in range(2):
        res = j.event(f"m{r}", "result", 30)
        assert (res["rank"], res["ws"], res["sum"]) == (r, 2, 3.0), res
        assert res["t"] - told["t"] < found(), (res, told)


@pytest.mark.timeout(90)
def test_a_joiner_killed_before_its_first_beat(slow_job):
    """A joiner that never beat (a loaded host, its heartbeat thread not yet scheduled) has no
    heartbeat connection to witness its death: the coordinator watches its process from its
    join request on, so its pidfd does."""
    j = slow_job(2)
    j.members(expect_ws=2, RECONSTRUCT_TIMEOUT=f"{scaled(FORMATION):g}")
    j.spawn("ghost", "joiner", "kill", SILENT="1")
    told = j.event("ghost", "told", 30)
    for r in range(2):
        res = j.event(f"m{r}", "result", 30)
        assert (res["rank"], res["ws"], res["sum"]) == (r, 2, 3.0), res
        assert res["t"] - told["t"] < found(), (res, told)


@pytest.mark.timeout(90)
def test_a_member_killed_during_reconstruct(slow_job):
    j = slow_job(3)
    j.members(expect_ws=3, faults={2: "kill"}, RECONSTRUCT_TIMEOUT=f"{scaled(FORMATION):g}")
    j.spawn("joiner", "joiner")
    told = j.event("m2", "told", 30)
    got = [j.event(name, "result", 30) for name in ("m0", "m1", "joiner")]
    assert [(g["rank"], g["ws"], g["sum"]) for g in got] == [
        (0, 3, 6.0),
        (1, 3, 6.0),
        (2, 3, 6.0),
    ], got
    assert all(g["t"] - told["t"] < found() for g in got), (got, told)
