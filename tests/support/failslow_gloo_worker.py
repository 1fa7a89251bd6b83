"""The fail-slow scenario's training loop over torch.distributed Gloo: the reference that does
nothing. The same steps as failslow_worker.py (the same gradients, the stop flag as one more
element, the same JSON line at the end), each an all_reduce(SUM) divided by the world size
(Gloo has no AVG) through a Gloo process group whose rendezvous is a FileStore (every network
namespace of one machine shares its files) and whose connections use the host's veth
($GLOO_SOCKET_IFNAME), so they cross the links that tc slows.
"""

import hashlib
import json
import os
import sys
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from failslow_worker import gradient


def main():
    count = int(os.environ.get("FAILSLOW_COUNT", str(2 << 20)))
    stop_file = os.environ.get("FAILSLOW_STOP", "")
    trace = os.environ.get("FAILSLOW_TRACE") == "1"
    max_steps = int(os.environ.get("FAILSLOW_MAX_STEPS", "2000"))
    times = open(os.environ["FAILSLOW_TIMES"], "a") if os.environ.get("FAILSLOW_TIMES") else None
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = timedelta(seconds=float(os.environ.get("FAILSLOW_TIMEOUT", "60")))
    store = dist.FileStore(os.environ["FAILSLOW_GLOO_STORE"], n)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=n, timeout=timeout)
    torch.set_num_threads(1)
    model = np.zeros(count, np.float32)
    ends, took = [], []
    buf = torch.empty(count + 1, dtype=torch.float32)
    view = buf.numpy()
    step = 0
    while step < max_steps:
        view[:count] = gradient(step, rank, count)
        view[count] = 1.0 if rank == 0 and stop_file and os.path.exists(stop_file) else 0.0
        t0 = time.monotonic()
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)
        buf /= n
        t1 = time.monotonic()
        ends.append(t1)
        took.append(t1 - t0)
        if times:
            print(f"{t1!r} {t1 - t0!r}", file=times, flush=True)
        model -= np.float32(0.01) * view[:count]
        step += 1
        if trace:
            print(f"step {step}", file=sys.stderr, flush=True)
        if view[count] > 0:
            break
    out = {
        "rank": rank,
        "steps": step,
        "generation": 0,
        "ends": ends,
        "took": took,
        "sha256": hashlib.sha256(model.tobytes()).hexdigest(),
        "rerouted": "gloo: the schedule never changes",
    }
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
