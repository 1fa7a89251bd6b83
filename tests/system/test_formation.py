"""A next generation that fails to form.

Invariants:
  * reconstruct() never returns a closed group. When a member or a joiner vanishes after it
    was told its rank in the next generation, the members get a working group of those left
    (a new generation: their next all_reduce is right), or, past their timeout, PeerFailure,
    after which reconstruct() on the same group goes on;
  * a joiner whose admission fell through (another newcomer or a member vanished) is
    admitted at the members' next attempt, within its own init_process_group timeout.
Workers are real processes (tests/support/formation_worker.py) with a coordinator in the test
process (port 0); each is in its own session, killed and reaped at teardown whatever happened.
"""

from __future__ import annotations

import os
import sys

import pytest

from support.ports import coordinator
from support.procs import ProcessSet, clean_env
from support.timing import bound, heartbeats, scaled

FORMATION_DEADLINE = 10.0  # s, scaled: the members' reconstruct timeout

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
WORKER = os.path.join(HERE, "support", "formation_worker.py")


class Job(ProcessSet):
    """A coordinator on port 0 and formation_worker.py processes reporting JSON events."""

    stderr_chars = 2000

    def __init__(self, world_size, tmp_path):
        super().__init__(
            tmp_path, coordinator(world_size, heartbeat_interval=0.2, heartbeat_timeout=scaled(1.0))
        )
        self.world_size = world_size

    def spawn(self, name, role, fault="", **env):
        env = clean_env(
            **heartbeats(0.2, 1.0),
            ROLE=role,
            FAULT=fault,
            COLLECTIVES_COORDINATOR=self.coordinator.address,
            **env,
        )
        return super().spawn(name, [sys.executable, WORKER], env)

    def members(self, expect_ws, faults=None, **env):
        for r in range(self.world_size):
            self.spawn(
                f"m{r}",
                "member",
                (faults or {}).get(r, ""),
                RANK=r,
                WORLD_SIZE=self.world_size,
                EXPECT_WS=expect_ws,
                **env,
            )
        for r in range(self.world_size):
            self.event(f"m{r}", "ready", 40)

    def event(self, name, kind, timeout):
        """The first event `kind` of process `name`; fails (with the workers' stderr) if a
        result is replaced by an exit, or nothing comes within `timeout` s."""

        def ended(e):  # `name` is gone (or gave up) without a `kind`
            return e["proc"] == name and e["event"] in ("exit", "gave_up") and kind != "exit"

        return self.wait_for(
            lambda e: e["proc"] == name and e["event"] == kind,
            timeout,
            f"{kind} from {name}",
            ends=ended,
        )


@pytest.fixture
def job(tmp_path):
    yield from Job.factory(tmp_path)


@pytest.mark.timeout(90)
def test_joiner_vanishing_after_its_rank_leaves_the_members_a_working_group(job):
    """A joiner that vanishes once told its rank: the members get a working group of the two
    of them, without waiting out the formation deadline (the reconstruct timeout), and
    reconstruct() returns neither the group it closed nor an error with no group to use."""
    j = job(2)
    j.members(expect_ws=2, RECONSTRUCT_TIMEOUT=f"{scaled(FORMATION_DEADLINE):g}")
    j.spawn("ghost", "joiner", "vanish")
    told = j.event("ghost", "told", 30)
    assert told["gen"] == 1 and told["rank"] == 2, told
    results = [j.event(f"m{r}", "result", 30) for r in range(2)]
    for r, res in enumerate(results):
        # a new generation (attempt 1 failed, so it is 2) of the two members, that works
        assert (res["rank"], res["ws"], res["gen"], res["sum"]) == (r, 2, 2, 3.0), res
        # found by a witness of its death (membership/liveness.py: its pidfd, watched from
        # its join request, or its closed connection) or its silent heartbeat (1 s), not the
        # 10 s formation deadline (both scaled alike)
        assert res["t"] - told["t"] < bound(6.0, below=FORMATION_DEADLINE, below_scaled=True), (
            res,
            told,
        )
    assert j.event("ghost", "exit", 10)["code"] == 3
    assert any(
        "generation 1 did not form: new rank 2 (a joiner) " in n
        and any(
            witness in n
            for witness in (
                "seen through its pidfd",
                "its connection to the coordinator closed",
                "sent no heartbeat",
            )
        )
        for n in j.notes()
    ), j.notes()


@pytest.mark.timeout(90)
def test_member_vanishing_after_its_rank_a_waiting_joiner_gets_in_next(job):
    """Member 2 dies once told its new rank; the joiner admitted with it waits for the next
    attempt and gets in: generation 2 = old ranks 0 and 1, then the joiner, whose
    init_process_group returns (it does not fail with 'call reconstruct() again')."""
    j = job(3)
    j.members(expect_ws=3, faults={2: "vanish"}, RECONSTRUCT_TIMEOUT=f"{scaled(10):g}")
    j.spawn("joiner", "joiner")
    told = j.event("m2", "told", 30)
    assert told["gen"] == 1, told
    joined = j.event("joiner", "joined", 30)
    assert (joined["rank"], joined["ws"], joined["gen"]) == (2, 3, 2), joined
    got = [j.event(name, "result", 20) for name in ("m0", "m1", "joiner")]
    assert [(g["rank"], g["ws"], g["gen"], g["sum"]) for g in got] == [
        (0, 3, 2, 6.0),
        (1, 3, 2, 6.0),
        (2, 3, 2, 6.0),
    ], got
    assert j.event("m2", "exit", 10)["code"] == 3
    assert any("generation 1 did not form: new rank 2 (old rank 2)" in n for n in j.notes())


@pytest.mark.timeout(90)
def test_reconstruct_past_its_timeout_raises_peer_failure_and_can_be_called_again(job):
    """A joiner that stays alive but never sends its address is caught only by the formation
    deadline, which is the members' whole reconstruct timeout: they get PeerFailure naming
    what happened, call reconstruct() on the same group again, and get a working one (the
    group is not left 'destroyed')."""
    j = job(2)
    j.members(expect_ws=2, RECONSTRUCT_TIMEOUT=2)
    j.spawn("stuck", "joiner", "hang")
    j.event("stuck", "told", 30)
    for r in range(2):
        failure = j.event(f"m{r}", "failure", 20)
        assert failure["type"] == "PeerFailure", failure
        assert (
            "generation 1 did not form: new rank 2 (a joiner) sent no address before the "
            "deadline" in failure["error"]
        ), failure
        assert "call reconstruct() on it again" in failure["error"], failure
    for r in range(2):
        res = j.event(f"m{r}", "result", 30)
        assert (res["rank"], res["ws"], res["sum"]) == (r, 2, 3.0), res
        assert res["gen"] >= 2, res
