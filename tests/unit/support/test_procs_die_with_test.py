"""A test process killed outright takes its workers with it (tests/support/procs.py): the
harness arms each child with a parent-death SIGKILL, as teardown never runs after a SIGKILL."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.procs import running
from support.timing import scaled

ROOT = Path(__file__).resolve().parents[3]

# The stand-in for a test: one ProcessSet, one worker that would sleep a minute, its pid
# printed, and then the "test" dies of SIGKILL with no teardown.
SCRIPT = """
import os, signal, sys, time
sys.path.insert(0, {tests!r})
from support.procs import ProcessSet
ps = ProcessSet({tmp!r})
p = ps.spawn("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ))
print(p.pid, flush=True)
time.sleep(0.5)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.timeout(60)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signals are Linux's")
def test_a_worker_dies_with_its_test_process_killed_outright(tmp_path):
    script = SCRIPT.format(tests=str(ROOT / "tests"), tmp=str(tmp_path))
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=scaled(30)
    )
    assert run.returncode == -9, run.stderr
    worker = int(run.stdout.split()[0])
    try:
        end = time.monotonic() + scaled(5)
        while running(worker) and time.monotonic() < end:
            time.sleep(0.05)
        assert not running(worker), f"worker {worker} outlived its test process"
    finally:
        if running(worker):
            os.kill(worker, 9)
