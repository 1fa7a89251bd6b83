"""The stalled-allreduce scenario's training loop, as a new user writes it.

    while steps < N:
        try:   pg.all_reduce(grad, op=AVG)
        except Evicted: leave
        except CollectiveError: pg = pg.reconstruct(); continue      # drop the stalled step
        model -= lr * grad; steps += 1
    pg.barrier(); pg.destroy()

Rank r's gradient at step s is drawn from a generator seeded with (s, r), r its rank in
generation 0, so two survivors that paired up different steps end with different models.
Prints one JSON line at the end: its steps, the steps it dropped, the generation and world
size of each step, and the model's sha256 (a survivor) or {"evicted": ...}.
"""

import hashlib
import json
import os
import re
import sys
import time

import numpy as np

import collectives as cl


def gradient(step: int, rank: int, count: int) -> np.ndarray:
    return np.random.default_rng([step, rank]).standard_normal(count).astype(np.float32)


def main():
    steps_wanted = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    count = int(os.environ.get("STALL_COUNT", "1000"))
    pace = float(os.environ.get("STALL_PACE", "0"))  # seconds of "compute" per step
    trace = os.environ.get("STALL_TRACE") == "1"  # a "step N" line on stderr per step
    # STALL_STEPS_AFTER_ERROR=k: the job ends k kept steps after its first error, not at
    # steps_wanted (bench/studies/stallmatrix.py: a run ends soon after its recovery)
    after_error = int(os.environ.get("STALL_STEPS_AFTER_ERROR", "0"))
    if os.environ.get("TEST_ONE_CPU") == "1":  # every rank on one CPU: a crowded host
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    # The rendezvous gets a deadline of its own: forming the group (CURVE handshakes, the
    # address exchange) beside CPU burners can take longer than the op timeout under test,
    # and a worker that never formed tests nothing. Every op and regroup keeps STALL_TIMEOUT.
    pg = cl.init_process_group(timeout=float(os.environ.get("STALL_INIT_TIMEOUT", "30")))
    pg.timeout = float(os.environ.get("STALL_TIMEOUT", "3"))
    me = pg.rank
    model = np.zeros(count, np.float32)
    steps, dropped, errors, history = 0, [], [], []
    # per error: seconds from the start of the op that stalled to the error, and to the next
    # completed step. The stalled op is the one the error names: an op whose commit round
    # stalled while every rank held its result counts, and the failure shows at the next op.
    recovery = []
    errors_at = []  # time.monotonic() at each error (one clock for every process of the host)
    errors_op_began = []  # time.monotonic() when this rank began the op each error names
    began: dict = {}  # (generation, op seq) -> when this rank started it (the last few)
    failed_at = None
    while steps < steps_wanted:
        grad = gradient(steps, me, count)
        started = time.monotonic()
        began[(pg.generation, pg._seq)] = started
        if len(began) > 8:
            del began[min(began)]
        try:
            pg.all_reduce(grad, op=cl.ReduceOp.AVG)
        except cl.Evicted as exc:
            named = re.search(r"op #(\d+)", str(exc))
            evicted = {
                "rank": me,
                "evicted": str(exc),
                "steps": steps,
                "at": time.monotonic(),
                "op_began": began.get((pg.generation, int(named.group(1)))) if named else None,
                # the errors of earlier generations (a wrong eviction's second stall)
                "errors": errors,
                "errors_at": errors_at,
                "errors_op_began": errors_op_began,
            }
            print(json.dumps(evicted), flush=True)
            pg.close()
            return
        except cl.CollectiveError as exc:
            named = re.search(r"op #(\d+)", str(exc))
            failed_at = (
                began.get((pg.generation, int(named.group(1))), started) if named else started
            )
            recovery.append([time.monotonic() - failed_at])
            errors_at.append(time.monotonic())
            errors_op_began.append(failed_at)
            if after_error and len(errors) == 0:
                steps_wanted = min(steps_wanted, steps + after_error)
            dropped.append(steps)
            errors.append(f"{type(exc).__name__}: {exc}")
            pg = pg.reconstruct()
            continue
        if failed_at is not None:
            recovery[-1].append(time.monotonic() - failed_at)
            failed_at = None
        history.append([pg.generation, pg.world_size])
        model -= np.float32(0.01) * grad
        steps += 1
        if trace:
            print(f"step {steps}", file=sys.stderr, flush=True)
        if pace:
            time.sleep(pace)
    pg.barrier()
    print(
        json.dumps(
            {
                "rank": me,
                "steps": steps,
                "dropped": dropped,
                "errors": errors,
                "history": history,
                "generation": pg.generation,
                "crowded": pg.crowded,
                "spin_yields": pg._spin_yields,
                "recovery": recovery,
                "errors_at": errors_at,
                "errors_op_began": errors_op_began,
                "sha256": hashlib.sha256(model.tobytes()).hexdigest(),
                "model": model[:8].tolist(),
            }
        ),
        flush=True,
    )
    pg.destroy()


if __name__ == "__main__":
    main()
