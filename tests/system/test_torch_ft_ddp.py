"""examples/torch_ft_ddp.py to the end of the job: a worker SIGKILLed or SIGSTOPped in the
middle of a backward, the survivors shrink the group and finish.

The workers are the example itself, started as a launcher would (RANK, WORLD_SIZE, a TCPStore
the test hosts, a coordinator the test starts) with `--fault kill|stop:RANK:STEP`; a warm
spare is the example started with COLLECTIVES_JOIN=1 and COLLECTIVES_SPARE=1.

Invariant: every process that ends (survivors, and the spare when one was admitted) exits 0
having finished all the steps, with the same parameter checksum; every survivor dropped the
same step and went on from the same step (the steps kept are the ones they agreed on). The
victim ended by its signal. `make test` runs one short case; the full matrix (3 and 4
workers, kill and stop, a spare) is marker `torch_recovery` (`make test-torch-recovery`).
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import sys

import pytest

from support import timing
from support.ports import coordinator_process, torch_store
from support.procs import clean_env

pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "torch_ft_ddp.py")
PY = sys.executable


def run_example(procs, n, kind, steps, fault_step, spare=False, timeout=150):
    secret = {"COLLECTIVES_JOB_SECRET": secrets.token_hex(16)}
    coord = coordinator_process(
        procs, "coordinator", n, env=clean_env(**secret, **timing.heartbeats())
    )
    victim = n - 1
    argv = [
        PY,
        EXAMPLE,
        "--steps",
        steps,
        "--timeout",
        f"{timing.scaled(10):g}",
        "--fault",
        f"{kind}:{victim}:{fault_step}",
    ]
    with torch_store() as store:
        common = dict(
            OMP_NUM_THREADS="1",
            PYTHONWARNINGS="ignore",
            WORLD_SIZE=str(n),
            COLLECTIVES_COORDINATOR=coord,
            **secret,
            **store,
            **timing.heartbeats(),
        )
        for r in range(n):
            procs.spawn(f"rank{r}", argv, clean_env(RANK=str(r), **common), merge_stderr=True)
        names = [f"rank{r}" for r in range(n - 1)]
        if spare:
            env = clean_env(COLLECTIVES_JOIN="1", COLLECTIVES_SPARE="1", **common)
            procs.spawn("spare", argv, env, merge_stderr=True)
            names.append("spare")
        results = {m: (x.code, x.output) for m, x in zip(names, procs.wait(names, timeout))}
        if kind == "stop":
            os.kill(procs.procs[f"rank{victim}"].pid, signal.SIGKILL)
        (v,) = procs.wait([f"rank{victim}"], 30)
    assert v.code == -signal.SIGKILL, v.output[-2000:]
    sums, dropped, went_on = set(), set(), set()
    for name, (rc, out) in results.items():
        assert rc == 0, f"{name} exited with {rc}:\n{out[-4000:]}"
        m = re.search(r"(\d+) steps, parameter checksum (\S+)", out)
        assert m and int(m.group(1)) == steps, out[-3000:]
        sums.add(m.group(2))
        if name != "spare":
            dropped.update(re.findall(r"step (\d+) dropped", out))
            went_on.update(re.findall(r"going on from step (\d+)", out))
            assert f"excluding ranks [{victim}]" in out, out[-3000:]
        else:
            assert "joined as rank" in out, out[-3000:]
    assert len(sums) == 1, f"parameters differ: {sums}"
    assert len(dropped) == 1 and len(went_on) == 1, (dropped, went_on)
    return results


@pytest.mark.timeout(240)
def test_short_kill_mid_backward_at_3_workers(procs):
    run_example(procs, 3, "kill", steps=12, fault_step=4)


@pytest.mark.torch_recovery
@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind", ["kill", "stop"])
@pytest.mark.parametrize("n", [3, 4])
def test_full_fault_mid_backward(procs, n, kind):
    run_example(procs, n, kind, steps=80, fault_step=30)


@pytest.mark.torch_recovery
@pytest.mark.timeout(400)
def test_full_kill_with_a_spare(procs):
    results = run_example(procs, 3, "kill", steps=60, fault_step=20, spare=True)
    for name, (_, out) in results.items():
        assert "of 3" in out.splitlines()[-1] or "/3 " in out, out[-2000:]


@pytest.mark.torch_recovery
@pytest.mark.timeout(400)
def test_full_under_the_launcher_with_spares(procs):
    """`collectives.launch --nproc 3 --spares 1`: the spare the launcher started takes the
    SIGKILLed rank's place; the three that end agree on the parameters."""
    cmd = [PY, "-m", "collectives.launch", "--nproc", "3", "--spares", "1", EXAMPLE]
    cmd += ["--steps", "40", "--timeout", f"{timing.scaled(10):g}", "--fault", "kill:2:10"]
    env = clean_env(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", COLLECTIVES_PROGRESS="off")
    procs.spawn("launch", cmd, env, merge_stderr=True)
    (x,) = procs.wait(["launch"], 200)
    out = x.output
    assert x.code == 0, out[-4000:]
    assert "joined as rank 2 of 3 at step 10" in out, out[-4000:]
    sums = re.findall(r"40 steps, parameter checksum (\S+)", out)
    assert len(sums) == 3 and len(set(sums)) == 1, out[-4000:]
