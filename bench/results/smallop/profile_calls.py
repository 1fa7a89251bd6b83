"""cProfile of rank 1 over 1000 4-byte all_reduces (2 ranks, CURVE on), sorted by call count:
`(cd WORKTREE && PYTHONPATH=. python bench/results/smallop/profile_calls.py 2 OUT)`: a script
puts its own folder on sys.path, not the working directory, so without PYTHONPATH it profiles
whichever tree the venv has installed."""

import multiprocessing as mp
import socket
import sys


def worker(rank, size, port, out):
    import cProfile
    import io
    import pstats

    import numpy as np

    import collectives as cl

    pg = cl.init_process_group(
        rank=rank, world_size=size, master_addr="127.0.0.1", master_port=port, timeout=60.0
    )
    buf = np.zeros(1, np.float32)
    for _ in range(200):
        pg.all_reduce(buf)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(1000):
        pg.all_reduce(buf)
    prof.disable()
    pg.barrier()
    pg.destroy()
    if rank == 1:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("ncalls").print_stats(80)
        with open(out, "w") as f:
            f.write(s.getvalue())


if __name__ == "__main__":
    size, out = int(sys.argv[1]), sys.argv[2]
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ctx = mp.get_context("spawn")
    ps = [ctx.Process(target=worker, args=(r, size, port, out)) for r in range(size)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(120)
