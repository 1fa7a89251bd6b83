"""A worker of tests/scenarios/test_security.py: `python security_worker.py SCENARIO OUTDIR`.

Joins with cl.init_process_group() from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (rank 0
hosts the coordinator; MASTER_PORT=0 makes it print the port it bound). It writes
OUTDIR/rank<R>.addr.json (its transport's addresses and pid) once it is in the group, and
OUTDIR/rank<R>.json at the end: {"ok": bool, "results": [...], "error": str|None}.

Scenarios:
  sum    wait for OUTDIR/go, then ROUNDS all_reduces (SUM, TEST_COUNT int64s, default 8):
         rank r contributes r+1, so
         every element of every result must be n(n+1)/2 exactly; a short pause between them
         lets an attacker's frames land in the middle of the job.
  idle   stay in the group, agreeing twice a second (an all_reduce MAX of "have I seen
         OUTDIR/stop?") whether to stop, so every rank leaves the loop after the same op; then
         one all_reduce, checked as above.
  join   a process that tries to join a running job (init_process_group(join=True)); it
         records the error it gets.
  survive  as idle, but a failure (a rank preempted) is survived: reconstruct() and go on;
         the final sum is checked for the group of the survivors.
  init   join the group and leave it: only the start-up is tried.
  rogue_rejoin  rank TEST_ROGUE, a member gone bad, sends the healthy coordinator a
         re-registration (in its own name, from a socket of its own) that says it was forming
         generation 2^31, and reports the answer it got ("rogue_answer", None if none came);
         then every rank calls reconstruct() and sums in the group it gets.
  flood_ahead   rank TEST_ROGUE sends rank 0 TEST_FRAMES frames of 1 MiB for ops that never
         come, then dies (os._exit); the others sum until that fails, reconstruct without it,
         sum again, and report their VmRSS before the flood and after the new group formed
         ("rss_kib": [before, after]) and their peak ("hwm_kib"). TEST_STASH_BYTES lowers the
         bound on frames kept for later ops (transport/stash.py), so that it is reached soon.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback

import msgspec
import numpy as np

import collectives as cl

ROUNDS = int(os.environ.get("TEST_ROUNDS", "40"))
COUNT = int(os.environ.get("TEST_COUNT", "8"))  # elements per all_reduce


def wait_file(path, timeout):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        time.sleep(0.02)


def checked_sum(pg) -> int:
    buf = np.full(COUNT, pg.rank + 1, np.int64)
    pg.all_reduce(buf)
    n = pg.world_size
    want = n * (n + 1) // 2
    if not (buf == want).all():
        bad = np.flatnonzero(buf != want)
        raise AssertionError(
            f"rank {pg.rank}: all_reduce gave {buf[bad[:8]].tolist()} at "
            f"{bad.size} of {buf.size} places, want {want}"
        )
    return int(buf[0])


def status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return -1


def rogue_rejoin(pg):
    """A re-registration in this member's own name and key, from a socket of its own."""
    import zmq

    from collectives.common import security
    from collectives.membership import heartbeat, rank
    import msgpack
    import msgspec

    from collectives.membership.protocol import pack

    client = pg._membership.client
    # past the bounds a coordinator keeps (recovery.rejoin_out_of_bounds)
    t = client.transport
    group = rank.Group(t.generation, t.rank, t.size, heartbeat.fault_of(t.failure))
    mine = rank.rejoin_of(client.mid, group, client.link, client.report(t))
    msg = msgspec.structs.replace(mine, forming=2**31)
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 1000)
    security.make_client(s, client.keys, getattr(client, "pair", None))
    s.connect(f"tcp://{client.address}")
    s.send(pack(msg))
    # the coordinator's answer, kept for the test: a refusal and its reason, or none at all
    # (a handshake that failed, a message never served)
    answer = None
    if s.poll(20_000):
        answer = msgpack.unpackb(s.recv())
    s.close()
    ctx.term()
    return answer


def flood_ahead(pg, frames: int):
    """frames x 1 MiB, each a valid-looking frame of a later op of this generation, to rank 0;
    then die without a word."""
    from collectives.transport.wire import DATA, encode_header

    t = pg.transport
    payload = np.zeros(1 << 17, np.int64)
    desc = ["all_reduce", payload.size, payload.dtype.str, cl.ReduceOp.SUM.value, "ring", None]
    seq = t.progress().seq
    for i in range(frames):
        header = encode_header(
            DATA, pg.generation, seq + 2 + i % 500, pg.rank, i // 500, "exchange", 0, pg.rank, desc
        )
        t.sender.dealers[0].send_multipart([header, payload])
    # not a wait: the frames' time to leave before this process dies without a word
    time.sleep(2.0)
    os._exit(0)


def log_every_drop():
    """TEST_LOG_EVERY_DROP=1: every warning of the coordinator's rate-limited log is written
    (common/throttle.py keeps a few per kind and window), so that a test can count the messages
    it dropped, one line each."""
    if os.environ.get("TEST_LOG_EVERY_DROP") == "1":
        from collectives.common import throttle

        init = throttle.Throttle.__init__

        def unthrottled(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self.burst = 1 << 30

        throttle.Throttle.__init__ = unthrottled


def lower_open_files():
    """TEST_NOFILE="soft[:hard]": this process's open-file limits, as a machine's defaults
    might set them (the library raises soft to hard at start)."""
    if os.environ.get("TEST_NOFILE"):
        import resource

        soft, _, hard = os.environ["TEST_NOFILE"].partition(":")
        old_hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (int(soft), int(hard or old_hard)))


def main():
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1)  # a stuck worker's stacks, for its test's report
    lower_open_files()
    log_every_drop()
    scenario, outdir = sys.argv[1], sys.argv[2]
    out = {"ok": False, "results": [], "error": None}
    rank = os.environ.get("RANK", "joiner")
    try:
        if scenario == "join":
            pg = cl.init_process_group(join=True, timeout=float(os.environ["TEST_TIMEOUT"]))
            out["error"] = f"admitted as rank {pg.rank}"
            pg.destroy()
            return
        if os.environ.get("TEST_STASH_BYTES"):
            from collectives.transport import stash

            stash.MAX_BYTES = int(os.environ["TEST_STASH_BYTES"])
        pg = cl.init_process_group(timeout=float(os.environ.get("TEST_TIMEOUT", "20")))
        rank = pg.rank
        rogue = rank == int(os.environ.get("TEST_ROGUE", "-1"))
        t = pg.transport
        addr = dict(
            msgspec.to_builtins(t.address_info()), pid=os.getpid(), mid=pg._membership.client.mid
        )
        tmp = os.path.join(outdir, f"rank{rank}.addr.json.tmp")
        with open(tmp, "w") as f:
            json.dump(addr, f)
        os.replace(tmp, os.path.join(outdir, f"rank{rank}.addr.json"))
        if scenario == "rogue_rejoin":
            if rogue:
                out["rogue_answer"] = rogue_rejoin(pg)
            pg.barrier()
            pg = pg.reconstruct(timeout=15)
            out["generation"] = pg.generation
            out["results"].append(checked_sum(pg))
        elif scenario == "flood_ahead":
            out["results"].append(checked_sum(pg))
            gc.collect()
            before = status_kib("VmRSS")
            pg.barrier()
            if rogue:
                flood_ahead(pg, int(os.environ["TEST_FRAMES"]))
            try:
                while True:
                    checked_sum(pg)
                    time.sleep(0.05)
            except cl.CollectiveError as exc:
                out["failure"] = f"{type(exc).__name__}: {exc}"
            pg = pg.reconstruct(timeout=30)
            out["results"].append(checked_sum(pg))
            gc.collect()
            out["rss_kib"] = [before, status_kib("VmRSS")]
            out["hwm_kib"] = status_kib("VmHWM")
        elif scenario == "sum":
            wait_file(os.path.join(outdir, "go"), 60)
            for _ in range(ROUNDS):
                out["results"].append(checked_sum(pg))
                time.sleep(0.02)  # not a wait: a pause between sums, for frames to land in
        elif scenario == "survive":
            while True:
                try:
                    seen = np.array([os.path.exists(os.path.join(outdir, "stop"))], dtype=np.int64)
                    pg.all_reduce(seen, op=cl.ReduceOp.MAX)
                except cl.CollectiveError as exc:
                    out.setdefault("failures", []).append(f"{type(exc).__name__}: {exc}")
                    pg = pg.reconstruct(timeout=30)
                    continue
                if seen[0]:
                    break
                time.sleep(0.2)
            out["generation"], out["world_size"] = pg.generation, pg.world_size
            out["results"].append(checked_sum(pg))
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
        if scenario != "init":
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
