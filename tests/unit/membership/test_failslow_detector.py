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
from collectives.membership.reroute import (
    RETRY_AFTER,
    TEST_BYTES,
    TEST_FRAMES,
    TEST_WAIT,
    Reroute,
)
from collectives.transport.linkstats import LinkCounters
from support.reroute import agree, notes, removed, tick, told

MB = 1 << 20
RING4 = [(0, 1), (1, 2), (2, 3), (3, 0)]


class Feed:
    """Cumulative counters per link, fed to a detector as beats every `dt` seconds."""

    def __init__(self, det, links):
        self.det, self.links = det, links
        self.tot = {k: [0, 0.0] for k in links}
        self.tested = {}  # link -> (test frames, cumulative; the latest test's fastest)
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
                    LinkCounters(
                        a,
                        *self.tot[(a, b)],
                        0,
                        0.0,
                        0.0,
                        0,
                        0.0,
                        *self.tested.get((a, b), (0, 0.0)),
                    )
                    for a, b in self.links
                    if b == r
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
    out = tick(r, f.now)
    (prop,) = told(out)
    assert prop.kind == "schedule" and prop.start == 11
    for rank in range(3):
        r.ack(rank, prop.version, True)
    assert tick(r, f.now) == []  # one answer missing: wait
    r.ack(3, prop.version, True)
    out = tick(r, f.now)
    assert [m.kind for m in told(out)] == ["sched_go"]
    assert any("rerouted from op #11" in n for n in notes(out))
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
    first = told(tick(r, f.now))[0]
    r.ack(2, first.version, False)
    drop, again = told(tick(r, f.now))
    assert drop.kind == "sched_drop" and drop.version == first.version
    assert again.kind == "schedule"
    assert again.version > first.version and again.start > first.start


def test_report_policy_changes_nothing():
    r = Reroute(4, 0, policy="report")
    f = Feed(r.detector, RING4)
    for rank in range(4):
        r.beat(rank, 10, [], 0.0)
    f.run(5, lambda a, b: 5e6 if (a, b) == (0, 1) else 200e6)
    out = tick(r, f.now)
    assert not told(out)


NEW_RING = [(0, 2), (2, 1), (1, 3), (3, 0)]


def _rerouted_around_0_1():
    """A Reroute whose plan keeps off the slowed link 0->1, and the Feed beating on the plan
    (0->1 carries next to nothing: it stays in the rows, not judged)."""
    r = Reroute(4, 0)
    f = Feed(r.detector, RING4)
    for rank in range(4):
        r.beat(rank, 10, [], 0.0)
    f.run(5, lambda a, b: 5e6 if (a, b) == (0, 1) else 200e6)
    agree(r, f.now)
    assert r.current is not None and (0, 1) in r.current.avoided
    for rank in range(4):
        r.beat(rank, 12, [], f.now)
    f.links = RING4 + NEW_RING
    f.tot.update({k: [0, 0.0] for k in NEW_RING})
    return r, f


def _run(r, f, seconds, tested=None):
    """Beat and tick for `seconds`; tested: {link: (frames, fastest transit)} the receiver
    timed of a test, reported from the first beat on."""
    out = []
    for i in range(int(round(seconds / 0.5))):
        if i == 0 and tested:
            for k, (n, best) in tested.items():
                f.tested[k] = (f.tested.get(k, (0, 0.0))[0] + n, best)
        f.run(0.5, lambda a, b: 1e3 if (a, b) == (0, 1) else 200e6)
        out += agree(r, f.now)
    return out


def _tests(out):
    return told(out, "test_links")


def test_a_routed_around_link_is_tested_off_the_schedule_and_cleared_once_well():
    """After RETRY_AFTER the link is tested with one frame beside a witness link into the
    same receiver -- no op runs on the default schedule for it (the old trial did) -- and
    once its frame is as quick as the witness's, it is cleared and the default returns."""
    r, f = _rerouted_around_0_1()
    out = _run(r, f, RETRY_AFTER + 1)
    assert not told(out, "schedule"), out
    (test,) = _tests(out)
    assert set(map(tuple, test.links)) == {(0, 1), (2, 1)}
    assert test.bytes == TEST_BYTES and test.frames == TEST_FRAMES  # flagged on throughput
    assert r.current is not None  # the plan holds while the link is tested
    # the receiver timed both links' frames: the fastest 10 ms on the link (a connection used
    # only for commit messages sends with a small congestion window), 1 ms on the busy
    # witness: 10x, but over 4x quicker than the 52 ms of 256 KiB at its flagged 5 MB/s
    said = notes(_run(r, f, 2, {(0, 1): (TEST_FRAMES, 0.010), (2, 1): (TEST_FRAMES, 0.001)}))
    assert any(
        n.startswith("link 0->1 cleared: the fastest of its 256 KiB test frames took 10.00 ms")
        for n in said
    ), said
    assert any("back to the default schedule" in n for n in said), said
    assert r.current is None


def test_a_link_still_slow_under_test_stays_off_and_the_next_test_waits_twice_as_long():
    """A test frame 40 times the witness's: still slow, the plan holds, no schedule is
    proposed, and the next test comes 2 x RETRY_AFTER later; a test with no figures counts as
    slow too (after TEST_WAIT)."""
    r, f = _rerouted_around_0_1()
    _run(r, f, RETRY_AFTER + 1)
    out = _run(r, f, 2, {(0, 1): (TEST_FRAMES, 0.2), (2, 1): (TEST_FRAMES, 0.005)})
    assert any(n.startswith("link 0->1 still slow") for n in notes(out))
    assert r.current is not None and (0, 1) in r.current.avoided
    assert not _tests(_run(r, f, 2 * RETRY_AFTER - 3))  # backed off
    later = _run(r, f, 4)
    assert len(_tests(later)) == 1
    said = notes(_run(r, f, TEST_WAIT + 1))  # no figures
    assert any("not tested" in n for n in said), said
    assert r.current is not None and not _tests(_run(r, f, 3 * RETRY_AFTER))


def test_a_slow_nic_is_replaced_only_under_replace_with_a_spare_waiting():
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
            out += tick(r, f.now, spare_waiting=spare)
        got = removed(out)
        assert [(verb, rank) for verb, rank, _ in got] == (
            [("replacing", 2)] if replaced else []
        ), (policy, spare, out)
        said = " ".join(notes(out))
        assert "rank 2's NIC flagged as slow" in said
        if not replaced:
            assert "no schedule avoids rank 2's links" in said


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
        out += tick(r, f.now, spare_waiting=spares_at(f.now))
    return out


def test_a_spare_that_arrives_after_the_flag_still_takes_the_slow_nics_place():
    """The NIC is flagged while no spare waits (reported, kept); a spare that comes later
    is used at once, naming the rank and its figures; and only once."""
    r = Reroute(4, 0, policy="replace")
    out = _slow_nic(r, lambda now: 1 if now >= 5.0 else 0)
    assert "no spare waits" in " ".join(notes(out))
    got = removed(out)
    assert [(verb, rank) for verb, rank, _ in got] == [("replacing", 2)], out
    assert re.search(r"its NIC is slow \(.*2->\d at \d+ Mbit/s", got[0][2]), got
    assert r.status().replaced == [2]


def test_a_slow_nic_is_removed_without_a_spare_under_shrink():
    """Under shrink the slow NIC's rank is removed once, naming it and its figures, with no
    spare waiting; the job goes on at one rank fewer."""
    r = Reroute(4, 0, policy="shrink", min_world=3)
    out = _slow_nic(r, lambda now: 0)
    got = removed(out)
    assert [(verb, rank) for verb, rank, _ in got] == [("removing", 2)], out
    assert re.search(r"its NIC is slow \(.*2->\d at \d+ Mbit/s.*goes on at 3 ranks", got[0][2])
    assert r.status().replaced == [2]


def test_shrink_never_goes_below_the_smallest_world():
    """min_world 4 at four ranks: the slow NIC is kept, and the note says why (once)."""
    r = Reroute(4, 0, policy="shrink", min_world=4)
    out = _slow_nic(r, lambda now: 0)
    assert not removed(out), out
    kept = [n for n in notes(out) if "keeping it" in n]
    assert len(kept) == 1 and "below COLLECTIVES_FAILSLOW_MIN_WORLD=4" in kept[0], out


def test_replace_falls_back_to_shrink_when_no_spare_comes_in_time():
    """replace with spare_wait: no spare within the wait after the flag, the rank is removed
    without one (not before the wait); without spare_wait, never; a spare in time replaces."""
    r = Reroute(4, 0, policy="replace", spare_wait=2.0)
    links = [(a, b) for a in range(4) for b in range(4) if a != b]
    f = Feed(r.detector, links)
    for rank in range(4):
        r.beat(rank, 10, [], 0.0)
    flagged_virtual = removed_virtual = None
    said, got = [], []
    for _ in range(40):
        f.run(0.25, lambda a, b: 5e6 if 2 in (a, b) else 200e6, judge=False)
        out = tick(r, f.now, spare_waiting=0)
        said += notes(out)
        if flagged_virtual is None and any("NIC flagged" in n for n in said):
            flagged_virtual = f.now
        got += removed(out)
        if got and removed_virtual is None:
            removed_virtual = f.now
    assert any("removed if none comes within 2 s" in n for n in said), said
    assert [(verb, rank) for verb, rank, _ in got] == [("removing", 2)], got
    assert "no spare came within 2 s" in got[0][2]
    assert flagged_virtual is not None and removed_virtual is not None
    # the feed's virtual clock (Feed.now): exact, so the bound is not scaled for load
    assert 2.0 <= removed_virtual - flagged_virtual <= 2.5, (flagged_virtual, removed_virtual)
    never = _slow_nic(Reroute(4, 0, policy="replace"), lambda now: 0)
    assert not removed(never), never
    spared = _slow_nic(Reroute(4, 0, policy="replace", spare_wait=2.0), lambda now: 1)
    assert [verb for verb, _, _ in removed(spared)] == ["replacing"], spared


class SmallFeed:
    """Beats of small frames only (no large bytes) to a detector, every `dt` s. Per beat,
    each link carries `frames`, of which shape(a, b) gives (timed frames, their latency,
    the bound on the rest's: found queued, linkstats.py)."""

    def __init__(self, det, links, dt=0.25, frames=40):
        self.det, self.links, self.dt, self.frames = det, links, dt, frames
        self.tot = {k: [0, 0.0, 0, 0.0] for k in links}
        self.now = 0.0

    def run(self, seconds, shape):
        events = []
        for _ in range(int(round(seconds / self.dt))):
            self.now += self.dt
            for (a, b), t in self.tot.items():
                timed, latency, bound = shape(a, b)
                t[0] += timed
                t[1] += timed * latency
                t[2] += self.frames - timed
                t[3] += (self.frames - timed) * bound
            for r in {b for _, b in self.links}:
                rows = [
                    LinkCounters(a, 0, 0.0, f, s, 0.0, q, qs)
                    for a, b in self.links
                    if b == r
                    for f, s, q, qs in [self.tot[(a, b)]]
                ]
                self.det.beat(r, rows, self.now)
            events += self.det.evaluate(self.now)
        return events


ALL4 = [(a, b) for a in range(4) for b in range(4) if a != b]


def healthy(a, b):
    """Small ops on a healthy link: 3 frames of 40 timed, the rest found queued."""
    return 3, 0.0003, 0.0005


def test_a_link_slow_for_small_frames_is_flagged_on_latency():
    """Small ops: the healthy links' frames are nearly all found queued, so they have few
    timed frames; counted with their bound, they are the peers (into the same rank) a link
    whose every frame takes 12 ms is judged against: flagged on latency, named in ms, priced
    at its window's latency (not its life's mean)."""
    det = Detector(4)
    f = SmallFeed(det, ALL4)
    assert f.run(4, healthy) == []

    def slow(a, b):
        return (40, 0.012, 0.0) if (a, b) == (0, 1) else healthy(a, b)

    ev = f.run(4, slow)
    assert [e.link for e in ev if isinstance(e, Flagged)] == [(0, 1)], ev
    (fig,) = ev[0].figures
    assert fig.latency and re.search(
        r"0->1's small frames at [\d.]+ ms against its peers' 0.4\d ms", describe(ev[0])
    ), describe(ev[0])
    f.run(4, slow)
    assert det.link_costs([(0, 1)]).cost(0, 1, 0) == pytest.approx(0.012, rel=0.05)
    # its latency back at its peers' (as when routed around: only the ops' small commit
    # messages cross it) does not clear it: a test of it does (reroute.py)
    assert f.run(8, healthy) == [] and [x.link for x in det.flagged()] == [(0, 1)]


def test_small_frames_slowed_together_or_waited_on_unevenly_stay_quiet():
    """Every link 20 times slower together (a busy CPU) is not a slow link; nor is a
    healthy link whose every frame its receiver waits for (timed: 2 ms each, a loaded
    host) beside links whose frames are found queued: a queued frame counts at its bound,
    never below its transit, so the waited-on link does not look slower than its peers."""
    calm = SmallFeed(Detector(4), ALL4)
    assert calm.run(4, healthy) == []
    assert calm.run(6, lambda a, b: (3, 0.006, 0.01)) == []
    uneven = SmallFeed(Detector(4), ALL4)

    def waited_on(a, b):
        return (40, 0.002, 0.0) if (a, b) == (0, 1) else (3, 0.002, 0.003)

    assert uneven.run(10, waited_on) == []
    # a healthy link's waits carry its receiver's wake-up: on a loaded host its latency read
    # up to 7x its peers' median (failslow.py); 7x, steadily, is still not slow
    spread = SmallFeed(Detector(4), ALL4)

    def woken_late(a, b):
        return (40, 0.0034, 0.0) if (a, b) == (0, 1) else healthy(a, b)

    assert spread.run(10, woken_late) == []


def test_a_loaded_receiver_waking_late_on_every_link_is_not_a_slow_link():
    """A rank short of CPU wakes late for every frame it waits for: each of its inbound
    links reads 10x the others' latency, the same on all of them; judged against the other
    links into the same rank, none is slow."""
    f = SmallFeed(Detector(4), ALL4)
    assert f.run(10, lambda a, b: (40, 0.005, 0.0) if b == 1 else healthy(a, b)) == []


def test_a_link_flagged_on_throughput_is_tested_on_throughput_though_routed_around():
    """Routed around, a link carries only the ops' small commit messages, so its later
    judgements are of their latency; its test still sends the large frames that what it was
    flagged on (its throughput) needs."""
    r = Reroute(4, 0)
    f = Feed(r.detector, ALL4)
    for rank in range(4):
        r.beat(rank, 10, [], 0.0)
    f.run(5, lambda a, b: 5e6 if (a, b) == (0, 1) else 200e6)
    agree(r, f.now)
    assert r.current is not None and (0, 1) in r.current.avoided
    for rank in range(4):
        r.beat(rank, 12, [], f.now)
    small = SmallFeed(r.detector, ALL4)
    small.now = f.now
    out = []
    for _ in range(int(RETRY_AFTER) + 2):
        small.run(1, healthy)
        out += agree(r, small.now)
    (last,) = [x for x in r.detector.flagged() if x.link == (0, 1)]
    assert last.latency and not r.detector.flagged_on((0, 1)).latency
    (test,) = _tests(out)
    assert test.bytes == TEST_BYTES


def test_a_link_cleared_by_a_test_and_flagged_again_soon_backs_the_tests_off():
    """A test that cleared a link only partly recovered: its figures flag it again within
    seconds, and the next test waits twice as long, as if the test had said slow."""
    r, f = _rerouted_around_0_1()
    _run(r, f, RETRY_AFTER + 1)
    said = notes(_run(r, f, 2, {(0, 1): (TEST_FRAMES, 0.007), (2, 1): (TEST_FRAMES, 0.0014)}))
    assert r.current is None, said
    f.links = RING4
    for rank in range(4):  # the ranks past the op the default returned from
        r.beat(rank, 100, [], f.now)
    out = []
    for _ in range(16):  # judged by the Reroute's tick alone: it sees the flag
        f.run(0.5, lambda a, b: 5e6 if (a, b) == (0, 1) else 200e6, judge=False)
        out += agree(r, f.now)
    said = notes(out)
    assert any("flagged again" in n and "next test in 60 s" in n for n in said), said
    assert r.current is not None and (0, 1) in r.current.avoided
    for rank in range(4):
        r.beat(rank, 200, [], f.now)
    f.links = RING4 + NEW_RING
    assert not _tests(_run(r, f, 2 * RETRY_AFTER - 10))  # the plan went under 8 s ago
    assert len(_tests(_run(r, f, 10))) == 1


def test_a_judgement_after_a_regroup_never_removes_by_the_old_generations_ranks():
    """The slow NIC (rank 2 of generation 0) is flagged under replace with a spare wait;
    before the wait ends, m0 leaves and generation 1 forms as [m1, m2, m3] (m2 is rank 1
    now, rank 2 is the healthy m3). The judgements due before the new generation's first
    beat with figures must not act for the old generation: no member is removed -- above
    all not m3, whom the old rank 2 names in the new roster -- and nothing is sent that
    carries generation 0."""
    from collectives.membership import slowlinks
    from support.reroute import state_of

    r = Reroute(4, 0, policy="replace", spare_wait=2.0)
    s = state_of(r)
    links = [(a, b) for a in range(4) for b in range(4) if a != b]
    f = Feed(r.detector, links)
    for rank in range(4):
        r.beat(rank, 10, [], 0.0)
    said = []
    while not any("NIC flagged" in n for n in said):
        assert f.now < 20.0, said
        f.run(0.25, lambda a, b: 5e6 if 2 in (a, b) else 200e6, judge=False)
        said += notes(tick(r, f.now))
    assert not removed(tick(r, f.now)), "removed before the spare wait ended"
    s.generation, s.members = 1, ["m1", "m2", "m3"]
    del s.beats["m0"]
    after = []
    for k in range(1, 13):  # 3 s of judgements, past the spare wait
        out = slowlinks.Outbox()
        slowlinks.feed(s, out, slowlinks.Judge(0), f.now + 0.25 * k)
        after += out.effects
    assert not removed(after), after
    assert "m3" not in s.failed and "m2" not in s.failed, s.failed
    sent = told(after)
    assert all(getattr(m, "generation", 1) == 1 for m in sent), sent
