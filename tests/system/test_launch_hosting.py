"""The launcher and the lives of its children (collectives/launch/hosting.py).

Invariants:
  * a launcher that is SIGKILLed leaves no worker running (parent-death signal) and no ipc
    endpoint behind (they are abstract names, which die with their sockets: no file in the
    temp dir); the coordinator child of an elastic launcher goes too;
  * an --elastic launcher hosts its coordinator as a child process and starts it again at the
    same address when it dies: the job goes on at generation 0, through membership rounds
    (reconstruct()) on the new coordinator, and ends with the parameters numpy computes.
Workers: tests/support/restart_worker.py; the launcher's pids are adopted by the ProcessSet,
so that whatever happens, nothing outlives the test.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import sys
import time

import pytest

from support.procs import clean_env, running
from support.timing import heartbeats

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from bench.stress.resources import ipc_endpoints, unix_sockets  # noqa: E402

WORKER = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "restart_worker.py"
)
LINE = re.compile(r"^\[rank (\d+)\] (\{.*\})$")


def children(pid: int) -> list[int]:
    out = []
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(path) as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def threads_left(pid: int) -> int:
    """Threads of `pid` not yet exited. The main thread shows as a zombie as soon as it has
    exited, while the others (ZeroMQ's I/O threads) may still be on their way out, holding
    the process's descriptors -- and so its bound sockets -- until the last one is gone."""
    left = 0
    for stat in glob.glob(f"/proc/{pid}/task/*/stat"):
        try:
            with open(stat) as f:
                left += f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except OSError:
            pass
    return left


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def events(procs, name="launch") -> list[dict]:
    out = []
    for line in procs.lines(name):
        m = LINE.match(line)
        if m:
            out.append(dict(json.loads(m.group(2)), rank=int(m.group(1))))
    return out


def wait_steps(procs, n, at_least, timeout=40):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = {e["rank"] for e in events(procs) if e["event"] == "step" and e["step"] >= at_least}
        if len(done) == n:
            return
        if procs.procs["launch"].poll() is not None:
            break
        time.sleep(0.05)
    procs.fail(f"not every rank reached step {at_least}")


def launch(procs, nproc, *args, **env):
    p = procs.spawn(
        "launch",
        [sys.executable, "-m", "collectives.launch", "--nproc", nproc, *args, WORKER],
        clean_env(**heartbeats(0.2, 1.5), COLLECTIVES_TRANSPORT="ipc", **env),
    )
    return p.pid


@pytest.mark.timeout(60)
def test_sigkilled_launcher_leaves_no_worker_and_no_ipc_endpoint(procs):
    # a grace longer than the test: only the parent-death signal can end the workers in time
    # and silent workers: writing to the dead launcher's pipe would end them by itself
    pid = launch(
        procs, 2, "--elastic", STEPS=10**6, COLLECTIVES_COORDINATOR_GRACE=120, QUIET_AFTER=5
    )
    wait_steps(procs, 2, 5)
    kids = children(pid)
    for k in kids:
        procs.adopt(k)  # killed at teardown, whatever happens
    workers = [k for k in kids if "restart_worker" in cmdline(k)]
    assert len(workers) == 2, [cmdline(k) for k in kids]
    # there is something to leave behind: every worker has its ipc endpoint bound (not caught
    # between two generations of a reconstruct(), which closes one transport, then opens one)
    deadline = time.monotonic() + 10
    while True:
        bound = {w: ipc_endpoints(w) for w in workers}
        if all(bound.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    ipc = [f for files in bound.values() for f in files]
    assert len(ipc) >= 2, bound
    # in the abstract namespace: no file that a SIGKILL could leave in the temp dir
    assert all(f.startswith("@") for f in ipc), ipc
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(running(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [cmdline(k) for k in kids if running(k)]
    assert not left, f"still running after the launcher's death: {left}"
    while any(threads_left(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(threads_left(k) for k in kids), {k: threads_left(k) for k in kids}
    still = {name for _, name in unix_sockets()} & set(ipc)
    assert not still, f"ipc endpoints still bound after the workers' death: {still}"


@pytest.mark.timeout(60)
def test_elastic_launcher_restarts_its_coordinator(procs):
    steps = 80
    pid = launch(procs, 2, "--elastic", STEPS=steps, RECONSTRUCT_EVERY=10)
    wait_steps(procs, 2, 10)
    coordinators = [k for k in children(pid) if "collectives.coordinator" in cmdline(k)]
    assert len(coordinators) == 1, [cmdline(k) for k in children(pid)]
    os.kill(coordinators[0], signal.SIGKILL)
    (result,) = procs.wait("launch", timeout=45)
    assert result.code == 0, result.output[-3000:]
    assert "the coordinator process died (-9); starting it again" in result.err, result.err
    finals = [e for e in events(procs) if e["event"] == "final"]
    assert len(finals) == 2, result.output[-3000:]
    for e in finals:
        assert e["sha"] == e["expected"] and (e["ws"], e["gen"], e["step"]) == (2, 0, steps), e
