"""One rank of bench/studies/multihost.py, started inside a network namespace ("host") by the driver:

    python -m bench.studies.multihost_worker --sizes 65536,... --backends ring,hierarchical,gloo
                                     --reps 3 --master-ip 169.254.79.1

RANK, WORLD_SIZE, COLLECTIVES_COORDINATOR and COLLECTIVES_SOCKET_IFNAME come from the
environment (GLOO_SOCKET_IFNAME too, for Gloo). Gloo's TCPStore is hosted by rank 0 on any free
port, which reaches the others through this library's broadcast. For each size, each backend
runs once untimed and checked; then in every repeat each backend (starting one later each
repeat) runs once after a barrier, timed and checked (every rank gives 1.0: the sum is n).
Prints one JSON line per timed op: {"size", "backend", "rep", "seconds", "wrong", "cpu": this
process's CPU seconds in the op (all its threads, ZeroMQ's I/O thread and its CURVE included),
"busy": the fraction of the machine's CPU time (every core, /proc/stat) not idle during the op
-- where the time goes: 2 emulated hosts share this machine's cores, "shm_sent": payloads this
rank sent through shared memory in the op}.

Backend "tcp" is the link's floor for the hierarchical schedule, measured by the same processes
in the same repeats: exactly the bytes hierarchical sends across the hosts (each of its k
leaders 2(H-1)/H N/k to the next host's leader of its ring, while receiving as much from the
previous host's), over one plain TCP connection per pair -- no ZeroMQ, no CURVE, no reduction,
no work within the host. Ranks that lead no ring only wait in the barriers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import struct
import threading
import time

import numpy as np


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all the machine's cores so far (/proc/stat's first line)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]  # idle + iowait
    return sum(v) - idle, sum(v)


class LinkFloor:
    """Leader j of host i sends to leader j of host i+1 and receives from leader j of host
    i-1 (the rings of hierarchical.py), over plain TCP on the host's interface."""

    def __init__(self, pg):
        groups: dict = {}
        for q, h in enumerate(pg.hosts):
            groups.setdefault(h, []).append(q)
        hosts = list(groups.values())
        self.k = min(len(g) for g in hosts)
        self.h = len(hosts)
        mine = next(g for g in hosts if pg.rank in g)
        i, v = hosts.index(mine), mine.index(pg.rank)
        self.leads = v < self.k and self.h > 1
        ip = socket.inet_aton(pg_address())
        listener = socket.create_server((socket.inet_ntoa(ip), 0))
        me = np.array([struct.unpack("!I", ip)[0], listener.getsockname()[1]], np.int64)
        everyone = np.zeros((pg.world_size, 2), np.int64)
        pg.all_gather(everyone, me)
        self.out = self.inp = None
        if self.leads:
            right = hosts[(i + 1) % self.h][v]
            addr = socket.inet_ntoa(struct.pack("!I", int(everyone[right][0])))
            self.out = socket.create_connection((addr, int(everyone[right][1])), timeout=60)
            self.inp, _ = listener.accept()
            self.inp.settimeout(60)
        listener.close()
        self.sent, self.got = bytearray(), bytearray()

    def exchange(self, nbytes: int):
        if not self.leads:
            return
        count = 2 * (self.h - 1) * nbytes // (self.h * self.k)
        if len(self.got) < count:
            self.sent, self.got = bytearray(count), bytearray(count)
        view = memoryview(self.got)[:count]
        sender = threading.Thread(
            target=self.out.sendall, args=(memoryview(self.sent)[:count],), daemon=True
        )  # bounded by the socket's 60 s timeout anyway
        sender.start()
        got = 0
        while got < count:
            k = self.inp.recv_into(view[got:], count - got)
            if not k:
                raise SystemExit("link floor: the previous host's leader closed its socket")
            got += k
        sender.join()

    def close(self):
        for s in (self.out, self.inp):
            if s is not None:
                s.close()


def pg_address() -> str:
    from collectives.transport.zmq.addresses import interface_address

    return interface_address(os.environ["COLLECTIVES_SOCKET_IFNAME"])


def emit(**event):
    print(json.dumps(event), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", required=True)
    p.add_argument("--backends", default="ring,hierarchical,gloo")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--master-ip", required=True)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--segment-bytes", type=int, default=None)
    a = p.parse_args()
    backends = a.backends.split(",")
    if "gloo" in backends:
        import torch  # before the group: the import holds the GIL long
        import torch.distributed as dist
    import collectives as cl

    pg = cl.init_process_group(timeout=a.timeout, segment_bytes=a.segment_bytes)
    n, r = pg.world_size, pg.rank
    emit(
        event="joined",
        rank=r,
        kinds={str(k): v for k, v in pg.transport.kinds.items()},
        hosts=list(pg.hosts),
        pid=os.getpid(),
    )
    if "gloo" in backends:
        timeout = datetime.timedelta(seconds=a.timeout)
        port = np.zeros(1, np.int64)
        store = None
        if r == 0:
            store = dist.TCPStore(a.master_ip, 0, n, True, timeout=timeout, wait_for_workers=False)
            port[0] = store.port
        pg.broadcast(port, src=0)
        if r != 0:
            store = dist.TCPStore(a.master_ip, int(port[0]), n, False, timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=r, world_size=n, timeout=timeout)

    link = LinkFloor(pg) if "tcp" in backends else None

    def op(name, x, t):
        if name == "gloo":
            dist.all_reduce(t)
        elif name == "tcp":
            link.exchange(x.nbytes)
        else:
            pg.all_reduce(x, algorithm=name)

    for size in [int(s) for s in a.sizes.split(",")]:
        x = np.ones(size // 4, np.float32)
        t = torch.from_numpy(x) if "gloo" in backends else None  # the same memory
        for name in backends:  # untimed: connections, arenas, first touch
            x[:] = 1
            op(name, x, t)
            if name != "tcp" and not (x == n).all():
                raise SystemExit(f"rank {r}: {name} all_reduce of {size} B is wrong")
        for rep in range(a.reps):
            for k in range(len(backends)):
                name = backends[(k + rep) % len(backends)]
                x[:] = 1
                pg.barrier()
                ticks, cpu = machine_ticks(), time.process_time()
                via_shm = getattr(getattr(pg.transport, "sender", None), "shm_sent", 0)
                start = time.perf_counter()
                op(name, x, t)
                seconds = time.perf_counter() - start
                cpu, after = time.process_time() - cpu, machine_ticks()
                busy = (after[0] - ticks[0]) / max(1, after[1] - ticks[1])
                emit(
                    event="op",
                    rank=r,
                    size=size,
                    backend=name,
                    rep=rep,
                    seconds=seconds,
                    wrong=0 if name == "tcp" else int((x != n).sum()),
                    cpu=cpu,
                    busy=busy,
                    shm_sent=getattr(getattr(pg.transport, "sender", None), "shm_sent", 0)
                    - via_shm,
                )
    pg.barrier()
    if link is not None:
        link.close()
    if "gloo" in backends:
        dist.destroy_process_group()
    pg.destroy()
    emit(event="done", rank=r)


if __name__ == "__main__":
    main()
