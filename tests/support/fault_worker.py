"""A worker for the fault tests: all_reduce in a loop, reconstructing after every failure.

Each step: reconstruct() at the step boundary (cheap when nothing changed), then rank r
contributes r+1 and checks that the sum is n(n+1)/2. Every event is one JSON line on stdout.
A replacement (COLLECTIVES_JOIN=1, no RANK) skips the first reconstruct: it was admitted by the
members' reconstruct, so its first call is the members' next all_reduce.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

import collectives as cl


def emit(**event):
    event["t"] = time.time()
    event["pid"] = os.getpid()
    print(json.dumps(event), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--count", type=int, default=4096)
    p.add_argument("--algorithm", default="ring")
    p.add_argument("--timeout", type=float, default=3.0)
    p.add_argument("--pause", type=float, default=0.02)
    p.add_argument("--registered", action="store_true",
                   help="all_reduce a buffer from pg.alloc (registered shared memory), "
                        "allocated once in the first group and kept across reconstructions")
    a = p.parse_args()
    joiner = "RANK" not in os.environ
    pg = cl.init_process_group(timeout=a.timeout if not joiner else 60.0)
    pg.timeout = a.timeout
    emit(event="joined", rank=pg.rank, ws=pg.world_size, gen=pg.generation, joiner=joiner)
    x = pg.alloc(a.count, np.float32) if a.registered else np.empty(a.count, np.float32)
    if a.registered:
        from collectives.transport import registered
        emit(event="registered", rank=pg.rank, ok=pg.is_registered(x),
             pools=[p.name for p in registered._pools.values()])
    end = time.time() + a.seconds
    skip_reconstruct = joiner
    steps = 0
    while time.time() < end and not os.path.exists(os.environ.get("STOP_FILE", "/nonexistent")):
        try:
            if not skip_reconstruct:
                before, started = pg.generation, time.time()
                pg = pg.reconstruct()
                if pg.generation != before:
                    emit(event="reconstructed", rank=pg.rank, ws=pg.world_size,
                         gen=pg.generation, started=started, seconds=time.time() - started)
            skip_reconstruct = False
            n = pg.world_size
            x[:] = pg.rank + 1
            pg.all_reduce(x, algorithm=a.algorithm)
            ok = bool((x == n * (n + 1) / 2).all())
            steps += 1
            emit(event="step", rank=pg.rank, ws=n, gen=pg.generation, ok=ok, step=steps,
                 shm_sent=getattr(pg.transport, "shm_sent", 0),   # payloads through shared memory
                 lent=getattr(getattr(pg.transport, "lender", None), "sent", 0))  # registered
            if not ok:
                sys.exit(4)
            time.sleep(a.pause)
        except cl.Evicted as e:
            emit(event="evicted", rank=pg.rank, gen=pg.generation, error=str(e))
            sys.exit(3)
        except cl.PeerFailure as e:
            emit(event="failure", rank=pg.rank, gen=pg.generation, kind=type(e).__name__,
                 failed=list(e.failed_ranks), error=str(e))
        except cl.CollectiveError as e:  # e.g. reconstruct raced with a failure: try again
            emit(event="error", rank=pg.rank, gen=pg.generation, kind=type(e).__name__,
                 error=str(e))
    emit(event="final", rank=pg.rank, ws=pg.world_size, gen=pg.generation, steps=steps)
    pg.destroy()


if __name__ == "__main__":
    main()
