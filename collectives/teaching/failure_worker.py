"""One worker of the failure story (teaching/failures.py starts it; not for use alone).

A member (RANK set) trains a toy model: each step all_reduces a gradient of ones and adds it in
(a committed step adds the number of ranks that took part). Rank STOP_RANK waits, after STOP_AT
steps, for the driver to kill or stop it. A PeerFailure drops the step: the survivors
reconstruct (generation + 1, ranks renumbered) and redo it. Below WANT members, the members
reconstruct again until joiners have been admitted, then rank 0 broadcasts (step, model) to
all. A joiner (COLLECTIVES_JOIN=1) waits to be admitted, takes (step, model) and trains on.
Every event is one JSON line on stdout.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from ..common.errors import PeerFailure
from ..membership.init import init_process_group

ELEMS = 4


def emit(event: str, **kw) -> None:
    print(json.dumps({"event": event, "t": time.time(), **kw}), flush=True)


def watch(pg, grace: float) -> None:
    """Learn of a dead peer from its closed connections (the kernel closes them when it ends
    the process), not only from the coordinator's heartbeats: transport/zmq/peerwatch.py."""
    if grace > 0 and hasattr(pg.transport, "watch_peers"):
        pg.transport.watch_peers(grace)


def main() -> int:
    steps, stop_at = int(os.environ["STEPS"]), int(os.environ["STOP_AT"])
    stop_rank, want = int(os.environ["STOP_RANK"]), int(os.environ["WANT"])
    op_timeout = float(os.environ.get("OP_TIMEOUT", "20"))
    joiner = os.environ.get("COLLECTIVES_JOIN") == "1"
    grace = float(os.environ.get("WATCH_GRACE", "0"))
    pg = init_process_group(timeout=op_timeout, join=joiner)
    watch(pg, grace)
    first = pg.rank if not joiner else None       # this process's rank in generation 0
    model, step = np.zeros(ELEMS), 0
    if joiner:
        emit("admitted", rank=pg.rank, world_size=pg.world_size, generation=pg.generation)
        state = np.zeros(ELEMS + 1)
        pg.broadcast(state, src=0)
        step, model = int(state[0]), state[1:].copy()
        emit("model", rank=pg.rank, step=step, model=model.tolist())
    else:
        emit("ready", rank=pg.rank, world_size=pg.world_size, generation=pg.generation)
    while step < steps:
        if first == stop_rank and step == stop_at:
            emit("waiting", rank=pg.rank, step=step)
            time.sleep(3600)                         # the driver kills or stops this process
        grad = np.ones(ELEMS)       # a committed step adds the number of ranks it had
        try:
            pg.all_reduce(grad)
        except PeerFailure as exc:
            emit("failure", rank=pg.rank, step=step + 1, failed=list(exc.failed_ranks),
                 error=str(exc), kind=type(exc).__name__, generation=pg.generation)
            old = pg
            pg = pg.reconstruct()
            watch(pg, grace)
            emit("generation", old_rank=old.rank, rank=pg.rank, world_size=pg.world_size,
                 generation=pg.generation, why="failure")
            continue                                  # the dropped step is done again
        model += grad
        step += 1
        emit("step", rank=pg.rank, step=step, model=model.tolist(), generation=pg.generation)
        deadline = time.monotonic() + op_timeout
        while pg.world_size < want and time.monotonic() < deadline:
            old = pg
            pg = pg.reconstruct()
            if pg is old:
                time.sleep(0.1)
                continue
            watch(pg, grace)
            emit("generation", old_rank=old.rank, rank=pg.rank, world_size=pg.world_size,
                 generation=pg.generation, why="admitted")
            state = np.concatenate([[float(step)], model])
            pg.broadcast(state, src=0)
            emit("sent_model", rank=pg.rank, step=step)
    emit("done", rank=pg.rank, step=step, model=model.tolist(), generation=pg.generation,
         world_size=pg.world_size)
    pg.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
