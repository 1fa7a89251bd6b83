"""The same script under the launchers people already have.

tests/support/launcher_worker.py calls cl.init_process_group() with no arguments and no RANK
or WORLD_SIZE of ours: under MPICH's mpiexec (the `mpich` wheel from pip) the rank, size and
local rank come from PMI_RANK, PMI_SIZE and MPI_LOCALRANKID; with Slurm's variables from
SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, and the coordinator's host from the first host of
SLURM_JOB_NODELIST. Invariant: every rank 0..n-1 reports once, with world size n, its local
rank, and the sum n(n+1)/2.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys

import pytest

from support.ports import coordinator_process, rank0_address
from support.procs import clean_env

WORKER = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "launcher_worker.py"
)
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable))


def check(results: list[dict], n: int):
    assert sorted(r["rank"] for r in results) == list(range(n)), results
    for r in results:
        assert r["ws"] == n and r["sum"] == n * (n + 1) / 2, r
        assert r["local_rank"] == r["rank"], r  # one host: local rank = rank


@pytest.mark.timeout(90)
def test_mpiexec_launches_the_script_unchanged(procs, monkeypatch):
    assert MPIEXEC, "the test extra installs MPICH's mpiexec (pip package mpich)"
    # a standalone coordinator needs the job's secret, and every rank the same one
    monkeypatch.setenv("COLLECTIVES_JOB_SECRET", "mpiexec-test-secret-0123456789")
    n = 3
    address = coordinator_process(procs, "coordinator", n)
    env = clean_env(COLLECTIVES_COORDINATOR=address)
    procs.spawn("mpiexec", [MPIEXEC, "-n", n, sys.executable, WORKER], env)
    res = procs.wait("mpiexec", timeout=80)[0]
    assert res.code == 0, res.output[-3000:]
    # mpiexec forwards the ranks' output as it comes, not line by line: take each object
    decode = json.JSONDecoder().raw_decode
    check([decode(res.out, m.start())[0] for m in re.finditer(r'\{"rank"', res.out)], n)


@pytest.mark.timeout(90)
def test_slurm_variables_give_rank_size_local_rank_and_the_master(procs):
    n = 3
    # srun would set these; the job's only host is this one (a Slurm host list of one)
    slurm = dict(SLURM_NTASKS=n, SLURM_JOB_NODELIST="127.0.0.1")
    procs.spawn(
        "task0",
        [sys.executable, WORKER],
        clean_env(SLURM_PROCID=0, SLURM_LOCALID=0, MASTER_PORT=0, **slurm),
    )
    port = rank0_address(procs, "task0").rsplit(":", 1)[1]
    for r in range(1, n):
        procs.spawn(
            f"task{r}",
            [sys.executable, WORKER],
            clean_env(SLURM_PROCID=r, SLURM_LOCALID=r, MASTER_PORT=port, **slurm),
        )
    results = procs.wait([f"task{r}" for r in range(n)], timeout=80)
    for res in results:
        assert res.code == 0, res.output[-3000:]
    check([json.loads(res.out.strip().splitlines()[-1]) for res in results], n)
    # rank 0 hosts the coordinator here (no launcher): it says once what that costs and how
    # to avoid it; the others host nothing and say nothing of it
    hint = "rank 0 hosts the coordinator, so the job ends if rank 0 dies"
    assert results[0].err.count(hint) == 1, results[0].err
    assert "python -m collectives.launch" in results[0].err
    assert not any(hint in res.err for res in results[1:])
