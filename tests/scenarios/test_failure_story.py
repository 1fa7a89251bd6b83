"""The failure story that `explain crash|reconstruct|join` and the tutorial tell, run for real
(teaching/failures.py: a coordinator in this process, worker processes, a real signal).

Invariants:
  * SIGKILL: both survivors raise PeerFailure naming the victim; the first witness is the
    closed connection (the kernel's), and the coordinator also removes it for its silence
    (the heartbeats'); SIGSTOP: only the heartbeats tell;
  * the step in flight is dropped on every survivor and done again in generation 1, whose
    ranks are the survivors' renumbered densely in their old order (0 -> 0, 2 -> 1);
  * the joiner is admitted as the last rank of generation 2 and receives the step count and
    the model; every rank ends with the same model: each committed step adds the number of
    ranks that took part (3 + 3, then 2, then 3 + 3 = 14).
Every worker is killed and reaped by run_story whatever happens.
"""

from __future__ import annotations

import pytest

from collectives.teaching import failures
from collectives.teaching.explain import views

pytestmark = pytest.mark.timeout(120)


def check_story(s):
    fails = s.failures
    assert sorted(e["rank"] for e in fails) == [0, 2]
    assert all(e["failed"] == [1] and e["step"] == 3 and e["generation"] == 0 for e in fails)
    assert s.renumbering() == {0: 0, 2: 1}
    redo = [e for e in s.of("step") if e["generation"] == 1]
    assert sorted((e["rank"], e["step"], e["model"][0]) for e in redo) == [(0, 3, 8.0), (1, 3, 8.0)]
    joined = s.of("admitted")[0]
    assert (joined["rank"], joined["world_size"], joined["generation"]) == (2, 3, 2)
    given = s.of("model")[0]
    assert given["step"] == 3 and given["model"] == [8.0] * 4
    finals = s.finals()
    assert sorted(finals) == ["joiner", "rank0", "rank2"]
    assert all(e["model"] == [14.0] * 4 and e["step"] == 5 for e in finals.values())
    for make in (views.reconstruct_model, views.join_model):
        assert views.text(make(s))


def test_sigkill_found_by_the_kernel():
    s = failures.run_story("KILL")
    check_story(s)
    # a kernel's witness: the survivors' own closed connections to rank 1, or the
    # coordinator's (rank 1's pidfd, or its closed connection: membership/liveness.py) --
    # whichever comes first; never the heartbeat timeout (2 s here)
    witnessed = ("connection to rank 1 closed", "died")
    assert all(any(w in e["error"] for w in witnessed) for e in s.failures), s.failures
    assert not any("sent no heartbeat" in what for _, what in s.coordinator), s.coordinator
    assert 0 < s.detection < 5
    assert "kernel's witness" in views.text(views.crash_model(s))


def test_sigstop_found_by_the_heartbeats():
    s = failures.run_story("STOP")
    check_story(s)
    assert all("sent no heartbeat" in e["error"] for e in s.failures)
    assert "kernel's witness" not in views.text(views.crash_model(s))
