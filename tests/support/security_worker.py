"""A worker of tests/scenarios/test_security.py: `python security_worker.py SCENARIO OUTDIR`.

Joins with cl.init_process_group() from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (rank 0
hosts the coordinator; MASTER_PORT=0 makes it print the port it bound). It writes
OUTDIR/rank<R>.addr.json (its transport's addresses and pid) once it is in the group, and
OUTDIR/rank<R>.json at the end: {"ok": bool, "results": [...], "error": str|None}.

Scenarios:
  sum    wait for OUTDIR/go, then ROUNDS all_reduces (SUM, int64): rank r contributes r+1, so
         every element of every result must be n(n+1)/2 exactly; a short pause between them
         lets an attacker's frames land in the middle of the job.
  idle   stay in the group, agreeing twice a second (an all_reduce MAX of "have I seen
         OUTDIR/stop?") whether to stop, so every rank leaves the loop after the same op; then
         one all_reduce, checked as above.
  join   a process that tries to join a running job (init_process_group(join=True)); it
         records the error it gets.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

import numpy as np

import collectives as cl

ROUNDS = int(os.environ.get("TEST_ROUNDS", "40"))


def wait_file(path, timeout):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        time.sleep(0.02)


def checked_sum(pg) -> int:
    buf = np.full(8, pg.rank + 1, np.int64)
    pg.all_reduce(buf)
    n = pg.world_size
    want = n * (n + 1) // 2
    if not (buf == want).all():
        raise AssertionError(f"rank {pg.rank}: all_reduce gave {buf.tolist()}, want {want}")
    return int(buf[0])


def main():
    scenario, outdir = sys.argv[1], sys.argv[2]
    out = {"ok": False, "results": [], "error": None}
    rank = os.environ.get("RANK", "joiner")
    try:
        if scenario == "join":
            pg = cl.init_process_group(join=True, timeout=float(os.environ["TEST_TIMEOUT"]))
            out["error"] = f"admitted as rank {pg.rank}"
            pg.destroy()
            return
        pg = cl.init_process_group(timeout=float(os.environ.get("TEST_TIMEOUT", "20")))
        rank = pg.rank
        t = pg.transport
        addr = dict(t.address_info(), pid=os.getpid())
        tmp = os.path.join(outdir, f"rank{rank}.addr.json.tmp")
        with open(tmp, "w") as f:
            json.dump(addr, f)
        os.replace(tmp, os.path.join(outdir, f"rank{rank}.addr.json"))
        if scenario == "sum":
            wait_file(os.path.join(outdir, "go"), 60)
            for _ in range(ROUNDS):
                out["results"].append(checked_sum(pg))
                time.sleep(0.02)
        elif scenario == "idle":
            # the ranks see the stop file at different moments: deciding it by a collective
            # keeps them calling the same operations (a barrier on one and the final sum on
            # the other is a CollectiveMismatch)
            while True:
                seen = np.array([os.path.exists(os.path.join(outdir, "stop"))], dtype=np.int64)
                pg.all_reduce(seen, op=cl.ReduceOp.MAX)
                if seen[0]:
                    break
                time.sleep(0.5)
            out["results"].append(checked_sum(pg))
        pg.barrier()
        pg.destroy()
        out["ok"] = True
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    finally:
        with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
