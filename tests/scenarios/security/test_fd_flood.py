"""Idle connections from anyone who can reach a port cannot turn a survivable failure into a
crash (docs/security.md, "Denial of service").

A rank starts with the usual soft limit on open files far below its hard limit (here 256, the
machine's default being 1,024), and an outsider without the secret holds more connections to
the coordinator's port than that, each having sent the first 10 bytes of a ZMTP greeting and
nothing more (re-opened as the coordinator drops them). Invariants:
  * a rank raises its soft limit to the hard one at start, so a preemption (SIGTERM) of another
    rank under the flood ends with the survivors re-formed and summing exactly, and rank 0 (which
    hosts the coordinator) has said in its log that it raised the limit;
  * where the hard limit itself is too low, start-up (init_process_group) under the flood
    either gets through between two waves of dropped connections or fails with an error that
    names the flood (connections that never authenticate) -- never a wrong address, never a
    ZeroMQ error. Each message that names the flood is required by
    tests/unit/membership/test_server_check.py: here a rank that gets in passes as well.
"""

from __future__ import annotations

import signal
import socket
import threading
import time

import pytest

from support.security_world import PY, SECRET, WORKER, Procs, base_env, start_world, wait_json
from support.timing import scaled

# rank 0's log once the flood took every file it may open (common/security.py)
OUT_OF_FILES = r"cannot accept connections: this process has as many files open as it may"
GREETING_START = b"\xff" + b"\0" * 8 + b"\x7f"  # the first 10 bytes of a ZMTP greeting


@pytest.fixture
def procs(tmp_path):
    ps = Procs(tmp_path)
    try:
        yield ps
    finally:
        ps.close()


class Flood:
    """`n` idle connections to 127.0.0.1:port, each re-opened when the server drops it."""

    def __init__(self, port: int, n: int):
        self.port, self.n = port, n
        self.stop = threading.Event()
        self.opened = 0  # connections opened in all
        self.peak = 0  # the most held open at once: the flood's size
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _open(self):
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=0.5)
            s.sendall(GREETING_START)
            s.setblocking(False)
            self.opened += 1
            return s
        except OSError:
            return None

    def _run(self):
        socks = []
        try:
            while not self.stop.is_set():
                alive = []
                for s in socks:
                    try:
                        if s.recv(4096) == b"":
                            s.close()
                            continue
                    except BlockingIOError:
                        pass
                    except OSError:
                        s.close()
                        continue
                    alive.append(s)
                socks = alive
                while len(socks) < self.n and not self.stop.is_set():
                    s = self._open()
                    if s is None:
                        break
                    socks.append(s)
                self.peak = max(self.peak, len(socks))
                self.stop.wait(0.05)
        finally:
            for s in socks:
                s.close()

    def reach(self, n: int, timeout: float):
        """Until `n` connections are held open at once (within `timeout` s, scaled)."""
        deadline = time.monotonic() + scaled(timeout)
        while self.peak < n:
            assert time.monotonic() < deadline, (
                f"the flood held at most {self.peak} connections at once, not {n}, "
                f"within {scaled(timeout):g} s"
            )
            time.sleep(0.05)

    def close(self):
        self.stop.set()
        self.thread.join(10)


@pytest.mark.timeout(150)
def test_a_preemption_under_a_connection_flood_is_survived(procs, tmp_path):
    env = base_env(COLLECTIVES_JOB_SECRET=SECRET, TEST_NOFILE="256", COLLECTIVES_DEBUG="INFO")
    port = start_world(procs, tmp_path, 3, "survive", env)
    for r in range(3):
        wait_json(tmp_path / f"rank{r}.addr.json", 60, procs, f"rank{r}")
    flood = Flood(port, 400)
    try:
        flood.reach(400, 20)  # more than the soft limit the ranks started with
        procs.procs["rank2"].send_signal(signal.SIGTERM)
        for r in (0, 1):  # the survivors re-form under the flood (lifecycle.py logs it)
            procs.wait_line(f"rank{r}", r"of generation [1-9]\d* \(2 ranks\)", 60)
        (tmp_path / "stop").touch()
        for r in (0, 1):
            rc = procs.wait(f"rank{r}", 90)
            rep = wait_json(tmp_path / f"rank{r}.json", 5)
            assert rc == 0 and rep["ok"], (r, rc, rep, procs.err(f"rank{r}")[-3000:])
            assert rep["world_size"] == 2 and rep["generation"] >= 1, rep
            assert rep["results"] == [3], rep
    finally:
        flood.close()
    assert "raised the open-file limit from 256" in procs.err("rank0")


@pytest.mark.timeout(120)
def test_start_up_under_a_connection_flood_names_the_flood(procs, tmp_path):
    env = base_env(
        COLLECTIVES_JOB_SECRET=SECRET, TEST_NOFILE="128:128", TEST_TIMEOUT=f"{scaled(12):g}"
    )
    procs.start(
        "rank0",
        [PY, WORKER, "init", str(tmp_path)],
        dict(env, RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="0"),
    )
    port = int(procs.wait_line("rank0", r"hosts the coordinator at [\d.]+:(\d+)", 60)[1])
    flood = Flood(port, 300)
    try:
        flood.reach(200, 20)  # more than the 128 files rank 0 may open
        # ... and rank 0 ran out of them: the flood filled its table
        procs.wait_line("rank0", OUT_OF_FILES, 30)
        procs.start(
            "rank1",
            [PY, WORKER, "init", str(tmp_path)],
            dict(env, RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
        )
        errors = {}
        for r in (0, 1):
            try:
                procs.wait(f"rank{r}", 60)
            except AssertionError:
                procs.procs[f"rank{r}"].send_signal(signal.SIGUSR1)  # its stacks, to stderr
                procs.wait_line(f"rank{r}", "most recent call first", 10)
                raise AssertionError(procs.err(f"rank{r}")[-6000:]) from None
            # a rank that ended without its report says why (its stderr)
            rep = wait_json(tmp_path / f"rank{r}.json", 5, procs, f"rank{r}")
            errors[r] = "" if rep["ok"] else rep["error"]
    finally:
        flood.close()
    # The flood's connections are dropped every 5 s (the handshake timeout), so a rank may
    # get in between two waves: then it started. One that does not must say why, naming the
    # flood. Which of the two happens is the machine's timing, so the message that names the
    # flood is required where it is made: tests/unit/membership/test_server_check.py.
    print({r: error or "started" for r, error in errors.items()})
    for r, error in errors.items():
        if error:
            assert "unauthenticated connections" in error, (r, error)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["ipc", "shm"])
def test_explicit_ipc_under_a_small_limit_is_refused_before_a_flood_can_abort_it(
    procs, tmp_path, transport
):
    """libzmq's ipc listener aborts the process when accept() finds no free descriptor, which
    a flood brings about under a small limit. Asked for ipc (or shm, which listens on ipc)
    with a hard limit of 128, each rank refuses at start-up, saying why and what to do,
    instead of listening on ipc and being aborted by the flood (SIGABRT, no report)."""
    env = base_env(
        COLLECTIVES_JOB_SECRET=SECRET,
        COLLECTIVES_TRANSPORT=transport,
        TEST_NOFILE="128:128",
        TEST_TIMEOUT=f"{scaled(12):g}",
    )
    procs.start(
        "rank0",
        [PY, WORKER, "init", str(tmp_path)],
        dict(env, RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="0"),
    )
    port = int(procs.wait_line("rank0", r"hosts the coordinator at [\d.]+:(\d+)", 60)[1])
    flood = Flood(port, 300)
    try:
        flood.reach(200, 20)
        procs.start(
            "rank1",
            [PY, WORKER, "init", str(tmp_path)],
            dict(env, RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
        )
        for r in (0, 1):
            rc = procs.wait(f"rank{r}", 60)
            rep = wait_json(tmp_path / f"rank{r}.json", 5, procs, f"rank{r}")
            assert rc == 0 and not rep["ok"], (r, rc, rep, procs.err(f"rank{r}")[-3000:])
            assert (
                f"transport '{transport}' needs an open-files limit of at least 4096, and this "
                "process's is 128" in rep["error"]
            ), (r, rep)
    finally:
        flood.close()
