"""Every collective once, checked against what numpy says, over whatever launched us.

Rank r's input is r + 1 (times its index), so every result is known in closed form. Prints
one JSON line per op ({"op", "ok"}) and, first, how this rank reaches each peer
({"kinds": {peer: "tcp" | "ipc" | "shm"}, "host": ..., "hosts": the group's host map}).
all_reduce runs every algorithm, hierarchical and auto included; what auto picked for each
size is printed ({"auto": {count: algorithm}, "crowded": whether the group counts a host as
crowded, which makes small ones "naive"})."""

import json
import socket

import numpy as np

import collectives as cl


def say(**event):
    print(json.dumps(event), flush=True)


pg = cl.init_process_group(timeout=30)
r, n = pg.rank, pg.world_size
say(
    rank=r,
    host=socket.gethostname(),
    endpoint=pg.transport.tcp_endpoint,
    kinds={str(p): k for p, k in pg.transport.kinds.items()},
    hosts=list(pg.hosts),
)
total = n * (n + 1) / 2
picked = []  # the algorithm each all_reduce ran, as its descriptor names it
pg.channel_wrappers.append(lambda ch: (picked.append(ch.descriptor.algorithm), ch)[1])
auto = {}
for algorithm in ("ring", "tree", "direct", "hierarchical", "auto"):
    for count in (5, 300_000):  # a few elements, and ~1.2 MB: several segments' worth
        x = np.arange(count, dtype=np.float32) * 0 + (r + 1)
        pg.all_reduce(x, algorithm=algorithm)
        if algorithm == "auto":
            auto[count] = picked[-1]
        say(rank=r, op=f"all_reduce {algorithm} {count}", ok=bool((x == total).all()))
# 20 MB: with H hosts each leader's chunk is several 4 MiB pieces, pipelined through the hosts
x = np.full(5_000_000, r + 1, np.float32)
pg.all_reduce(x, algorithm="hierarchical")
say(rank=r, op="all_reduce hierarchical 5000000", ok=bool((x == total).all()))
say(rank=r, auto=auto, crowded=pg.crowded)
x = np.full(1000, r + 1.0)
pg.broadcast(x, src=n - 1)
say(rank=r, op="broadcast", ok=bool((x == n).all()))
x = np.full(1000, r + 1.0)
pg.reduce(x, dst=1 % n)
say(rank=r, op="reduce", ok=bool((x == (total if r == 1 % n else r + 1)).all()))
out = np.zeros((n, 10))
pg.all_gather(out, np.full(10, r + 1.0))
say(rank=r, op="all_gather", ok=bool((out == np.arange(1, n + 1)[:, None]).all()))
out = np.zeros(10)
pg.reduce_scatter(out, np.arange(n * 10, dtype=np.float64) * 0 + (r + 1))
say(rank=r, op="reduce_scatter", ok=bool((out == total).all()))
peer_to, peer_from = (r + 1) % n, (r - 1) % n
if n > 1:
    w = pg.send(np.full(7, r + 1.0), peer_to, async_op=True)
    got = np.zeros(7)
    pg.recv(got, peer_from)
    w.wait()
    say(rank=r, op="send/recv", ok=bool((got == peer_from + 1).all()))
pg.barrier()
say(rank=r, op="done", ok=True)
pg.destroy()
