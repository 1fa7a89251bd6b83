"""One worker of bench/stress/chaos.py: checked all_reduces and a small training loop that survive
whatever bench/stress/chaos_faults.py does to the job.

Each step, at its boundary: reconstruct() (admits joiners; cheap when nothing changed); after
a generation change, a state sync (below); the link fault the supervisor ordered, if any; then
  1. a checked all_reduce: rank r contributes r+1 (n(n+1)/2 expected), plus one "stop" element
     (1 where the supervisor's stop file exists), so that every member stops after the same step;
  2. a training step: linear regression on a fixed seeded data set, each rank's gradient over
     its shard of the step's batch, averaged with all_reduce(AVG); the parameters change only
     after the average came back (an op counts on every survivor or on none: the commit round).
State sync: all_gather of (has state, step, params hash); the members that have state must
agree on (step, hash) -- a disagreement is a wrong result -- then the lowest of them
broadcasts params and step to everyone (a joiner has none).

Evicted (a stall, a slow link): close the old group and join again (init_process_group(
join=True)); SIGTERM: the library leaves the group and the process exits 143; the
coordinator lost for good (away past the grace, CoordinatorLost): the process says so and
exits LOST_EXIT, since every later call would raise it again. A watchdog
thread reports an op, reconstruct or admission wait that runs past --hang-after seconds (a
hang; a stopped process does not count: its watchdog is stopped too). Its resources
(bench/stress/resources.py) are sampled after SAMPLE_AT steps and at the end. One JSON line per event.
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import json
import os
import random
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import collectives as cl  # noqa: E402
from bench.stress import resources  # noqa: E402

DIM, SAMPLES, BATCH, LR = 16, 512, 64, 0.05
ALGORITHMS = ["ring", "tree", "direct", "naive", "auto"]
REPORT_EVERY = 0.25
LOST_EXIT = 3  # the exit status of a worker whose coordinator is lost for good
SAMPLE_AT = 100  # resources are sampled at the first step at full size after this
# many steps of this process, and at the end: what every
# reconstruction and rejoin in between left behind


def emit(**event):
    event["t"] = time.time()
    event["pid"] = os.getpid()
    print(json.dumps(event), flush=True)


class Watchdog:
    """Reports (once per activity) an activity that has run longer than `bound` seconds."""

    def __init__(self, bound: float):
        self.bound = bound
        self.what, self.since, self.reported = None, 0.0, False
        threading.Thread(target=self._run, daemon=True, name="chaos-watchdog").start()

    def start(self, what: str):
        self.what, self.since, self.reported = what, time.monotonic(), False

    def stop(self):
        self.what = None

    def _run(self):
        last = time.monotonic()
        while True:
            time.sleep(0.5)
            now = time.monotonic()
            if now - last > 2.0:  # we were stopped (SIGSTOP): that time is not ours
                self.since += now - last - 0.5
            last = now
            what = self.what
            if what is not None and not self.reported and now - self.since > self.bound:
                self.reported = True
                emit(event="hang", what=what, seconds=round(now - self.since, 1))
                faulthandler.dump_traceback(sys.stderr)


def data():
    g = np.random.default_rng(1234)
    x = g.standard_normal((SAMPLES, DIM))
    return x, x @ g.standard_normal(DIM) + 0.01 * g.standard_normal(SAMPLES)


def digest(params, step) -> int:
    h = hashlib.sha256(params.tobytes() + int(step).to_bytes(8, "little")).digest()
    return int.from_bytes(h[:7], "little")  # fits an int64


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--timeout", type=float, default=3.0, help="op timeout (s)")
    p.add_argument("--hang-after", type=float, default=30.0)
    p.add_argument("--join-timeout", type=float, default=120.0)
    p.add_argument("--control", required=True, help="the supervisor's directory")
    p.add_argument("--world-size", type=int, required=True, help="the job's full size")
    p.add_argument("--count", type=int, default=256, help="elements of the checked all_reduce")
    a = p.parse_args()
    control = a.control
    stop_file = os.path.join(control, "stop")
    order_file = os.path.join(control, f"order-{os.getpid()}")
    dog = Watchdog(a.hang_after)
    x_all, y_all = data()
    joiner = "RANK" not in os.environ
    dog.start("init (join)" if joiner else "init")
    pg = cl.init_process_group(timeout=a.join_timeout if joiner else 30.0)
    pg.timeout = a.timeout
    dog.stop()
    emit(event="joined", rank=pg.rank, ws=pg.world_size, gen=pg.generation, joiner=joiner)
    params = np.zeros(DIM)
    step, has_state = 0, not joiner
    synced = None if joiner else pg.generation
    rng = random.Random(os.getpid())
    reconstruct_first = not joiner  # a joiner's first call is the members' next op
    checked = np.empty(a.count + 1, np.float32)
    reported_gen, reported_at, local_steps, sampled, rejoins = None, 0.0, 0, False, 0
    while True:
        try:
            if reconstruct_first:
                before, started = pg.generation, time.time()
                dog.start("reconstruct")
                pg = pg.reconstruct()
                if pg.generation != before:
                    emit(
                        event="reconstructed",
                        rank=pg.rank,
                        ws=pg.world_size,
                        gen=pg.generation,
                        started=started,
                    )
            reconstruct_first = True
            n, r = pg.world_size, pg.rank
            if pg.generation != synced:
                dog.start("sync")
                table = np.zeros((n, 3), np.int64)
                pg.all_gather(table, np.array([has_state, step, digest(params, step)], np.int64))
                holders = table[table[:, 0] == 1]
                if len(holders) and (holders[:, 1:] != holders[0, 1:]).any():
                    emit(event="diverged", rank=r, gen=pg.generation, table=table.tolist())
                src = int(np.flatnonzero(table[:, 0] == 1)[0]) if len(holders) else 0
                buf = np.append(params, float(step))
                pg.broadcast(buf, src=src)
                params, step, has_state = buf[:DIM].copy(), int(buf[DIM]), True
                synced = pg.generation
            if os.path.exists(order_file):
                kind, seconds = open(order_file).read().split()
                os.unlink(order_file)
                src = rng.choice([q for q in range(n) if q != r])
                spec = f"delay:{src}->{r}:{seconds}s" if kind == "delay" else f"drop:{src}->{r}"
                cl.inject_faults(pg, spec)
                emit(event="link_fault", rank=r, gen=pg.generation, spec=spec)
            # 1. the checked all_reduce (and the agreement to stop)
            dog.start("all_reduce")
            checked[:-1] = r + 1
            checked[-1] = 1.0 if os.path.exists(stop_file) else 0.0
            algorithm = ALGORITHMS[step % len(ALGORITHMS)]
            pg.all_reduce(checked, algorithm=algorithm)
            ok = bool((checked[:-1] == n * (n + 1) / 2).all())
            # 2. the training step
            dog.start("train all_reduce")
            lo = step * BATCH % SAMPLES
            rows = np.arange(lo, lo + BATCH)[r::n] % SAMPLES
            xb, yb = x_all[rows], y_all[rows]
            grad = np.zeros(DIM + 1)
            grad[:DIM] = 2 * xb.T @ (xb @ params - yb) / BATCH * n  # mean over the batch
            grad[DIM] = len(rows)
            pg.all_reduce(grad, op=cl.ReduceOp.AVG)
            dog.stop()
            if round(grad[DIM] * n) != BATCH:  # every row of the batch, exactly once
                ok = False
            params -= LR * grad[:DIM]
            step += 1
            local_steps += 1
            if not sampled and local_steps >= SAMPLE_AT and n == a.world_size:
                sampled = True  # at the full world size, as the end sample is
                emit(
                    event="sample",
                    phase="early",
                    ws=n,
                    **resources.sample(pg),
                    fd_kinds=resources.fd_kinds(),
                    threads_named=resources.thread_names(),
                )
            # one event per REPORT_EVERY s (and at once for the first step of a generation or
            # a wrong one): eight workers stepping at full speed would flood the supervisor
            now = time.monotonic()
            if not ok or pg.generation != reported_gen or now - reported_at >= REPORT_EVERY:
                emit(
                    event="step",
                    rank=r,
                    ws=n,
                    gen=pg.generation,
                    ok=ok,
                    step=step,
                    algorithm=algorithm,
                    rerouted=pg.rerouted,  # the schedule around slow links, if any
                )
                reported_gen, reported_at = pg.generation, now
            if checked[-1] > 0:
                break
        except cl.Evicted as e:
            dog.start("rejoin")
            emit(event="evicted", rank=pg.rank, gen=pg.generation, error=str(e)[:300])
            pg.close()
            pg = cl.init_process_group(join=True, timeout=a.join_timeout)
            pg.timeout = a.timeout
            dog.stop()
            emit(
                event="joined",
                rank=pg.rank,
                ws=pg.world_size,
                gen=pg.generation,
                joiner=True,
                rejoin=True,
            )
            reconstruct_first, has_state = False, False
            rejoins += 1
        except cl.PeerFailure as e:
            emit(
                event="failure",
                rank=pg.rank,
                gen=pg.generation,
                kind=type(e).__name__,
                failed=list(e.failed_ranks),
                error=str(e)[:300],
            )
        except cl.CoordinatorLost as e:
            # for good: the coordinator stayed away past the grace, and every call of this
            # process raises it at once from now on -- retrying would only spin. The run
            # ends, with this as its reason (chaos.py).
            emit(event="coordinator_lost", rank=pg.rank, gen=pg.generation, error=str(e)[:300])
            sys.exit(LOST_EXIT)
        except cl.CollectiveError as e:  # e.g. a reconstruct that raced with a failure
            emit(
                event="error",
                rank=pg.rank,
                gen=pg.generation,
                kind=type(e).__name__,
                error=str(e)[:300],
            )
    dog.start("final barrier")
    pg.barrier()
    dog.stop()
    emit(
        event="sample",
        phase="end",
        ws=pg.world_size,
        **resources.sample(pg),
        fd_kinds=resources.fd_kinds(),
        threads_named=resources.thread_names(),
        rejoins=rejoins,
    )
    emit(
        event="final",
        rank=pg.rank,
        ws=pg.world_size,
        gen=pg.generation,
        step=step,
        params_sha256=hashlib.sha256(params.tobytes()).hexdigest(),
    )
    pg.destroy()


if __name__ == "__main__":
    main()
