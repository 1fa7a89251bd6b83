"""A stalled op is judged, and a failed one settled, by the group (group/judge.py), not by the
transport (transport/stall.py):

* a collective's channel stops at its deadline and reports the stall to the group's op
  runner, which asks the Judge the group was given -- with this rank's progress, taken as it
  asks, and the channel's prober -- and raises what the verdict calls for; while the judge
  works, the progress the heartbeats read still shows the op stalled, waiting on that peer;
* without a judge (a bare group, no coordinator), or with one that cannot answer, the peer
  waited on is blamed, as before;
* a point-to-point receive that starves blames its sender, and no judge is asked;
* an op that failed where this rank held its result is settled by the group's Arbiter, and a
  failed end is published, each with the progress taken as the group asks;
* the transport module keeps no Diagnoser or Arbiter, and a Transport no diagnose or settle.

In-process, two ranks, rank 1 never calls: nothing here is timed, the op's deadline only
bounds a wait that must fail.
"""

from __future__ import annotations

import numpy as np
import pytest

import collectives as cl
from collectives.common.errors import CollectiveTimeout, Evicted, PeerTimeout
from collectives.group import judge as judging
from collectives.transport import base
from collectives.transport.base import ABANDONED, COMPLETED, LACKED, Progress
from collectives.transport.channel import OpChannel
from collectives.transport.inproc import InprocWorld
from collectives.transport.wire import Descriptor
from support.timing import scaled

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]

PROBE_WINDOW = 0.05  # s: the probe round the fake judge runs (rank 1 never answers it)


class FakeJudge:
    """Blames whom it is told to, after running the channel's prober; keeps what it saw."""

    def __init__(self, culprits: list[int], why: str, evicted: bool | str):
        self.verdict = (culprits, why, evicted)
        self.transport = None
        self.asked: list[tuple[int, int | None, Progress, float | None]] = []
        self.read_meanwhile: list[Progress] = []  # what a heartbeat would read while judged
        self.probed: list[dict[int, float | None]] = []

    def diagnose(self, seq, waiting_on, *, progress, prober, timeout):
        self.asked.append((seq, waiting_on, progress, timeout))
        if self.transport is not None:
            self.read_meanwhile.append(self.transport.progress())
        if prober is not None:
            self.probed.append(prober(7, [1], 0, PROBE_WINDOW))
        return self.verdict


class Unreachable:
    """A judge whose coordinator cannot be reached."""

    def diagnose(self, seq, waiting_on, *, progress, prober, timeout):
        raise ConnectionError("no coordinator")


def _group(judge=None, timeout: float = 0.5) -> cl.ProcessGroup:
    world = InprocWorld(2)
    world.transport(1)  # rank 1 exists, but never calls
    return cl.ProcessGroup(world.transport(0), timeout=scaled(timeout), judge=judge)


def test_a_stall_reaches_the_groups_judge_and_its_verdict_is_raised():
    judge = FakeJudge([1], "was judged by the group", "stalled")
    pg = _group(judge)
    judge.transport = pg.transport  # read while it judges, as the heartbeats read it
    try:
        with pytest.raises(PeerTimeout) as info:
            pg.all_reduce(np.ones(4, np.float32))
    finally:
        pg.destroy()
    exc = info.value
    assert "rank 1 was judged by the group; evicted, call reconstruct() to go on" in str(exc)
    assert tuple(exc.failed_ranks) == (1,) and exc.peer == 1 and exc.rank == 0
    ((seq, waiting_on, handed, timeout),) = judge.asked
    assert (seq, waiting_on, timeout) == (0, 1, scaled(0.5))
    # handed and read while judged: the op is not abandoned yet, it still waits on rank 1
    for progress in (handed, *judge.read_meanwhile):
        assert (progress.seq, progress.in_op, progress.waiting_on) == (0, True, 1)
    assert judge.probed == [{1: None}]  # the prober ran over the stalled op's transport
    after = pg.transport.progress()
    assert (after.in_op, after.waiting_on) == (False, None)  # abandoned once judged
    assert (0, LACKED) in after.done


def test_the_verdict_may_evict_this_rank():
    pg = _group(FakeJudge([0], "was slow", "stalled"))
    try:
        with pytest.raises(Evicted, match="rank 0 was slow; this rank was evicted"):
            pg.all_reduce(np.ones(4, np.float32))
    finally:
        pg.destroy()


@pytest.mark.parametrize("judge", [None, Unreachable()], ids=["no judge", "no answer"])
def test_without_a_verdict_the_peer_waited_on_is_blamed(judge):
    pg = _group(judge)
    try:
        with pytest.raises(CollectiveTimeout, match=r"\(op #0\); rank 1 sent nothing") as info:
            pg.all_reduce(np.ones(4, np.float32))
    finally:
        pg.destroy()
    assert type(info.value) is CollectiveTimeout and info.value.peer == 1


def test_a_point_to_point_receive_blames_its_sender_unjudged():
    judge = FakeJudge([0], "must not be asked", "stalled")
    pg = _group(judge)
    try:
        with pytest.raises(CollectiveTimeout, match="rank 1 sent nothing") as info:
            pg.recv(np.empty(4, np.float32), src=1)
    finally:
        pg.destroy()
    assert info.value.peer == 1 and judge.asked == []


class FakeArbiter:
    """Answers `verdict`; keeps each call and the progress it was handed."""

    def __init__(self, verdict: str | None):
        self.verdict = verdict
        self.calls: list[tuple[str, Progress]] = []

    def outcome(self, seq, timeout, progress):
        self.calls.append(("outcome", progress))
        return self.verdict

    def publish(self, progress):
        self.calls.append(("publish", progress))


def _failed_op(hold: bool) -> tuple[OpChannel, CollectiveTimeout]:
    t = InprocWorld(2).transport(0)
    desc = Descriptor("all_reduce", 4, "<f4", "sum", "direct", None)
    ch = OpChannel(t, 3, desc, "all_reduce", 1.0).begin()
    if hold:
        ch.hold_result()  # in the commit round
    ch.abandon()
    return ch, CollectiveTimeout("timed out", op="all_reduce", rank=0, peer=1)


@pytest.mark.parametrize(
    "verdict, counts, ended, asked",
    [
        ("commit", True, COMPLETED, ["outcome"]),
        ("abort", False, ABANDONED, ["outcome", "publish"]),
        (None, False, ABANDONED, ["outcome", "publish"]),
    ],
)
def test_an_op_failed_in_its_commit_round_is_settled_by_the_groups_arbiter(
    verdict, counts, ended, asked
):
    ch, exc = _failed_op(hold=True)
    arbiter = FakeArbiter(verdict)
    assert judging.settle(arbiter, ch.t, ch, exc) is counts
    assert [what for what, _ in arbiter.calls] == asked
    outcome = arbiter.calls[0][1]
    assert outcome.seq == 3 and (3, ended) not in outcome.done  # taken as it asked
    for _, published in arbiter.calls[1:]:
        assert (3, ended) in published.done  # published once recorded
    assert (3, ended) in ch.t.progress().done


def test_an_op_failed_without_its_result_is_dropped_and_published_unasked():
    ch, exc = _failed_op(hold=False)
    arbiter = FakeArbiter("commit")
    assert judging.settle(arbiter, ch.t, ch, exc) is False
    assert [what for what, _ in arbiter.calls] == ["publish"]
    assert (3, LACKED) in arbiter.calls[0][1].done


def test_the_transport_keeps_no_judge_or_arbiter():
    for name in ("Diagnoser", "Arbiter"):
        assert not hasattr(base, name), name
    for name in ("diagnose", "settle"):
        assert not hasattr(base.Transport, name), name
