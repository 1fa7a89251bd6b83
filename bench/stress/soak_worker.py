"""One rank of bench/stress/soak.py: runs the seeded op sequence (soak_ops.py), checks every result
against numpy, and samples its resources (resources.py) at the start, the middle and the end.

Every CHECKPOINT ops the ranks agree (an all_reduce MAX of two flags) on whether the time is
up and whether half of it has passed, so that all of them sample the middle and stop after the
same op. Each sample is taken after a barrier, when no op is in flight. REJOINS times in a run
(at checkpoints, spread over the ops or the time) the last rank leaves and joins again, so
that what a reconstruction leaves behind shows up in the samples too. One JSON line per event
on stdout: sample, wrong (the first 20), progress, done.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import collectives as cl  # noqa: E402
from bench.stress import resources, soak_ops  # noqa: E402

CHECKPOINT = 20
REJOINS = 6  # times in a run the last rank leaves and joins again as a new member


def rejoin(pg, timeout: float):
    """The last rank leaves the group and joins again as a new member; the others reconstruct
    until it is back: two membership changes (or one, if both reach the coordinator before the
    members' first reconstruct), a new group on every rank. Returns the new group."""
    n, gen = pg.world_size, pg.generation
    if pg.rank == n - 1:
        pg.leave()
        pg.close()  # the old group's sockets and threads go; the process stays
        return cl.init_process_group(join=True, timeout=timeout)
    deadline = time.monotonic() + timeout
    while not (pg.generation > gen and pg.world_size == n):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {pg.rank}: the last rank did not rejoin within {timeout:g} s")
        new = pg.reconstruct()
        if new is pg:
            time.sleep(0.05)
        pg = new
    return pg


def emit(**event):
    event["t"] = time.time()
    print(json.dumps(event), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ops", type=int, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-bytes", type=int, default=soak_ops.MAX_BYTES)
    p.add_argument("--timeout", type=float, default=60.0)
    a = p.parse_args()
    pg = cl.init_process_group(timeout=a.timeout)
    r, n = pg.rank, pg.world_size
    # pyzmq starts a garbage-collector thread with a context of its own (3 threads, ~7 fds)
    # at a process's first zero-copy send, once: started here, it is not counted as growth
    # by a short run whose first large socket payload comes after the middle sample.
    import zmq.utils.garbage

    zmq.utils.garbage.gc.start()
    pg.barrier()
    emit(event="sample", phase="start", rank=r, ops=0, **resources.sample(pg))
    t0 = time.monotonic()
    wrong, done, middle, rejoins = 0, 0, False, 0
    every = max(CHECKPOINT, a.ops // (REJOINS + 1) // CHECKPOINT * CHECKPOINT)
    kinds: dict[str, int] = {}
    while done < a.ops:
        op = soak_ops.draw(a.seed, done, n, a.max_bytes)
        got = soak_ops.run(pg, a.seed, op, a.timeout)
        why = soak_ops.check(got, soak_ops.expected(a.seed, op, r, n), op)
        if why:
            wrong += 1
            if wrong <= 20:
                emit(event="wrong", rank=r, error=why)
        kinds[op.kind] = kinds.get(op.kind, 0) + 1
        done += 1
        if done % CHECKPOINT == 0 or done == a.ops:
            elapsed = time.monotonic() - t0
            # rejoins are spread over the ops or the time, whichever runs out first
            due = max(int(elapsed // (a.seconds / (REJOINS + 1))), done // every)
            flags = np.array([elapsed >= a.seconds, elapsed >= a.seconds / 2, due], np.int32)
            pg.all_reduce(flags, op=cl.ReduceOp.MAX)
            if r == 0:
                emit(event="progress", ops=done, seconds=round(elapsed, 1))
            if not middle and (flags[1] or done >= a.ops // 2):
                middle = True
                pg.barrier()
                emit(
                    event="sample",
                    phase="middle",
                    rank=r,
                    ops=done,
                    **resources.sample(pg),
                    thread_names=resources.thread_names(),
                )
            if flags[0]:
                break
            if flags[2] > rejoins and rejoins < REJOINS and done < a.ops:
                pg = rejoin(pg, a.timeout)
                rejoins += 1
                r = pg.rank
                emit(event="rejoined", rank=r, gen=pg.generation, ops=done)
    pg.barrier()
    emit(
        event="sample",
        phase="end",
        rank=r,
        ops=done,
        **resources.sample(pg),
        thread_names=resources.thread_names(),
        fd_targets=sorted(
            os.readlink(f"/proc/self/fd/{fd}")
            for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")
        ),
    )
    emit(
        event="done",
        rank=r,
        ops=done,
        wrong=wrong,
        kinds=kinds,
        rejoins=rejoins,
        generation=pg.generation,
        seconds=round(time.monotonic() - t0, 1),
    )
    pg.destroy()


if __name__ == "__main__":
    main()
