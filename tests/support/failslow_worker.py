"""The fail-slow scenario's training loop: an 8 MiB all_reduce(AVG) per step, timed.

The gradient carries one more element, the stop flag: rank 0 sets it once the file named by
$FAILSLOW_STOP exists, and every rank stops after the step whose average says so, so every
rank runs the same steps whatever the links do. Prints "step N" on stderr after each step
(FAILSLOW_TRACE=1) and one JSON line at the end: the steps' end times (time.monotonic(), the
same clock in every network namespace of one machine) and durations, the generation, and the
model's sha256, and the schedule its last step ran on (pg.rerouted). With $FAILSLOW_TIMES, it
also appends each step's end time and duration to that file as the step ends, for a harness
that times the steps while the job runs.
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


def main():
    count = int(os.environ.get("FAILSLOW_COUNT", str(2 << 20)))
    stop_file = os.environ.get("FAILSLOW_STOP", "")
    trace = os.environ.get("FAILSLOW_TRACE") == "1"
    max_steps = int(os.environ.get("FAILSLOW_MAX_STEPS", "2000"))
    times = open(os.environ["FAILSLOW_TIMES"], "a") if os.environ.get("FAILSLOW_TIMES") else None
    # "R:S": rank R computes S seconds before each step (a compute straggler, not a link)
    lag_rank, _, lag = os.environ.get("FAILSLOW_COMPUTE", "-1:0").partition(":")
    pg = cl.init_process_group(timeout=float(os.environ.get("FAILSLOW_TIMEOUT", "60")))
    model = np.zeros(count, np.float32)
    ends, took = [], []
    buf = np.empty(count + 1, np.float32)
    step = 0
    while step < max_steps:
        buf[:count] = gradient(step, pg.rank, count)
        buf[count] = 1.0 if pg.rank == 0 and stop_file and os.path.exists(stop_file) else 0.0
        if pg.rank == int(lag_rank):
            time.sleep(float(lag))
        t0 = time.monotonic()
        pg.all_reduce(buf, op=cl.ReduceOp.AVG)
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
    }
    pg.barrier()
    pg.destroy()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
