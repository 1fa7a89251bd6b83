"""A worker's environment, torchrun's contract: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT and COLLECTIVES_COORDINATOR, the rest of what torchrun's agent gives a worker
(torchrun_env), OMP_NUM_THREADS=1 where a host runs several, and the job's secret.

The launcher copies its own environment for its children here and reads nothing of it: every
variable the library reads goes through common/config.py.
"""

from __future__ import annotations

import os
import sys


def environment() -> dict:
    """A copy of the launcher's environment for a child (the launcher reads nothing of it)."""
    return dict(os.environ)


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


OMP_NOTICE = (
    "Setting OMP_NUM_THREADS environment variable for each process to be 1 in "
    "default, to avoid your system being overloaded, please further tune the "
    "variable for optimal performance in your application as needed."
)


def omp_threads(nproc: int) -> str | None:
    """torchrun's rule: OMP_NUM_THREADS=1 for the workers when it is unset and a host runs
    more than one worker (None: leave the environment as it is)."""
    return "1" if "OMP_NUM_THREADS" not in environment() and nproc > 1 else None


def torchrun_env(
    rank: int,
    world_size: int,
    nproc: int,
    nnodes: int,
    node_rank: int,
    run_id: str,
    restart_count: int = 0,
    max_restarts: int = 0,
) -> dict:
    """What torchrun's agent gives a worker besides RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR
    and MASTER_PORT (torch/distributed/elastic/agent/server/local_elastic_agent.py,
    _start_workers), with the same values for this launcher's one role, "default"."""
    return dict(
        LOCAL_WORLD_SIZE=str(nproc),
        GROUP_RANK=str(node_rank),
        GROUP_WORLD_SIZE=str(nnodes),
        ROLE_RANK=str(rank),
        ROLE_NAME="default",
        ROLE_WORLD_SIZE=str(world_size),
        TORCHELASTIC_RESTART_COUNT=str(restart_count),
        TORCHELASTIC_MAX_RESTARTS=str(max_restarts),
        TORCHELASTIC_RUN_ID=run_id,
        # No agent hosts a store here: rank 0's init_process_group hosts it at MASTER_PORT,
        # as under torchrun with a rendezvous other than c10d's.
        TORCHELASTIC_USE_AGENT_STORE="False",
        TORCH_NCCL_ASYNC_ERROR_HANDLING=environment().get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        # torchrun's agent names the signals it handles and its workers inherit the name;
        # this launcher forwards these two (torchrun: also SIGHUP and SIGQUIT).
        TORCHELASTIC_SIGNALS_TO_HANDLE="SIGINT,SIGTERM",
    )


def worker_env(
    local_rank: int,
    nproc: int,
    addr: str,
    port: int,
    joiner: bool = False,
    nnodes: int = 1,
    node_rank: int = 0,
    secret: str | None = None,
    run_id: str = "none",
    restart_count: int = 0,
    max_restarts: int = 0,
) -> dict:
    """A worker's environment, torchrun's contract: ranks are node-major (node i's workers
    are ranks i*nproc .. i*nproc+nproc-1). restart_count: 0 for the first workers, k for the
    k-th replacement (--elastic)."""
    env = environment()
    if secret is not None:  # the job's secret, made by the launcher (docs/security.md)
        env["COLLECTIVES_JOB_SECRET"] = secret
    rank, world_size = node_rank * nproc + local_rank, nnodes * nproc
    env.update(
        torchrun_env(
            rank, world_size, nproc, nnodes, node_rank, run_id, restart_count, max_restarts
        )
    )
    omp = omp_threads(nproc)
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(local_rank),
        MASTER_ADDR=addr,
        MASTER_PORT=str(port),
        COLLECTIVES_COORDINATOR=f"{addr}:{port + 1}",
        PYTHONUNBUFFERED="1",
    )  # lines appear when printed, not when a buffer fills
    # Workers write into our pipes, so they cannot see whether the output is a terminal:
    # tell them (a live bar there, plain lines into a log), unless the user chose.
    env.setdefault("COLLECTIVES_PROGRESS", "bar" if _is_terminal(sys.stderr) else "lines")
    if joiner:  # a replacement: no rank of its own until the members admit it
        del env["RANK"], env["ROLE_RANK"]
        env["COLLECTIVES_JOIN"] = "1"
    return env
