"""A program that ignores SIGTERM keeps ignoring it after init_process_group.

Invariant: with SIGTERM set to SIG_IGN before init_process_group, a SIGTERM neither ends the
process nor takes it out of its group: its next all_reduce still runs (world size 1, rank 0
hosting the coordinator on any free port: master_port=0) and it exits 0. A real process,
reaped whatever happens.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from support.procs import clean_env

WORKER = textwrap.dedent("""
    import signal, sys, time
    import numpy as np
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    import collectives as cl
    pg = cl.init_process_group(rank=0, world_size=1, master_addr="127.0.0.1",
                               master_port=0, timeout=10)
    print("ready", flush=True)
    sys.stdin.readline()              # the test sends SIGTERM, then a line
    x = np.ones(3)
    pg.all_reduce(x)
    print("after", pg.world_size, x.tolist(), flush=True)
    pg.destroy()
""")


@pytest.mark.timeout(60)
def test_sigterm_ignored_before_init_stays_ignored(procs):
    p = procs.spawn("worker", [sys.executable, "-c", WORKER], clean_env(), stdin=subprocess.PIPE)
    procs.wait_for_line("worker", r"^ready$", timeout=30)
    p.send_signal(signal.SIGTERM)
    time.sleep(0.5)  # not a wait: a window in which the SIGTERM could end it, which it must not
    assert p.poll() is None, f"SIGTERM ended the process: {procs.stderr('worker')[-2000:]}"
    p.stdin.write("go\n")
    p.stdin.flush()
    (run,) = procs.wait("worker", 30)
    assert run.code == 0, run.err[-2000:]
    assert "after 1 [1.0, 1.0, 1.0]" in run.out, (run.out, run.err[-2000:])
    assert "rank 0 hosts the coordinator at 127.0.0.1:" in run.err, run.err[-2000:]
