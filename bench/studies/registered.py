"""Registered buffers (pg.alloc) against ordinary ones, and both against their copy floors.

    python -m bench registered                      # 2 ranks, 64 MiB float32 SUM, ring
    python -m bench registered --mib 16 --rounds 9 --iters 3 --nproc 2
    python -m bench registered --ddp                # + DataParallel steps/s on the 2.37 M MLP

Every rank holds two buffers of the same size: one from np.empty (today's shm path: the sender
copies each segment into a slot, the receiver reduces/copies it from there) and one from
pg.alloc (registered: the receiver reads the sender's buffer in place). Rounds interleave
[floor measurement, plain x iters, registered x iters] in one run, so background load hits all
alike; the figures are medians over rounds, with the spread (min-max).

Copy floor (nccl-tests' "what must at least happen"): the bytes each rank must copy and add
for a ring all_reduce on this transport, at the single-core copy and add bandwidth rank 0
measures in that round (np.copyto and np.add over the same number of bytes, the other ranks
waiting at a barrier). Per rank, for N bytes and n ranks, with f = (n-1)/n:
    plain (through slots):   copy 2f*N (into slots) + f*N (out of slots), add f*N
    registered (in place):   copy f*N, add f*N   -- the sender copies nothing
--ddp: DataParallel (bucket 25 MiB, AVG) on the MLP of bench/studies/ddp_speed.py (256-1024x3-10,
2.37 M params), once with registered buckets and once with ordinary ones, rounds interleaved.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import collectives as cl


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--mib", type=float, default=64.0, help="buffer size in MiB (float32)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--iters", type=int, default=3, help="ops per kind per round")
    p.add_argument("--algorithm", default="ring")
    p.add_argument("--ddp", action="store_true", help="also DataParallel steps/s")
    p.add_argument("--ddp-steps", type=int, default=20)
    return p.parse_args(argv)


def spread(xs, fmt="{:.2f}"):
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def floor_times(pg, nbytes, together=False, bufs=None):
    """(copy s, add s, copy CPU s, add CPU s) for nbytes on rank 0, alone (the others wait),
    or with together=True on every rank at once (the slowest rank's figures). On two fresh
    numpy arrays, or on `bufs` (two arrays of nbytes: e.g. registered memory)."""
    out = np.zeros(4)
    pg.barrier()
    if pg.rank == 0 or together:
        a, b = (
            bufs
            if bufs is not None
            else (np.ones(nbytes // 4, np.float32), np.ones(nbytes // 4, np.float32))
        )
        b.fill(1)
        np.copyto(a, b)
        c0, t0 = time.process_time(), time.perf_counter()
        np.copyto(a, b)
        c1, t1 = time.process_time(), time.perf_counter()
        np.add(a, b, out=a)
        out[:] = (t1 - t0, time.perf_counter() - t1, c1 - c0, time.process_time() - c1)
    if together:
        pg.all_reduce(out, op=cl.ReduceOp.MAX)
    else:
        pg.broadcast(out, src=0)
    return out


def _pages() -> str:
    """What pages shared memory gets here (transparent huge pages for shmem, or not)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as f:
            mode = f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "page size unknown"
    return "4 KiB pages, shmem THP " + mode if mode in ("never", "deny") else "shmem THP " + mode


def allreduce_bench(pg, a):
    size = pg.world_size
    count = int(a.mib * (1 << 20)) // 4
    nbytes = count * 4
    plain = np.empty(count, np.float32)
    reg = pg.alloc(count, np.float32)
    want = np.float32(size * (size + 1) / 2)
    times = {"plain": [], "registered": []}
    floors = {"plain": [], "registered": []}
    cpu, cpu_floors = {"plain": [], "registered": []}, {"plain": [], "registered": []}
    both = {"plain": [], "registered": []}  # the floor with every rank copying at once
    # registered's floor on the memory it copies: shared memfd pages, which this kernel backs
    # with 4 KiB pages only (shmem_enabled), while numpy's own arrays get transparent huge
    # pages (numpy asks for them): the same copy can take longer there
    shared = (pg.alloc(count, np.float32), pg.alloc(count, np.float32))
    on_shared = []
    f = (size - 1) / size
    for _ in range(a.rounds):
        copy_m, add_m = floor_times(pg, nbytes, bufs=shared)[:2]
        on_shared.append(f * copy_m + f * add_m)
        copy_s, add_s, copy_c, add_c = floor_times(pg, nbytes)
        floors["plain"].append(3 * f * copy_s + f * add_s)
        floors["registered"].append(f * copy_s + f * add_s)
        cpu_floors["plain"].append(3 * f * copy_c + f * add_c)
        cpu_floors["registered"].append(f * copy_c + f * add_c)
        copy_b, add_b = floor_times(pg, nbytes, together=True)[:2]
        both["plain"].append(3 * f * copy_b + f * add_b)
        both["registered"].append(f * copy_b + f * add_b)
        for kind, buf in (("plain", plain), ("registered", reg)):
            ts, cs = [], []
            for _ in range(a.iters):
                buf.fill(pg.rank + 1)
                pg.barrier()
                c0, t0 = time.process_time(), time.perf_counter()
                pg.all_reduce(buf, algorithm=a.algorithm)
                ts.append(time.perf_counter() - t0)
                cs.append(time.process_time() - c0)
                if not (buf == want).all():
                    raise SystemExit(f"rank {pg.rank}: wrong result on the {kind} buffer")
            cpu[kind].append(statistics.median(cs))
            # slowest rank's median for this round
            t = np.array([statistics.median(ts)])
            pg.all_reduce(t, op=cl.ReduceOp.MAX)
            times[kind].append(float(t[0]))
    if pg.rank != 0:
        return
    busbw = {k: [nbytes / t * 2 * f / 1e9 for t in v] for k, v in times.items()}
    ratio = [p / r for p, r in zip(times["plain"], times["registered"])]
    print(
        f"all_reduce {a.mib:g} MiB float32 SUM, {size} ranks, {a.algorithm}, shm transport; "
        f"median (min-max) of {a.rounds} rounds x {a.iters} ops, interleaved"
    )
    print(f"  is_registered: plain={pg.is_registered(plain)} registered={pg.is_registered(reg)}")
    for k in ("plain", "registered"):
        eff = [fl / t for fl, t in zip(floors[k], times[k])]
        print(
            f"  {k:10s} time {spread([t * 1e3 for t in times[k]])} ms  busbw "
            f"{spread(busbw[k])} GB/s  copy floor {spread([x * 1e3 for x in floors[k]])} ms"
            f"  floor/time {spread([e * 100 for e in eff], '{:.0f}')} %"
        )
    print(f"  registered / plain busbw = {spread(ratio)}x", flush=True)
    print("  the same floors with every rank copying at once (they share the memory bus):")
    for k in ("plain", "registered"):
        eff = [fl / t for fl, t in zip(both[k], times[k])]
        print(
            f"  {k:10s} floor {spread([x * 1e3 for x in both[k]])} ms  floor/time "
            f"{spread([e * 100 for e in eff], '{:.0f}')} %"
        )
    eff = [fl / t for fl, t in zip(on_shared, times["registered"])]
    print(
        f"  registered's floor measured on registered memory (memfd: {_pages()}): "
        f"{spread([x * 1e3 for x in on_shared])} ms  floor/time "
        f"{spread([e * 100 for e in eff], '{:.0f}')} %"
    )
    print("  CPU time of rank 0's process per op (all its threads; less sensitive to other load)")
    for k in ("plain", "registered"):
        eff = [fl / t for fl, t in zip(cpu_floors[k], cpu[k])]
        print(
            f"  {k:10s} CPU {spread([t * 1e3 for t in cpu[k]])} ms  CPU copy floor "
            f"{spread([x * 1e3 for x in cpu_floors[k]])} ms  floor/CPU "
            f"{spread([e * 100 for e in eff], '{:.0f}')} %",
            flush=True,
        )


def ddp_bench(pg, a):
    import torch

    import collectives as cl

    torch.set_num_threads(1)

    def model():
        torch.manual_seed(0)
        dims = [256, 1024, 1024, 1024, 10]
        mods = []
        for i in range(len(dims) - 1):
            mods += [torch.nn.Linear(dims[i], dims[i + 1]), torch.nn.ReLU()]
        return torch.nn.Sequential(*mods[:-1])

    runs = {}
    for kind in ("plain", "registered"):
        m = cl.DataParallel(model(), pg, registered=kind == "registered")
        runs[kind] = (
            m,
            torch.optim.SGD(m.parameters(), lr=0.01),
            torch.Generator().manual_seed(pg.rank),
        )
    regs = [pg.is_registered(b.flat) for b in runs["registered"][0].buckets]

    def steps(kind, k):
        m, opt, gen = runs[kind]
        for _ in range(k):
            x = torch.randn(32, 256, generator=gen)
            y = torch.randint(0, 10, (32,), generator=gen)
            loss = torch.nn.functional.cross_entropy(m(x), y)
            opt.zero_grad()
            loss.backward()
            m.sync_gradients()
            opt.step()

    for kind in runs:
        steps(kind, 3)
    rates = {k: [] for k in runs}
    for _ in range(a.rounds):
        for kind in runs:
            pg.barrier()
            t0 = time.perf_counter()
            steps(kind, a.ddp_steps)
            rates[kind].append(a.ddp_steps / (time.perf_counter() - t0))
    same = all(
        torch.equal(p, q)
        for p, q in zip(runs["plain"][0].parameters(), runs["registered"][0].parameters())
    )
    if pg.rank == 0:
        n = sum(p.numel() for p in runs["plain"][0].parameters())
        print(
            f"DataParallel, {pg.world_size} ranks, MLP 3x1024 ({n / 1e6:.2f} M params), batch "
            f"32, bucket 25 MiB; median (min-max) of {a.rounds} rounds x {a.ddp_steps} steps"
        )
        for k in runs:
            print(f"  {k:10s} {spread(rates[k], '{:.1f}')} steps/s")
        ratio = [r / p for p, r in zip(rates["plain"], rates["registered"])]
        print(
            f"  registered / plain = {spread(ratio)}x; buckets registered: {regs}; "
            f"parameters bitwise equal: {same}",
            flush=True,
        )
    if not same:
        raise SystemExit("plain and registered buckets ended with different parameters")


def worker(a):
    import collectives as cl

    pg = cl.init_process_group(timeout=120.0)
    try:
        allreduce_bench(pg, a)
        if a.ddp:
            ddp_bench(pg, a)
    finally:
        pg.destroy()


if __name__ == "__main__":
    args = parse()
    if "RANK" in os.environ:
        worker(args)
    else:
        env = dict(os.environ, COLLECTIVES_TRANSPORT="shm", OMP_NUM_THREADS="1")
        cmd = [
            sys.executable,
            "-m",
            "collectives.launch",
            "--nproc",
            str(args.nproc),
            os.path.abspath(__file__),
            *sys.argv[1:],
        ]
        sys.exit(subprocess.run(cmd, env=env).returncode)
