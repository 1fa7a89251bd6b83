"""A member's side, without sockets: the coordinator's comings and goings as the member sees
them (membership/link.py) and what a notice on the heartbeat socket makes the transport raise
(heartbeat.notice_error)."""

from __future__ import annotations

from types import SimpleNamespace

import msgspec
import pytest

from collectives.common.errors import Evicted, PeerFailure, PeerTimeout
from collectives.membership import protocol, rank
from collectives.membership.heartbeat import notice_error
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


def transport(generation=3, rank=1, failure=None):
    return SimpleNamespace(generation=generation, rank=rank, size=3, failure=failure)


def test_a_failure_notice_of_this_generation_is_a_peer_failure():
    msg = protocol.Failure(generation=3, failed_ranks=[2], reason="died", op=None)
    err = notice_error(msg, transport())
    assert type(err) is PeerFailure and err.failed_ranks == (2,) and "died" in str(err)
    stalled = notice_error(msgspec.structs.replace(msg, op=7), transport())
    assert isinstance(stalled, PeerTimeout)  # as the rank whose deadline fired raises
    other = msgspec.structs.replace(msg, generation=2)
    assert notice_error(other, transport()) is None  # another generation
    assert notice_error(msg, None) is None  # a joiner: no group to interrupt


def test_an_eviction_is_raised_once():
    err = notice_error(protocol.Evicted(reason="stalled"), transport())
    assert isinstance(err, Evicted) and err.failed_ranks == (1,)
    again = protocol.Evicted(reason="again")
    assert notice_error(again, transport(failure=err)) is None


def test_the_notice_rule_is_the_rank_machines(monkeypatch):
    """The heartbeat thread raises what the rank machine's rule (rank.notice_fault, the one the
    simulator runs) says a notice means: one rule, not a copy of it."""
    said = rank.Fault("PeerTimeout", "as the machine says", (0,), 3, 1, graceful=True)
    monkeypatch.setattr(rank, "notice_fault", lambda msg, group: said)
    err = notice_error(protocol.Ping(), transport())
    assert type(err) is PeerTimeout and str(err).startswith("as the machine says")
    assert err.failed_ranks == (0,) and err.graceful and err.peer == 0
