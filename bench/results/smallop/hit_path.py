"""The small op's own cost with nothing to wait for: rank 1's side of a 2-rank 4-byte
all_reduce with its commit round, in one process, rank 0 played by posting its two frames
(the data, then the commit token, with the plan's own headers) before rank 1 calls. Every
receive of rank 1 finds its frame there, so what is timed is the op path's Python and its
syscalls, without the peer's scheduling, wake-ups or waits that make a 2-process run noisy.

    (cd WORKTREE && PYTHONPATH=. python bench/results/smallop/hit_path.py [OPS [SLEEP_US]])

prints rank 1's wall and CPU time per op for 7 repeats of OPS ops and the best of them.
SLEEP_US: sleep that long before each op, outside what is timed: the same op path run as a
rank that sleeps once per op runs it, its CPU handed to other processes meanwhile (cold
caches and branch predictors when it runs again)."""

import sys
import threading
import time

import numpy as np

import collectives as cl
from collectives.transport.base import OpContext
from collectives.transport.wire import DATA
from collectives.transport.zmq.transport import ZmqTransport


class Survivor:
    """A membership never asked anything: collectives end with a commit round."""

    def leave(self):
        pass

    def close_link(self):
        pass

    def reconstruct(self, *args, **kw):
        raise AssertionError("not asked")


def main(ops: int, sleep: float = 0.0) -> None:
    ts = [ZmqTransport(r, 2, transport="ipc", keys=None) for r in range(2)]
    infos = [t.address_info() for t in ts]
    for t in ts:
        t.connect(infos)
    pgs = [cl.ProcessGroup(t, timeout=60, membership=Survivor()) for t in ts]
    for pg in pgs:
        pg._crowded = False  # direct, and the all-to-all commit round

    def warm(pg):  # the plan made, the fast links confirmed
        b = np.ones(1, np.float32)
        for _ in range(30):
            pg.all_reduce(b)

    threads = [threading.Thread(target=warm, args=(pg,)) for pg in pgs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rank0, rank1 = ts
    pg1 = pgs[1]
    headers = next(iter(pg1._collectives.plans.values())).headers
    assert 1 in rank0.fast.ready and 0 in rank1.fast.by_peer, "fast links not up"
    payload, token, buf = np.ones(1, np.float32), np.empty(0, np.uint8), np.ones(1, np.float32)
    gen = rank1.generation
    best = None
    for rep in range(7):
        wall = cpu = 0.0
        for _ in range(ops):
            seq = pg1._core.seq
            rank0.begin_op(OpContext(0, seq))
            rank0.post_small(
                1, headers.encode(DATA, gen, seq, 0, 0, "exchange", 0, 0, time.time()), payload
            )
            rank0.post_small(
                1, headers.encode(DATA, gen, seq, 0, 1, "commit", 0, 0, time.time()), token
            )
            if sleep:
                time.sleep(sleep)
            w0, c0 = time.perf_counter(), time.thread_time()
            pg1.all_reduce(buf)
            wall += time.perf_counter() - w0
            cpu += time.thread_time() - c0
            while rank0.read_peer(1) is not None:  # what rank 1 sent: read off, unused
                pass
        got = (wall / ops * 1e6, cpu / ops * 1e6)
        best = got if best is None or got[1] < best[1] else best
        print(f"repeat {rep}: {got[0]:.2f} us wall, {got[1]:.2f} us cpu per op", flush=True)
    print(f"best: {best[0]:.2f} us wall, {best[1]:.2f} us cpu")
    for t in ts:
        t.close(0)


if __name__ == "__main__":
    main(
        int(sys.argv[1]) if len(sys.argv) > 1 else 3000,
        float(sys.argv[2]) * 1e-6 if len(sys.argv) > 2 else 0.0,
    )
