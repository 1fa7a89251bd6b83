"""One rank of bench/studies/scale.py: `python -m bench.studies.scale_worker --iters K --reps R`.

Joins (RANK, WORLD_SIZE, COLLECTIVES_COORDINATOR from the environment), then prints one JSON
event per line:
  joined        how long init_process_group took;
  timing        per size (4 B, 1 MiB; algorithm "auto"), the median over R repeats of the mean
                time per all_reduce over K back-to-back ones, each repeat started after a
                barrier; the result is checked exactly (every rank gives 1: the sum is n);
  looping       it now all_reduces 4 bytes every 20 ms until the driver SIGKILLs a rank;
  detected      when its PeerFailure was raised (time.time(), compared with the kill's);
  reconstructed how long pg.reconstruct() took, and the new world size;
  checked       the first all_reduce of the new group (rank r gives r+1: n(n+1)/2, exact).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

import collectives as cl
from collectives.group.tuning import all_reduce_algorithm

SIZES = {"4 B": 1, "1 MiB": 1 << 18}  # float32 elements


def emit(**event):
    event["t"] = time.time()
    print(json.dumps(event), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--timeout", type=float, default=300.0)
    a = p.parse_args()
    t0 = time.monotonic()
    pg = cl.init_process_group(timeout=a.timeout)
    n, r = pg.world_size, pg.rank
    emit(event="joined", rank=r, ws=n, init_s=time.monotonic() - t0, pid=os.getpid())
    for label, count in SIZES.items():
        x = np.ones(count, np.float32)
        for _ in range(2):  # warm up: connections, arenas, caches
            x[:] = 1
            pg.all_reduce(x)
        means = []
        for _ in range(a.reps):
            pg.barrier()
            start = time.perf_counter()
            for _ in range(a.iters):
                x[:] = 1
                pg.all_reduce(x)
            means.append((time.perf_counter() - start) / a.iters)
        algorithm = all_reduce_algorithm(x.nbytes, n, pg.hosts)  # what "auto" ran
        emit(
            event="timing",
            rank=r,
            size=label,
            nbytes=x.nbytes,
            algorithm=algorithm,
            seconds=statistics.median(means),
            ok=bool((x == n).all()),
        )
    pg.barrier()
    emit(event="looping", rank=r)
    x = np.ones(1, np.float32)
    deadline = time.monotonic() + a.timeout
    while time.monotonic() < deadline:
        try:
            x[:] = 1
            pg.all_reduce(x)
            time.sleep(0.02)
        except cl.PeerFailure as exc:
            emit(event="detected", rank=r, failed=list(exc.failed_ranks))
            break
    start = time.monotonic()
    pg = pg.reconstruct()
    emit(
        event="reconstructed",
        rank=pg.rank,
        ws=pg.world_size,
        gen=pg.generation,
        seconds=time.monotonic() - start,
    )
    n = pg.world_size
    x = np.full(1000, pg.rank + 1, np.int64)
    pg.all_reduce(x)
    emit(event="checked", rank=pg.rank, ws=n, ok=bool((x == n * (n + 1) // 2).all()))
    pg.destroy()


if __name__ == "__main__":
    main()
