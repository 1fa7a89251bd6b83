"""The fail-slow scenario's training loop: an 8 MiB all_reduce(AVG) per step, timed.

The gradient carries one more element, the stop flag: rank 0 sets it once the file named by
$FAILSLOW_STOP exists, and every rank stops after the step whose average says so, so every
rank runs the same steps whatever the links do. Prints "step N" on stderr after each step
(FAILSLOW_TRACE=1) and one JSON line at the end: the steps' end times (time.monotonic(), the
same clock in every network namespace of one machine) and durations, the generation, and the
model's sha256, and the schedule its last step ran on (pg.rerouted).

With FAILSLOW_ELASTIC=1 the job survives a rank removed from it (the coordinator's `replace`
policy: a rank whose NIC is slow makes way for a warm spare): an op that raises PeerFailure
is given up, the survivors reconstruct() (which admits the waiting spare), and the lowest
rank with the most steps hands every member its step count and model (resync), so that the
step given up is run again by the new generation. FAILSLOW_JOINER=1: this process is that
spare (COLLECTIVES_SPARE=1), waiting to be admitted; its JSON line's "ends" start with its
first committed step. The rank removed prints its line with "evicted" (the reason) and exits
0 without the final barrier: it is no longer a member.
With $FAILSLOW_TIMES, it also appends each step's end time and duration to that file as the
step ends, for a harness that times the steps while the job runs.
"""

import hashlib
import json
import os
import sys
import time

import numpy as np

import collectives as cl


def gradient(step: int, rank: int, count: int) -> np.ndarray:
    return np.random.default_rng([step, rank]).standard_normal(count).astype(np.float32)


def resync(pg, model: np.ndarray, step: int) -> int:
    """Every member's step count gathered; the lowest rank with the most hands out its model
    and count (a joiner has -1): the new generation goes on from there, identical."""
    steps = np.zeros((pg.world_size, 1), np.float64)
    pg.all_gather(steps, np.array([float(step)]))
    src = int(np.argmax(steps[:, 0]))
    pg.broadcast(model, src=src)
    return int(steps[src, 0])


def main():
    count = int(os.environ.get("FAILSLOW_COUNT", str(2 << 20)))
    stop_file = os.environ.get("FAILSLOW_STOP", "")
    trace = os.environ.get("FAILSLOW_TRACE") == "1"
    max_steps = int(os.environ.get("FAILSLOW_MAX_STEPS", "2000"))
    times = open(os.environ["FAILSLOW_TIMES"], "a") if os.environ.get("FAILSLOW_TIMES") else None
    # "R:S": rank R computes S seconds before each step (a compute straggler, not a link)
    lag_rank, _, lag = os.environ.get("FAILSLOW_COMPUTE", "-1:0").partition(":")
    elastic = os.environ.get("FAILSLOW_ELASTIC") == "1"
    joiner = os.environ.get("FAILSLOW_JOINER") == "1"
    timeout = float(os.environ.get("FAILSLOW_TIMEOUT", "60"))
    model = np.zeros(count, np.float32)
    step = 0
    evicted = None
    changes = []  # (time.monotonic(), generation, world size) at each group change
    if joiner:
        print("waiting", file=sys.stderr, flush=True)
        pg = cl.init_process_group(join=True, timeout=3600.0)  # waits as long as the job runs
        pg.timeout = timeout
        step = resync(pg, model, -1)
        changes.append((time.monotonic(), pg.generation, pg.world_size))
    else:
        pg = cl.init_process_group(timeout=timeout)
    ends, took = [], []
    buf = np.empty(count + 1, np.float32)
    while step < max_steps:
        buf[:count] = gradient(step, pg.rank, count)
        buf[count] = 1.0 if pg.rank == 0 and stop_file and os.path.exists(stop_file) else 0.0
        if pg.rank == int(lag_rank):
            time.sleep(float(lag))
        t0 = time.monotonic()
        try:
            pg.all_reduce(buf, op=cl.ReduceOp.AVG)
        except cl.PeerFailure as exc:
            if not elastic:
                raise
            try:
                if isinstance(exc, cl.Evicted):
                    raise
                pg = pg.reconstruct()
            except cl.Evicted as gone:
                evicted = str(gone)
                break
            step = resync(pg, model, step)
            changes.append((time.monotonic(), pg.generation, pg.world_size))
            continue
        t1 = time.monotonic()
        ends.append(t1)
        took.append(t1 - t0)
        if times:
            print(f"{t1!r} {t1 - t0!r}", file=times, flush=True)
        model -= np.float32(0.01) * buf[:count]
        step += 1
        if trace:
            print(f"step {step}", file=sys.stderr, flush=True)
        if buf[count] > 0:
            break
    out = {
        "rank": pg.rank,
        "steps": step,
        "generation": pg.generation,
        "ends": ends,
        "took": took,
        "sha256": hashlib.sha256(model.tobytes()).hexdigest(),
        "rerouted": pg.rerouted,
        "world_size": pg.world_size,
        "changes": changes,
        "evicted": evicted,
    }
    if evicted is None:
        pg.barrier()
    pg.destroy()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
