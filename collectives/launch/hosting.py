"""The launcher's coordinator, and what ties the workers' lives to the launcher's.

* start_coordinator() hosts it at MASTER_PORT + 1, or on any free port whose neighbour below
  is free for MASTER_PORT; job_keys() says with which keys (the environment's secret, or a
  new one for a single-node job, handed to the workers).
* Without --elastic the coordinator runs on a thread of the launcher (membership/server.py).
* With --elastic it runs as a child process (`python -m collectives.coordinator`), and
  check() starts it again at the same address (same port, same job secret, hence the same
  CURVE keys) when it dies: the members re-register with the new one and the job goes on
  (membership/recovery.py).
* Parent-death signals (Linux prctl(PR_SET_PDEATHSIG), through ctypes): every child gets
  one, set between fork and exec, so a launcher that is SIGKILLed leaves nothing running --
  the coordinator child gets SIGKILL, each worker SIGTERM (the library's handler announces
  its departure as it exits; its ipc endpoints are abstract names, transport/zmq/transport.py). The
  lost coordinator link (COLLECTIVES_COORDINATOR_GRACE) ends the workers too, where there
  is no prctl (not Linux).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from ..common import secret as shared
from ..membership.server import Coordinator
from ..common import security
from .environment import environment

PR_SET_PDEATHSIG = 1
START_TIMEOUT = 60.0  # s: a coordinator process that has not listened by then failed
_libc = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        _libc = None


def dies_with_parent(sig: int):
    """A preexec_fn: the child gets `sig` when the launcher dies (Linux; elsewhere None).
    Loaded before the fork, only a system call after it. If the launcher died between the
    fork and the prctl, the signal would never come: the child sends it to itself."""
    if _libc is None:
        return None
    parent = os.getpid()

    def arm():
        _libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return arm


class CoordinatorProcess:
    """`python -m collectives.coordinator` as a child of the launcher, at `port` (0: any);
    `env`: the launcher's environment, which it inherits."""

    def __init__(
        self,
        host: str,
        port: int,
        world_size: int,
        keys,
        env: dict,
        min_world_size: int | None = None,
    ):
        self.host, self.port, self.world_size, self.keys = host, port, world_size, keys
        self.min_world_size = min_world_size
        self.env = env
        self.proc = None
        self.restarts = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self):
        env = dict(self.env)
        if self.keys is None:
            env["COLLECTIVES_INSECURE"] = "1"
        else:
            env["COLLECTIVES_JOB_SECRET"] = self.keys.secret.decode()
            env.pop("COLLECTIVES_JOB_SECRET_FILE", None)
        with tempfile.TemporaryDirectory(prefix="collectives-launch-") as tmp:
            port_file = os.path.join(tmp, "port")
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "collectives.coordinator",
                    "--host",
                    self.host,
                    "--port",
                    str(self.port),
                    "--port-file",
                    port_file,
                    "--world-size",
                    str(self.world_size),
                    "--quiet",
                ]
                + (["--insecure"] if self.keys is None else [])
                + (
                    []
                    if self.min_world_size is None
                    else ["--min-world-size", str(self.min_world_size)]
                ),
                env=env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=dies_with_parent(signal.SIGKILL),
            )
            deadline = time.monotonic() + START_TIMEOUT
            while not os.path.exists(port_file):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"the coordinator process did not listen on "
                        f"{self.host}:{self.port or 'any port'}"
                    )
                time.sleep(0.02)
            with open(port_file) as f:
                self.port = int(f.read())
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check(self, say):
        """Start it again at the same address if it died."""
        if self.alive():
            return
        code = self.proc.returncode
        self.restarts += 1
        say(
            f"the coordinator process died ({code}); starting it again at "
            f"{self.address} (restart {self.restarts})"
        )
        try:
            self.start()
        except RuntimeError as exc:  # the port taken meanwhile, say: the next poll tries again
            say(f"{exc}; trying again")

    def stop(self, timeout: float = 5.0):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


class CoordinatorThread:
    """The coordinator on a thread of the launcher (without --elastic: its death is the
    launcher's, and a launcher that dies ends the job)."""

    def __init__(
        self,
        host: str,
        port: int,
        world_size: int,
        keys,
        env=None,
        min_world_size: int | None = None,
    ):
        self.host, self.port, self.world_size, self.keys = host, port, world_size, keys
        self.min_world_size = min_world_size
        self.server = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self):
        self.server = Coordinator(
            self.host,
            self.port,
            self.world_size,
            keys=self.keys,
            min_world_size=self.min_world_size,
        ).start()
        self.port = self.server.port
        return self

    def stop(self):
        self.server.stop()


def _port_is_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def job_keys(nnodes: int = 1):
    """(keys for the coordinator, the secret to give the workers or None). The environment's
    secret, which the workers inherit; none when COLLECTIVES_INSECURE=1; else a new one --
    on one node only: the launchers of several nodes cannot agree on a secret by themselves."""
    try:
        keys = security.from_environment()
    except ValueError as exc:
        raise SystemExit(f"[launch] {exc}") from None
    if keys is security.AUTO and nnodes > 1:
        raise SystemExit(
            "[launch] --nnodes > 1: every node needs the same job secret, "
            "COLLECTIVES_JOB_SECRET or COLLECTIVES_JOB_SECRET_FILE (or, on a "
            "network you trust, COLLECTIVES_INSECURE=1); see docs/security.md"
        )
    if keys is security.AUTO:
        keys = security.JobKeys(shared.generate(), "launcher")
        return keys, keys.secret.decode()
    return keys, None


def start_coordinator(
    host: str,
    master_port: int | None,
    world_size: int,
    keys=security.AUTO,
    process: bool = False,
    min_world_size: int | None = None,
):
    """(MASTER_PORT, the running coordinator on MASTER_PORT + 1): on a thread of this process,
    or (process=True, --elastic) a child process that check() restarts (hosting.py)."""
    kind = CoordinatorProcess if process else CoordinatorThread
    if master_port is not None:
        try:
            return master_port, kind(
                host, master_port + 1, world_size, keys, environment(), min_world_size
            ).start()
        except Exception as exc:
            raise SystemExit(
                f"[launch] cannot host the coordinator at {host}:{master_port + 1} "
                f"(MASTER_PORT + 1): {exc}"
            ) from None
    for _ in range(100):  # the coordinator on any free port C, whose neighbour C - 1 is free
        coordinator = kind(host, 0, world_size, keys, environment(), min_world_size).start()
        port = coordinator.port - 1
        if port > 0 and _port_is_free(host, port):
            return port, coordinator
        coordinator.stop()
    raise SystemExit(f"[launch] found no free pair of ports on {host}")
