"""A small test cluster: a coordinator in the test process and workers as real processes.

Workers run tests/fault_worker.py and report JSON events; the test waits for events with
deadlines. Every process is killed and reaped in close(), whatever happened.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

from collectives.rendezvous import Coordinator

WORKER = os.path.join(os.path.dirname(__file__), "fault_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, world_size: int, tmp_path, *, heartbeat_timeout: float = 1.0,
                 heartbeat_interval: float = 0.2, host: str = "127.0.0.1",
                 worker_args=(), env=None, coordinator_prefix=None):
        self.world_size = world_size
        self.tmp = tmp_path
        self.host = host
        self.worker_args = list(worker_args)
        self.env = dict(env or {})
        self.heartbeat_interval = heartbeat_interval
        self.coordinator = None
        self.port = None
        self.procs: dict[str, subprocess.Popen] = {}
        self.exit_times: dict[str, float] = {}
        self.events: queue.Queue = queue.Queue()
        self.seen: list[dict] = []
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
        err = open(self.tmp / f"{name}.stderr", "w")
        p = subprocess.Popen([*prefix, sys.executable, WORKER, *self.worker_args, *args],
                             stdout=subprocess.PIPE, stderr=err, env=e, text=True,
                             start_new_session=True)
        err.close()
        self.procs[name] = p
        threading.Thread(target=self._read, args=(name, p), daemon=True).start()
        return p

    def start(self):
        for r in range(self.world_size):
            self.spawn(f"w{r}", r)
        return self

    def _read(self, name, p):
        for line in p.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            event["proc"] = name
            self.events.put(event)
        code = p.wait()
        self.exit_times[name] = time.time()
        self.events.put({"event": "exit", "proc": name, "code": code, "t": time.time()})

    def signal(self, name: str, sig):
        os.kill(self.procs[name].pid, sig)
        return time.time()

    # --- waiting for events --------------------------------------------------------------------
    def wait_for(self, predicate, timeout: float, what: str = "event"):
        """Return the first event (already seen or new) for which predicate(event) is true."""
        for e in self.seen:
            if predicate(e):
                return e
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {what} within {timeout:g} s; last events: "
                                     f"{self.seen[-12:]}\n{self.stderr_tail()}")
            try:
                e = self.events.get(timeout=remaining)
            except queue.Empty:
                continue
            self.seen.append(e)
            if predicate(e):
                return e

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

    def stderr_tail(self) -> str:
        out = []
        for name in self.procs:
            path = self.tmp / f"{name}.stderr"
            if path.exists():
                text = path.read_text()[-1500:]
                if text.strip():
                    out.append(f"--- {name} stderr ---\n{text}")
        return "\n".join(out)

    def close(self):
        (self.tmp / "stop").write_text("stop")
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGCONT)
                except OSError:
                    pass
        deadline = time.monotonic() + 5
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
                p.wait(timeout=5)
        if self.coordinator is not None:
            self.coordinator.stop()
        if self.coordinator_proc is not None:
            self.coordinator_proc.kill()
            self.coordinator_proc.wait(timeout=5)

