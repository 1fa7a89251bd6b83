"""One rank of bench/soak.py: runs the seeded op sequence (soak_ops.py), checks every result
against numpy, and samples its resources (resources.py) at the start, the middle and the end.

Every CHECKPOINT ops the ranks agree (an all_reduce MAX of two flags) on whether the time is
up and whether half of it has passed, so that all of them sample the middle and stop after the
same op. Each sample is taken after a barrier, when no op is in flight. One JSON line per event
on stdout: sample, wrong (the first 20), progress, done.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import collectives as cl  # noqa: E402
from bench import resources, soak_ops  # noqa: E402

CHECKPOINT = 50


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
    pg.barrier()
    emit(event="sample", phase="start", rank=r, ops=0, **resources.sample(pg))
    t0 = time.monotonic()
    wrong, done, middle = 0, 0, False
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
            flags = np.array([elapsed >= a.seconds, elapsed >= a.seconds / 2], np.int32)
            pg.all_reduce(flags, op=cl.ReduceOp.MAX)
            if r == 0:
                emit(event="progress", ops=done, seconds=round(elapsed, 1))
            if not middle and (flags[1] or done >= a.ops // 2):
                middle = True
                pg.barrier()
                emit(event="sample", phase="middle", rank=r, ops=done, **resources.sample(pg))
            if flags[0]:
                break
    pg.barrier()
    emit(event="sample", phase="end", rank=r, ops=done, **resources.sample(pg))
    emit(event="done", rank=r, ops=done, wrong=wrong, kinds=kinds,
         seconds=round(time.monotonic() - t0, 1))
    pg.destroy()


if __name__ == "__main__":
    main()
