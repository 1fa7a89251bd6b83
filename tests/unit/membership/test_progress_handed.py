"""A stalled or failed op hands its rank's progress to membership with the call.

Invariant: the group's op runner (group/judge.py: blame, settle) passes the transport's
progress, taken as it asks, to the judge and the arbiter; the client
(membership/client.py) builds its diagnose, outcome and progress requests from that record and
never reads the transport back for them -- the crossing the rank machine's OpStalled and
OpFailed events carry the same way (membership/rank.py; docs/failure_paths.md counts it).
In-process: no coordinator; the client's request socket is stood in for.
"""

from __future__ import annotations

import pytest

from collectives.membership.client import CoordinatorClient
from collectives.membership.protocol import (
    Diagnose,
    Outcome,
    OutcomeAnswer,
    Progress as ProgressMsg,
    Verdict,
    decode_request,
)
from collectives.common.errors import CollectiveTimeout
from collectives.group import judge as judging
from collectives.transport.base import LACKED, Progress
from collectives.transport.channel import OpChannel
from collectives.transport.inproc import InprocWorld
from collectives.transport.stall import Stall

pytestmark = [pytest.mark.fast, pytest.mark.timeout(20)]

HANDED = Progress(7, 4, True, 2, (1, 0, 3), (0, 0, 2), False, ((3, 1),), (0.5, None, 0.25))


class _Recorder:
    """A judge and an arbiter that keep the progress each call was handed."""

    def __init__(self) -> None:
        self.handed: list[tuple[str, Progress]] = []

    def diagnose(self, seq, waiting_on, *, progress, prober, timeout):
        self.handed.append(("diagnose", progress))
        return [waiting_on], "sent nothing", False

    def outcome(self, seq, timeout, progress):
        self.handed.append(("outcome", progress))
        return "commit"

    def publish(self, progress):
        self.handed.append(("publish", progress))


def _stalled_op() -> OpChannel:
    """Op #4 of rank 1 of 3, generation 7, past its deadline waiting on rank 2."""
    t = InprocWorld(3, generation=7).transport(1)
    return OpChannel(t, 4, None, "all_reduce", 1.0).begin()


def test_the_group_hands_the_transports_progress_with_each_call():
    rec = _Recorder()
    ch = _stalled_op()
    stall = Stall(4, 2, "waiting for rank 2", ch.where(), ch.t.progress())
    judging.blame(rec, ch.t, ch, stall)
    ch.abandon()
    judging.settle(rec, ch.t, ch, TimeoutError("not settled"))  # a failure: published at once
    ch.hold_result()  # as if held: its outcome is asked
    judging.settle(rec, ch.t, ch, CollectiveTimeout("timed out", op="all_reduce", rank=1))
    assert [what for what, _ in rec.handed] == ["diagnose", "publish", "outcome"]
    for what, progress in rec.handed:
        assert progress.generation == 7, what
    assert (4, LACKED) not in rec.handed[0][1].done  # taken at the call, not later
    assert (4, LACKED) in rec.handed[1][1].done
    assert (4, LACKED) in rec.handed[2][1].done


class _NoReadBack:
    """A transport whose progress must not be read: the client has it from the call."""

    rank, size, generation, failure = 1, 3, 7, None

    def progress(self):
        raise AssertionError("the client read the transport's progress back")


class _Sent:
    """The client's socket, for publish(): keeps what is sent."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send(self, data: bytes, flags: int = 0) -> None:
        self.sent.append(data)

    def close(self, linger: int = 0) -> None:
        pass


@pytest.fixture
def client(monkeypatch):
    c = CoordinatorClient("127.0.0.1:9", 1, 3, keys=None)  # nothing listens: nothing is sent
    c.transport = _NoReadBack()
    asked: list = []
    answers: list = []

    def send(data, deadline, op):  # the request socket: keep the ask, queue its answer
        msg = decode_request(data)
        asked.append(msg)
        seq = msg.report.seq
        if isinstance(msg, Outcome):
            answers.append(OutcomeAnswer(seq=seq, verdict="commit"))
        else:
            answers.append(
                Verdict(seq=seq, culprits=[2], why="sent nothing", evicted=True, stall=True)
            )
        return True

    monkeypatch.setattr(c, "_send", send)
    monkeypatch.setattr(c, "_next_reply", lambda wait, op: answers.pop(0) if answers else None)
    c.asked = asked
    yield c
    c.close()


def test_the_client_builds_its_requests_from_the_progress_handed(client, monkeypatch):
    culprits, _, evicted = client.diagnose(5, 2, progress=HANDED, timeout=1.0)
    assert (culprits, evicted) == ([2], "stalled")
    assert client.outcome(5, 1.0, HANDED) == "commit"
    real, sock = client.sock, _Sent()
    monkeypatch.setattr(client, "sock", sock)
    client.publish(HANDED)
    monkeypatch.setattr(client, "sock", real)

    diagnose, outcome = client.asked
    assert isinstance(diagnose, Diagnose) and isinstance(outcome, Outcome)
    (published,) = [decode_request(raw) for raw in sock.sent]
    assert isinstance(published, ProgressMsg)
    for report in (diagnose.report, outcome.report, published.report):
        assert report.generation == 7
        assert report.sent == [1, 0, 3] and report.recv == [0, 0, 2]
        assert report.done == [(3, 1)] and report.sent_age == [0.5, None, 0.25]
    assert (diagnose.report.seq, diagnose.report.waiting_on) == (5, 2)
    assert outcome.report.seq == 5 and published.report.seq == 4
