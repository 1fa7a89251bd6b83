"""Blame from evidence (membership/evidence.py, diagnose.judge): the fewest ranks that touch
every bad link; probes when the stalled op's own picture ties; history, then a stated rule,
only when the evidence cannot decide."""

import pytest

from collectives.membership.diagnose import judge
from collectives.membership.evidence import min_covers, probe_links
from collectives.transport.base import Progress

pytestmark = [pytest.mark.fast, pytest.mark.timeout(10)]


def S(seq, in_op, waiting_on, sent=None, recv=None):
    """A rank's picture of op `seq`, as it reports it."""
    return Progress(0, seq, in_op, waiting_on, sent, recv)


def test_min_covers_finds_the_common_rank_and_every_tie():
    assert min_covers([(2, 0), (0, 1)]) == [(0,)]  # two links, one rank
    assert min_covers([(2, 0)]) == [(0,), (2,)]  # one link: a tie
    assert min_covers([(0, 1), (2, 3)]) == [(0, 2), (0, 3), (1, 2), (1, 3)]
    assert min_covers([(3, p) for p in range(3)] + [(p, 3) for p in range(3)]) == [(3,)]
    assert min_covers([]) == [()]


def test_probe_links_judges_only_links_between_ranks_that_took_part():
    heard = {0: {1: 0.001, 2: None, 3: None}, 1: {0: None, 2: 0.002}, 2: {0: 0.0, 1: 0.001}}
    slow, healthy = probe_links(heard)
    assert slow == {(2, 0), (0, 1)}  # rank 3 took no part: 3->0 tells nothing
    assert healthy == {(1, 0), (2, 1), (0, 2), (1, 2)}


# A tree all_reduce at 3 ranks with links 2->0 and 0->1 slowed (culprit 0): rank 0 waits for
# rank 2's contribution, which is on the wire; ranks 1 and 2 wait for rank 0's broadcast, which
# rank 0 has not sent yet. The op shows one stalled link, 2->0, whose ends tie.
TREE = {
    0: S(7, True, 2, [0, 0, 0], [0, 1, 0]),
    1: S(7, True, 0, [1, 0, 0], [0, 0, 0]),
    2: S(7, True, 0, [1, 0, 0], [0, 0, 0]),
}


def test_a_tie_in_the_op_asks_for_probes_before_deciding():
    j = judge(7, TREE, 3)
    assert j.needs_probes and j.evidence.stalled == [(2, 0)]
    assert "the evidence cannot decide between rank(s) 0 or 2" in j.why


def test_probes_single_out_the_rank_on_both_slow_links():
    probes = {0: {1: 0.001, 2: None}, 1: {0: None, 2: 0.001}, 2: {0: 0.0, 1: 0.0}}
    j = judge(7, TREE, 3, probes=probes)
    assert j.culprits == [0] and not j.needs_probes
    assert j.evidence.decided_by == "probes" and j.evidence.bad == [(0, 1), (2, 0)]
    assert "slow link(s) 2->0, 0->1" in j.why and "probes not heard on 2->0, 0->1" in j.why


def test_no_rank_is_blamed_for_a_link_the_probes_show_healthy():
    # the stalled link 2->0 answered its probe (a passing hiccup), and so did every other
    probes = {r: {p: 0.001 for p in range(3) if p != r} for r in range(3)}
    j = judge(7, TREE, 3, probes=probes)
    assert j.evidence.cleared == [(2, 0)] and j.evidence.bad == []
    assert j.culprits == [0] and "wait cycle" in j.why  # the last resort, and it says so


def test_one_slow_link_history_then_the_rule_decides_and_says_so():
    probes = {0: {1: 0.0, 2: None}, 1: {0: 0.0, 2: 0.0}, 2: {0: 0.0, 1: 0.0}}
    j = judge(7, TREE, 3, probes=probes, history={0: 2})
    assert j.culprits == [0] and j.evidence.decided_by == "history"
    assert "earlier stalls found rank(s) 0 on bad links" in j.why
    j = judge(7, TREE, 3, probes=probes)
    assert j.culprits == [2] and j.evidence.decided_by == "rule"
    assert "cannot decide between rank(s) 0 or 2; rule: the highest rank goes" in j.why


def test_the_ops_picture_decides_alone_when_it_can():
    # direct all_reduce, links 2->0 and 0->1 held: both show as stalled
    states = {
        0: S(3, True, 2, [0, 1, 1], [0, 1, 0]),
        1: S(3, True, 0, [1, 0, 1], [0, 0, 1]),
        2: S(3, True, 0, [1, 1, 0], [0, 1, 0]),
    }
    j = judge(3, states, 3)
    assert j.culprits == [0] and not j.needs_probes
    assert j.evidence.decided_by == "the stalled op"


def test_a_wait_cycle_in_pictures_taken_apart_evicts_nobody():
    """The pictures of the real coordinator are placed: a cycle with no link proven stalled
    and every probe answered is a rank that came late (short of CPU), not a fault."""
    from collectives.membership.diagnose import Placed

    placed = {r: Placed(float("-inf"), 10.0) for r in range(3)}
    j = judge(7, TREE, 3, placed=placed, hold=0.75)
    assert j.culprits == [] and j.needs_probes and j.evidence.unproven == [(2, 0)]
    probes = {r: {p: 0.001 for p in range(3) if p != r} for r in range(3)}
    j = judge(7, TREE, 3, probes=probes, placed=placed, hold=0.75)
    assert j.culprits == [] and not j.needs_probes and "a rank came late" in j.why


def test_a_tie_with_a_rank_left_out_of_the_probes_evicts_nobody():
    """Only ranks 0 and 2 took part: their link is slow both ways, and rank 1 (late) might
    have told which end's NIC it is. With every rank probed, the rule decides as before."""
    probes = {0: {2: None}, 2: {0: None}}
    j = judge(7, TREE, 3, probes=probes)
    assert j.culprits == [] and "rank(s) 1 took no part in the probes" in j.why
    probes = {0: {1: 0.0, 2: None}, 1: {0: 0.0, 2: 0.0}, 2: {0: None, 1: 0.0}}
    assert judge(7, TREE, 3, probes=probes).culprits == [2]
