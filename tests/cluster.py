"""A small test cluster: a coordinator in the test process and workers as real processes.

Workers run tests/fault_worker.py and report JSON events; the test waits for events with
deadlines. Every process is killed and reaped in close(), whatever happened (the machinery is
tests/procs.py's ProcessSet).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from collectives.membership.server import Coordinator
from procs import ProcessSet

WORKER = os.path.join(os.path.dirname(__file__), "fault_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster(ProcessSet):
    def __init__(self, world_size: int, tmp_path, *, heartbeat_timeout: float = 1.0,
                 heartbeat_interval: float = 0.2, host: str = "127.0.0.1",
                 worker_args=(), env=None, coordinator_prefix=None):
        super().__init__(tmp_path)
        self.world_size = world_size
        self.host = host
        self.worker_args = list(worker_args)
        self.env = dict(env or {})
        self.heartbeat_interval = heartbeat_interval
        self.port = None
        self.coordinator_proc = None
        if coordinator_prefix is None:
            self.coordinator = Coordinator(host, 0, world_size,
                                           heartbeat_interval=heartbeat_interval,
                                           heartbeat_timeout=heartbeat_timeout).start()
            self.port = self.coordinator.port
        else:  # e.g. inside a network namespace: a coordinator process of its own
            self.port = free_port()
            e = dict(os.environ, COLLECTIVES_HEARTBEAT_TIMEOUT=str(heartbeat_timeout))
            err = open(self.tmp / "coordinator.stderr", "w")
            self.coordinator_proc = subprocess.Popen(
                [*coordinator_prefix, sys.executable, "-m", "collectives.coordinator",
                 "--host", host, "--port", str(self.port), "--world-size", str(world_size),
                 "--heartbeat-interval", str(heartbeat_interval)],
                stdout=subprocess.DEVNULL, stderr=err, env=e, start_new_session=True)
            err.close()

    # --- processes ---------------------------------------------------------------------------
    def spawn(self, name: str, rank: int | None, prefix=(), env=None, args=()):
        e = dict(os.environ)
        e.update(self.env)
        e.update(env or {})
        e.update(COLLECTIVES_COORDINATOR=f"{self.host}:{self.port}",
                 COLLECTIVES_HEARTBEAT_INTERVAL=str(self.heartbeat_interval),
                 PYTHONUNBUFFERED="1", STOP_FILE=str(self.tmp / "stop"))
        e.pop("RANK", None)
        e.pop("COLLECTIVES_JOIN", None)
        if rank is None:
            e["COLLECTIVES_JOIN"] = "1"
        else:
            e.update(RANK=str(rank), WORLD_SIZE=str(self.world_size))
        argv = [*prefix, sys.executable, WORKER, *self.worker_args, *args]
        return super().spawn(name, argv, e)

    def start(self):
        for r in range(self.world_size):
            self.spawn(f"w{r}", r)
        return self

    def signal(self, name: str, sig):
        os.kill(self.procs[name].pid, sig)
        return time.time()

    # --- waiting for events --------------------------------------------------------------------
    def wait_steps(self, procs, ws, timeout, after: float = 0.0):
        """Wait until each of `procs` reported a correct step at world size `ws`, later than
        time `after`; return those events."""
        found = []
        for name in procs:
            found.append(self.wait_for(
                lambda e, name=name: e["proc"] == name and e["event"] == "step"
                and e["ws"] == ws and e["t"] > after, timeout, f"a step of {name} at ws {ws}"))
            assert found[-1]["ok"], found[-1]
        return found

    def close(self):
        # Let the workers end by themselves first (they stop at the stop file; a stopped one
        # must be continued to see it), then kill whoever is left after 5 s.
        (self.tmp / "stop").write_text("stop")
        self.signal_running(signal.SIGCONT)
        self.reap(5)
        super().close(reap_timeout=5)
        if self.coordinator_proc is not None:
            self.coordinator_proc.kill()
            self.coordinator_proc.wait(timeout=5)
