"""A member's heartbeat connection as a witness of its death, judged inside the machine.

The shell's witness (liveness.py) only reports what its socket monitor saw -- a connection
accepted, one that said whose it is, one that closed, a process it now watches through a
pidfd -- as events; this module decides, on the machine's clock, which closed connection is a
death (DESIGN.md, principle 10: a dead process closes its sockets at once). So every death the
coordinator declares is judged in one place, the machine: a heartbeat timeout
(machine.check_heartbeats), a connection that stayed closed (here), or a certain witness (a
pidfd, a launcher's report: machine.died).

A live process's connection can drop too, and ZeroMQ connects it again (its client beats at
once on a new connection: restart.Watch). So a member is declared only if no beat comes on a
new connection within GRACE, or within GRACE_MAX while a connection accepted since has not yet
said whose it is (that may be it, its handshake slow on a loaded host). A member whose process
the shell watches through a pidfd is never declared on its connection: the pidfd tells.
"""

from __future__ import annotations

from .state import Down, Ident, Mid, Outbox, State

# s: how long a member's closed connection may stay closed, no new one accepted, before it is
# declared dead. ZeroMQ connects again after the client's reconnect interval
# (restart.RECONNECT_IVL, 10 ms), but only once the client's I/O thread runs, and the accept is
# seen only once the coordinator's thread runs: on a host with several runnable tasks per CPU
# each waits its turn, and 0.1 s evicted live members whose connection had merely dropped.
# Still far below a heartbeat timeout, and a SIGKILL's detection bound in the tests.
GRACE = 0.5
GRACE_MAX = 1.0  # s: the grace while a newer connection has not said whose it is


def opened(s: State, fd: int, now: float) -> None:
    """A connection was accepted on descriptor `fd`; nobody's yet."""
    s.connections.accepted[fd] = now


def spoke(s: State, fd: int) -> None:
    """A message came on `fd`: the connection says whose it is (its message does)."""
    s.connections.accepted.pop(fd, None)


def closed(s: State, fd: int, ident: Ident | None, now: float) -> None:
    """The connection on `fd` closed; `ident`: the routing id of the last message on it."""
    c = s.connections
    c.accepted.pop(fd, None)
    owner = None if ident is None else s.owner_of(ident)
    if owner is not None and s.is_known(owner) and owner not in c.down:
        if owner not in c.pid_watched:
            c.down[owner] = Down(ident or b"", now)


def watched(s: State, mid: Mid, on: bool) -> None:
    """The shell watches (or no longer watches) member `mid`'s process through a pidfd."""
    c = s.connections
    if on:
        c.pid_watched.add(mid)
        c.down.pop(mid, None)  # its pidfd tells: a connection that closed is no death
    else:
        c.pid_watched.discard(mid)


def beat(s: State, out: Outbox, mid: Mid, ident: Ident, now: float) -> None:
    """A beat on the heartbeat socket: one on a new connection shows a closed one came back."""
    down = s.connections.down.get(mid)
    if down is not None and down.ident != ident:
        del s.connections.down[mid]
        out.note(
            f"a member's connection closed and came back after {now - down.since:.3f} s",
            detail=True,
        )


def gone(s: State, now: float) -> list[tuple[Mid, str]]:
    """The members whose connection stayed closed past the grace: (mid, why), each once."""
    c = s.connections
    dead = []
    for mid, down in list(c.down.items()):  # every tick: O(1) per closed connection
        if not s.is_known(mid):
            del c.down[mid]
            continue
        newer = any(t >= down.since for t in c.accepted.values())
        if now - down.since >= (GRACE_MAX if newer else GRACE):
            del c.down[mid]
            dead.append(
                (
                    mid,
                    f"died: its connection to the coordinator closed and no new one came "
                    f"within {now - down.since:.2f} s (its process ended)",
                )
            )
    return dead


def prune(s: State, known: set[Mid]) -> None:
    """Forget the pidfd watches of processes the job no longer needs (the shell closes them);
    known: s.known()."""
    s.connections.pid_watched &= known
