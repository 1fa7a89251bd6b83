"""A worker for the fault tests: all_reduce in a loop, reconstructing after every failure.

Each step: reconstruct() at the step boundary (cheap when nothing changed), then rank r
contributes r+1 and checks that the sum is n(n+1)/2. Every event is one JSON line on stdout.
A replacement (COLLECTIVES_JOIN=1, no RANK) skips the first reconstruct: it was admitted by the
members' reconstruct, so its first call is the members' next all_reduce.

--agree-stop: the ranks end together. After each step they all_reduce one vote (1 once this
rank's --seconds are over or STOP_FILE exists), and all stop after the same step as soon as
one votes; then a barrier and a last all_reduce whose digest every rank reports ("final"
gets "digest" and "exact"): identical results on every rank, a clean end.

CoordinatorLost (the coordinator away past COLLECTIVES_COORDINATOR_GRACE) ends the worker
(exit code 5) after its event: every later operation would raise it too.
"""

import argparse
import hashlib
import json
import os
import signal
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
    p.add_argument("--agree-stop", action="store_true")
    p.add_argument(
        "--init-timeout",
        type=float,
        default=None,
        help="deadline of the first rendezvous (default: --timeout)",
    )
    p.add_argument(
        "--registered",
        action="store_true",
        help="all_reduce a buffer from pg.alloc (registered shared memory), "
        "allocated once in the first group and kept across reconstructions",
    )
    p.add_argument(
        "--die-at-init",
        type=int,
        default=None,
        help="this rank SIGKILLs itself as soon as init_process_group returns",
    )
    a = p.parse_args()
    joiner = "RANK" not in os.environ
    pg = cl.init_process_group(timeout=60.0 if joiner else a.init_timeout or a.timeout)
    if pg.rank == a.die_at_init:
        emit(event="dying", rank=pg.rank)
        os.kill(os.getpid(), signal.SIGKILL)
    pg.timeout = a.timeout
    emit(event="joined", rank=pg.rank, ws=pg.world_size, gen=pg.generation, joiner=joiner)
    x = pg.alloc(a.count, np.float32) if a.registered else np.empty(a.count, np.float32)
    if a.registered:
        from collectives.transport.zmq import registered

        emit(
            event="registered",
            rank=pg.rank,
            ok=pg.is_registered(x),
            pools=[p.name for p in registered._pools.values()],
        )
    end = time.time() + a.seconds
    skip_reconstruct = joiner
    steps = 0
    stop_file = os.environ.get("STOP_FILE", "/nonexistent")

    def want_stop():
        return time.time() >= end or os.path.exists(stop_file)

    while a.agree_stop or not want_stop():
        try:
            if not skip_reconstruct:
                before, started = pg.generation, time.time()
                pg = pg.reconstruct()
                if pg.generation != before:
                    emit(
                        event="reconstructed",
                        rank=pg.rank,
                        ws=pg.world_size,
                        gen=pg.generation,
                        started=started,
                        seconds=time.time() - started,
                    )
            skip_reconstruct = False
            n = pg.world_size
            x[:] = pg.rank + 1
            pg.all_reduce(x, algorithm=a.algorithm)
            ok = bool((x == n * (n + 1) / 2).all())
            steps += 1
            sender = getattr(pg.transport, "sender", None)  # ZeroMQ's send side, if any
            emit(
                event="step",
                rank=pg.rank,
                ws=n,
                gen=pg.generation,
                ok=ok,
                step=steps,
                shm_sent=getattr(sender, "shm_sent", 0),  # payloads through shared memory
                lent=getattr(getattr(sender, "lender", None), "sent", 0),
            )  # registered
            if not ok:
                sys.exit(4)
            if a.agree_stop:
                vote = np.array([float(want_stop())])
                pg.all_reduce(vote)
                if vote[0] > 0:
                    break
            time.sleep(a.pause)
        except cl.Evicted as e:
            emit(event="evicted", rank=pg.rank, gen=pg.generation, error=str(e))
            sys.exit(3)
        except cl.PeerFailure as e:
            emit(
                event="failure",
                rank=pg.rank,
                gen=pg.generation,
                kind=type(e).__name__,
                failed=list(e.failed_ranks),
                error=str(e),
            )
        except cl.CoordinatorLost as e:  # every later op raises it too: nothing to retry
            emit(
                event="error", rank=pg.rank, gen=pg.generation, kind=type(e).__name__, error=str(e)
            )
            sys.exit(5)
        except cl.CollectiveError as e:  # e.g. reconstruct raced with a failure: try again
            emit(
                event="error", rank=pg.rank, gen=pg.generation, kind=type(e).__name__, error=str(e)
            )
    final = {}
    if a.agree_stop:
        pg.barrier()
        n = pg.world_size
        y = np.arange(1000, dtype=np.float64) * (pg.rank + 1)
        pg.all_reduce(y)
        final = {
            "digest": hashlib.sha256(y.tobytes()).hexdigest()[:16],
            "exact": bool((y == np.arange(1000) * (n * (n + 1) / 2)).all()),
        }
    emit(event="final", rank=pg.rank, ws=pg.world_size, gen=pg.generation, steps=steps, **final)
    pg.destroy()


if __name__ == "__main__":
    main()
