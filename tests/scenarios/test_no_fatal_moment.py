"""No moment where one death ends the job (membership/formation.py, liveness.py): a rank that
dies after joining but before generation 0 formed gives its place to a replacement, or (with
min_world_size) generation 0 forms with it and declares it failed at once, so that the others
re-form without it in generation 1, the first they sum in; a warm spare waits outside the group, never
growing it, and takes the place of a rank that dies. Invariant after each: the ranks left go
on with correct all_reduces (rank r gives r+1; the sum is n(n+1)/2) at the expected size.
"""

import signal
import time

import pytest

from support.cluster import Cluster
from support.timing import bound, scaled

INIT = ["--init-timeout", "60"]


def _wait_joined(c, n, timeout=30.0):
    """Until the in-process coordinator holds `n` joins for generation 0."""
    deadline = time.monotonic() + timeout
    while len(c.coordinator.joined) < n:
        assert time.monotonic() < deadline, f"{len(c.coordinator.joined)} of {n} joined"
        time.sleep(0.02)


def _noted(c, text, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not any(text in w for _, w in list(c.coordinator.events)):
        assert time.monotonic() < deadline, (text, list(c.coordinator.events))
        time.sleep(0.02)


@pytest.mark.timeout(90)
def test_a_rank_dead_before_generation_0_gives_its_place_to_a_replacement(tmp_path):
    c = Cluster(3, tmp_path, heartbeat_timeout=5.0, worker_args=INIT)
    try:
        c.spawn("w0", 0)
        c.spawn("w2", 2)
        _wait_joined(c, 2)
        c.signal("w2", signal.SIGKILL)
        _noted(c, "rank 2 ended before generation 0 formed")
        c.spawn("j", None)  # the replacement an elastic launcher would start
        _noted(c, "takes the place of rank 2")
        c.spawn("w1", 1)  # the last rank arrives: generation 0 forms, at 3
        steps = c.wait_steps(["w0", "w1", "j"], ws=3, timeout=30)
        assert all(s["gen"] == 0 for s in steps), steps
    finally:
        c.close()


@pytest.mark.timeout(90)
def test_min_world_size_forms_generation_0_without_the_dead(tmp_path):
    c = Cluster(3, tmp_path, heartbeat_timeout=5.0, worker_args=INIT, min_world_size=2)
    try:
        c.spawn("w0", 0)
        c.spawn("w2", 2)
        _wait_joined(c, 2)
        c.signal("w2", signal.SIGKILL)
        _noted(c, "rank 2 ended before generation 0 formed")
        c.spawn("w1", 1)
        _noted(c, "it formed without it")
        _noted(c, "generation 0 formed with 3 ranks")
        steps = c.wait_steps(["w0", "w1"], ws=2, timeout=30)
        # generation 0 formed with the dead rank in it and declared it failed at once
        # (formation.py); the two re-formed once, into generation 1, and sum there
        assert all(s["gen"] == 1 for s in steps), steps
    finally:
        c.close()


@pytest.mark.timeout(90)
def test_a_spare_waits_outside_and_takes_a_dead_ranks_place(tmp_path):
    """The workers reconstruct at every step, which admits any plain joiner at once: the
    spare stays out while nobody fails (no event of it joining before the kill, of all it
    sent), then replaces rank 1 within 2 s (scaled) of its SIGKILL, well before a heartbeat
    timeout would tell. (The launcher's --spares: tests/system/test_launch_spares.py.)"""
    c = Cluster(3, tmp_path, heartbeat_timeout=scaled(5.0))
    try:
        c.start()
        c.spawn("spare", None, env={"COLLECTIVES_SPARE": "1"})
        _noted(c, "a spare worker waits to join")
        waited = time.time()
        # not a wait: a window in which the spare could join too early, which it must not
        time.sleep(scaled(1.0))
        before = c.wait_steps(["w0", "w1", "w2"], ws=3, timeout=15, after=waited)
        assert not [e for e in c.seen if e["proc"] == "spare" and e["event"] == "joined"]
        killed_at = c.signal("w1", signal.SIGKILL)
        # the first steps of a later generation: a survivor's step of generation 0 may be
        # stamped after the kill when the survivor was scheduled late
        steps = c.wait_steps(
            ["w0", "w2", "spare"],
            ws=3,
            timeout=30,
            after=killed_at,
            after_gen=max(s["gen"] for s in before),
        )
        assert len({s["gen"] for s in steps}) == 1 and steps[0]["gen"] >= 1, steps
        # in soon after the kill: from its witnesses, not the (scaled) 5 s heartbeat timeout
        took = steps[2]["t"] - killed_at
        assert took < bound(2.0, below=5.0, below_scaled=True), took
        # and it stayed out until then: every event it ever sent, not only those read so far
        joined = [e for e in c.seen if e["proc"] == "spare" and e["event"] == "joined"]
        assert joined and all(e["t"] > killed_at for e in joined), joined
    finally:
        c.close()
