"""What a client says when the process at the coordinator's address completes no handshake
(collectives/membership/server_check.py), from the handshakes it saw.

Invariants: where that process accepted a connection but completed no handshake, or closed
every handshake without saying why, the error names the op, the rank, the address and, among
the causes, a coordinator flooded with connections that never authenticate ("too many
unauthenticated connections"); where this very process hosts a coordinator that ran out of
file descriptors, the error is that process's own note; a server that answers with the other
mechanism is a mismatch, and the error says that instead; while nothing is known yet, no
error. why_silent() names the flood too. (tests/scenarios/security/test_fd_flood.py floods a
real coordinator, where a rank may also get in between two waves.)"""

from __future__ import annotations

import errno
import time
from dataclasses import dataclass

import pytest

from collectives.common import security
from collectives.common.errors import CollectiveError
from collectives.membership import server_check
from collectives.membership.lifecycle import sockets_failed

pytestmark = pytest.mark.fast

FLOOD = "too many unauthenticated connections"
ADDRESS = "127.0.0.1:29500"


@dataclass
class Seen:
    """What a client socket's handshakes showed (security.HandshakeWatch's reading side)."""

    said: str | None = None  # what problem() says
    mismatch: bool = False
    failures: int = 0
    first_failure: float | None = None
    connected_at: float | None = None
    mechanism: bytes | None = None  # what the server answers when asked its mechanism

    def problem(self, stuck_after: float = 5.0) -> str | None:
        return self.said

    def probe(self, address: str) -> bytes | None:
        return self.mechanism

    def poll(self) -> None:
        pass


@pytest.fixture
def not_flooded_here(monkeypatch):
    monkeypatch.setattr(security, "flood_note", lambda within=30.0: "")


def _error(seen: Seen, keyed: bool = True) -> str:
    with pytest.raises(CollectiveError) as got:
        server_check.check(seen, keyed, ADDRESS, 1, "join", time.monotonic())  # type: ignore[arg-type]
    return str(got.value)


def test_a_server_that_accepts_but_never_handshakes_may_be_a_flooded_coordinator(
    not_flooded_here,
):
    stuck = Seen(said="it accepted a connection but completed no handshake in 5 s")
    msg = _error(stuck)
    assert msg.startswith(f"join: rank 1: the process listening at {ADDRESS} accepted"), msg
    assert FLOOD in msg and "MASTER_PORT taken?" in msg, msg


def test_a_coordinator_flooded_in_this_process_says_so_itself(monkeypatch):
    note = f"the coordinator cannot accept connections: ... ({FLOOD}) keeps the job's own out"
    monkeypatch.setattr(security, "flood_note", lambda within=30.0: note)
    msg = _error(Seen(said="it accepted a connection but completed no handshake in 5 s"))
    assert msg.endswith(note), msg


def test_handshakes_closed_without_a_word_name_the_flood_among_the_causes(not_flooded_here):
    long_ago = time.monotonic() - 2 * server_check.PROBE_FOR  # asked for long enough
    closed = Seen(
        said="it closed the connection during the handshake", failures=3, first_failure=long_ago
    )
    msg = _error(closed)
    assert f"join: the process listening at {ADDRESS} is not this job's coordinator" in msg
    assert FLOOD in msg and "out of file descriptors" in msg, msg
    # asked only a moment ago, a loaded coordinator may still answer: no verdict yet
    closed.first_failure = time.monotonic()
    server_check.check(closed, True, ADDRESS, 1, "join", time.monotonic())  # type: ignore[arg-type]


def test_a_mechanism_mismatch_is_named_not_the_flood(not_flooded_here):
    msg = _error(Seen(said="it runs insecure", mismatch=True, failures=1))
    assert "COLLECTIVES_INSECURE=1" in msg and FLOOD not in msg, msg


def test_nothing_known_is_no_error(not_flooded_here):
    server_check.check(Seen(), True, ADDRESS, 1, "join", time.monotonic())  # type: ignore[arg-type]
    server_check.check(None, True, ADDRESS, 1, "join", time.monotonic())


def test_why_silent_names_the_flood(not_flooded_here):
    assert FLOOD in server_check.why_silent(None)
    connected = Seen(connected_at=time.monotonic())
    said = server_check.why_silent(connected)  # type: ignore[arg-type]
    assert said.startswith("it accepted a connection but completed no handshake") and FLOOD in said


def test_out_of_files_while_opening_sockets_names_the_flood(not_flooded_here):
    """A rank whose own servers noted no flood yet still names it among the causes: the
    flood may have taken its files before any accept failed."""
    err = sockets_failed(OSError(errno.EMFILE, "Too many open files"), "init_process_group", 0, 0)
    msg = str(err)
    assert msg.startswith("init_process_group: rank 0 cannot open its sockets for generation 0")
    assert FLOOD in msg and "limit" in msg, msg
