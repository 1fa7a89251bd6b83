"""Small-op latency against its floor: `python -m bench smallop [--nproc N] [--sizes 4,1K]`.

Every rank runs, in the same processes and interleaved repeat by repeat:
  * `lib`:   pg.all_reduce(buf) (algorithm auto) on this library's group;
  * `floor`: the bare exchange pattern of the algorithm auto picks, in raw pyzmq: each rank
    sends its buffer to every peer it would send to, then receives from each (PAIR sockets
    over ipc, no header, no checks), as many rounds as the algorithm has.
It prints the median time per op of each, their ratio (lib / floor) and the spread (min-max
over repeats of the slowest rank). `--profile DIR` writes a cProfile text summary per rank
of the library loop (the top functions by own time and by cumulative time).

This is the measurement behind the small-op targets; bench/harness/cli.py prints the same
floor as the `floor` rows of the main benchmark.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing as mp
import os
import statistics
import time

import numpy as np

from ..floors.collective import PairMesh, algorithm_of, pattern
from ..harness.spec import parse_size


def worker(rank, size, port, sizes, repeats, iters, profile, alone, flip, tag, conn):
    import collectives as cl

    pg = cl.init_process_group(
        rank=rank, world_size=size, master_addr="127.0.0.1", master_port=port, timeout=60.0
    )
    mesh = PairMesh(rank, size, tag)
    out = {}
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
    try:
        for nbytes in sizes:
            buf = np.ones(max(nbytes // 4, 1), np.float32)
            alg = algorithm_of("all_reduce", buf.nbytes, size, pg.crowded)
            rounds = pattern("all_reduce", alg, rank, size, buf.nbytes, pg._commits(), pg.crowded)
            arrays: dict = {}
            plan = [
                (
                    [(p, arrays.setdefault(("s", b), np.ones(b, np.uint8))) for p, b in snd],
                    [(p, arrays.setdefault(("r", p, b), np.ones(b, np.uint8))) for p, b in rcv],
                )
                for snd, rcv in rounds
            ]
            rounds = len(rounds)
            for _ in range(20):
                buf[:] = 1
                pg.all_reduce(buf)
                mesh.run(plan)
            assert buf[0] == size, buf[0]
            buf[:] = 0  # 0 + 0 stays 0: no overflow over thousands of sums
            times = {
                "lib": [],
                "floor": [],
                "lib_cpu": [],
                "floor_cpu": [],
                "transport": [],
                "transport_cpu": [],
                "transport_spin": [],
                "transport_spin_cpu": [],
                "flipped": [],
                "flipped_cpu": [],
            }
            # --flip-crowded: the schedule the group runs when the opposite holds (crowded:
            # naive + star commit; else direct + the all-to-all or dissemination commit)
            flipped = algorithm_of("all_reduce", buf.nbytes, size, not pg.crowded)
            t = pg.transport
            hdr = b"\x00" * 60
            spin = pg._spin  # what the group's small receives spin (0: none) ...
            yields = pg._spin_yields  # ... and whether they give the CPU away meanwhile
            other = 1 - rank if size == 2 else None
            for rep in range(repeats):
                names = ("lib", "floor") if rep % 2 else ("floor", "lib")
                if other is not None and alone:
                    names += ("transport", "transport_spin")
                if flip:
                    names += ("flipped",)
                for name in names:
                    pg.barrier()
                    t0, c0 = time.perf_counter(), time.thread_time()
                    if name == "lib":
                        if prof:
                            prof.enable()
                        for _ in range(iters):
                            pg.all_reduce(buf)
                        if prof:
                            prof.disable()
                    elif name == "flipped":
                        crowded = pg.crowded
                        pg._crowded = not crowded  # the commit round's shape follows
                        for _ in range(iters):
                            pg.all_reduce(buf, algorithm=flipped)
                        pg._crowded = crowded
                    elif name == "transport":  # the transport alone: post + next_frame
                        for _ in range(iters):
                            t.post(other, hdr, buf, False)
                            got = t.next_frame(1.0)
                            t.release(got[2])
                    elif name == "transport_spin":
                        # the same, read as the op's small receive reads: the peer's link
                        # first, with the group's spin, so that both wait the same way
                        for _ in range(iters):
                            t.post(other, hdr, buf, False)
                            got = t.wait_peer(other, 1.0, spin, yields) or t.next_frame(1.0)
                            t.release(got[2])
                    else:
                        for _ in range(iters):
                            mesh.run(plan)
                    times[name].append((time.perf_counter() - t0) / iters)
                    times[name + "_cpu"].append((time.thread_time() - c0) / iters)
            out[nbytes] = (alg, rounds, times)
        out["crowded"] = pg.crowded
        out["spin"] = pg._spin
        out["spin_yields"] = pg._spin_yields
        pg.barrier()
    finally:
        mesh.close()
        pg.destroy()
    text = None
    if prof:
        import pstats

        s = io.StringIO()
        st = pstats.Stats(prof, stream=s)
        st.sort_stats("tottime").print_stats(25)
        st.sort_stats("cumulative").print_stats(30)
        text = s.getvalue()
    conn.send((out, text))


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench smallop")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--sizes", default="4,1K,16K,64K")
    p.add_argument("--repeats", type=int, default=11)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--profile", metavar="DIR")
    p.add_argument(
        "--transport-alone",
        action="store_true",
        help="2 ranks: also time the transport alone (post one frame, take one), read "
        "the general way and as the op's small receive reads (its spin)",
    )
    p.add_argument(
        "--flip-crowded",
        action="store_true",
        help="also time the schedule for the opposite crowding (group/tuning.py, "
        "crowded): naive + star commit against direct + its commit",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="the library's group without CURVE (COLLECTIVES_INSECURE=1)",
    )
    args = p.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    from collectives.membership.server import Coordinator

    if args.insecure:
        os.environ["COLLECTIVES_INSECURE"] = "1"  # the spawned ranks inherit it
    coord = Coordinator(
        "127.0.0.1", 0, args.nproc, **({"keys": None} if args.insecure else {})
    ).start()
    ctx = mp.get_context("spawn")
    tag = f"{os.getpid()}"
    procs, conns = [], []
    try:
        for r in range(args.nproc):
            a, b = ctx.Pipe()
            pr = ctx.Process(
                target=worker,
                daemon=True,
                args=(
                    r,
                    args.nproc,
                    coord.port,
                    sizes,
                    args.repeats,
                    args.iters,
                    bool(args.profile),
                    args.transport_alone,
                    args.flip_crowded,
                    tag,
                    b,
                ),
            )
            pr.start()
            procs.append(pr)
            conns.append(a)
        results = [c.recv() for c in conns]
    finally:
        for pr in procs:
            pr.join(10)
            if pr.is_alive():
                pr.kill()
        coord.stop()
    print(
        f"# {args.nproc} ranks, float32 SUM, {args.repeats} repeats x {args.iters} ops, "
        "time per op (us): slowest rank per repeat, median [min-max]; "
        "cpu: the calling thread's CPU time per op (us), median over ranks and repeats"
    )
    first = results[0][0]
    wait = "reads yielding its CPU" if first["spin_yields"] else "spins"
    print(
        f"# a small receive {wait} for up to {first['spin'] * 1e6:g} us before it sleeps"
        if first["spin"]
        else "# a small receive sleeps at once"
    )
    print(
        f"{'size':>8} {'alg':>7} {'rounds':>6} {'lib':>22} {'floor':>22} {'lib/floor':>9}"
        f" {'lib cpu':>8} {'floor cpu':>9}"
    )
    for nbytes in sizes:
        alg, rounds = results[0][0][nbytes][:2]
        got = results[0][0][nbytes][2]
        if got["transport"]:
            print(
                f"# transport alone: {statistics.median(got['transport']) * 1e6:.1f} us, cpu "
                f"{statistics.median(got['transport_cpu']) * 1e6:.1f}; read as the op reads "
                f"(spinning {results[0][0]['spin'] * 1e6:g} us): "
                f"{statistics.median(got['transport_spin']) * 1e6:.1f} us, cpu "
                f"{statistics.median(got['transport_spin_cpu']) * 1e6:.1f}"
            )
        row = {}
        for name in ("lib", "floor"):
            per_rep = [
                max(res[0][nbytes][2][name][i] for res in results) for i in range(args.repeats)
            ]
            row[name] = [t * 1e6 for t in per_rep]
        ratios = [a / b for a, b in zip(row["lib"], row["floor"])]
        cpu = {
            name: statistics.median(
                t * 1e6 for res in results for t in res[0][nbytes][2][name + "_cpu"]
            )
            for name in ("lib", "floor")
        }
        fmt = lambda v: f"{statistics.median(v):7.1f} [{min(v):6.1f}-{max(v):6.1f}]"
        print(
            f"{nbytes:>8} {alg:>7} {rounds:>6} {fmt(row['lib']):>22} {fmt(row['floor']):>22} "
            f"{statistics.median(ratios):9.2f} {cpu['lib']:8.1f} {cpu['floor']:9.1f}"
        )
        if results[0][0][nbytes][2]["flipped"]:
            flip = [
                max(res[0][nbytes][2]["flipped"][i] for res in results) * 1e6
                for i in range(args.repeats)
            ]
            crowded = results[0][0]["crowded"]
            other = "direct + its commit round" if crowded else "naive + the star commit round"
            print(
                f"# {'crowded' if crowded else 'not crowded'}; {other} instead: "
                f"{fmt(flip)} us, lib / that "
                f"{statistics.median(a / b for a, b in zip(row['lib'], flip)):.2f}"
            )
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
        for r, (_, text) in enumerate(results):
            with open(os.path.join(args.profile, f"rank{r}.txt"), "w") as f:
                f.write(text)
        print(f"# profiles in {args.profile}/rank*.txt")


if __name__ == "__main__":
    main()
