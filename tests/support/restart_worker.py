"""A worker for tests/scenarios/test_coordinator_restart.py: a deterministic "training" loop of
all_reduces that a coordinator restart must not disturb. One JSON line on stdout per event.

Each step, launch rank r contributes (r + 1) * (step + 1) + arange(COUNT) (int64: sums are
exact, whatever the algorithm's order) and adds the all_reduced sum into its parameters; every
RECONSTRUCT_EVERY steps it calls reconstruct() (as ElasticTrainer admits joiners: a membership
round with the coordinator). A failed step (PeerFailure, CollectiveTimeout) is redone by the
group reconstruct() returns. At the end: a final barrier, then
    {"event": "final", "sha": sha256 of the parameters, "expected": the sha an undisturbed
     world of WORLD_SIZE ranks gives (numpy), "ws", "gen", "step"}
Each step's event names the schedule its all_reduce ran on ("plan": pg.rerouted, None for
the default), so that a test can tell that every rank ran each op on the same plan.
ALGORITHM: the all_reduce's algorithm (default auto; ring: a schedule the coordinator may
move, group/schedbook.py). COUNT: elements per all_reduce (default 4096).
QUIET_AFTER=S: no step events after step S (a worker that writes nothing to a dead reader's
pipe, which would end it by itself). Any other CollectiveError ends the worker with
{"event": "error", "type", "message"}, exit 3.
"""

import hashlib
import json
import os
import sys
import time

import numpy as np

import collectives as cl

COUNT = int(os.environ.get("COUNT", "4096"))
ALGORITHM = os.environ.get("ALGORITHM", "auto")


def emit(**event):
    event["t"] = time.time()
    event["pid"] = os.getpid()
    print(json.dumps(event), flush=True)


def contribution(r, step):
    return (r + 1) * (step + 1) + np.arange(COUNT, dtype=np.int64)


def expected(world_size, steps):
    params = np.zeros(COUNT, np.int64)
    for step in range(steps):
        params += sum(contribution(r, step) for r in range(world_size))
    return hashlib.sha256(params.tobytes()).hexdigest()


def main():
    steps = int(os.environ.get("STEPS", "150"))
    pause = float(os.environ.get("STEP_SLEEP", "0.02"))
    every = int(os.environ.get("RECONSTRUCT_EVERY", "10"))
    quiet_after = int(os.environ.get("QUIET_AFTER", str(1 << 62)))  # no step events after
    launch_rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    pg = cl.init_process_group(timeout=30.0)  # starting up on a busy machine
    op_timeout = float(os.environ.get("OP_TIMEOUT", "3"))  # each op's deadline
    pg.timeout = op_timeout
    emit(event="started", rank=pg.rank)
    params = np.zeros(COUNT, np.int64)
    step = 0
    try:
        while step < steps:
            x = contribution(launch_rank, step)
            try:
                pg.all_reduce(x, algorithm=ALGORITHM)
                if every and step % every == every - 1:
                    pg = pg.reconstruct()
                    pg.timeout = op_timeout
            except (cl.PeerFailure, cl.CollectiveTimeout) as exc:
                if isinstance(exc, cl.Evicted):
                    raise
                emit(event="failure", step=step, error=type(exc).__name__, message=str(exc))
                pg = pg.reconstruct()
                pg.timeout = op_timeout
                emit(event="reconstructed", step=step, ws=pg.world_size, gen=pg.generation)
                continue
            params += x
            if step <= quiet_after:  # plan: the schedule this step's all_reduce ran on
                emit(event="step", step=step, ws=pg.world_size, gen=pg.generation, plan=pg.rerouted)
            step += 1
            time.sleep(pause)
        pg.barrier()
    except cl.CollectiveError as exc:
        emit(event="error", type=type(exc).__name__, message=str(exc))
        sys.exit(3)
    emit(
        event="final",
        sha=hashlib.sha256(params.tobytes()).hexdigest(),
        expected=expected(world, steps),
        ws=pg.world_size,
        gen=pg.generation,
        step=step,
    )
    pg.destroy()


if __name__ == "__main__":
    main()
