"""A worker for tests/system/test_formation.py: a member that calls reconstruct() until the group has
a later generation of EXPECT_WS ranks, or a joiner; then one all_reduce (rank r gives r + 1).
One JSON line on stdout per event.

ROLE (env): member | joiner. FAULT (env), acting when this process is told its rank in a
generation > 0, i.e. after the coordinator counted it into the next generation and before it
sends its address:
  vanish   the process exits at once (status 3), as if killed;
  kill     it SIGKILLs itself;
  hang     it stops there for good; its heartbeat thread goes on (a live process that never
           sends its address: only the formation deadline catches it).
RECONSTRUCT_TIMEOUT (env): the members' reconstruct() timeout.
SILENT=1 (env): this process never beats (its heartbeat thread only waits to be stopped), so the
coordinator has no heartbeat connection of it: only its pidfd can witness its death.
"""

import json
import os
import signal
import time

import numpy as np

import collectives as cl
from collectives.membership.init import Membership


def emit(**event):
    event["t"] = time.time()
    event["pid"] = os.getpid()
    print(json.dumps(event), flush=True)


def inject(fault):
    """Replace Membership._group: the fault strikes where a new generation's rank is known."""
    real = Membership._group

    def faulty(self, rank, world_size, generation, timeout):
        if generation > 0:
            emit(event="told", rank=rank, ws=world_size, gen=generation)
            if fault == "vanish":
                os._exit(3)
            if fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            while True:
                time.sleep(1)
        return real(self, rank, world_size, generation, timeout)

    Membership._group = faulty


def silence():
    """Replace the heartbeat thread's body (membership/heartbeat.py) by one that never beats."""
    from collectives.membership import heartbeat

    heartbeat.run = lambda client: client.stopping.wait()


def member():
    pg = cl.init_process_group(timeout=20)
    emit(event="ready", rank=pg.rank)
    want = int(os.environ["EXPECT_WS"])
    timeout = float(os.environ.get("RECONSTRUCT_TIMEOUT", "10"))
    deadline = time.monotonic() + 60
    while not (pg.generation > 0 and pg.world_size == want):
        if time.monotonic() > deadline:
            emit(event="gave_up", gen=pg.generation, ws=pg.world_size)
            return
        try:
            new = pg.reconstruct(timeout=timeout)
        except cl.PeerFailure as exc:
            # the group is closed; reconstruct() on it again is the documented way on
            emit(
                event="failure",
                error=str(exc),
                failed=list(exc.failed_ranks),
                type=type(exc).__name__,
            )
            continue
        if new is not pg:
            pg = new
            emit(event="regrouped", rank=pg.rank, ws=pg.world_size, gen=pg.generation)
        time.sleep(0.05)
    finish(pg)


def joiner():
    pg = cl.init_process_group(join=True, timeout=30)
    emit(event="joined", rank=pg.rank, ws=pg.world_size, gen=pg.generation)
    finish(pg)


def finish(pg):
    x = np.array([pg.rank + 1.0])
    pg.all_reduce(x)
    emit(event="result", rank=pg.rank, ws=pg.world_size, gen=pg.generation, sum=float(x[0]))
    pg.destroy()


if __name__ == "__main__":
    if os.environ.get("SILENT") == "1":
        silence()
    if os.environ.get("FAULT"):
        inject(os.environ["FAULT"])
    (member if os.environ["ROLE"] == "member" else joiner)()
