"""SIGTERM means preemption: announce the departure at once, then do what SIGTERM did before.

install() puts _on_sigterm in place, once per process (init_process_group calls it). It leaves
every Membership whose coordinator link is open (opened() / closed() keep that set), so the
others do not wait for a heartbeat timeout, then runs the previous handler (or exits with
128 + SIGTERM where there was none). A program that ignores SIGTERM keeps ignoring it.
abandons_join() makes SIGTERM end a replacement's wait to be admitted.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any, NoReturn

# Every Membership whose coordinator link is open: the members (and waiting joiners) this
# process is. SIGTERM announces the departure from each (see _on_sigterm). A plain set
# changed only by whole-object add/discard, read with tuple(): safe from a signal handler.
_open: set[Any] = set()
_previous: Any = None  # SIGTERM's handler before the library installed _on_sigterm
_installed = False


def opened(membership: Any) -> None:
    _open.add(membership)


def closed(membership: Any) -> None:
    _open.discard(membership)


@contextlib.contextmanager
def abandons_join(client: Any) -> Iterator[None]:
    """While this process waits to be admitted (the join timeout: often a minute or more),
    SIGTERM ends the wait within ABANDON_POLL s: the handler marks the join abandoned, then
    does what SIGTERM did before: a handler of the caller's runs (ElasticTrainer's marks the
    rank preempted and returns; the abandoned join then raises CollectiveError, and fit()
    returns), and where SIGTERM had its default action, the process exits as with the
    library's handler (128 + SIGTERM; join_group withdraws the request on the way out).
    Needed because a signal does not end a zmq poll: after a handler that returns, the wait
    would go on until admission or timeout. Main thread only (signal.signal's rule)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous in (signal.SIG_IGN, None):  # ignored, or a handler not set from Python
        yield
        return

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        client.abandon_join(f"{signal.Signals(signum).name} while waiting to be admitted")
        if callable(previous):
            previous(signum, frame)
        else:
            exit_on(signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM (preemption): announce the departure first, so the others do not wait for the
    heartbeat timeout, then do what SIGTERM did before (exit, where it had no handler). From
    every membership open now, not the one of the init_process_group that installed this:
    a rank that rejoined (init_process_group(join=True) again) has closed the old link, and
    leaving through it would announce nothing."""
    for membership in tuple(_open):
        membership.leave()
    if callable(_previous):
        _previous(signum, frame)
    else:
        exit_on(signum)


def exit_on(signum: int) -> NoReturn:
    """Exit as SIGTERM's default action would have (128 + signum), but through SystemExit,
    so that `finally` blocks and atexit run (the group leaves cleanly; where ipc endpoints are
    files, not Linux's abstract names, they are removed there).
    Further SIGTERMs are ignored from here on: the process is leaving anyway, and one raised
    again in the middle of that clean-up would cut it short. They do come: a parent-death
    signal (launch/hosting.py) is sent again each time the orphan is handed to another thread
    of its dying launcher, and a launcher forwards a Ctrl-C or a SIGTERM of its own."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(128 + signum)


def install() -> None:
    """Install _on_sigterm, once per process: a later init_process_group (a rejoin) adds no
    handler on top of it, nor on top of one installed meanwhile (ElasticTrainer.fit()'s, which
    puts this one back when it returns). Main thread only (signal.signal's rule)."""
    global _previous, _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN:
        # The program chose to survive SIGTERM: it stays in the group, so announcing a
        # departure (and exiting) would be wrong. Leave its choice alone.
        return
    _previous = previous
    signal.signal(signal.SIGTERM, _on_sigterm)
    _installed = True
