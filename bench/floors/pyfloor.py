"""The fastest exchange pure Python can make: `python -m bench pyfloor [--sizes 4,16K,64K]`.

Two processes (a fork each) on one host, no library: every op, each sends its float32 buffer
to the other and adds the other's into its own -- a 2-rank all_reduce with nothing around it
(no header, no checks, no deadline, no failure detection). Two ways:

  * `socket`: one SOCK_SEQPACKET socketpair; send(buf), poll(), recv_into(scratch), np.add.
  * `shm`:    the data through a shared mmap (each rank copies its buffer into one of its two
              slots, as our shared-memory transport does), a 1-byte note through the socket
              to say it is there. Two slots a rank, used in turn, need no "done reading"
              reply: a rank writes slot k % 2 again only after the peer's note of op k + 1,
              sent once the peer had added op k's.

This bounds what any Python library on this machine can reach for a small all_reduce (the
target was 64 KiB within 2x MPICH's time; the README's MPI paragraph sets this beside it).
Time is wall time per op (the slower rank), median of the repeats [min-max]; cpu is the
process CPU time per op, mean of the two ranks.
"""

from __future__ import annotations

import argparse
import ast
import mmap
import os
import select
import socket
import statistics
import time

import numpy as np

from ..harness.spec import parse_size


def _wait(poller, rank):
    """Until the peer's message is here; a peer that died or stalled ends the run, loudly."""
    if not poller.poll(5000):
        raise TimeoutError(
            f"bench.floors.pyfloor: rank {rank} heard nothing from rank {1 - rank} for 5 s"
        )


def _rank(sock, mm, rank, nbytes, mode, repeats, iters, out):
    n = max(nbytes // 4, 1)
    buf = np.zeros(n, np.float32)  # 0 + 0 stays 0: no overflow over thousands of ops
    scratch = np.empty(n, np.float32)
    slots = [
        [np.frombuffer(mm, np.float32, n, offset=(2 * r + k) * n * 4) for k in (0, 1)]
        for r in (0, 1)
    ]
    k = 0
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    note = bytearray(1)
    times, cpus = [], []
    for rep in range(repeats + 1):  # the first repeat warms up and is dropped
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(iters):
            if mode == "socket":
                sock.send(buf)
                _wait(poller, rank)
                if not sock.recv_into(scratch):
                    raise EOFError(f"bench.floors.pyfloor: rank {1 - rank} is gone")
                np.add(buf, scratch, out=buf)
            else:
                slots[rank][k][:] = buf
                sock.send(b"x")
                _wait(poller, rank)
                if not sock.recv_into(note):
                    raise EOFError(f"bench.floors.pyfloor: rank {1 - rank} is gone")
                np.add(buf, slots[1 - rank][k], out=buf)
                k ^= 1
        if rep:
            times.append((time.perf_counter() - t0) / iters)
            cpus.append((time.process_time() - c0) / iters)
    os.write(out, repr((times, cpus)).encode())


def measure(nbytes, mode, repeats, iters):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (a, b):  # room for a 64 KiB+ message either way
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, max(4 * nbytes, 1 << 18))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, max(4 * nbytes, 1 << 18))
    mm = mmap.mmap(-1, 4 * max(nbytes, 4))
    results, pids = [], []
    for rank, (sock, other) in enumerate(((a, b), (b, a))):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(r)
                other.close()  # only the peer holds that end: its death is our EOF
                _rank(sock, mm, rank, nbytes, mode, repeats, iters, w)
                code = 0
            finally:
                os._exit(code)  # a traceback above says why it failed
        os.close(w)
        pids.append((pid, r))
    a.close()
    b.close()
    for rank, (pid, r) in enumerate(pids):
        chunks = []
        while chunk := os.read(r, 1 << 16):
            chunks.append(chunk)
        os.close(r)
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        if status != 0:
            raise RuntimeError(
                f"bench.floors.pyfloor: rank {rank} exited {status} ({nbytes} B, {mode})"
            )
        results.append(ast.literal_eval(b"".join(chunks).decode()))
    mm.close()
    wall = [max(x, y) for x, y in zip(results[0][0], results[1][0])]
    cpu = statistics.mean(results[0][1] + results[1][1])
    return statistics.median(wall), min(wall), max(wall), cpu


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4,1K,16K,64K")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--iters", type=int, default=2000)
    args = ap.parse_args(argv)
    print(
        f"# python -m bench pyfloor --sizes {args.sizes} --repeats {args.repeats} "
        f"--iters {args.iters}"
    )
    print(
        "# 2 processes, float32 SUM, time per op (us): slower rank, median [min-max]; "
        "cpu: process CPU per op (us)"
    )
    print(f"{'size':>8} {'mode':>7} {'time':>28} {'cpu':>7}")
    for size in (parse_size(s) for s in args.sizes.split(",")):
        for mode in ("socket", "shm"):
            med, lo, hi, cpu = measure(size, mode, args.repeats, args.iters)
            print(
                f"{size:>8} {mode:>7} {med * 1e6:>9.1f} [{lo * 1e6:>7.1f}-{hi * 1e6:>7.1f}] "
                f"{cpu * 1e6:>7.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
