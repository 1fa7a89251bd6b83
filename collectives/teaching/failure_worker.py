"""One worker of the failure story (teaching/failures.py starts it; not for use alone).

A member (RANK set) trains a toy model: each step all_reduces a gradient of ones and adds it in
(a committed step adds the number of ranks that took part). Its parameters come as one JSON
argument (steps, stop_at, stop_rank, want, op_timeout, watch_grace). Rank stop_rank waits,
after stop_at steps, for the driver to kill or stop it. A PeerFailure drops the step: the survivors
reconstruct (generation + 1, ranks renumbered) and redo it. Below `want` members, the members
reconstruct again until joiners have been admitted, then rank 0 broadcasts (step, model) to
all. A joiner (COLLECTIVES_JOIN=1) waits to be admitted, takes (step, model) and trains on.
Every event is one JSON line on stdout.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import numpy as np

from ..common import config
from ..common.errors import PeerFailure
from ..membership.init import init_process_group
from .trace import Tracer

ELEMS = 4


_OUT = threading.Lock()  # the op's thread reports messages while the main thread reports steps


def emit(event: str, **kw) -> None:
    line = json.dumps({"event": event, "t": time.time(), **kw}) + "\n"
    with _OUT:
        sys.stdout.write(line)
        sys.stdout.flush()


def trace(pg) -> None:
    """Report every message this process sends or takes as it happens (a line each): the
    driver merges every process's lines into one recorded run, the killed one's included
    (explain replay)."""
    gen = pg.generation

    def report(ev: dict) -> None:
        emit(
            "msg",
            generation=gen,
            rank=ev["rank"],
            kind=ev["kind"],
            src=ev["src"],
            dst=ev["dst"],
            op=ev["op"],
            opkey=ev["opkey"],
            phase=ev["phase"],
            step=ev["step"],
            nbytes=ev["nbytes"],
        )

    Tracer(on_event=report).install(pg)


def watch(pg, grace: float) -> None:
    """Learn of a dead peer from its closed connections (the kernel closes them when it ends
    the process), not only from the coordinator's heartbeats: transport/zmq/peerwatch.py."""
    if grace > 0 and hasattr(pg.transport, "watch_peers"):
        pg.transport.watch_peers(grace)


def main() -> int:
    story = json.loads(sys.argv[1])  # the driver's parameters (failures.py)
    steps, stop_at = int(story["steps"]), int(story["stop_at"])
    stop_rank, want = int(story["stop_rank"]), int(story["want"])
    op_timeout = float(story["op_timeout"])
    joiner = config.join_requested(None)
    grace = float(story["watch_grace"])
    pg = init_process_group(timeout=op_timeout, join=joiner)
    watch(pg, grace)
    trace(pg)
    first = pg.rank if not joiner else None  # this process's rank in generation 0
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
            time.sleep(3600)  # the driver kills or stops this process
        grad = np.ones(ELEMS)  # a committed step adds the number of ranks it had
        try:
            pg.all_reduce(grad)
        except PeerFailure as exc:
            emit(
                "failure",
                rank=pg.rank,
                step=step + 1,
                failed=list(exc.failed_ranks),
                error=str(exc),
                kind=type(exc).__name__,
                generation=pg.generation,
            )
            old = pg
            pg = pg.reconstruct()
            watch(pg, grace)
            trace(pg)
            emit(
                "generation",
                old_rank=old.rank,
                rank=pg.rank,
                world_size=pg.world_size,
                generation=pg.generation,
                why="failure",
            )
            continue  # the dropped step is done again
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
            trace(pg)
            emit(
                "generation",
                old_rank=old.rank,
                rank=pg.rank,
                world_size=pg.world_size,
                generation=pg.generation,
                why="admitted",
            )
            state = np.concatenate([[float(step)], model])
            pg.broadcast(state, src=0)
            emit("sent_model", rank=pg.rank, step=step)
    emit(
        "done",
        rank=pg.rank,
        step=step,
        model=model.tolist(),
        generation=pg.generation,
        world_size=pg.world_size,
    )
    pg.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
