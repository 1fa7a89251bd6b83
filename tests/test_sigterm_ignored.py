"""A program that ignores SIGTERM keeps ignoring it after init_process_group.

Invariant: with SIGTERM set to SIG_IGN before init_process_group, a SIGTERM neither ends the
process nor takes it out of its group: its next all_reduce still runs (world size 1, rank 0
hosting the coordinator on a free port) and it exits 0. A real process, reaped whatever
happens.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

WORKER = textwrap.dedent("""
    import signal, sys, time
    import numpy as np
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    import collectives as cl
    pg = cl.init_process_group(rank=0, world_size=1, master_addr="127.0.0.1",
                               master_port=int(sys.argv[1]), timeout=10)
    print("ready", flush=True)
    sys.stdin.readline()              # the test sends SIGTERM, then a line
    x = np.ones(3)
    pg.all_reduce(x)
    print("after", pg.world_size, x.tolist(), flush=True)
    pg.destroy()
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(60)
def test_sigterm_ignored_before_init_stays_ignored():
    p = subprocess.Popen([sys.executable, "-c", WORKER, str(free_port())], text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
        p.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert p.poll() is None, f"SIGTERM ended the process: {p.stderr.read()[-2000:]}"
        p.stdin.write("go\n")
        p.stdin.flush()
        out, err = p.communicate(timeout=30)
        assert p.returncode == 0, err[-2000:]
        assert "after 1 [1.0, 1.0, 1.0]" in out, (out, err[-2000:])
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
