"""A small test cluster: a coordinator and workers as real processes (tests/support/procs.py).

Workers run tests/support/fault_worker.py and report JSON events; the test waits for events
with deadlines. The coordinator is in the test process, or (coordinator_prefix, e.g. inside a
network namespace) a `python -m collectives.coordinator` process of its own; either binds any
free port and reports it (ports.py). Every process is killed and reaped in close(), whatever
happened.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from collectives.common.variables import DEFAULT_HEARTBEAT_TIMEOUT

from .ports import coordinator, coordinator_process
from .procs import ProcessSet, clean_env
from .timing import scaled

WORKER = os.path.join(os.path.dirname(__file__), "fault_worker.py")


class Cluster(ProcessSet):
    def __init__(
        self,
        world_size: int,
        tmp_path,
        *,
        heartbeat_timeout: float | None = None,
        heartbeat_interval: float = 0.2,
        host: str = "127.0.0.1",
        worker_args=(),
        env=None,
        coordinator_prefix=None,
        detect=None,
        min_world_size=None,
    ):
        """detect: the coordinator's crash witnesses besides heartbeats (a comma list or
        "none", as COLLECTIVES_FAILURE_DETECTION; default all)."""
        super().__init__(tmp_path)
        if heartbeat_timeout is None:  # 1 s on an idle machine (timing.py)
            heartbeat_timeout = scaled(1.0)
        self.world_size = world_size
        self.worker_args = list(worker_args)
        self.env = dict(env or {})
        self.heartbeat_interval = heartbeat_interval
        if coordinator_prefix is None:
            self.coordinator = coordinator(
                world_size,
                heartbeat_interval=heartbeat_interval,
                heartbeat_timeout=heartbeat_timeout,
                detect=detect,
                min_world_size=min_world_size,
            )
            self.address = self.coordinator.address
        else:
            self.address = coordinator_process(
                self,
                "coordinator",
                world_size,
                prefix=coordinator_prefix,
                host=host,
                env=clean_env(
                    COLLECTIVES_HEARTBEAT_TIMEOUT=heartbeat_timeout,
                    **({} if detect is None else {"COLLECTIVES_FAILURE_DETECTION": detect}),
                ),
                args=["--heartbeat-interval", heartbeat_interval],
            )

    # --- processes ---------------------------------------------------------------------------
    def spawn(self, name: str, rank: int | None, prefix=(), env=None, args=()):
        # The workers' own heartbeat timeout (how long they bear a silent coordinator, and
        # the grace after it, 3 times that) is the library's default, scaled as their op
        # timeout is: under load a cut-off worker still times out in its op before it gives
        # the coordinator up. A test's env wins.
        e = clean_env(
            **{
                "COLLECTIVES_HEARTBEAT_TIMEOUT": f"{scaled(DEFAULT_HEARTBEAT_TIMEOUT):g}",
                **self.env,
            }
        )
        e.update(env or {})
        e.update(
            COLLECTIVES_COORDINATOR=self.address,
            COLLECTIVES_HEARTBEAT_INTERVAL=str(self.heartbeat_interval),
            STOP_FILE=str(self.tmp / "stop"),
        )
        if rank is None:
            e["COLLECTIVES_JOIN"] = "1"
        else:
            e.update(RANK=str(rank), WORLD_SIZE=str(self.world_size))
        # the worker's own deadlines, scaled (timing.py); a test's --timeout or --seconds,
        # given later, wins
        defaults = ["--timeout", f"{scaled(3.0):g}", "--seconds", f"{scaled(30.0):g}"]
        argv = [*prefix, sys.executable, WORKER, *defaults, *self.worker_args, *args]
        return super().spawn(name, argv, e)

    def start(self):
        for r in range(self.world_size):
            self.spawn(f"w{r}", r)
        return self

    def signal(self, name: str, sig):
        os.kill(self.procs[name].pid, sig)
        return time.time()

    # --- waiting for events --------------------------------------------------------------------
    def wait_steps(self, procs, ws, timeout, after: float = 0.0, after_gen: int = -1):
        """Wait until each of `procs` reported a correct step at world size `ws`, later than
        time `after` and in a generation above `after_gen`; return those events. A step
        stamped after a fault may still have been taken before it (a process scheduled late
        prints late): `after_gen` is what tells a step of the group the fault made."""
        found = []
        for name in procs:
            found.append(
                self.wait_for(
                    lambda e, name=name: (
                        e["proc"] == name
                        and e["event"] == "step"
                        and e["ws"] == ws
                        and e["t"] > after
                        and e["gen"] > after_gen
                    ),
                    timeout,
                    f"a step of {name} at ws {ws}",
                )
            )
            assert found[-1]["ok"], found[-1]
        return found

    def close(self):
        # Let the workers end by themselves first (they stop at the stop file; a stopped one
        # must be continued to see it), then kill whoever is left after 5 s.
        (self.tmp / "stop").write_text("stop")
        self.signal_running(signal.SIGCONT)
        self.reap(5)
        super().close(reap_timeout=5)
