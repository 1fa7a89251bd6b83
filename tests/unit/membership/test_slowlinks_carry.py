"""A slow link learnt in one generation is known in the next (membership/slowlinks.py `_for`,
reroute.py `Reroute.handover`): renumbered through the members' ids, avoided from the next
generation's first proposal, not learnt again from fresh figures; a link whose end left is
forgotten, a link a test cleared is not carried, and the tests' back-off goes on.

Invariants: after a regroup the coordinator proposes the plan around every carried link as
soon as every member has beaten in the new generation, with no link figures of it; a member
that left takes its links with it; the next test of a carried link comes when the generation
before had it due, at the interval it had reached."""

import pytest

from collectives.membership import slowlinks
from collectives.membership.changes import install_generation
from collectives.membership.effects import Outbox
from collectives.membership.reroute import RETRY_AFTER, TEST_FRAMES, Reroute
from collectives.membership.state import State
from collectives.transport.address import RankAddress
from collectives.transport.linkstats import LinkCounters
from support.reroute import agree, notes, serve, tick, told

pytestmark = [pytest.mark.fast, pytest.mark.timeout(20)]

M = ["m0", "m1", "m2", "m3"]
RING4 = [(0, 1), (1, 2), (2, 3), (3, 0)]
AROUND = [(0, 2), (2, 1), (1, 3), (3, 0), (2, 3), (1, 0), (3, 2), (0, 3)]  # what plans use
MB = 1 << 20


class Feed:
    """Cumulative counters per link, beaten into a Reroute every `dt` s, and its ticks, with
    every proposal accepted by every rank."""

    def __init__(self, r: Reroute, links, now: float = 0.0):
        self.r, self.links, self.now = r, list(links), now
        self.tot = {k: [0, 0.0] for k in self.links}
        self.tested: dict = {}  # link -> (test frames, cumulative; the latest test's fastest)

    def run(self, seconds, slow, dt=0.25):
        """Each link moves 4 MiB a beat, a link of `slow` 5 MB/s -- next to nothing once
        routed around; every tick's output."""
        out = []
        for _ in range(int(round(seconds / dt))):
            self.now += dt
            for k in self.links:
                t = self.tot.setdefault(k, [0, 0.0])
                avoided = self.r.current is not None and k in self.r.current.avoided
                rate = 1e3 if avoided else 5e6 if k in slow else 200e6
                moved = min(4 * MB, int(rate * dt))
                t[0] += moved
                t[1] += moved / rate
            for rank in range(self.r.size):
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
                    )  # fmt: skip
                    for a, b in self.links
                    if b == rank
                ]
                self.r.beat(rank, self.r.seqs[rank] + 1, rows, self.now)  # an op a beat
            out += agree(self.r, self.now)
        return out


def beat_all(r: Reroute, seq: int, now: float) -> None:
    for rank in range(r.size):
        r.beat(rank, seq, [], now)


def flagged(r: Reroute):
    return sorted(f.link for f in r.detector.flagged())


def link_tests(out):
    return told(out, "test_links")


def learnt(slow) -> tuple[State, Feed]:
    """Generation 0 of M, with the links of `slow` flagged and a plan around them agreed."""
    s = serve(State(world_size=4, heartbeat_timeout=5.0, diagnose_window=1.0, members=list(M)))
    r = slowlinks._for(s)
    beat_all(r, 10, 0.0)
    f = Feed(r, RING4)
    f.run(5, slow)
    assert flagged(r) == sorted(slow)
    assert r.current is not None and set(slow) <= set(r.current.avoided)
    beat_all(r, 20, f.now)
    f.links += [k for k in AROUND if k not in f.links]
    return s, f


def regroup(s: State, members: list[str]) -> Reroute:
    s.generation += 1
    s.members = list(members)
    return slowlinks._for(s)


def test_a_link_flagged_in_one_generation_is_avoided_in_the_next_renumbered():
    """m0->m1 flagged in generation 0 (ranks 0->1); generation 1 orders the members
    m3, m0, m1, m2: the link is 1->2 there (on the ring in rank order), flagged from the
    start on the figures it was flagged on, and the first tick after every member beat
    proposes the plan around it -- with no figures of generation 1 at all."""
    s, f = learnt([(0, 1)])
    now = f.now + 1
    r = regroup(s, ["m3", "m0", "m1", "m2"])
    assert flagged(r) == [(1, 2)]
    fig = r.detector.flagged_on((1, 2))  # what a test of it and a plan's price read
    assert fig is not None and fig.link == (1, 2) and fig.rate == pytest.approx(5e6, rel=0.2)
    for rank in range(3):
        r.beat(rank, 0, [], now)
    out = tick(r, now)
    assert not told(out)  # rank 3 has not beaten yet
    r.beat(3, 0, [], now)
    out += agree(r, now + 0.01)
    said = notes(out)
    assert any("link 1->2 flagged in the generation before" in n for n in said), said
    assert r.current is not None and (1, 2) in r.current.avoided, said
    assert any(n.startswith("rerouted from op #1: ring over") for n in said), said


def test_a_link_whose_end_left_is_forgotten_and_the_others_kept():
    """m0->m1 and m2->m3 flagged; m1 leaves and a new member takes the last rank: m0->m1
    is gone, m2->m3 (ranks 1->2 now) kept; the newcomer's links start unknown."""
    s, _ = learnt([(0, 1), (2, 3)])
    r = regroup(s, ["m0", "m2", "m3", "new"])
    assert flagged(r) == [(1, 2)]
    r = regroup(s, ["new", "m1", "m3"])  # m0 and m2 left too: neither link has both ends
    assert flagged(r) == []


def test_a_link_a_test_cleared_is_not_carried():
    """Of two links routed around, the test clears 0->1 and finds 2->3 still slow: the next
    generation inherits 2->3 only."""
    s, f = learnt([(0, 1), (2, 3)])
    out = f.run(RETRY_AFTER + 1, [(0, 1), (2, 3)])
    assert link_tests(out), "no test"
    f.tested = {(0, 1): (TEST_FRAMES, 0.002), (2, 1): (TEST_FRAMES, 0.002),
                (2, 3): (TEST_FRAMES, 0.2), (0, 3): (TEST_FRAMES, 0.002)}  # fmt: skip
    f.run(2, [(0, 1), (2, 3)])
    assert flagged(f.r) == [(2, 3)]
    r = regroup(s, list(M))
    assert flagged(r) == [(2, 3)]


def test_the_tests_back_off_goes_on_across_generations():
    """Generation 0 tested 0->1 and found it still slow: its next test is due 2 x RETRY_AFTER
    later. Generation 1 (renumbered, 20 s on) tests it at that moment, not RETRY_AFTER after
    its own plan, and a still-slow verdict there doubles the interval again."""
    s, f = learnt([(0, 1)])
    f.run(RETRY_AFTER + 1, [(0, 1)])
    f.tested = {(0, 1): (TEST_FRAMES, 0.2), (2, 1): (TEST_FRAMES, 0.002)}
    f.run(2, [(0, 1)])
    assert f.r.retry == 2 * RETRY_AFTER and f.r.retry_at is not None
    due = f.r.retry_at
    f.run(20, [(0, 1)])
    r = regroup(s, ["m3", "m0", "m1", "m2"])  # 0->1 is 1->2 now
    g = Feed(r, [(b, c) for b, c in [(0, 1), (1, 2), (2, 3), (3, 0)]], f.now)
    g.links += [k for k in AROUND if k not in g.links]
    beat_all(r, 0, g.now)
    out = g.run(due - g.now - 1, [(1, 2)])
    assert r.current is not None and (1, 2) in r.current.avoided
    assert not link_tests(out), "tested before the back-off ran out"
    (test,) = link_tests(g.run(2, [(1, 2)]))
    assert (1, 2) in set(map(tuple, test.links))
    g.tested = {(1, 2): (TEST_FRAMES, 0.2), (0, 2): (TEST_FRAMES, 0.002)}
    g.run(2, [(1, 2)])
    assert r.retry == 4 * RETRY_AFTER


# --- links kept by host (membership/hostlinks.py) -----------------------------------------------
HOSTS = {"m0": "hA", "m1": "hB", "m2": "hC", "m3": "hD"}


def form(s: State, members: list[str], hosts: dict[str, str]) -> Reroute:
    """The next generation of `members`, installed as a regroup installs it (changes.py,
    its welcome carrying each member's address and host), then its Reroute."""
    infos = [RankAddress(rank=i, host=hosts[m]) for i, m in enumerate(members)]
    idents = {m: m.encode() for m in members}
    install_generation(s, Outbox(), s.generation + 1, members, 0.0, welcome=(idents, infos))
    return slowlinks._for(s)


def learnt_on_hosts(slow) -> tuple[State, Feed]:
    s, f = learnt(slow)
    s.failslow.hosts.update(HOSTS)  # generation 0's welcome, as formation.py installs it
    return s, f


def test_a_member_on_the_host_of_one_that_left_takes_its_slow_links():
    """m0->m1 (host hA -> hB) flagged; m1 leaves (the link is dropped: an end left); a new
    member starts on hB: the link m0->new (0->1, on the ring in rank order) is flagged from
    that generation's start, on the figures it was flagged on, and its first tick after every
    member beat proposes the plan around it."""
    s, f = learnt_on_hosts([(0, 1)])
    r = form(s, ["m0", "m2", "m3"], HOSTS)
    assert flagged(r) == []
    r = form(s, ["m0", "new", "m2", "m3"], {**HOSTS, "new": "hB"})
    assert flagged(r) == [(0, 1)]
    fig = r.detector.flagged_on((0, 1))
    assert fig is not None and fig.link == (0, 1) and fig.rate == pytest.approx(5e6, rel=0.2)
    now = f.now + 1
    for rank in range(4):
        r.beat(rank, 0, [], now)
    said = notes(agree(r, now))
    assert any("link 0->1 flagged in the generation before" in n for n in said), said
    assert r.current is not None and (0, 1) in r.current.avoided, said


def test_the_host_link_is_taken_when_the_regroups_come_together():
    """The leave and the join in one step (no beat of the generation between): the same."""
    s, _ = learnt_on_hosts([(0, 1)])
    r = form(s, ["new", "m0", "m2", "m3"], {**HOSTS, "new": "hB"})
    assert flagged(r) == [(1, 0)]


def test_a_member_on_another_host_or_a_shared_host_starts_unknown():
    """The newcomer on a host nobody left starts with no flagged link; on a host with two
    members nothing is taken (which of them the link was is not known); the link stays kept
    for a later newcomer on its host."""
    s, _ = learnt_on_hosts([(0, 1)])
    form(s, ["m0", "m2", "m3"], HOSTS)
    r = form(s, ["m0", "m2", "m3", "new"], {**HOSTS, "new": "hE"})
    assert flagged(r) == []
    r = form(s, ["m0", "m2", "m3", "new", "n2"], {**HOSTS, "new": "hE", "n2": "hE"})
    assert flagged(r) == []
    r = form(s, ["m0", "m2", "n2", "x", "y"], {**HOSTS, "n2": "hE", "x": "hB", "y": "hB"})
    assert flagged(r) == []
    r = form(s, ["m0", "m2", "m3", "z"], {**HOSTS, "z": "hB"})
    assert flagged(r) == [(0, 3)]


def test_members_that_stayed_keep_their_own_verdict():
    """Two members that both stayed never take a link by host: theirs came by rank (a test
    may have cleared it). Only a newcomer takes one."""
    s, _ = learnt_on_hosts([(0, 1)])
    form(s, ["m0", "m2", "m3"], HOSTS)
    kept = dict(s.failslow.by_host.kept)
    assert list(kept) == [("hA", "hB")]
    r = form(s, ["m0", "m2", "m3"], HOSTS)  # a regroup with nobody new
    assert flagged(r) == [] and s.failslow.by_host.kept == kept
