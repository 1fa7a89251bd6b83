"""A tour of every collective, run by real processes over ZeroMQ:

    python -m collectives.launch --nproc 4 examples/collectives_tour.py     (or: make demo)

Rank r contributes x_r = [r+1, 10*(n-r)] (float32), so every expected result can be read off
by hand: with 4 ranks, SUM = [10, 100], PRODUCT = [24, 240000], MAX = [4, 40], MIN = [1, 10],
AVG = [2.5, 25]. Each rank checks its own result against numpy; rank 0 gathers every rank's
result and timing (with all_gather, itself a collective) and prints one table. Any wrong result
makes every rank exit with status 1.
"""

from __future__ import annotations

import os
import sys
import textwrap
import time

import numpy as np

import collectives as cl
from collectives.group import tuning

REPS = 3  # each op runs REPS times; the table shows the fastest (max over ranks)
MAXVALS = 8  # room for a result in the gathered record
OPS = [cl.ReduceOp.SUM, cl.ReduceOp.PRODUCT, cl.ReduceOp.MAX, cl.ReduceOp.MIN, cl.ReduceOp.AVG]
ALGORITHMS = ["ring", "tree", "naive", "direct", "auto"]
BIG = 1 << 20  # elements in the large all_reduce (4 MiB of float32)


def x(r, n):
    return np.array([r + 1, 10 * (n - r)], np.float32)


def reference(op, n):
    stack = np.stack([x(r, n) for r in range(n)])
    return {
        cl.ReduceOp.SUM: stack.sum(0),
        cl.ReduceOp.PRODUCT: stack.prod(0),
        cl.ReduceOp.MAX: stack.max(0),
        cl.ReduceOp.MIN: stack.min(0),
        cl.ReduceOp.AVG: stack.mean(0),
    }[op].astype(np.float32)


def fmt(a) -> str:
    return "[" + ",".join(f"{v:g}" for v in np.asarray(a).reshape(-1)) + "]"


def timed(pg, run):
    """Run `run()` REPS times, each after a barrier; return (seconds of the fastest, its result)."""
    best, out = float("inf"), None
    for _ in range(REPS):
        pg.barrier()
        t0 = time.perf_counter()
        out = run()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> int:
    pg = cl.init_process_group(timeout=60.0)
    n, r = pg.world_size, pg.rank
    rows = []  # (collective, algorithm, op, sent, got, seconds over ranks, ok, note)

    def record(collective, algorithm, op, sent, result, expect_fn, seconds, note=""):
        """Gather (time, ok, result) from every rank to all; rank 0 keeps a table row."""
        res = np.asarray(result, np.float64).reshape(-1)
        ok = float(expect_fn(r, res))
        mine = np.zeros(2 + MAXVALS)
        mine[0], mine[1], mine[2 : 2 + res.size] = seconds, ok, res
        everyone = np.zeros((n, 2 + MAXVALS))
        pg.all_gather(everyone, mine)
        results = everyone[:, 2 : 2 + res.size]
        rows.append(
            (
                collective,
                algorithm,
                op,
                sent,
                results,
                everyone[:, 0].max(),
                bool(everyone[:, 1].all()),
                note,
            )
        )

    everyone_sends = " ".join(fmt(x(q, n)) for q in range(n))

    # --- all_reduce: every algorithm x every op -------------------------------------------------
    for algorithm in ALGORITHMS:
        for op in OPS:
            ref = reference(op, n)

            def run():
                buf = x(r, n)
                pg.all_reduce(buf, op=op, algorithm=algorithm)
                return buf

            secs, got = timed(pg, run)
            note = (
                "auto chose " + tuning.all_reduce_algorithm(got.nbytes, n)
                if algorithm == "auto"
                else ""
            )
            record(
                "all_reduce",
                algorithm,
                op.name,
                everyone_sends,
                got,
                lambda q, res: np.array_equal(res, ref),
                secs,
                note,
            )

    # --- reduce to rank 1, broadcast from rank n-1 ---------------------------------------------
    dst = 1 % n
    ref = reference(cl.ReduceOp.SUM, n)

    def run():
        buf = x(r, n)
        pg.reduce(buf, dst=dst, op=cl.ReduceOp.SUM)
        return buf

    secs, got = timed(pg, run)
    record(
        "reduce",
        "tree",
        "SUM",
        everyone_sends,
        got,
        lambda q, res: np.array_equal(res, ref if q == dst else x(q, n)),
        secs,
        f"dst={dst}; others keep their input",
    )

    src = n - 1

    def run():
        buf = x(r, n) if r == src else np.zeros(2, np.float32)
        pg.broadcast(buf, src=src)
        return buf

    secs, got = timed(pg, run)
    record(
        "broadcast",
        "tree",
        "-",
        f"rank {src}: {fmt(x(src, n))}",
        got,
        lambda q, res: np.array_equal(res, x(src, n)),
        secs,
        f"src={src}",
    )

    # --- all_gather, reduce_scatter -------------------------------------------------------------
    def run():
        out = np.zeros((n, 1), np.float32)
        pg.all_gather(out, np.array([r + 1], np.float32))
        return out

    secs, got = timed(pg, run)
    record(
        "all_gather",
        "ring",
        "-",
        " ".join(f"[{q + 1}]" for q in range(n)),
        got,
        lambda q, res: np.array_equal(res, np.arange(1, n + 1)),
        secs,
    )

    def run():
        out = np.zeros(1, np.float32)
        pg.reduce_scatter(out, np.arange(n, dtype=np.float32) + r, op=cl.ReduceOp.SUM)
        return out

    secs, got = timed(pg, run)
    # rank r sends [r, r+1, ..., r+n-1]; chunk q summed over ranks is n*q + n(n-1)/2
    record(
        "reduce_scatter",
        "ring",
        "SUM",
        f"rank r: [r..r+{n - 1}]",
        got,
        lambda q, res: res[0] == n * q + n * (n - 1) // 2,
        secs,
        "rank q gets chunk q",
    )

    # --- all_to_all, gather, scatter, a bitwise all_reduce ---------------------------------------
    def run():
        out = np.zeros((n, 1), np.float32)
        pg.all_to_all(out, (10 * r + np.arange(n, dtype=np.float32)).reshape(n, 1))
        return out

    secs, got = timed(pg, run)
    # rank r sends rank p the value 10r + p; rank q ends with [10p + q for every p]
    record(
        "all_to_all",
        "pairwise",
        "-",
        "rank r -> rank p: 10r+p",
        got,
        lambda q, res: np.array_equal(res, 10 * np.arange(n) + q),
        secs,
        "rank q gets 10p+q from each p",
    )

    root = n - 1

    def run():
        out = np.zeros((n, 1), np.float32) if r == root else None
        pg.gather(out, np.array([r + 1], np.float32), dst=root)
        return out if out is not None else np.zeros(n)

    secs, got = timed(pg, run)
    record(
        "gather",
        "linear",
        "-",
        " ".join(f"[{q + 1}]" for q in range(n)),
        got,
        lambda q, res: np.array_equal(res, np.arange(1, n + 1) if q == root else np.zeros(n)),
        secs,
        f"dst={root}; the others pass out=None, shown as 0s",
    )

    def run():
        out = np.zeros(1, np.float32)
        pg.scatter(
            out, (np.arange(n, dtype=np.float32) * 10).reshape(n, 1) if r == 0 else None, src=0
        )
        return out

    secs, got = timed(pg, run)
    record(
        "scatter",
        "linear",
        "-",
        "rank 0: [0, 10, 20, ...]",
        got,
        lambda q, res: np.array_equal(res, [10 * q]),
        secs,
        "src=0; rank q gets 10q",
    )

    def run():
        buf = np.array([1 << r, 0xFF ^ (1 << r)], np.uint8)
        pg.all_reduce(buf, op=cl.ReduceOp.BXOR)
        return buf

    secs, got = timed(pg, run)
    every = np.bitwise_xor.reduce([[1 << q, 0xFF ^ (1 << q)] for q in range(n)], axis=0)
    record(
        "all_reduce",
        "auto",
        "BXOR",
        "rank r: [2^r, 255 ^ 2^r] (uint8)",
        got,
        lambda q, res: np.array_equal(res, every),
        secs,
        "bitwise, integers and bool",
    )

    # --- barrier, send/recv round the ring ------------------------------------------------------
    secs, _ = timed(pg, lambda: pg.barrier())
    record("barrier", "dissemination", "-", "-", np.zeros(0), lambda q, res: True, secs)

    def run():
        got = np.zeros(2, np.float32)
        right, left = (r + 1) % n, (r - 1) % n
        # Even ranks send first, odd ranks receive first: a blocking send returns only once
        # its receiver has the data, so if everyone sent first, everyone would wait forever.
        if r % 2 == 0:
            pg.send(x(r, n), dst=right)
            pg.recv(got, src=left)
        else:
            pg.recv(got, src=left)
            pg.send(x(r, n), dst=right)
        return got

    if n > 1:
        secs, got = timed(pg, run)
        record(
            "send/recv",
            "direct",
            "-",
            "rank r -> rank r+1",
            got,
            lambda q, res: np.array_equal(res, x((q - 1) % n, n)),
            secs,
            "got = left's x",
        )

    # --- one large all_reduce per algorithm: where the schedules differ --------------------------
    big_rows = []
    # Warm-up, untimed: the first large payloads fault in the transport's shared-memory slots
    # and the buffers' pages (tens of ms here); without it the first algorithm timed pays for
    # all of them (measured: ring 53 ms timed first, 16 ms timed third, on 4 ranks and 2 cores).
    for algorithm in ALGORITHMS:
        pg.all_reduce(np.full(BIG, r + 1, np.float32), algorithm=algorithm)
    for algorithm in ALGORITHMS:

        def run():
            buf = np.full(BIG, r + 1, np.float32)
            pg.all_reduce(buf, algorithm=algorithm)
            return buf

        secs, got = timed(pg, run)
        ok = np.zeros(2)
        ok[:] = [secs, float(np.all(got == n * (n + 1) / 2))]
        everyone = np.zeros((n, 2))
        pg.all_gather(everyone, ok)
        big_rows.append((algorithm, everyone[:, 0].max(), bool(everyone[:, 1].all())))

    all_ok = all(row[6] for row in rows) and all(b[2] for b in big_rows)
    if r == 0:
        print_report(pg, rows, big_rows, all_ok)
    pg.destroy()
    return 0 if all_ok else 1


def print_report(pg, rows, big_rows, all_ok):
    n = pg.world_size
    print(
        f"collectives tour: {n} ranks, one process each, over ZeroMQ; rank r sends "
        f"x_r = [r+1, 10*(n-r)] (float32)"
    )
    print(f"times: fastest of {REPS} runs, slowest rank; every result checked against numpy\n")
    head = f"{'collective':<14} {'algorithm':<13} {'op':<7} {'time':>8}  {'check':<5} result"
    print(head)
    print("-" * len(head))
    last = None
    for coll, alg, op, sent, results, secs, ok, note in rows:
        if coll != last and coll != "all_reduce":
            print()
        if coll != last:
            print(f"{coll} -- sent: {sent}")
        last = coll
        if len({results[q].tobytes() for q in range(n)}) == 1:
            got = f"every rank: {fmt(results[0])}" if results.size else "every rank returned"
        else:
            got = " ".join(f"r{q}:{fmt(results[q])}" for q in range(n))
        extra = f"  ({note})" if note else ""
        print(
            f"  {'':<12} {alg:<13} {op:<7} {secs * 1e6:7.0f}us  {'ok' if ok else 'WRONG':<5} "
            f"{got}{extra}"
        )
    nbytes = BIG * 4
    factor = 2 * (n - 1) / n
    print(f"\nall_reduce of {nbytes >> 20} MiB float32 SUM (busbw = bytes/time x 2(n-1)/n):")
    for alg, secs, ok in big_rows:
        extra = f"  (auto chose {tuning.all_reduce_algorithm(nbytes, n)})" if alg == "auto" else ""
        print(
            f"  {alg:<8} {secs * 1e3:8.1f} ms  busbw {nbytes / secs * factor / 1e9:5.2f} GB/s"
            f"  {'ok' if ok else 'WRONG'}{extra}"
        )
    print(crossover_note(n, big_rows, pg.crowded))
    print("\nall results correct" if all_ok else "\nSOME RESULTS WERE WRONG (see WRONG above)")


def crossover_note(n, big_rows, crowded):
    """Why the textbook order (ring fastest for large buffers) may not show on this host."""
    fastest = min(big_rows, key=lambda b: b[1])[0] if big_rows else "?"
    if fastest == "auto":
        fastest = f"auto ({tuning.all_reduce_algorithm(BIG * 4, n)})"
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if not crowded:
        text = (
            f"fastest at {BIG * 4 >> 20} MiB: {fastest}. With a core per rank the ring "
            "should win here: each rank moves 2(n-1)/n of the buffer, naive's rank 0 "
            "2(n-1) buffers (python -m collectives.explain crossover shows the model)."
        )
    else:
        text = (
            f"fastest at {BIG * 4 >> 20} MiB: {fastest}. This host is crowded ({n} ranks "
            f"on {cpus} CPU{'s' if cpus != 1 else ''}), so the order need not be the "
            "textbook's (ring fastest for large buffers). The alpha-beta model gives every "
            "rank its own link and CPU and counts the bytes per rank: the ring moves "
            "2(n-1)/n N each, naive 2(n-1) N through rank 0. Here the ranks share the CPUs "
            "that copy and add, so the totals count, and they are the same: both move "
            f"2(n-1) N = {2 * (n - 1)} buffers and add (n-1) N in all; the ring keeps its "
            "edge only by spreading that work, and its "
            f"{2 * (n - 1)} dependent steps each need a sender and a receiver on a CPU at "
            "once, so the order can change from run to run with whatever else the CPUs "
            "do. (Times are the fastest of 3 after an untimed warm-up: without it the first "
            "algorithm timed, the ring, paid for faulting in the transport's memory and "
            "naive looked fastest.)"
        )
    return "\n" + textwrap.fill(text, 100)


if __name__ == "__main__":
    sys.exit(main())
