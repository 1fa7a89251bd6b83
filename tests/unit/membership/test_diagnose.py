"""Whom a stall blames, and how a half-finished op is settled (collectives/membership/diagnose.py)."""

import pytest

from collectives.membership.diagnose import blame
from collectives.membership.protocol import Evidence
from collectives.transport.base import Progress

pytestmark = pytest.mark.fast  # in-process: part of `make test-fast`


def S(seq, in_op, waiting_on, sent=None, recv=None, sent_age=None):
    """A rank's picture of op `seq`, as it reports it."""
    return Progress(0, seq, in_op, waiting_on, sent, recv, sent_age=sent_age)


@pytest.mark.timeout(10)
def test_silent_ranks_first():
    assert blame(3, {0: S(3, True, 1), 1: None, 2: S(3, True, 0)}, 3)[0] == [1]


@pytest.mark.timeout(10)
def test_rank_that_never_entered_the_op():
    # ring 0->1->2->0 where rank 2 is still computing (its last op was #4)
    assert blame(5, {0: S(5, True, 2), 1: S(5, True, 0), 2: S(4, False, None)}, 3)[0] == [2]


@pytest.mark.timeout(10)
def test_ranks_still_inside_an_earlier_op_are_judged_on_that_op():
    # links 0-1 and 0-2 slowed: rank 2 got its part of op #6 through (slowly), entered op #7
    # and waits there; ranks 0 and 1 still wait on each other inside op #6. Not "0 and 1
    # never entered op #7": op #6 stalled first, and its picture (link 0-1) decides.
    from collectives.membership.diagnose import judge

    states = {
        0: S(6, True, 1, [0, 1, 1], [0, 0, 1]),
        1: S(6, True, 0, [1, 0, 1], [0, 0, 1]),
        2: S(7, True, 0, [0, 0, 0], [0, 0, 0]),
    }
    j = judge(7, states, 3)
    assert j.evidence.judged_op == 6 and j.needs_probes, j
    assert j.evidence.stalled == [(0, 1), (1, 0)], j
    # the probes: 0's links unheard both ways, 1-2 healthy -> rank 0 alone
    probes = {0: {1: None, 2: None}, 1: {0: None, 2: 0.01}, 2: {0: None, 1: 0.01}}
    j = judge(7, states, 3, probes=probes)
    assert j.culprits == [0] and j.evidence.judged_op == 6, j
    # a rank that is only late (between ops, computing) is still absent from op #7
    late = judge(7, {0: S(7, True, 1), 1: S(6, False, None), 2: S(7, True, 1)}, 3)
    assert late.culprits == [1] and late.evidence == Evidence(decided_by="absence"), late


@pytest.mark.timeout(10)
def test_seed_scenario_two_slow_links_point_at_their_common_rank():
    # links 0->1 and 1->2 deliver nothing: rank 1 is on both stalled links
    states = {
        0: S(0, True, 2, [0, 1, 0], [0, 0, 1]),
        1: S(0, True, 0, [0, 0, 1], [0, 0, 0]),
        2: S(0, True, 1, [1, 0, 0], [0, 0, 0]),
    }
    culprits, why = blame(0, states, 3)
    assert culprits == [1] and "0->1, 1->2" in why


@pytest.mark.timeout(10)
def test_single_stalled_link_blames_the_higher_rank():
    states = {0: S(0, True, 1, [0, 1], [0, 0]), 1: S(0, True, 0, [1, 0], [1, 0])}
    assert blame(0, states, 2)[0] == [1]


@pytest.mark.timeout(10)
def test_stalled_rank_inside_the_op_not_the_root_waiting_on_it():
    # tree all_reduce at 3 ranks: leaf 1 stalls before sending; root 0 waits on it; leaf 2
    # already sent and waits for the broadcast from 0. Rank 0 is blocked, not guilty.
    states = {
        0: S(42, True, 1, [0, 0, 0], [0, 0, 0]),
        1: S(42, True, None, [0, 0, 0], [0, 0, 0]),
        2: S(42, True, 0, [1, 0, 0], [0, 0, 0]),
    }
    assert blame(42, states, 3)[0] == [1]


@pytest.mark.timeout(10)
def test_nobody_waiting_blames_nobody():
    assert blame(1, {0: S(1, False, None), 1: S(1, False, None)}, 2)[0] == []


# --- the outcome of an op that failed while some ranks held its result -------------------------
from collectives.membership.diagnose import ABANDONED, COMPLETED, LACKED, holds_result, outcome  # noqa: E402


def test_holds_result_reads_the_commit_round_and_the_recent_ends():
    # (last op entered, holds its result, how its last ops ended)
    assert holds_result(5, 5, True, [(4, COMPLETED)]) is True  # in op 5's commit round
    assert holds_result(5, 5, False, [(4, COMPLETED)]) is None  # may still get its data
    assert holds_result(4, 5, False, [(4, COMPLETED)]) is True
    assert holds_result(5, 6, False, [(5, LACKED)]) is False
    assert holds_result(5, 5, False, [(5, ABANDONED)]) is True
    assert holds_result(5, -1, False, []) is None  # nothing reported of it


def test_outcome_commits_only_when_every_survivor_holds_the_result():
    assert outcome([True, True, True]) == "commit"
    assert outcome([True, None, True]) is None  # one still moving data: wait for it
    assert outcome([True, None, False]) == "abort"  # one stopped without it: dropped
    assert outcome([]) is None


@pytest.mark.timeout(10)
def test_a_link_counts_as_stalled_only_when_its_bytes_left_before_the_receivers_picture():
    """p -> r is stalled only if p's last frame to r left at least `hold` s before r's picture
    (placed on the judge's clock): 0 sent to 1 at 9.95 (its answer arrived at 10.0, the frame
    0.05 s old) and 1's picture was taken after 9.9: nothing proves 1 should have it."""
    from collectives.membership.diagnose import Placed, proven

    states = {0: S(5, True, None, [0, 1], sent_age=[None, 0.05]), 1: S(5, True, 0)}
    placed = {0: Placed(9.9, 10.0), 1: Placed(9.9, 10.0)}
    assert not proven(0, 1, states, placed, hold=0.75)
    states[0] = S(5, True, None, [0, 1], sent_age=[None, 3.0])  # left at 7.0: 2.9 s earlier
    assert proven(0, 1, states, placed, hold=0.75)
    # a receiver whose picture cannot be placed (its own diagnose), an age not said, a
    # sender that gave no picture: not proven
    assert not proven(0, 1, states, {0: placed[0], 1: Placed(float("-inf"), 10.0)}, 0.75)
    assert not proven(0, 1, {0: S(5, True, None, [0, 1]), 1: states[1]}, placed, 0.75)
    assert not proven(0, 1, states, {1: placed[1]}, 0.75)
    # one snapshot (the in-process world): every link is in time
    assert proven(0, 1, {0: S(5, True, None, [0, 1]), 1: states[1]}, None, 0.75)
