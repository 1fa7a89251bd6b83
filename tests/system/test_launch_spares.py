"""Warm spares through the launcher: `python -m collectives.launch --nproc 2 --spares K`
(tests/support/spare_worker.py, an ElasticTrainer on a tiny model).

Invariants, for K = 1 and 2 spares started with the job (each waiting, everything imported,
before the members start training):
  * a member SIGKILLed mid-run is replaced by one spare, never more: the world size stays 2
    in every step of every process, and exactly one spare joins;
  * the spare is handed the model: at its first step its parameters are the survivor's at
    that step, and every process ends with the same parameters;
  * its first committed step comes within SPARE_BOUND s of the kill: the process's death is
    seen by its witnesses (its pidfd, the launcher), not by a heartbeat timeout, which the
    job is given at HEARTBEAT_TIMEOUT (and its ops time out at OP_TIMEOUT), far beyond the
    bound, so that a detection by heartbeat alone breaks it;
  * the launcher starts a new spare in the dead member's stead (it waits as a spare: the
    members hold near the end until it does), and at the end ends the K spares nobody
    needed, the new one among them: once the launcher has exited, no process it started
    runs; the job exits 0.
And with K = 0 (`--spares 0 --elastic --max-restarts 1`) nothing waits at launch: the launcher
starts a replacement after the death, which joins cold and ends with the same parameters;
no process the launcher started outlives it.
"""

import json
import os
import re
import signal
import sys
import time

import pytest

from support.procs import clean_env
from support.timing import bound, heartbeats, scaled

WORKER = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "spare_worker.py"
)
NPROC = 2
MAX_STEPS = 60
SPARE_BOUND = 3.0  # s, scaled: from the kill to the spare's first committed step
# s, scaled: the heartbeat timeout and the workers' op timeout (a survivor whose all_reduce
# times out has the coordinator look too), each far beyond SPARE_BOUND
HEARTBEAT_TIMEOUT = OP_TIMEOUT = 30.0
HOLD_STEP = MAX_STEPS - 5  # the members wait here for the new spare to wait too
EVENT = re.compile(r"^\[(rank \d+|join \d+)\] (\{.*\})$")


def events(lines) -> list[dict]:
    """The workers' JSON events in the launcher's output, each with "who" (its prefix)."""
    out = []
    for line in lines:
        m = EVENT.match(line)
        if m:
            out.append(dict(json.loads(m[2]), who=m[1]))
    return out


def launch(procs, tmp_path, spares: int, hold: bool = False):
    """The job; hold: its members hold at HOLD_STEP until tmp_path/more exists."""
    env = clean_env(
        SPARE_OUT=str(tmp_path),
        MAX_STEPS=str(MAX_STEPS),
        HOLD_STEP=str(HOLD_STEP if hold else -1),
        GO_TIMEOUT=f"{scaled(120):g}",
        OP_TIMEOUT=f"{scaled(OP_TIMEOUT):g}",
        AWAIT_WS=str(NPROC) if spares == 0 else "0",
        **heartbeats(0.2, HEARTBEAT_TIMEOUT),
    )
    extra = ["--elastic", "--max-restarts", "1"] if spares == 0 else []
    argv = [
        sys.executable,
        "-m",
        "collectives.launch",
        "--nproc",
        str(NPROC),
        "--spares",
        str(spares),
        *extra,
        "--timeout",
        f"{scaled(150):g}",
        WORKER,
    ]

    def adopt(line):  # every worker the launcher starts is reaped by the test too
        m = EVENT.match(line)
        if m and '"pid"' in m[2]:
            procs.adopt(json.loads(m[2])["pid"])

    procs.spawn("launch", argv, env, merge_stderr=True, on_line=adopt)


def wait_event(procs, what: str, predicate, timeout: float) -> dict:
    """The first worker event for which predicate holds, within `timeout` s (scaled)."""
    deadline = time.monotonic() + scaled(timeout)
    while True:
        found = [e for e in events(procs.lines("launch")) if predicate(e)]
        if found:
            return found[0]
        if time.monotonic() > deadline or procs.procs["launch"].poll() is not None:
            procs.fail(f"no {what} within {scaled(timeout):g} s")
        time.sleep(0.02)


def kill_a_member(procs) -> tuple[int, float]:
    """SIGKILL rank 1 once rank 0 trains past the go step: (its pid, when)."""
    member = wait_event(procs, "rank 1 joined", lambda e: e["who"] == "rank 1", 60)
    wait_event(
        procs,
        "rank 0 training past the go step",
        lambda e: e["who"] == "rank 0" and e["event"] == "step" and e["step"] >= 8,
        60,
    )
    killed_at = time.time()
    os.kill(member["pid"], signal.SIGKILL)
    return member["pid"], killed_at


def finals(seen) -> dict[str, dict]:
    return {e["who"]: e for e in seen if e["event"] == "final"}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("spares", [pytest.param(1, marks=pytest.mark.long), 2])
def test_a_warm_spare_takes_a_killed_members_place_with_its_model(procs, tmp_path, spares):
    """With 2 spares (`make test`) every check of the run with 1 holds, and one more: of two
    spares waiting, exactly one is admitted. The run with 1 spare, the launcher's common case
    and a whole job more, is marker `long`'s (`make test-long`)."""
    launch(procs, tmp_path, spares, hold=True)
    for k in range(1, spares + 1):  # each spare started with the job waits, imports done
        wait_event(procs, f"spare {k} waiting", lambda e, k=k: e["who"] == f"join {k}", 60)
    started = {f"join {k}" for k in range(1, spares + 1)}
    (tmp_path / "go").touch()
    _, killed_at = kill_a_member(procs)
    first = wait_event(
        procs,
        "a spare's step",
        lambda e: e["who"].startswith("join") and e["event"] == "step",
        SPARE_BOUND,
    )
    committed = wait_event(
        procs,
        "the spare's first committed step",
        lambda e: e["who"] == first["who"] and e["event"] == "step" and e["step"] > first["step"],
        SPARE_BOUND,
    )
    took = committed["t"] - killed_at
    # the launcher's new spare, in the dead member's stead: a process that waits as a spare
    new = wait_event(
        procs,
        "the new spare waiting",
        lambda e: e["event"] == "waiting" and e["who"] not in started,
        60,
    )
    (tmp_path / "more").touch()  # the members may end the job now
    (p,) = procs.wait("launch", timeout=120)
    out = p.output
    assert p.code == 0, out[-4000:]
    seen = events(procs.lines("launch"))
    print(f"{spares} spare(s): the spare's first committed step {took:.2f} s after the kill")
    # a detection by heartbeat or op timeout alone breaks the bound
    limit = bound(SPARE_BOUND, below=min(HEARTBEAT_TIMEOUT, OP_TIMEOUT), below_scaled=True)
    assert took < limit, (took, out[-4000:])
    # one spare admitted, never growing the group
    joined = [e for e in seen if e["event"] == "joined" and e["joiner"]]
    assert [e["who"] for e in joined] == [first["who"]], joined
    assert joined[0]["ws"] == NPROC and joined[0]["gen"] >= 1, joined
    assert {e["ws"] for e in seen if e["event"] in ("step", "final")} == {NPROC}, out[-4000:]
    # handed the model: at its first step, the survivor's parameters at that step
    survivor = {
        e["step"]: e["params"] for e in seen if e["who"] == "rank 0" and e["event"] == "step"
    }
    assert first["step"] >= 8 and first["params"] == survivor[first["step"]], (first, out[-4000:])
    ends = finals(seen)
    assert set(ends) == {"rank 0", first["who"]}, ends
    assert len({e["params"] for e in ends.values()}) == 1, ends
    assert all(e["step"] == MAX_STEPS for e in ends.values()), ends
    # a new spare in the dead member's stead, and the unneeded ones ended at the end
    assert (
        "rank 1 failed (signal SIGKILL); the others go on without it; starting a new spare" in out
    )
    assert new["spare"] and new["t"] > killed_at and new["who"] not in ends, (new, ends)
    assert all(e["spare"] for e in seen if e["event"] == "waiting"), out[-4000:]
    # the K - 1 never admitted and the new one: ended, and said so
    assert f"ending {spares} spare(s) not needed" in out, out[-4000:]
    assert procs.adopted_alive() == [], (procs.adopted_alive(), new, out[-4000:])


@pytest.mark.timeout(150)
def test_no_spares_a_replacement_joins_after_the_death(procs, tmp_path):
    launch(procs, tmp_path, 0)
    wait_event(procs, "rank 0 joined", lambda e: e["who"] == "rank 0", 60)
    (tmp_path / "go").touch()
    _, killed_at = kill_a_member(procs)
    (p,) = procs.wait("launch", timeout=120)
    out = p.output
    assert p.code == 0, out[-4000:]
    seen = events(procs.lines("launch"))
    waiting = [e for e in seen if e["event"] == "waiting"]
    assert [e["who"] for e in waiting] == ["join 1"], waiting  # nobody waited at launch
    assert waiting[0]["t"] > killed_at and not waiting[0]["spare"], waiting
    assert "starting a replacement" in out, out[-4000:]
    ends = finals(seen)
    assert set(ends) == {"rank 0", "join 1"}, ends
    assert len({e["params"] for e in ends.values()}) == 1, ends
    assert {e["ws"] for e in ends.values()} == {NPROC}, ends
    assert procs.adopted_alive() == [], (procs.adopted_alive(), out[-4000:])
