"""An evicted rank that rejoins, for real (worker processes, a coordinator in the test process).

Invariants:
  * the group a rank was evicted from is closed when it rejoins: after the rejoin the process
    runs one heartbeat thread and at most one op thread (not one more of each per eviction);
  * SIGTERM while an evicted rank waits to be readmitted ends that wait at once: the rank
    withdraws its join request (the coordinator notes it), ElasticTrainer.fit() returns with
    summary["left"] and the process exits 0 within seconds, not after the admission timeout;
  * a bare joiner (init_process_group(join=True), no SIGTERM handler of its own) withdraws
    and exits as the library's SIGTERM handler would (status 128 + SIGTERM), within seconds;
  * after a rejoin, SIGTERM announces the departure from the group the rank is in now (not
    through the closed link of the first init_process_group), also after fit() returned, and
    the rejoin adds no SIGTERM handler.
Evictions: SIGSTOP the worker until the other rank has regrouped without it (heartbeat timeout
1 s), then SIGCONT: it finds itself evicted and rejoins. Every spawned process is in its own
session and is killed and reaped at teardown, whatever happened.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from support.ports import coordinator
from support.procs import ProcessSet, clean_env
from support.timing import heartbeats, scaled

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
WORKER = os.path.join(HERE, "support", "elastic_worker.py")
WITHDREW = "withdrew"  # the coordinator's note when a waiting joiner leaves


class Workers(ProcessSet):
    """A coordinator on port 0 and worker processes reporting JSON events."""

    def __init__(self, world_size, tmp_path):
        super().__init__(
            tmp_path, coordinator(world_size, heartbeat_interval=0.2, heartbeat_timeout=scaled(1.0))
        )
        self.world_size = world_size

    def env(self, **extra):
        return clean_env(
            **heartbeats(0.2, 1.0), COLLECTIVES_COORDINATOR=self.coordinator.address, **extra
        )

    def trainer(self, name, rank, admit_every, **extra):
        return self.spawn(
            name,
            [sys.executable, WORKER],
            self.env(
                RANK=str(rank),
                WORLD_SIZE=str(self.world_size),
                ADMIT_EVERY=str(admit_every),
                **extra,
            ),
        )

    def step(self, name, timeout, **want):
        """The first step event of `name` whose fields match `want` (values or predicates)."""

        def ok(e):
            return (
                e["proc"] == name
                and e["event"] == "step"
                and all(v(e[k]) if callable(v) else e[k] == v for k, v in want.items())
            )

        return self.wait_for(ok, timeout, f"a step of {name} with {want}")

    def evict(self, name, survivor, timeout=30):
        """SIGSTOP `name` until `survivor` trains without it, then SIGCONT it."""
        stopped_at = time.time()
        os.kill(self.procs[name].pid, signal.SIGSTOP)
        try:
            self.step(survivor, timeout, ws=1, t=lambda t: t > stopped_at)
        finally:
            os.kill(self.procs[name].pid, signal.SIGCONT)

    def joiners(self) -> int:
        # read from the test thread: len() of a dict is atomic
        return len(self.coordinator.joiners)


@pytest.fixture
def workers(tmp_path):
    yield from Workers.factory(tmp_path)


def wait_until(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout:g} s")
        time.sleep(0.02)


@pytest.mark.timeout(90)
def test_rejoin_closes_the_evicted_group(workers):
    w = workers(2)
    w.trainer("w0", 0, admit_every=5)
    w.trainer("w1", 1, admit_every=5)
    w.step("w0", 40, ws=2)
    before = w.step("w1", 10, ws=2)
    assert before["heartbeat"] == 1, before
    w.evict("w1", "w0")
    w.wait_for(lambda e: e["proc"] == "w1" and e["event"] == "rejoining", 20, "w1 rejoining")
    after = w.step("w1", 30, ws=2, gen=lambda g: g >= 2)  # readmitted by w0
    # the evicted group's heartbeat thread (and its op thread) went with it
    assert after["heartbeat"] == 1, after
    assert after["runner"] <= 1, after


@pytest.mark.timeout(90)
def test_sigterm_while_waiting_for_readmission_exits_at_once(workers):
    w = workers(2)
    w.trainer("w0", 0, admit_every=0)  # never admits: w1's rejoin waits (JOIN_TIMEOUT 60 s)
    w.trainer("w1", 1, admit_every=5)
    w.step("w0", 40, ws=2)
    w.step("w1", 10, ws=2)
    w.evict("w1", "w0")
    w.wait_for(lambda e: e["proc"] == "w1" and e["event"] == "rejoining", 20, "w1 rejoining")
    wait_until(lambda: w.joiners() == 1, 10, "w1 waiting for admission")
    time.sleep(0.3)  # not a wait: the SIGTERM lands well inside the wait, not at its start
    termed = time.time()
    os.kill(w.procs["w1"].pid, signal.SIGTERM)
    final = w.wait_for(lambda e: e["proc"] == "w1" and e["event"] == "final", 10, "fit() end")
    assert final["left"] is True, final
    assert final["t"] - termed < scaled(2.0), final  # the wait polls for it every 0.1 s
    # then the interpreter's exit, torch's teardown included (> 1 s on a busy machine); not
    # the 60 s admission timeout
    gone = w.wait_for(lambda e: e["proc"] == "w1" and e["event"] == "exit", 10, "w1 exiting")
    assert gone["t"] - termed < scaled(6.0), (gone, w.stderr_tail())
    assert gone["code"] == 0, (gone, w.stderr_tail())
    # it withdrew its request (not forgotten after a heartbeat timeout)
    assert w.joiners() == 0
    assert any(WITHDREW in n for n in w.notes()), w.notes()
    # the member that never admits goes on undisturbed
    w.step("w0", 10, ws=1, t=lambda t: t > gone["t"])


JOINER = "import collectives as cl; cl.init_process_group(join=True, timeout=60)"


@pytest.mark.timeout(60)
def test_sigterm_ends_a_bare_join_wait(workers):
    w = workers(1)
    p = w.spawn("j", [sys.executable, "-c", JOINER], w.env(COLLECTIVES_JOIN="1"))
    wait_until(lambda: w.joiners() == 1, 20, "the joiner waiting for admission")
    time.sleep(0.3)  # not a wait: the SIGTERM lands well inside the wait, not at its start
    termed = time.time()
    p.send_signal(signal.SIGTERM)
    gone = w.wait_for(lambda e: e["proc"] == "j" and e["event"] == "exit", 10, "joiner exiting")
    assert gone["t"] - termed < scaled(3.0), gone
    assert gone["code"] == 128 + signal.SIGTERM, (gone, w.stderr_tail())
    assert w.joiners() == 0
    assert any(WITHDREW in n for n in w.notes()), w.notes()


@pytest.mark.timeout(120)
def test_sigterm_after_a_rejoin_and_fit_announces_the_current_group(workers):
    """A rank that rejoined during fit() and gets SIGTERM after it announces its departure
    from the current group at once: the handler is the current link's (not the first
    init_process_group's, whose link is closed), so the coordinator does not wait for the
    heartbeat timeout."""
    w = workers(2)
    # alone, w0 would need 36 s for its 120 steps: w1 is back long before
    hold = {"MAX_STEPS": "120", "HOLD": "1", "SOLO_SLEEP": "0.3"}
    w.trainer("w0", 0, admit_every=5, **hold)
    w.trainer("w1", 1, admit_every=5, **hold)
    started = w.wait_for(lambda e: e["proc"] == "w1" and e["event"] == "started", 40, "start")
    w.step("w0", 40, ws=2)
    before = w.step("w1", 10, ws=2)
    w.evict("w1", "w0")
    after = w.step("w1", 30, ws=2, gen=lambda g: g >= 2)  # readmitted by w0
    assert after["sigterm"] == before["sigterm"], (before, after)  # fit()'s, nothing on top
    holding = w.wait_for(
        lambda e: e["proc"] == "w1" and e["event"] == "holding", 60, "w1 holding after fit()"
    )
    assert holding["gen"] >= 2, holding
    assert holding["sigterm"] == started["sigterm"], (started, holding)  # the library's, again
    os.kill(w.procs["w1"].pid, signal.SIGTERM)
    gone = w.wait_for(lambda e: e["proc"] == "w1" and e["event"] == "exit", 10, "w1 exiting")
    assert gone["code"] == 128 + signal.SIGTERM, (gone, w.stderr_tail())
    left = f"generation {holding['gen']}: rank(s) [{holding['rank']}] removed: left the group"
    wait_until(lambda: any(left in n for n in w.notes()), 5, "the departure announced")
    assert not any(f"generation {holding['gen']}:" in n and "heartbeat" in n for n in w.notes()), (
        w.notes()
    )
