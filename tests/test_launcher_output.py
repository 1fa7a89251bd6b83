"""What the launcher shows of its workers (issue 17, item 1).

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
import subprocess
import sys
import threading
import time
import tty

import pytest

from collectives.launch.__main__ import Prefixer

HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(HERE)

WORKER = r'''
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
'''


def _launch(script, **kw):
    return subprocess.Popen([sys.executable, "-m", "collectives.launch", "--nproc", "1",
                             "--timeout", "60", script], start_new_session=True, **kw)


def _reap(p):
    if p.poll() is None:
        p.kill()
    p.wait(timeout=10)


@pytest.mark.timeout(60)
def test_progress_updates_reach_a_terminal_live_and_prefixed(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    master, slave = pty.openpty()
    tty.setraw(slave)                 # no newline translation: we read exactly what is sent
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
def test_into_a_pipe_workers_are_told_to_print_lines(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    p = _launch(str(script), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = p.communicate(timeout=50)
    finally:
        _reap(p)
    assert p.returncode == 0, err[-2000:]
    assert b"[rank 0] progress=lines\n" in out


@pytest.mark.timeout(120)
def test_training_progress_into_a_log_is_plain_lines(tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "collectives.launch", "--nproc", "2",
                          "--timeout", "100", os.path.join(ROOT, "examples", "train_digits.py"),
                          "--epochs", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=110)
    finally:
        _reap(p)
    assert p.returncode == 0, err[-2000:]
    assert b"\r" not in err and b"\r" not in out
    progress = re.findall(rb"\[rank 0\] \[collectives\] train (\d+)/(\d+) loss", err)
    assert progress, err[-2000:]
    done, total = progress[-1]
    assert done == total            # the last line says the training finished
