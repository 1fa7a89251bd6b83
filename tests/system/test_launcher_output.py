"""What the launcher shows of its workers.

Invariants:
  * under a terminal, a worker's carriage-return updates (a progress bar) are forwarded as
    they come, each prefixed with its rank: the first update reaches the terminal long
    before the worker ends, not as one line at its exit;
  * workers are told whether the output is a terminal (COLLECTIVES_PROGRESS: bar or lines);
  * no forwarded line is longer than the launcher's MAX_LINE (plus its prefix);
  * into a pipe (a log, CI), training progress is plain lines, never a \\r bar.
"""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time
import tty

import pytest

from collectives.launch.output import Prefixer
from support.procs import ROOT, clean_env

WORKER = r"""
import os, sys, time
print("progress=" + os.environ.get("COLLECTIVES_PROGRESS", "?"), flush=True)
for i in range(12):
    sys.stderr.write(f"\rstep {i}")
    sys.stderr.flush()
    time.sleep(0.15)
sys.stderr.write("\n")
sys.stdout.write("x" * 100000)       # one endless line, no newline
sys.stdout.write("\n")
print("done", flush=True)
"""


def _launch(script, **kw):
    """The launcher in a session of its own (under a pty: ProcessSet reads pipes only)."""
    return subprocess.Popen(
        [sys.executable, "-m", "collectives.launch", "--nproc", "1", "--timeout", "60", script],
        start_new_session=True,
        env=clean_env(),
        cwd=ROOT,
        **kw,
    )


def _reap(p):
    """Kill the launcher's whole session (its workers too) if it is still there."""
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=10)


@pytest.mark.timeout(60)
def test_progress_updates_reach_a_terminal_live_and_prefixed(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    master, slave = pty.openpty()
    tty.setraw(slave)  # no newline translation: we read exactly what is sent
    got: list[tuple[float, bytes]] = []

    def read():
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            got.append((time.monotonic(), data))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    p = _launch(str(script), stdout=slave, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    try:
        assert p.wait(timeout=50) == 0
    finally:
        _reap(p)
    reader.join(5)
    os.close(master)
    out = b"".join(d for _, d in got)
    assert b"[rank 0] progress=bar\n" in out, out[:300]
    assert b"[rank 0] step 3\r" in out and b"[rank 0] step 11\n" in out, out[:600]

    def arrival(marker: bytes) -> float:
        seen = b""
        for t, d in got:
            seen += d
            if marker in seen:
                return t
        raise AssertionError(f"{marker!r} never arrived")

    # the worker spends ~1.5 s drawing its bar: an update forwarded live arrives well before
    # the worker's last line, not with it
    assert arrival(b"done\n") - arrival(b"[rank 0] step 1\r") > 1.0
    lines = re.split(rb"[\r\n]", out)
    assert max(len(line) for line in lines) <= Prefixer.MAX_LINE + len(b"[rank 0] ")
    assert sum(len(line) for line in lines if line.startswith(b"[rank 0] xxx")) >= 100000


@pytest.mark.timeout(60)
def test_into_a_pipe_workers_are_told_to_print_lines(procs, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    procs.spawn(
        "launch",
        [sys.executable, "-m", "collectives.launch", "--nproc", 1, "--timeout", 50, script],
        clean_env(),
    )
    res = procs.wait("launch", timeout=55)[0]
    assert res.code == 0, res.err[-2000:]
    assert "[rank 0] progress=lines" in res.out.splitlines()


@pytest.mark.timeout(120)
def test_training_progress_into_a_log_is_plain_lines(procs):
    procs.spawn(
        "launch",
        [
            sys.executable,
            "-m",
            "collectives.launch",
            "--nproc",
            2,
            "--timeout",
            100,
            os.path.join(ROOT, "examples", "train_digits.py"),
            "--epochs",
            2,
        ],
        clean_env(),
    )
    res = procs.wait("launch", timeout=110)[0]
    assert res.code == 0, res.err[-2000:]
    assert "\r" not in res.err and "\r" not in res.out
    progress = re.findall(r"\[rank 0\] \[collectives\] train (\d+)/(\d+) loss", res.err)
    assert progress, res.err[-2000:]
    done, total = progress[-1]
    assert done == total  # the last line says the training finished
