"""Ending the launcher's workers: signals passed on, SIGTERM then SIGKILL after a grace,
every one reaped; the spares a finished job does not need; an exit status in words."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

POLL_S = 0.05  # s between two looks at the workers


def signal_all(procs, sig):
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(sig)
            except ProcessLookupError:
                pass


def end_workers(procs, grace: float):
    """SIGTERM every live worker, SIGKILL what is left after `grace` seconds, reap them all."""
    signal_all(procs, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and None in [p.poll() for p in procs]:
        time.sleep(POLL_S)
    signal_all(procs, signal.SIGKILL)
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:  # unkillable (D state): give up, say so
            print(f"[launch] worker pid {p.pid} did not die after SIGKILL", file=sys.stderr)


def workers_done(procs, spares) -> bool:
    """Whether every worker not started as a spare has ended, one of them successfully."""
    workers = [p for i, p in enumerate(procs) if i not in spares]
    return all(p.returncode is not None for p in workers) and any(
        p.returncode == 0 for p in workers
    )


def end_spares(procs, spares, lost, grace: float, say):
    """The spares still running `grace` s after the workers ended are ended (SIGTERM: a spare
    waiting to be admitted withdraws and exits), and their exit codes are no failure."""
    deadline = time.monotonic() + grace
    waiting = [i for i in spares if procs[i].poll() is None]
    while waiting and time.monotonic() < deadline:
        time.sleep(POLL_S)
        waiting = [i for i in waiting if procs[i].poll() is None]
    if waiting:
        say(f"ending {len(waiting)} spare(s) not needed")
    signal_all([procs[i] for i in waiting], signal.SIGTERM)
    lost.update(waiting)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
