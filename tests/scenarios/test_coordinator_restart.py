"""The coordinator can die and come back: a standalone coordinator SIGKILLed in the
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
from support.timing import heartbeats, scaled

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
WORKER = os.path.join(HERE, "support", "restart_worker.py")
SECRET = "restart-test-secret-0123456789"


def hb() -> dict[str, str]:
    """The job's heartbeats, scaled when the test runs (support/timing.py), and its secret."""
    return {**heartbeats(0.2, 1.5), "COLLECTIVES_JOB_SECRET": SECRET}


N = 3


def start_job(procs, steps, n=N, **extra):
    address = coordinator_process(procs, "coord", n, env=clean_env(**hb()))
    for r in range(n):
        procs.spawn(
            f"w{r}",
            [sys.executable, WORKER],
            clean_env(
                **hb(), COLLECTIVES_COORDINATOR=address, RANK=r, WORLD_SIZE=n, STEPS=steps, **extra
            ),
        )
    return address


@pytest.fixture
def restarted():
    """restart(address): the coordinator started again on the same port, with the same secret
    -- in the test process (no interpreter to start: the command line's restart is
    tests/system/test_launch_hosting.py's); stopped at teardown."""
    from collectives.membership.server import Coordinator
    from collectives.common.security import JobKeys

    made = []

    def restart(address):
        made.append(
            Coordinator(
                HOST,
                int(address.rpartition(":")[2]),
                N,
                heartbeat_interval=0.2,
                heartbeat_timeout=scaled(1.5),
                keys=JobKeys(SECRET.encode()),
            ).start()
        )
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
    return procs.wait_for(
        lambda e: e["proc"] == name and e["event"] == "step" and e["step"] >= at_least,
        timeout,
        f"step {at_least} of {name}",
        ends=lambda e: e["proc"] == name and e["event"] == "exit",
    )


def finals(procs, names, timeout=40):
    out = {}
    for n in names:
        out[n] = procs.wait_for(
            lambda e, n=n: e["proc"] == n and e["event"] in ("final", "error"),
            timeout,
            f"the end of {n}",
            ends=lambda e, n=n: e["proc"] == n and e["event"] == "exit",
        )
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
    for r in range(N):  # every rank steps while no coordinator runs
        procs.wait_for(
            lambda e, r=r: e["proc"] == f"w{r}" and e["event"] == "step" and e["t"] > killed_at,
            10,
            f"w{r} stepping with no coordinator",
        )
    restarted_at = time.time()
    coord = restarted(address)
    end = finals(procs, [f"w{r}" for r in range(N)])
    for name, e in end.items():
        assert e["sha"] == e["expected"], f"{name}: parameters differ from numpy's"
        assert (e["ws"], e["gen"], e["step"]) == (N, 0, steps), e
    # collectives ran on every rank while the coordinator was away (the membership rounds at
    # steps 24 and 49 ran on the new one)
    away = {
        e["proc"] for e in procs.seen if e["event"] == "step" and killed_at < e["t"] < restarted_at
    }
    assert away == {f"w{r}" for r in range(N)}, away
    assert not [e for e in procs.seen if e["event"] == "failure"]
    assert "generation 0 rebuilt: 3 of 3 ranks back" in notes(coord), notes(coord)
    for r in range(N):
        assert procs.wait(f"w{r}", 10)[0].code == 0


@pytest.mark.timeout(60)
def test_a_coordinator_whose_machine_halts_starts_afresh_and_the_job_goes_on(procs, monkeypatch):
    """A transition raises (a bug): the machine halts (machine.Halted), the coordinator starts
    afresh at its address, the members re-register as after a crash, and the job ends at
    generation 0 with the undisturbed run's parameters."""
    from collectives.common.security import JobKeys
    from collectives.membership import machine
    from collectives.membership.server import Coordinator

    steps = 50
    coord = Coordinator(
        HOST,
        0,
        N,
        heartbeat_interval=0.2,
        heartbeat_timeout=scaled(1.5),
        keys=JobKeys(SECRET.encode()),
    ).start()
    try:
        for r in range(N):
            env = dict(RANK=r, WORLD_SIZE=N, STEPS=steps, RECONSTRUCT_EVERY=25)
            procs.spawn(
                f"w{r}",
                [sys.executable, WORKER],
                clean_env(**hb(), COLLECTIVES_COORDINATOR=coord.address, **env),
            )
        for r in range(N):
            step_of(procs, f"w{r}", 2)
        first, raised = coord.machine, []

        def broken_once(s, out, now):
            if not raised:
                raised.append(now)
                raise RuntimeError("a bug in a transition")

        monkeypatch.setattr(machine, "PERIODIC", (*machine.PERIODIC, broken_once))
        end = finals(procs, [f"w{r}" for r in range(N)])
        assert raised and first.halted is not None and coord.machine is not first
        for name, e in end.items():
            assert e["sha"] == e["expected"], f"{name}: parameters differ from numpy's"
            assert (e["ws"], e["gen"], e["step"]) == (N, 0, steps), e
        assert not [e for e in procs.seen if e["event"] == "failure"]
        log = notes(coord)
        assert any("a bug in a transition" in what for what in log), log
        assert "generation 0 rebuilt: 3 of 3 ranks back" in log, log
        for r in range(N):
            assert procs.wait(f"w{r}", 10)[0].code == 0
    finally:
        coord.stop()


@pytest.mark.timeout(60)
def test_worker_killed_while_coordinator_away(procs, restarted):
    address = start_job(procs, 40, RECONSTRUCT_EVERY=0, OP_TIMEOUT=2)
    for r in range(N):
        step_of(procs, f"w{r}", 10)
    kill_coordinator(procs)
    os.kill(procs.procs["w2"].pid, signal.SIGKILL)
    time.sleep(0.5)  # not a wait: the coordinator stays away a while after the death
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
    # before the kill: no member sees it gone sooner (taken after the reaping, the member's
    # grace, which counts from its connection's closing, could end "before" the kill)
    killed_at = time.time()
    kill_coordinator(procs)
    for r in range(n):
        e = procs.wait_for(
            lambda e, r=r: e["proc"] == f"w{r}" and e["event"] == "error",
            grace + 10,
            f"CoordinatorLost on w{r}",
            ends=lambda e, r=r: e["proc"] == f"w{r}" and e["event"] == "exit",
        )
        assert e["type"] == "CoordinatorLost", e
        assert "COLLECTIVES_COORDINATOR_GRACE" in e["message"] and address_in(e), e
        assert grace <= e["t"] - killed_at < grace + scaled(5), e["t"] - killed_at
    for r in range(n):
        assert procs.wait(f"w{r}", 10)[0].code == 3


def address_in(e) -> bool:
    return "the coordinator at" in e["message"]


HELD = 1.0  # s the ranks are held at the proposal's start op before the restart


class Proposer:
    """Stands in for the first coordinator's Reroute (membership/reroute.py): proposes one
    schedule -- the ring the other way round, from an op well ahead of the ranks -- and never
    decides it, as a coordinator that dies between its proposal and its decision."""

    def __init__(self, size, lead):
        self.size, self.generation, self.lead = size, 0, lead
        self.seqs = [-1] * size
        self.version = 0
        self.start = None
        self.acked, self.refused = set(), False

    def beat(self, rank, seq, rows, now):
        self.seqs[rank] = max(self.seqs[rank], seq)

    def ack(self, rank, version, ok):
        if version == self.version:
            self.acked.add(rank) if ok else setattr(self, "refused", True)

    def tick(self, out, members, now, spare_waiting=0):
        from collectives.membership.reroute import to_all

        if min(self.seqs) < 0 or (self.start is not None and not self.refused):
            return
        self.version += 1
        self.start, self.acked, self.refused = max(self.seqs) + self.lead, set(), False
        plan = [list(reversed(range(self.size))), False, [], True]
        msg = {"t": "schedule", "generation": 0, "version": self.version, "start": self.start}
        to_all(out, members, dict(msg, plan=plan, ops=None))

    def status(self):
        return None


@pytest.mark.timeout(120)
def test_a_proposal_left_undecided_by_a_coordinator_that_died_is_decided_by_the_next(
    procs, restarted
):
    """The coordinator proposes a schedule, every rank accepts it, and the coordinator dies
    before deciding: the ranks reach the proposal's start op and wait there (nobody may run
    it on a plan the others might not). The restarted coordinator, once every rank is back,
    drops it (nobody applied it; group/schedbook.py states the rule): the ranks go on at
    once -- within a few seconds of the restart, far inside the op timeout they would
    otherwise wait out -- with no failure, at generation 0, with numpy's parameters, and every
    op on every rank on the default schedule (each step's plan, recorded by the worker: the
    int64 sums are the same under any plan, so they cannot tell)."""
    from collectives.common.security import JobKeys
    from collectives.membership.server import Coordinator

    steps, lead = 400, 60
    first = Coordinator(
        HOST,
        0,
        N,
        heartbeat_interval=0.2,
        heartbeat_timeout=scaled(1.5),
        keys=JobKeys(SECRET.encode()),
    ).start()
    address = f"{HOST}:{first.port}"
    try:
        for r in range(N):
            procs.spawn(
                f"w{r}",
                [sys.executable, WORKER],
                clean_env(
                    **hb(),
                    COLLECTIVES_COORDINATOR=address,
                    RANK=r,
                    WORLD_SIZE=N,
                    STEPS=steps,
                    RECONSTRUCT_EVERY=0,
                    ALGORITHM="ring",
                    OP_TIMEOUT=f"{scaled(60):g}",
                ),
            )
        for r in range(N):
            step_of(procs, f"w{r}", 2)
        proposer = Proposer(N, lead)
        first.state.failslow.reroute = proposer  # generation 0 formed: the loop keeps it
        deadline = time.monotonic() + scaled(20)
        while len(proposer.acked) < N:
            assert time.monotonic() < deadline, "the ranks did not accept the proposal"
            time.sleep(0.01)
        first.stop()  # between the proposal and its decision
    except BaseException:
        first.stop()
        raise
    start = proposer.start
    for r in range(N):  # every rank at the proposal's start op, waiting there
        step_of(procs, f"w{r}", start - 1)
    # not a wait: a window in which no rank may run op `start` (a step takes ~20 ms)
    time.sleep(HELD)
    restarted_at = time.time()
    coord = restarted(address)
    firsts = [step_of(procs, f"w{r}", start, timeout=60) for r in range(N)]
    # every rank ran op `start` only after the restart: it waited for the decision
    early = [e for e in firsts if e["t"] <= restarted_at]
    assert not early, f"ran op #{start} before the coordinator came back: {early}"
    waited = max(e["t"] for e in firsts) - restarted_at
    print(f"the ranks ran op #{start} {waited:.2f} s after the restart")
    assert waited < scaled(5), f"the ranks waited {waited:.1f} s after the restart"
    end = finals(procs, [f"w{r}" for r in range(N)], timeout=120)
    # every op ran on one plan on every rank: the default, the proposal being dropped
    plans: dict[int, dict[str, str | None]] = {}
    for e in procs.seen:
        if e["event"] == "step":
            plans.setdefault(e["step"], {})[e["proc"]] = e["plan"]
    assert sorted(plans) == list(range(steps)), sorted(plans)[-5:]
    odd = {step: p for step, p in plans.items() if len(p) != N or set(p.values()) != {None}}
    assert not odd, f"ops not run on the default schedule on every rank: {odd}"
    assert any("is dropped: nobody applied it" in n for n in notes(coord)), notes(coord)
    for name, e in end.items():
        assert e["sha"] == e["expected"], f"{name}: parameters differ from numpy's"
        assert (e["ws"], e["gen"], e["step"]) == (N, 0, steps), e
    assert not [e for e in procs.seen if e["event"] == "failure"], procs.seen[-10:]
