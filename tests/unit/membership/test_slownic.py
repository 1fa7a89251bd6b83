"""A NIC behind its peers short of the fail-slow flag (membership/slownic.py), and the
coordinator's plan around it (membership/reroute.py, algorithms/schedule.py plan_for_nics), on
synthetic figures.

Invariants: a rank whose every judged link, in and out, runs at half the pace of the links
between the others, steadily for the sustain time, is named behind, and the coordinator
proposes the ring with its chunks sized by bandwidth (that rank owning the larger share); a
clean run -- every link slowed together (a busy CPU), or noisy figures, one rank's links
slower now and then -- names nobody and proposes nothing; a single slow link is not a NIC;
a rank back at its peers' pace is cleared after the clear time, and the default returns."""

import random

import pytest

from collectives.algorithms.schedule import Plan
from collectives.membership.failslow import Detector
from collectives.membership.reroute import Reroute
from collectives.membership.slownic import Behind, CaughtUp, NicJudge, NicThresholds, nic_costs
from collectives.transport.linkstats import LinkCounters
from support.reroute import notes as said
from support.reroute import tick, told

HEALTHY = 250e6  # bytes/s: 2 Gbit/s
MB = 1 << 20
RING4 = [(0, 1), (1, 2), (2, 3), (3, 0)]  # the links a ring of 4 in rank order carries


class Feed:
    """Cumulative counters per link, fed to a detector as beats every `dt` seconds
    (test_failslow_detector.py's)."""

    def __init__(self, det, links):
        self.det, self.links = det, links
        self.tot = {k: [0, 0.0] for k in links}
        self.now = 0.0

    def run(self, seconds, rate_of, dt=0.25, per_beat=4 * MB, judge=True):
        for _ in range(int(round(seconds / dt))):
            self.now += dt
            for (a, b), t in self.tot.items():
                rate = rate_of(a, b)
                moved = min(per_beat, int(rate * dt))
                t[0] += moved
                t[1] += moved / rate
            for r in {b for _, b in self.links}:
                rows = [
                    LinkCounters(a, *self.tot[(a, b)], 0, 0.0, 0.0) for a, b in self.links if b == r
                ]
                self.det.beat(r, rows, self.now)
            if judge:
                self.det.evaluate(self.now)


def _judge(judge, det, rates, seconds, dt=0.25):
    """Feed a detector and judge its window figures every dt; every event."""
    f = Feed(det, RING4)
    events = []
    for _ in range(int(round(seconds / dt))):
        f.run(dt, rates, dt=dt)
        events += judge.evaluate(det.window_rates, f.now, det.newest_rates)
    return events


def _at(k, rank=2):
    return lambda a, b: HEALTHY / k if rank in (a, b) else HEALTHY


@pytest.mark.timeout(30)
def test_a_nic_at_half_speed_is_named_after_the_sustain_time_and_cleared_once_back():
    det, judge = Detector(4), NicJudge(4)
    th = NicThresholds()
    f = Feed(det, RING4)
    events = []

    def go(seconds, rate_of):
        for _ in range(int(round(seconds / 0.25))):
            f.run(0.25, rate_of)
            events.extend(
                (f.now, e) for e in judge.evaluate(det.window_rates, f.now, det.newest_rates)
            )

    go(5, _at(1.0))
    assert events == []
    slowed = f.now
    go(10, _at(2.0))
    assert [type(e) for _, e in events] == [Behind] and events[0][1].figures.rank == 2
    named = events[0][0] - slowed
    assert th.sustain <= named <= th.sustain + 3.5  # the window fills, then the sustain time
    assert events[0][1].figures.others / events[0][1].figures.mine == pytest.approx(2, rel=0.05)
    assert not det.flagged()  # half speed is no flag of failslow.py's (a quarter)
    go(10, _at(1.0))
    assert [type(e) for _, e in events] == [Behind, CaughtUp]
    assert events[1][0] - f.now + 10 >= th.clear_sustain


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "rate_of",
    [
        lambda a, b: HEALTHY / 10,  # every link slowed together: a busy CPU
        lambda a, b: HEALTHY / 3 if (a, b) == (1, 2) else HEALTHY,  # one slow link, not a NIC
    ],
)
def test_no_nic_is_named_on_a_clean_or_single_link_slowdown(rate_of):
    det, judge = Detector(4), NicJudge(4)
    assert _judge(judge, det, rate_of, 20) == []


@pytest.mark.timeout(60)
def test_ten_minutes_of_noisy_figures_name_nobody():
    """Each beat a link's pace is drawn between 0.5x and 1.5x of healthy, and every few
    seconds one rank's links all run at half for up to 2 s (descheduled, on a busy machine):
    nobody is named (a spell shorter than the sustain time, however deep, is no verdict)."""
    rng = random.Random(7)
    det, judge = Detector(4), NicJudge(4)
    f = Feed(det, RING4)
    events = []
    hit, spell = None, 0
    for _ in range(4 * 600):
        if spell == 0:
            hit, spell = (rng.randrange(4), rng.randint(1, 8)) if hit is None else (None, 8)
        spell -= 1
        noise = {k: rng.uniform(0.5, 1.5) for k in RING4}
        f.run(
            0.25,
            lambda a, b: HEALTHY * noise[(a, b)] / (2 if hit in (a, b) else 1),
        )
        events += judge.evaluate(det.window_rates, f.now, det.newest_rates)
    assert events == []


@pytest.mark.timeout(30)
def test_the_costs_price_the_nic_and_the_others_at_their_own_pace():
    rates = {(0, 1): 200e6, (3, 0): 220e6, (1, 2): 100e6, (2, 3): 110e6}
    c = nic_costs(4, [2], rates, {})
    assert c is not None and c.rate == pytest.approx(210e6, rel=0.01)
    assert c.rate_of(1, 2) == pytest.approx(100e6, rel=0.01)
    assert c.rate_of(2, 0) == pytest.approx(105e6, rel=0.01)  # not judged: the NIC's median
    assert c.rate_of(0, 1) == pytest.approx(210e6, rel=0.01)
    assert nic_costs(4, [2], {(1, 2): 1e6, (2, 3): 1e6}) is None  # nothing to compare with


def _ticks(r, f, seconds, rate_of, seq, dt=0.25):
    """Beats and ticks every dt, every proposal answered yes; the notes and the proposals."""
    notes, props = [], []
    for _ in range(int(round(seconds / dt))):
        f.run(dt, rate_of, dt=dt, judge=False)
        for rank in range(r.size):
            r.beat(rank, seq, [], f.now)
        out = tick(r, f.now)
        for msg in told(out, "schedule"):
            props.append(msg)
            for rank in range(r.size):
                r.ack(rank, msg.version, True)
        out += tick(r, f.now)
        notes += said(out)
        seq += 1
    return notes, props


@pytest.mark.timeout(30)
def test_the_coordinator_sizes_the_ring_around_a_nic_at_half_and_goes_back_when_it_recovers():
    r = Reroute(4, 0)
    f = Feed(r.detector, RING4)
    notes, props = _ticks(r, f, 5, _at(1.0), 10)
    assert notes == [] and props == []
    notes, props = _ticks(r, f, 10, _at(2.0), 30)
    assert any("rank 2's NIC runs behind its peers" in x for x in notes), notes
    (prop,) = props
    plan = Plan.from_wire(prop.plan, 4)
    assert plan is not None and plan.weights and max(plan.weights) == plan.weights[2]
    assert any("chunks sized by bandwidth" in x for x in notes), notes
    assert r.current == plan and r.retry_at is None  # its links still carry figures: no trial
    notes, props = _ticks(r, f, 10, _at(1.0), 80)
    assert any("back to its peers' pace" in x for x in notes), notes
    assert [p.plan for p in props] == [None] and r.current is None


@pytest.mark.timeout(30)
def test_a_nic_behind_its_peers_hides_no_link_flagged_at_its_rank():
    """A NIC at half (judged behind, its ring sized around it), then one of its links at a
    fortieth: the link is routed around, not left in the schedule as the NIC's (the
    simulator's sweep found it kept for good: tests/unit/simulation/test_failslow_sim.py)."""
    r = Reroute(4, 0)
    f = Feed(r.detector, RING4)
    notes, props = _ticks(r, f, 10, _at(2.0), 10)
    assert any("rank 2's NIC runs behind its peers" in x for x in notes), notes

    def link_too(a: int, b: int) -> float:
        return HEALTHY / 40 if (a, b) == (1, 2) else _at(2.0)(a, b)

    notes, props = _ticks(r, f, 10, link_too, 60)
    assert any("link 1->2 flagged as slow" in x for x in notes), notes
    plan = Plan.from_wire(props[-1].plan, 4)
    assert plan is not None and (1, 2) in plan.avoided and plan.avoids
    assert r.current == plan
