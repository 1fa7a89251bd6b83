"""Crash detection from the kernel: the coordinator learns of a member's death within
milliseconds from the best witness (DESIGN.md, principle 10), not at the heartbeat timeout.

A process's death closes its sockets and ends its pid at once. Three witnesses of that, each
one switched on or off by COLLECTIVES_FAILURE_DETECTION (all on by default):

  pidfd       a member on the coordinator's host is watched through a pidfd (os.pidfd_open),
              which becomes readable when the process ends. "On this host" is exact: a member
              sends its `proc` key (process_key: boot id, pid namespace, pid, start time), and
              only a key with this process's boot id and pid namespace is watched, after its
              start time is checked against /proc (a pid reused by another process does not
              match). A joiner is watched from its join request on, a rank from its address.
              Certain: declared at once.
  exit        the member's launcher reaped it and says so: `exited {proc, code}`
              (launch/reporter.py). Certain: declared at once.
  connection  the member's heartbeat connection closed. A socket monitor on the ROUTER says
              which file descriptor's connection ended (EVENT_DISCONNECTED), and every message
              read says which descriptor it came in on (ZMQ_SRCFD), hence whose connection that
              was. It also works across hosts (the dead process's kernel closes the connection),
              but a live process's connection can drop too, and ZeroMQ connects it again: this
              witness only reports what it saw (`observed`, as machine.Connection events), and
              the machine judges, on its clock, when a closed connection is a death
              (connections.py).

Heartbeats remain for what gives no such signal: a host that vanishes, a partition, a stopped
process (SIGSTOP keeps the sockets open and the pidfd quiet) -- and a rank that is only slow is
never declared by any of these, since its process and its connection live.

What the witnesses find ended the coordinator feeds to its state machine as a death
(machine.died): a member is declared as at a heartbeat timeout (changes.declare), the others'
operations raise PeerFailure naming the rank. A waiting joiner that dies is forgotten; one that
dies while its admission's generation forms makes that formation fail at once ('unformed').
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

import zmq

from ..common.monitor import next_event
from ..common.security import HANDSHAKE_FAILED, user_id
from .clock import REAL, Clock
from .machine import Connection, Event, PidWatch

log = logging.getLogger("collectives")

PRUNE_EVERY = 1.0  # s: watches of processes that are no longer members are closed this often


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (clock ticks after boot): with the pid, it names a process."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # after the command name, which may hold spaces
    return fields[19] if len(fields) > 19 else None


def host_key() -> str | None:
    """Processes with equal host keys see the same pids: same kernel boot, same pid namespace."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    try:
        pidns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return f"{boot.strip()}:{pidns}" if boot else None


def process_key(pid: int | None = None) -> str | None:
    """`host_key:pid:start_time` of a process (this one by default), or None without /proc."""
    pid = os.getpid() if pid is None else pid
    here, start = host_key(), _start_time(pid)
    return f"{here}:{pid}:{start}" if here and start else None


class Liveness:
    """The coordinator's crash witnesses, on the coordinator's thread: poll() and recv()
    replace the socket's own; learn() is told of process keys, reported() of a launcher's
    report; check() runs in the periodic work. What they find ended, take_ended() hands over
    (the shell feeds it to the machine as deaths); what the socket monitor saw of the
    connections, take_observed() (the machine judges it: connections.py).

    known(): the member ids the job still needs (machine.py answers from its state)."""

    def __init__(
        self,
        sock: zmq.Socket[Any],
        guard: Any,
        detect: frozenset[str],
        known: Callable[[], set[str]],
        clock: Clock = REAL,
    ):
        self.clock = clock
        self.sock = sock
        self.guard = guard
        self.detect = detect
        self.known = known
        events = (zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED) if "connection" in detect else 0
        if guard is not None:  # one monitor per socket: the ZAP guard's events come here too
            events |= HANDSHAKE_FAILED
        self.mon: zmq.Socket[Any] | None = sock.get_monitor_socket(events) if events else None
        self.poller = zmq.Poller()
        self.poller.register(sock, zmq.POLLIN)
        if self.mon is not None:
            self.poller.register(self.mon, zmq.POLLIN)
        self.proved: bytes | None = None  # the member id the last message's connection proved
        self.conns: dict[int, bytes] = {}  # fd -> routing id of the last message on it
        # fds whose connection closed before a message on it was read: a message the
        # connection sent before it closed may still be queued, read after the closing
        # (events are read before messages), and then says whose connection it was
        self.silent: set[int] = set()
        self.late: list[Event] = []  # such closings, handed over after that message
        # what was seen, for the machine (take_observed): connections, pidfd watches
        self.observed: list[Event] = []
        self.procs: dict[str, str] = {}  # mid -> its process key
        self.watching: dict[str, int] = {}  # mid -> pidfd
        self.pidfds: dict[int, str] = {}  # pidfd -> mid
        self.ended: list[tuple[str, str]] = []  # (mid, why) found dead, not handed over yet
        self.here = host_key() if "pidfd" in detect and hasattr(os, "pidfd_open") else None
        self._pruned_at = 0.0

    # --- the socket ----------------------------------------------------------------------------
    def poll(self, timeout_ms: int) -> bool:
        """Wait for a message, a connection event or a watched process's end; whether a
        message is there to recv()."""
        ready = dict(self.poller.poll(timeout_ms))
        if self.mon is not None and self.mon in ready:
            self._events()
        for fd in [fd for fd in ready if isinstance(fd, int) and fd in self.pidfds]:
            mid = self.pidfds[fd]
            self._unwatch(mid)
            self.ended.append(
                (mid, "died: its process ended (seen through its pidfd on the coordinator's host)")
            )
        return self.sock in ready

    def recv(self) -> list[bytes]:
        """The next message's frames, noting which connection (fd) it came on. The monitor's
        events are read first: a connection's ACCEPTED comes before its first message."""
        if self.mon is not None:
            self._events()
        frames = self.sock.recv_multipart(copy=False)
        self.proved = user_id(frames[-1])  # the member id its connection proved (identity.py)
        try:
            fd = frames[0].get(zmq.SRCFD)
        except zmq.ZMQError:
            fd = -1
        if fd >= 0 and "connection" in self.detect:
            if fd in self.silent:  # it closed already: now we know whose it was
                self.silent.discard(fd)
                self.late.append(Connection(fd, "closed", frames[0].bytes))
            else:
                if self.conns.get(fd) is None:
                    self.observed.append(Connection(fd, "spoke"))
                self.conns[fd] = frames[0].bytes
        return [f.bytes for f in frames]

    def _events(self) -> None:
        assert self.mon is not None
        while True:
            try:
                event = next_event(self.mon, zmq.NOBLOCK)
            except zmq.Again:
                return
            kind = event.kind
            if kind == zmq.EVENT_DISCONNECTED:
                ident = self.conns.pop(event.value, None)
                if ident is None:
                    self.silent.add(event.value)
                self.observed.append(Connection(event.value, "closed", ident))
            elif kind == zmq.EVENT_ACCEPTED:
                self.conns.pop(event.value, None)  # a new connection on a reused fd
                self.silent.discard(event.value)
                self.observed.append(Connection(event.value, "opened"))
            elif self.guard is not None:
                self.guard.on_event(event)  # the ZAP guard's handshake failures

    def close(self) -> None:
        for mid in list(self.watching):
            self._unwatch(mid)
        if self.mon is not None:
            # switched off while this end is open (its last event must have a reader)
            try:
                self.sock.disable_monitor()
            except zmq.ZMQError:
                pass
            self.mon.close(linger=0)
            self.mon = None

    # --- what the coordinator tells ------------------------------------------------------------
    def learn(self, mid: str, key: str) -> None:
        """A member's or joiner's process key: watch its pidfd if it runs on this host."""
        self.procs[mid] = key
        if self.here is None or mid in self.watching or not key.startswith(self.here + ":"):
            return
        try:
            pid, start = key[len(self.here) + 1 :].split(":")
            fd = os.pidfd_open(int(pid))
        except ValueError:
            return  # not a key of ours: nothing to watch
        except ProcessLookupError:
            self.ended.append(
                (mid, "its process had ended already (no such pid on the coordinator's host)")
            )
            return
        except OSError as exc:  # no pidfds here (an old kernel): the other witnesses remain
            log.debug("coordinator: no pidfd for pid %s: %s", key, exc)
            return
        if _start_time(int(pid)) != start:
            os.close(fd)
            self.ended.append(
                (mid, "its process had ended already (its pid now names another process)")
            )
            return
        self.watching[mid] = fd
        self.pidfds[fd] = mid
        self.poller.register(fd, zmq.POLLIN)
        self.observed.append(PidWatch(mid, True))

    def on_exited(self, proc: str, code: int | None) -> None:
        """A launcher's report of a worker that exited (`exited {proc, code}`)."""
        how = f"exit code {code}" if code is None or code >= 0 else f"signal {-code}"
        self.reported(proc, f"died: its process ended ({how}), said its launcher")

    def reported(self, key: str, why: str) -> None:
        """A launcher says the process with this key ended."""
        if "exit" not in self.detect:
            return
        for mid in [m for m, k in self.procs.items() if k == key]:
            self.ended.append((mid, why))

    def check(self) -> None:
        """Close the watches of processes the coordinator no longer needs (every PRUNE_EVERY
        s)."""
        now = self.clock.monotonic()
        if now - self._pruned_at >= PRUNE_EVERY:
            self._pruned_at = now
            known = self.known()
            for mid in [m for m in self.procs if m not in known]:
                del self.procs[mid]
                self._unwatch(mid)

    def take_observed(self) -> list[Event]:
        """What the socket monitor and the pidfd watches saw since the last call, in order.
        A closing that a message read late named comes one call later: after the machine
        was fed that message (its first beat makes the routing id a member's)."""
        seen, self.observed, self.late = self.observed, self.late, []
        return seen

    def take_ended(self) -> list[tuple[str, str]]:
        """(mid, why) of every process found ended since the last call; no longer watched."""
        ended, self.ended = self.ended, []
        for mid, _ in ended:
            self._unwatch(mid)
        return ended

    # --- internals -----------------------------------------------------------------------------
    def _unwatch(self, mid: str) -> None:
        fd = self.watching.pop(mid, None)
        if fd is None:
            return
        self.observed.append(PidWatch(mid, False))
        self.pidfds.pop(fd, None)
        try:
            self.poller.unregister(fd)
        except KeyError:
            pass
        os.close(fd)
