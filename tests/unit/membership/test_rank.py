"""The rank's side as a machine (membership/rank.py), driven event by event: what it sends,
when it answers, what it raises, and the error state a transition that raises leaves."""

from __future__ import annotations

import msgspec
import pytest

from collectives.membership import protocol as p
from collectives.membership import rank as r
from collectives.membership.link import LinkState

pytestmark = [pytest.mark.fast, pytest.mark.timeout(10)]

MID = "a" * 32
REP = p.Report(generation=0, seq=4, in_op=True, waiting_on=2)


def member(rank: int = 1, size: int = 3) -> r.RankMachine:
    m = r.machine(MID, "h:1", heartbeat_interval=0.5, heartbeat_timeout=2.0, grace=10.0, pid=7)
    m.feed(r.NewGroup(0, rank, size), 0.0)
    return m


def sends(effects: list[r.Effect]) -> list[p.Request]:
    return [e.request for e in effects if isinstance(e, r.Send)]


def test_beats_on_its_interval_only():
    m = member()
    first = m.feed(r.Tick(REP), 0.0)
    assert sends(first) == [p.Beat(mid=MID, report=REP)]
    assert sends(m.feed(r.Tick(REP), 0.3)) == []
    assert sends(m.feed(r.Tick(REP), 0.5)) == [p.Beat(mid=MID, report=REP)]


def test_the_fail_slow_side_beats_figures_books_a_schedule_and_answers_it():
    """The fail-slow path through the machine: a tick's link figures go out in the beat (the
    detector's input), a schedule notice goes to the book, the book's answer goes back, a
    link test goes to the transport's link tests."""
    m = member()
    rows = ((0, 1 << 21, 0.5, 3, 0.01, 0.0), (2, 1 << 21, 2.5, 3, 0.04, 0.0))
    (beat,) = sends(m.feed(r.Tick(REP, rows), 0.0))
    assert isinstance(beat, p.Beat) and [tuple(x) for x in beat.links] == list(rows)
    proposal = p.Schedule(generation=0, version=3, start=9, plan=None)
    assert m.feed(r.Received(proposal, "heartbeat", REP), 0.1) == [r.ToBook(proposal)]
    answer = m.feed(r.SchedAnswer(0, 3, True), 0.1)
    assert answer == [r.Send(p.SchedAck(mid=MID, generation=0, version=3, ok=True), "heartbeat")]
    go = p.SchedGo(generation=0, version=3)
    assert m.feed(r.Received(go, "heartbeat", REP), 0.2) == [r.ToBook(go)]
    # a routed-around link's test goes to the transport's link tests, which pick this
    # rank's frames (slowlinks.on_test)
    test = p.TestLinks(generation=0, token=1, links=[(0, 1), (2, 1)], bytes=1 << 18, frames=4)
    assert m.feed(r.Received(test, "heartbeat", REP), 0.3) == [r.ToTests(test)]


def test_a_ping_is_answered_with_its_token():
    m = member()
    out = m.feed(r.Received(p.Ping(token=9), "heartbeat", REP), 1.0)
    assert out == [r.Send(p.State(mid=MID, report=REP, token=9), "heartbeat")]


def test_a_stall_asks_then_probes_then_blames():
    m = member()
    (ask,) = sends(m.feed(r.OpStalled(4, 2, REP, timeout=3.0, can_probe=True), 1.0))
    assert isinstance(ask, p.Diagnose) and ask.probe and ask.report.seq == 4
    # an answer about another op is skipped
    old = p.Verdict(seq=3, culprits=[0], why="old", evicted=True)
    assert m.feed(r.Received(old, "request", REP), 1.1) == []
    probe = p.Probe(seq=4, token=5, peers=[0, 2, 9], bytes=1 << 30, window=99.0)
    (run,) = m.feed(r.Received(probe, "request", REP), 1.2)
    assert run == r.RunProbes(4, 5, (0, 2), r.MAX_PROBE_BYTES, r.MAX_PROBE_WINDOW)
    (probed,) = sends(m.feed(r.ProbesDone(5, (0.01, None, None), 0.5), 1.7))
    assert isinstance(probed, p.Probed) and probed.heard == [0.01, None, None]
    verdict = p.Verdict(seq=4, culprits=[2], why="2 -> 1 stalled", evicted=True, stall=True)
    out = m.feed(r.Received(verdict, "request", REP), 1.8)
    assert out == [r.Blame(4, (2,), "2 -> 1 stalled", "stalled")]
    assert m.state.pending is None


def test_no_verdict_in_time_fails_the_diagnosis():
    m = member()
    m.feed(r.OpStalled(4, 2, REP, timeout=1.0, can_probe=False), 0.0)
    wait = max(2.0, 4 * 0.5) + 2 * 1.0
    assert not [e for e in m.feed(r.Tick(REP), wait - 0.01) if isinstance(e, r.Failed)]
    failed = [e for e in m.feed(r.Tick(REP), wait) if isinstance(e, r.Failed)]
    assert len(failed) == 1 and failed[0].fault.kind == "Timeout"
    assert "rank 1" in failed[0].fault.message  # names the rank


def test_the_op_threads_clock_ends_a_request_as_a_tick_does_but_never_beats():
    """Waiting (a shell whose beats run elsewhere: the client) applies the tick's request
    rules -- the deadline, not while the coordinator is away, and the grace -- and Resume asks
    the request again with the whole timeout, as a re-registration's answer does."""
    m = member()
    m.feed(r.OpStalled(4, 2, REP, timeout=1.0, can_probe=False), 0.0)
    wait = max(2.0, 4 * 0.5) + 2 * 1.0
    assert m.feed(r.Waiting(), wait - 0.01) == []  # no beat, though one is due
    m.feed(r.Gone(), wait - 0.01)
    assert not [e for e in m.feed(r.Waiting(), wait + 1.0) if isinstance(e, r.Failed)]
    m.state.link.came_back(wait + 2.0)  # the heartbeat side saw it (restart.Watch)
    (again,) = sends(m.feed(r.Resume(), wait + 2.0))
    assert isinstance(again, p.Diagnose) and again.waited == pytest.approx(wait + 2.0)
    m.feed(r.Gone(), wait + 2.5)
    assert m.state.link.overdue(wait + 12.51) is not None  # past the grace (restart.Watch)
    lost = m.feed(r.Waiting(), wait + 12.51)
    assert [e.fault.kind for e in lost if isinstance(e, r.Failed)] == ["CoordinatorLost"]


def test_a_failure_notice_interrupts_its_generation_only():
    m = member()
    other = p.Failure(generation=5, failed_ranks=[2], reason="died")
    assert m.feed(r.Received(other, "heartbeat", REP), 1.0) == []
    mine = p.Failure(generation=0, failed_ranks=[2], reason="stalled", op=4)
    (irq,) = m.feed(r.Received(mine, "heartbeat", REP), 1.0)
    assert isinstance(irq, r.Interrupt) and irq.fault.kind == "PeerTimeout"
    assert irq.fault.failed_ranks == (2,)


def test_reconstruct_answered_and_address_carries_the_pid():
    m = member()
    (rec,) = sends(m.feed(r.AskReconstruct(0, REP, timeout=5.0, exclude=(2, 0)), 1.0))
    assert isinstance(rec, p.Reconstruct) and rec.exclude == [0, 2]
    regroup = p.Regroup(generation=1, rank=0, world_size=2)
    assert m.feed(r.Received(regroup, "request", REP), 1.5) == [r.Replied("reconstruct", regroup)]
    (addr,) = sends(m.feed(r.AskAddress(1, p.Info(tcp="tcp://x:1"), timeout=5.0), 1.6))
    assert isinstance(addr, p.Address) and addr.info.pid == 7 and m.state.link.forming == 1
    welcome = p.Welcome(generation=1, infos=[], members=[MID, "b" * 32])
    m.feed(r.Received(welcome, "request", REP), 1.7)
    assert m.state.link.forming == -1 and m.state.link.members == {1: [MID, "b" * 32]}


def test_an_error_answer_fails_the_request_naming_the_rank():
    m = member()
    m.feed(r.AskOutcome(4, REP, timeout=1.0), 0.0)
    (failed,) = m.feed(r.Received(p.Error(message="no"), "request", REP), 0.1)
    assert isinstance(failed, r.Failed) and failed.fault.kind == "CollectiveError"
    assert "outcome" in failed.fault.message and "rank 1" in failed.fault.message


def test_coordinator_gone_back_rejoins_and_resends():
    m = member()
    m.feed(r.AskJoin(1, 3, p.Info(), timeout=5.0), 0.0)
    m.feed(r.Received(p.Welcome(generation=0, infos=[], members=[MID] * 3), "request", REP), 0)
    m.feed(r.Back(REP), 0.0)
    m.feed(r.AskOutcome(4, REP, timeout=1.0), 0.1)
    gone = m.feed(r.Gone(), 1.0)
    assert [e for e in gone if isinstance(e, r.Note) and e.warn]
    out = m.feed(r.Back(REP), 3.0)
    (rejoin,) = [q for q in sends(out) if isinstance(q, p.Rejoin)]
    assert rejoin.rank == 1 and rejoin.world_size == 3
    assert rejoin.host is None  # its address named none
    back = m.feed(r.Received(p.Rejoined(generation=0), "heartbeat", REP), 3.1)
    assert [q for q in sends(back) if isinstance(q, p.Outcome)]  # the request asked again
    assert m.state.rejoin_due is None


def test_a_rejoin_names_the_host_of_the_members_last_address():
    """A restarted coordinator keeps slow links by host (membership/hostlinks.py): the
    re-registration names the host the member's last address named. The request side's
    machine gives the addresses and the heartbeat side's re-registers (client.py,
    heartbeat.py): two machines over one link."""
    m = member()
    beats = r.RankMachine(r.RankState(MID, 0.5, 2.0, m.state.link))
    beats.feed(r.NewGroup(0, 1, 3), 0.0)
    m.feed(r.AskJoin(1, 3, p.Info(host="node-a:1"), timeout=5.0), 0.0)
    m.feed(r.Received(p.Welcome(generation=0, infos=[], members=[MID] * 3), "request", REP), 0)
    m.feed(r.AskAddress(1, p.Info(host="node-b:2"), timeout=5.0), 0.1)  # a regroup's address
    beats.feed(r.Back(REP), 0.2)
    beats.feed(r.Gone(), 1.0)
    (rejoin,) = [q for q in sends(beats.feed(r.Back(REP), 3.0)) if isinstance(q, p.Rejoin)]
    assert rejoin.host == "node-b:2"


def test_coordinator_lost_past_the_grace():
    m = member()
    m.feed(r.Back(REP), 0.0)
    m.feed(r.AskOutcome(4, REP, timeout=100.0), 0.0)
    m.feed(r.Gone(), 1.0)
    out = m.feed(r.Tick(REP), 11.5)
    kinds = {e.fault.kind for e in out if isinstance(e, (r.Interrupt, r.Failed))}
    assert kinds == {"CoordinatorLost"}


class BrokenLink(LinkState):
    def went_away(self, now: float) -> bool:
        raise RuntimeError("broken")


def test_a_transition_that_raises_leaves_the_error_state():
    m = member()
    m.feed(r.AskOutcome(4, REP, timeout=1.0), 0.0)
    m.state.link = BrokenLink("h:1", 10.0)
    out = m.feed(r.Gone(), 1.0)
    assert m.error == r.Stopped("Gone", "RuntimeError('broken')")
    assert m.state.pending is None
    note, failed = out
    assert isinstance(note, r.Note) and note.warn and "rank 1" in note.what
    assert isinstance(failed, r.Failed) and failed.fault.kind == "CollectiveError"
    # refused from now on, with a note, nothing sent
    (refused,) = m.feed(r.Tick(REP), 2.0)
    assert isinstance(refused, r.Note) and "membership machine stopped" in refused.what


def test_records_round_trip_the_wire():
    m = member()
    for q in sends(m.feed(r.OpStalled(4, 2, REP, timeout=0.0, can_probe=False), 1.0)):
        assert p.decode_request(p.pack(q)) == q
    assert msgspec.structs.replace(REP, seq=1).seq == 1


def test_a_deadline_passed_while_the_coordinator_is_away_is_not_due():
    """A shell ticks at due(): a request past its deadline waits for the coordinator (or the
    grace) while it is away, so due() must not name that deadline, or the shell ticks again
    and again at the same instant (the simulator's sweep never ended so: seed 680)."""
    m = member()
    m.feed(r.Back(REP), 0.0)
    m.feed(r.OpStalled(4, 2, REP, timeout=1.0, can_probe=False), 0.0)
    m.feed(r.Gone(), 0.5)
    m.feed(r.Tick(REP), 5.0)  # past the diagnosis' deadline (4 s), within the grace (10 s)
    assert m.state.pending is not None
    assert m.due() > 5.0


def test_a_joins_timeout_holds_while_the_coordinator_is_away():
    """A join's deadline is hard (Pending.until): asked again when the coordinator is back,
    it keeps its end, and it fails at that end even while the coordinator is away -- where a
    reconstruct waits for the coordinator (the grace bounds it)."""
    m = r.machine(MID, "h:1", heartbeat_interval=0.5, heartbeat_timeout=2.0, grace=10.0)
    (join,) = sends(m.feed(r.AskJoin(1, 3, p.Info(rank=1), 5.0), 0.0))
    assert isinstance(join, p.Join) and join.rank == 1
    m.state.link.came_back(1.0)
    (again,) = sends(m.feed(r.Resume(), 1.0))
    assert again == join and m.state.pending.deadline == 5.0  # not 1.0 + 5.0
    m.feed(r.Gone(), 2.0)
    assert m.due() <= 5.0  # the join's end wakes the shell, away or not
    assert m.feed(r.Waiting(), 4.99) == []
    (failed,) = m.feed(r.Waiting(), 5.0)
    assert isinstance(failed, r.Failed) and failed.fault.kind == "Timeout"
    assert failed.request == "join" and "rank 1" in failed.fault.message

    rec = member()
    rec.feed(r.AskReconstruct(0, REP, 1.0), 0.0)
    rec.feed(r.Gone(), 1.0)
    assert rec.feed(r.Waiting(), 7.0) == []  # past its deadline: waits for the coordinator
