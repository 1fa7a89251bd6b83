"""A member's side, without sockets: the coordinator's comings and goings as the member sees
them (membership/link.py). What a notice makes the transport raise: test_heartbeat_shell.py."""

from __future__ import annotations

import pytest

from collectives.membership.link import LinkState

pytestmark = [pytest.mark.fast, pytest.mark.timeout(10)]


def test_away_back_and_lost():
    link = LinkState("h:1", grace=10.0)
    assert link.came_back(0.0) is None and link.epoch == 1  # never went: requests resend
    assert link.went_away(5.0) and not link.went_away(6.0)  # news once
    assert link.overdue(14.0) is None  # within the grace
    assert link.came_back(8.0) == 3.0 and link.away_since is None and link.epoch == 2
    link.went_away(20.0)
    lost = link.overdue(30.5)
    assert lost is not None and "unreachable for 10.5 s" in lost and link.lost == lost
    assert link.overdue(40.0) is None  # said once


def test_a_welcome_keeps_only_the_newest_roster():
    link = LinkState("h:1", grace=1.0)
    link.welcomed(0, ["a", "b"])
    link.welcomed(1, ["a"])
    assert link.members == {1: ["a"]}
