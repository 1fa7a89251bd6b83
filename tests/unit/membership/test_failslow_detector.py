"""Fail-slow detection (membership/failslow.py), the schedule around it (algorithms/schedule.py)
and the coordinator's agreement on it (membership/reroute.py), on synthetic figures.

Invariants: a link is flagged only when it lags the median of its peers by the slow ratio,
steadily for the sustain time; a clean run whose links all slow down together (a busy CPU)
and a noisy run are never flagged; a flagged link is cleared once well for the clear time,
not before; a plan keeps off the flagged links where any ring or tree does; every rank
accepts or the proposal is dropped."""

import random
import re

import pytest

from collectives.algorithms.schedule import Plan, plan_around, ring_links, tree_links
from collectives.membership.failslow import Cleared, Detector, Flagged, Thresholds, describe
from collectives.membership.reroute import Note, Reroute, ToAll
from collectives.transport.linkstats import LinkCounters

MB = 1 << 20
RING4 = [(0, 1), (1, 2), (2, 3), (3, 0)]


class Feed:
    """Cumulative counters per link, fed to a detector as beats every `dt` seconds."""

    def __init__(self, det, links):
        self.det, self.links = det, links
        self.tot = {k: [0, 0.0] for k in links}
        self.now = 0.0

    def run(self, seconds, rate_of, dt=0.25, per_beat=4 * MB, judge=True):
        """Each link moves per_beat bytes a beat, or what its rate lets through in dt."""
        events = []
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
                events += self.det.evaluate(self.now)
        return events


def test_a_slow_link_is_flagged_after_the_sustain_time_and_named():
    det = Detector(4)
    f = Feed(det, RING4)
    assert f.run(5, lambda a, b: 200e6) == []
    ev = f.run(5, lambda a, b: 5e6 if (a, b) == (0, 1) else 200e6)
    assert [type(e) for e in ev] == [Flagged] and ev[0].link == (0, 1)
    assert "0->1" in describe(ev[0]) and "Mbit/s" in describe(ev[0])
    # the figures a schedule is priced on: the flagged link at its own, the others at theirs
    costs = det.link_costs([(0, 1)])
    assert costs.slow() == {(0, 1)} and costs.rate == pytest.approx(200e6, rel=0.01)
    assert costs.links[0].rate == pytest.approx(5e6, rel=0.01)
    # recovery clears it, after clear_sustain and not before
    th = Thresholds()
    ev = f.run(th.clear_sustain - 0.5, lambda a, b: 200e6)
    assert ev == []
    ev = f.run(th.window + 2, lambda a, b: 200e6)
    assert [type(e) for e in ev] == [Cleared] and ev[0].link == (0, 1)


def test_a_short_slowdown_is_not_flagged():
    f = Feed(Detector(4), RING4)
    f.run(3, lambda a, b: 200e6)
    assert f.run(0.5, lambda a, b: 2e6 if (a, b) == (0, 1) else 200e6) == []
    assert f.run(6, lambda a, b: 200e6) == []


def test_a_busy_cpu_slowing_every_link_and_noise_stay_quiet():
    rnd = random.Random(7)
    f = Feed(Detector(4), RING4)
    # every link 10x slower together (a busy CPU), then noisy figures: each beat's rate drawn
    # from a factor-of-3 spread, now and then one link descheduled for a beat
    assert f.run(20, lambda a, b: 20e6) == []
    noisy = lambda a, b: 200e6 * rnd.uniform(0.33, 1.0) / (20 if rnd.random() < 0.03 else 1)  # noqa: E731
    assert f.run(600, noisy) == []


def test_a_slow_nic_is_named():
    links = [(a, b) for a in range(4) for b in range(4) if a != b]
    f = Feed(Detector(4), links)
    ev = f.run(6, lambda a, b: 5e6 if 2 in (a, b) else 200e6)
    assert any(isinstance(e, Flagged) and e.rank == 2 for e in ev), ev
    assert "rank 2's NIC" in describe(next(e for e in ev if e.rank == 2))


def test_two_slow_nics_name_those_two_ranks_only():
    """Ranks 1 and 4 of 8 slow on every link: every other rank also has flagged links, in and
    out, to two peers (its links to 1 and to 4), yet those are explained by the two slow
    NICs; naming a healthy rank would have `replace` remove it."""
    links = [(a, b) for a in range(8) for b in range(8) if a != b]
    f = Feed(Detector(8), links)
    ev = f.run(6, lambda a, b: 5e6 if {a, b} & {1, 4} else 200e6)
    named = {e.rank for e in ev if isinstance(e, Flagged) and e.rank is not None}
    assert named == {1, 4}, ev


def test_plans_keep_off_the_slow_links():
    assert plan_around(4, []) is None
    p = plan_around(4, [(0, 1), (1, 0)])
    assert p.avoids and not p.tree and not ring_links(p.order) & {(0, 1), (1, 0)}
    # three ranks, one pair slow both ways: no ring avoids it, the tree rooted at 2 does
    p = plan_around(3, [(0, 1), (1, 0)])
    assert p.avoids and p.tree and p.order[0] == 2 and not tree_links(p.order) & {(0, 1), (1, 0)}
    # the seed's two links around rank 1: the reversed ring
    p = plan_around(3, [(0, 1), (1, 2)])
    assert p.avoids and not p.tree and p.order == (0, 2, 1)
    # a slow NIC: nothing avoids it; the ring as it is, at most (the tree costs more)
    nic = plan_around(3, [(1, 0), (0, 1), (1, 2), (2, 1)])
    assert nic is None or (not nic.avoids and not nic.tree and nic.order == (0, 1, 2))
    assert Plan.from_wire(p.wire(), 3) == p and Plan.from_wire(p.wire(), 4) is None
    assert Plan.from_wire("junk", 3) is None


def test_the_coordinator_agrees_a_plan_with_every_rank():
    r = Reroute(4, 0)
    f = Feed(r.detector, RING4)
    for rank in range(4):
        r.beat(rank, 10, [], 0.0)
    ev = f.run(5, lambda a, b: 5e6 if (a, b) == (0, 1) else 200e6)
    assert [e.link for e in ev] == [(0, 1)]
    out = r.tick(f.now)
    (prop,) = [o.msg for o in out if isinstance(o, ToAll)]
    assert prop.kind == "schedule" and prop.start == 11
    for rank in range(3):
        r.ack(rank, prop.version, True)
    assert r.tick(f.now) == []  # one answer missing: wait
    r.ack(3, prop.version, True)
    out = r.tick(f.now)
    assert [o.msg.kind for o in out if isinstance(o, ToAll)] == ["sched_go"]
    assert any(isinstance(o, Note) and "rerouted from op #11" in o.text for o in out)
    assert r.status().schedule.startswith("ring over 0 -> 2")
    # the plan carries the figures it was chosen on, for every rank to price its schedules
    plan = Plan.from_wire(prop.plan, 4)
    assert plan == r.current and plan.costs is not None and plan.costs.slow() == {(0, 1)}


def test_a_refusal_drops_the_proposal_and_the_next_starts_further_ahead():
    r = Reroute(4, 0)
    f = Feed(r.detector, RING4)
    for rank in range(4):
        r.beat(rank, 10, [], 0.0)
    f.run(5, lambda a, b: 5e6 if (a, b) == (0, 1) else 200e6)
    first = [o.msg for o in r.tick(f.now) if isinstance(o, ToAll)][0]
    r.ack(2, first.version, False)
    drop, again = [o.msg for o in r.tick(f.now) if isinstance(o, ToAll)]
    assert drop.kind == "sched_drop" and drop.version == first.version
    assert again.kind == "schedule"
    assert again.version > first.version and again.start > first.start


def test_report_policy_changes_nothing():
    r = Reroute(4, 0, policy="report")
    f = Feed(r.detector, RING4)
    for rank in range(4):
        r.beat(rank, 10, [], 0.0)
    f.run(5, lambda a, b: 5e6 if (a, b) == (0, 1) else 200e6)
    out = r.tick(f.now)
    assert not [o for o in out if isinstance(o, ToAll)]


def _agree(r, f, now):
    """Answer every proposal of this tick with yes; return the notes and messages."""
    out = r.tick(now)
    for o in out:
        if isinstance(o, ToAll) and o.msg.kind == "schedule":
            for rank in range(r.size):
                r.ack(rank, o.msg.version, True)
    return out + r.tick(now)


def test_a_routed_around_link_is_tried_for_one_op_and_cleared_once_well():
    r = Reroute(4, 0)
    f = Feed(r.detector, RING4)
    for rank in range(4):
        r.beat(rank, 10, [], 0.0)
    slow = lambda a, b: 5e6 if (a, b) == (0, 1) else 200e6  # noqa: E731
    f.run(5, slow)
    _agree(r, f, f.now)
    assert r.current is not None and r.current.avoids
    # the plan runs: (0, 1) carries nothing; after RETRY_AFTER, a one-op trial
    for rank in range(4):
        r.beat(rank, 12, [], f.now)
    f.links = [(0, 2), (2, 1), (1, 3), (3, 0)]
    f.tot = {k: [0, 0.0] for k in f.links}
    f.run(31, lambda a, b: 200e6)
    out = _agree(r, f, f.now)
    (prop,) = [o.msg for o in out if isinstance(o, ToAll) and o.msg.kind == "schedule"]
    assert prop.plan is None and prop.ops == 1
    assert any(isinstance(o, Note) and "trying link 0->1 again" in o.text for o in out)
    # the trial op ran on the default ring, the link well again
    for rank in range(4):
        r.beat(rank, prop.start + 1, [], f.now)
    f.links = RING4 + [(0, 2), (2, 1), (1, 3), (3, 0)]
    f.tot.update({k: [0, 0.0] for k in RING4})
    notes = []
    for _ in range(12):
        f.run(0.5, lambda a, b: 200e6)
        notes += [o.text for o in _agree(r, f, f.now) if isinstance(o, Note)]
    assert any("link 0->1 cleared" in n for n in notes), notes
    assert any("back to the default schedule" in n for n in notes), notes
    assert r.current is None


def test_a_slow_nic_is_replaced_only_under_replace_with_a_spare_waiting():
    from collectives.membership.reroute import Replace

    links = [(a, b) for a in range(4) for b in range(4) if a != b]
    for policy, spare, replaced in [
        ("replace", True, True),
        ("replace", False, False),
        ("reroute", True, False),
    ]:
        r = Reroute(4, 0, policy=policy)
        f = Feed(r.detector, links)
        for rank in range(4):
            r.beat(rank, 10, [], 0.0)
        out = []
        for _ in range(24):
            f.run(0.25, lambda a, b: 5e6 if 2 in (a, b) else 200e6, judge=False)
            out += r.tick(f.now, spare_waiting=spare)
        got = [o for o in out if isinstance(o, Replace)]
        assert [o.rank for o in got] == ([2] if replaced else []), (policy, spare, out)
        notes = " ".join(o.text for o in out if isinstance(o, Note))
        assert "rank 2's NIC flagged as slow" in notes
        if not replaced:
            assert "no schedule avoids rank 2's links" in notes


def test_a_slow_link_among_many_is_flagged_against_one_median():
    links = [(r, (r + 1) % 40) for r in range(40)]  # a ring of 40
    f = Feed(Detector(40), links)
    ev = f.run(5, lambda a, b: 5e6 if (a, b) == (7, 8) else 200e6)
    assert [e.link for e in ev] == [(7, 8)]


def _slow_nic(r, spares_at):
    """Rank 2's every link at 5 MB/s, the others at 200 MB/s, for 6 s of beats; spares_at(t):
    how many spares wait at time t. What the Reroute said."""
    links = [(a, b) for a in range(4) for b in range(4) if a != b]
    f = Feed(r.detector, links)
    for rank in range(4):
        r.beat(rank, 10, [], 0.0)
    out = []
    for _ in range(24):
        f.run(0.25, lambda a, b: 5e6 if 2 in (a, b) else 200e6, judge=False)
        out += r.tick(f.now, spare_waiting=spares_at(f.now))
    return out


def test_a_spare_that_arrives_after_the_flag_still_takes_the_slow_nics_place():
    """The NIC is flagged while no spare waits (reported, kept); a spare that comes later
    is used at once, naming the rank and its figures; and only once."""
    from collectives.membership.reroute import Replace

    r = Reroute(4, 0, policy="replace")
    out = _slow_nic(r, lambda now: 1 if now >= 5.0 else 0)
    notes = " ".join(o.text for o in out if isinstance(o, Note))
    assert "no spare waits" in notes
    got = [o for o in out if isinstance(o, Replace)]
    assert [o.rank for o in got] == [2], out
    assert re.search(r"its NIC is slow \(.*2->\d at \d+ Mbit/s", got[0].reason), got
    assert r.status().replaced == [2]


def test_a_slow_nic_is_removed_without_a_spare_under_shrink():
    """Under shrink the slow NIC's rank is removed once, naming it and its figures, with no
    spare waiting; the job goes on at one rank fewer."""
    from collectives.membership.reroute import Replace, Shrink

    r = Reroute(4, 0, policy="shrink", min_world=3)
    out = _slow_nic(r, lambda now: 0)
    got = [o for o in out if isinstance(o, Shrink)]
    assert [o.rank for o in got] == [2], out
    assert re.search(r"its NIC is slow \(.*2->\d at \d+ Mbit/s.*goes on at 3 ranks", got[0].reason)
    assert not [o for o in out if isinstance(o, Replace)]
    assert r.status().replaced == [2]


def test_shrink_never_goes_below_the_smallest_world():
    """min_world 4 at four ranks: the slow NIC is kept, and the note says why (once)."""
    from collectives.membership.reroute import Shrink

    r = Reroute(4, 0, policy="shrink", min_world=4)
    out = _slow_nic(r, lambda now: 0)
    assert not [o for o in out if isinstance(o, Shrink)], out
    notes = [o.text for o in out if isinstance(o, Note) and "keeping it" in o.text]
    assert len(notes) == 1 and "below COLLECTIVES_FAILSLOW_MIN_WORLD=4" in notes[0], out


def test_replace_falls_back_to_shrink_when_no_spare_comes_in_time():
    """replace with spare_wait: no spare within the wait after the flag, the rank is removed
    without one (not before the wait); without spare_wait, never; a spare in time replaces."""
    from collectives.membership.reroute import Replace, Shrink

    r = Reroute(4, 0, policy="replace", spare_wait=2.0)
    links = [(a, b) for a in range(4) for b in range(4) if a != b]
    f = Feed(r.detector, links)
    for rank in range(4):
        r.beat(rank, 10, [], 0.0)
    flagged_virtual = removed_virtual = None
    notes, got = [], []
    for _ in range(40):
        f.run(0.25, lambda a, b: 5e6 if 2 in (a, b) else 200e6, judge=False)
        out = r.tick(f.now, spare_waiting=0)
        notes += [o.text for o in out if isinstance(o, Note)]
        if flagged_virtual is None and any("NIC flagged" in n for n in notes):
            flagged_virtual = f.now
        got += [o for o in out if isinstance(o, Shrink)]
        if got and removed_virtual is None:
            removed_virtual = f.now
    assert any("removed if none comes within 2 s" in n for n in notes), notes
    assert [o.rank for o in got] == [2], got
    assert "no spare came within 2 s" in got[0].reason
    assert flagged_virtual is not None and removed_virtual is not None
    # the feed's virtual clock (Feed.now): exact, so the bound is not scaled for load
    assert 2.0 <= removed_virtual - flagged_virtual <= 2.5, (flagged_virtual, removed_virtual)
    never = _slow_nic(Reroute(4, 0, policy="replace"), lambda now: 0)
    assert not [o for o in never if isinstance(o, Shrink)], never
    spared = _slow_nic(Reroute(4, 0, policy="replace", spare_wait=2.0), lambda now: 1)
    assert [type(o) for o in spared if isinstance(o, Replace | Shrink)] == [Replace], spared
