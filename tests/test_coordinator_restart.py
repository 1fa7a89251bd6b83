"""The coordinator can die and come back (issue 14): a standalone coordinator SIGKILLed in the
middle of a job and started again at the same address (same port, same job secret, so the same
CURVE keys).

Invariants:
  * collectives go on while it is away, the members re-register with the new one, and it
    rebuilds the generation from them without a generation change: the job ends at generation
    0 with the parameters an undisturbed run gives (the same sha256 as numpy's recomputation),
    after membership rounds (reconstruct(), as ElasticTrainer's admissions) on the new one;
  * a worker SIGKILLed while the coordinator is away is declared dead once it is back, and
    the survivors reconstruct and run to the final barrier with identical parameters;
  * a coordinator that stays away past COLLECTIVES_COORDINATOR_GRACE: every member raises
    CoordinatorLost, which says so, within the grace and a bound -- no hang.
Workers: tests/support/restart_worker.py (numpy only: cheap to start).
"""
from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from support.ports import HOST, coordinator_process
from support.procs import clean_env

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "support", "restart_worker.py")
SECRET = "restart-test-secret-0123456789"
HB = {"COLLECTIVES_HEARTBEAT_INTERVAL": "0.2", "COLLECTIVES_HEARTBEAT_TIMEOUT": "1.5",
      "COLLECTIVES_JOB_SECRET": SECRET}
N = 3


def start_job(procs, steps, n=N, **extra):
    address = coordinator_process(procs, "coord", n, env=clean_env(**HB))
    for r in range(n):
        procs.spawn(f"w{r}", [sys.executable, WORKER], clean_env(
            **HB, COLLECTIVES_COORDINATOR=address, RANK=r, WORLD_SIZE=n, STEPS=steps,
            **extra))
    return address


@pytest.fixture
def restarted():
    """restart(address): the coordinator started again on the same port, with the same secret
    -- in the test process (no interpreter to start: the command line's restart is
    tests/test_launch_hosting.py's); stopped at teardown."""
    from collectives.membership.server import Coordinator
    from collectives.transport.security import JobKeys
    made = []

    def restart(address):
        made.append(Coordinator(HOST, int(address.rpartition(":")[2]), N,
                                heartbeat_interval=0.2, heartbeat_timeout=1.5,
                                keys=JobKeys(SECRET.encode())).start())
        return made[-1]
    yield restart
    for c in made:
        c.stop()


def notes(coordinator) -> list[str]:
    return [what for _, what in list(coordinator.events)]


def kill_coordinator(procs):
    os.kill(procs.procs["coord"].pid, signal.SIGKILL)
    procs.procs["coord"].wait(5)


def step_of(procs, name, at_least, timeout=30):
    return procs.wait_for(lambda e: e["proc"] == name and e["event"] == "step"
                          and e["step"] >= at_least, timeout, f"step {at_least} of {name}",
                          ends=lambda e: e["proc"] == name and e["event"] == "exit")


def finals(procs, names, timeout=40):
    out = {}
    for n in names:
        out[n] = procs.wait_for(lambda e, n=n: e["proc"] == n and e["event"] in ("final", "error"),
                                timeout, f"the end of {n}",
                                ends=lambda e, n=n: e["proc"] == n and e["event"] == "exit")
        assert out[n]["event"] == "final", f"{n}: {out[n]}"
    return out


@pytest.mark.timeout(60)
def test_restart_mid_training_keeps_generation_and_result(procs, restarted):
    steps = 50
    address = start_job(procs, steps, RECONSTRUCT_EVERY=25)
    for r in range(N):
        step_of(procs, f"w{r}", 2)
    kill_coordinator(procs)
    killed_at = time.time()
    time.sleep(0.5)             # steps without any coordinator
    restarted_at = time.time()
    coord = restarted(address)
    end = finals(procs, [f"w{r}" for r in range(N)])
    for name, e in end.items():
        assert e["sha"] == e["expected"], f"{name}: parameters differ from numpy's"
        assert (e["ws"], e["gen"], e["step"]) == (N, 0, steps), e
    # collectives ran on every rank while the coordinator was away (the membership rounds at
    # steps 24 and 49 ran on the new one)
    away = {e["proc"] for e in procs.seen if e["event"] == "step"
            and killed_at < e["t"] < restarted_at}
    assert away == {f"w{r}" for r in range(N)}, away
    assert not [e for e in procs.seen if e["event"] == "failure"]
    assert "generation 0 rebuilt: 3 of 3 ranks back" in notes(coord), notes(coord)
    for r in range(N):
        assert procs.wait(f"w{r}", 10)[0].code == 0


@pytest.mark.timeout(60)
def test_worker_killed_while_coordinator_away(procs, restarted):
    address = start_job(procs, 40, RECONSTRUCT_EVERY=0, OP_TIMEOUT=2)
    for r in range(N):
        step_of(procs, f"w{r}", 10)
    kill_coordinator(procs)
    os.kill(procs.procs["w2"].pid, signal.SIGKILL)
    time.sleep(0.5)
    coord = restarted(address)
    end = finals(procs, ["w0", "w1"])
    assert end["w0"]["sha"] == end["w1"]["sha"]
    for e in end.values():
        assert (e["ws"], e["gen"], e["step"]) == (2, 1, 40), e
    log = notes(coord)
    assert "generation 0 rebuilt: 2 of 3 ranks back" in log, log
    assert "generation 1 formed: 3 -> 2 ranks" in log, log


@pytest.mark.timeout(40)
def test_coordinator_away_past_grace(procs):
    grace, n = 1.5, 2
    start_job(procs, 100000, n, RECONSTRUCT_EVERY=0, COLLECTIVES_COORDINATOR_GRACE=grace)
    for r in range(n):
        step_of(procs, f"w{r}", 5)
    kill_coordinator(procs)
    killed_at = time.time()
    for r in range(n):
        e = procs.wait_for(lambda e, r=r: e["proc"] == f"w{r}" and e["event"] == "error",
                           grace + 10, f"CoordinatorLost on w{r}",
                           ends=lambda e, r=r: e["proc"] == f"w{r}" and e["event"] == "exit")
        assert e["type"] == "CoordinatorLost", e
        assert "COLLECTIVES_COORDINATOR_GRACE" in e["message"] and address_in(e), e
        assert grace <= e["t"] - killed_at < grace + 5, e["t"] - killed_at
    for r in range(n):
        assert procs.wait(f"w{r}", 10)[0].code == 3


def address_in(e) -> bool:
    return "the coordinator at" in e["message"]


def rejoin(mid, rank, generation, members, failed=(), forming=-1):
    return {"t": "rejoin", "mid": mid, "rank": rank, "world_size": len(members),
            "generation": generation, "members": list(members), "failed": list(failed),
            "forming": forming, "seq": 7, "in_op": False, "waiting_on": None, "sent": None,
            "recv": None}


@pytest.mark.fast
@pytest.mark.timeout(20)
def test_recovery_rebuilds_from_re_registrations_and_refuses_conflicts():
    """In-process, without the loop: the coordinator's recovery on its own (recovery.py).
    The first re-registration installs its generation as it is; the others must agree with
    it; one that does not come back is declared dead after the heartbeat timeout, not at
    once; the generation number never changes."""
    from collectives.membership.protocol import pack
    from collectives.membership.server import Coordinator
    c = Coordinator(HOST, 0, 3, heartbeat_interval=0.05, heartbeat_timeout=0.3, keys=None)
    sent = []
    c._send = lambda ident, msg: sent.append((ident, msg))
    m = ["a" * 32, "b" * 32, "c" * 32]
    try:
        c.handle([b"i0", pack(rejoin(m[0], 0, 4, m, forming=5))])
        assert (c.generation, c.members, c.recovering) == (4, m, {m[1], m[2]})
        assert sent[-1] == (b"i0", {"t": "rejoined", "generation": 4})
        assert c.dissolved and c.tried == 5     # the next reconstruct forms a fresh one
        refused = [rejoin(m[1], 1, 4, [m[1], m[0], m[2]]),        # another member list
                   rejoin("d" * 32, 1, 4, [m[0], "d" * 32, m[2]]),  # rank 1 is m[1]'s
                   rejoin(m[1], 1, 3, m)]                           # an older generation
        for msg in refused:
            c.handle([b"ix", pack(msg)])
            assert sent[-1][1]["t"] == "evicted", (msg, sent[-1])
        assert (c.generation, c.members, c.recovering) == (4, m, {m[1], m[2]})
        c.handle([b"i1", pack(rejoin(m[1], 1, 4, m))])
        assert c.recovering == {m[2]} and not c.failed
        t0 = time.monotonic()
        while c.recovering is not None and time.monotonic() < t0 + 5:
            for i in (0, 1):     # the two that are back beat
                beat = dict(rejoin(m[i], i, 4, m), t="beat")
                c.handle([b"h%d" % i, pack(beat)])
            c.tick()
            time.sleep(0.02)
        assert time.monotonic() - t0 >= 0.25       # waited for it: not declared at once
        assert list(c.failed) == [m[2]] and c.generation == 4
        notes = [what for _, what in c.events]
        assert "generation 4 rebuilt: 2 of 3 ranks back" in notes, notes
    finally:
        c.stop()


@pytest.mark.fast
@pytest.mark.timeout(20)
def test_a_coordinator_that_paused_declares_nobody_dead_for_it():
    """A coordinator that did not run for longer than the heartbeat timeout (SIGSTOP, a busy
    host) holds no fresh beats when it runs again: that silence is its own, and the members'
    clocks move on by the pause. A member that stays silent afterwards is still declared."""
    from collectives.membership.protocol import pack
    from collectives.membership.server import Coordinator
    c = Coordinator(HOST, 0, 2, heartbeat_interval=0.05, heartbeat_timeout=0.3, keys=None)
    c._send = lambda ident, msg: None
    m = ["a" * 32, "b" * 32]
    try:
        c.handle([b"i0", pack(rejoin(m[0], 0, 0, m))])
        c.handle([b"i1", pack(rejoin(m[1], 1, 0, m))])
        c.tick()
        time.sleep(0.6)                      # "stopped": no loop, no beats taken
        c.tick()
        assert not c.failed, c.failed
        t0 = time.monotonic()
        while not c.failed and time.monotonic() < t0 + 5:
            c.handle([b"h0", pack(dict(rejoin(m[0], 0, 0, m), t="beat"))])
            c.tick()
            time.sleep(0.02)
        assert list(c.failed) == [m[1]]      # the silent one, once its own timeout passed
    finally:
        c.stop()


def _answered_round(seqs, member2, failed=False):
    """A 3-member coordinator (in-process, its answers recorded): members 0 and 1 ask
    reconstruct() with their last op's seq (`seqs`), member 2 beats `member2` = (seq, in_op);
    returns what 0 and 1 were answered by the time the round is checked."""
    from collectives.membership.server import Coordinator
    from collectives.membership import protocol
    c = Coordinator("127.0.0.1", 0, 3, heartbeat_interval=0.1, heartbeat_timeout=30.0,
                    keys=None)
    sent = []
    try:
        for r in range(3):
            c.handle([b"j%d" % r, protocol.pack({"t": "join", "rank": r, "world_size": 3,
                                                 "mid": f"m{r}",
                                                 "info": {"tcp": "tcp://x:1", "pid": 1}})])
        assert c.members == ["m0", "m1", "m2"]
        c._send = lambda ident, msg: sent.append((ident, msg["t"]))
        if failed:
            c._declare(["m2"], "test: failed")
            sent.clear()
        for r, seq in enumerate(seqs):
            msg = {"t": "reconstruct", "mid": f"m{r}", "generation": c.generation,
                   "timeout": 30.0}
            if seq is not None:
                msg["seq"] = seq
            c.handle([b"r%d" % r, protocol.pack(msg)])
        seq, in_op = member2
        c.handle([b"b2", protocol.pack({"t": "beat", "mid": "m2", "generation": c.generation,
                                        "seq": seq, "in_op": in_op, "waiting_on": None,
                                        "sent": None, "recv": None})])
        c._check_round()
        return sorted(t for ident, t in sent if ident in (b"r0", b"r1"))
    finally:
        c.stop()


@pytest.mark.fast
@pytest.mark.timeout(30)
def test_askers_get_unchanged_when_a_member_is_already_past_the_round():
    """A coordinator SIGKILLed while it answered a reconstruct() round 'unchanged' (rank 2
    got it and went on into its next op; ranks 0 and 1 did not, and asked the restarted
    coordinator again) must not wait for rank 2: it is in op #7, waiting for them (bench.chaos
    hung there, 2 runs of 10 minutes out of 2). Rank 2 being past the round is what says so;
    a rank merely still in the op the askers finished, a failure to regroup for, or an asker
    that does not say its seq keep the round waiting (or regrouping) as before."""
    assert _answered_round([6, 6], (7, True)) == ["unchanged", "unchanged"]
    assert _answered_round([6, 6], (6, True)) == []           # still in op #6: it will come
    assert _answered_round([6, None], (7, True)) == []        # an asker did not say
    assert "unchanged" not in _answered_round([6, 6], (7, True), failed=True)
