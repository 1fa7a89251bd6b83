"""A closed heartbeat connection as a witness of death, judged by the machine on its own clock
(collectives/membership/connections.py): the shell only reports what its socket monitor saw."""

from __future__ import annotations

import pytest

from collectives.membership.connections import GRACE, GRACE_MAX
from collectives.membership.machine import Connection, PidWatch
from support.machine import Driver

pytestmark = [pytest.mark.fast, pytest.mark.timeout(30)]


def formed(n: int = 3) -> Driver:
    d = Driver(n)
    d.join_all()
    for r in range(n):
        d.beat(f"m{r}")  # on routing id b"hb-m<r>"
    return d


def feed(d: Driver, event: object) -> None:
    d.effects += d.machine.feed(event, d.now)  # type: ignore[arg-type]


def failures(d: Driver) -> list:
    return sorted(
        {r for e in d.effects if hasattr(e, "msg") for r in e.msg.get("failed_ranks", ())}
    )


def test_a_connection_that_stays_closed_is_a_death_after_the_grace():
    d = formed()
    feed(d, Connection(7, "closed", b"hb-m2"))
    d.tick(GRACE / 2)
    assert "m2" not in d.s.failed
    d.tick(GRACE)
    assert "m2" in d.s.failed and "connection to the coordinator closed" in d.s.failed["m2"]
    assert failures(d) == [2]


def test_a_beat_on_a_new_connection_within_the_grace_is_no_death():
    d = formed()
    feed(d, Connection(7, "closed", b"hb-m2"))
    d.tick(GRACE / 2)
    d.arrive(
        b"hb-m2-again",
        {
            "t": "beat",
            "mid": "m2",
            "generation": 0,
            "seq": -1,
            "in_op": False,
            "waiting_on": None,
            "sent": None,
            "recv": None,
        },
    )
    d.tick(GRACE_MAX * 2)
    assert d.s.failed == {} and d.s.connections.down == {}


def test_a_newer_connection_still_in_its_handshake_extends_the_grace():
    """It may be the same member's, its handshake slow on a loaded host."""
    d = formed()
    feed(d, Connection(7, "closed", b"hb-m2"))
    feed(d, Connection(8, "opened"))
    d.tick((GRACE + GRACE_MAX) / 2)  # past the grace, within the longer one
    assert "m2" not in d.s.failed
    d.tick(GRACE_MAX)
    assert "m2" in d.s.failed


def test_a_process_watched_through_its_pidfd_is_never_declared_on_its_connection():
    d = formed()
    feed(d, PidWatch("m2", True))
    feed(d, Connection(7, "closed", b"hb-m2"))
    d.tick(GRACE_MAX * 2)
    assert d.s.failed == {}
    # and once the watch is closed, the connection witnesses again
    feed(d, PidWatch("m2", False))
    feed(d, Connection(9, "closed", b"hb-m2"))
    d.tick(GRACE * 2)
    assert "m2" in d.s.failed


def test_a_connection_nobody_owns_closing_says_nothing():
    d = formed()
    feed(d, Connection(7, "closed", b"a-stranger"))
    feed(d, Connection(8, "closed", None))
    d.tick(GRACE_MAX * 2)
    assert d.s.failed == {} and d.s.connections.down == {}
