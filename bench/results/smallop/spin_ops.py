"""N ranks running 4-byte all_reduces (CURVE on) for SECONDS, for a sampling profiler to
attach to: `(cd WORKTREE && PYTHONPATH=. python bench/results/smallop/spin_ops.py N SECONDS
PIDFILE)`; rank 1 writes its pid to PIDFILE once warm, and each rank prints its time and
CPU per op at the end. With py-spy:

    py-spy record --native -r 500 -d 5 -p $(cat PIDFILE) -f raw -o OUT.raw
    python bench/results/smallop/pyspy_breakdown.py OUT.raw
"""

import multiprocessing as mp
import os
import socket
import sys
import time


def worker(rank, size, port, seconds, pidfile):
    import numpy as np

    import collectives as cl

    pg = cl.init_process_group(
        rank=rank, world_size=size, master_addr="127.0.0.1", master_port=port, timeout=60.0
    )
    buf = np.zeros(1, np.float32)
    for _ in range(500):
        pg.all_reduce(buf)
    if rank == 1:
        with open(pidfile, "w") as f:
            f.write(str(os.getpid()))
    n, end = 0, time.monotonic() + seconds
    t0, c0 = time.perf_counter(), time.thread_time()
    while True:
        for _ in range(200):
            pg.all_reduce(buf)
        n += 200
        # every rank stops after the same op: rank 0's clock decides
        stop = np.array([float(rank == 0 and time.monotonic() > end)], np.float32)
        pg.all_reduce(stop)
        if stop[0]:
            break
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    print(f"rank {rank}: {n} ops, {wall / n * 1e6:.1f} us/op, cpu {cpu / n * 1e6:.1f}", flush=True)
    pg.barrier()
    pg.destroy()


if __name__ == "__main__":
    size, seconds, pidfile = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ctx = mp.get_context("spawn")
    ps = [ctx.Process(target=worker, args=(r, size, port, seconds, pidfile)) for r in range(size)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(120)
