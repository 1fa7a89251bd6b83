"""Faults that follow the processes (transport/faults.py): rules in launch ranks, mapped to
each generation's ranks; a rule naming a process that left the group is dropped."""

import pytest

from collectives.transport.faults import _to_current_ranks, parse

pytestmark = [pytest.mark.fast, pytest.mark.timeout(10)]


def test_launch_ranks_map_to_the_current_generation():
    rules = parse("delay:2->0:60s;delay:0->1:60s;delay:1->2:5s;stall:2@op=3:1s")
    # generation 1 after launch rank 0 was evicted: launch ranks 1, 2 are now ranks 0, 1
    now = _to_current_ranks(rules, [1, 2])
    assert [(r.kind, r.src, r.rank, r.seconds) for r in now] == [
        ("delay", 0, 1, 5.0),
        ("stall", None, 1, 1.0),
    ]


def test_a_replacement_has_no_launch_rank_and_no_rules():
    rules = parse("delay:1->0:1s;delay:2->1:1s;delay:0->2:1s")
    # launch rank 2 is gone; a replacement (no launch rank) is rank 1, launch rank 1 rank 2
    now = _to_current_ranks(rules, [0, None, 1])
    assert [(r.src, r.rank) for r in now] == [(2, 0)]  # only 1->0 names two processes here
    assert _to_current_ranks(rules, None) == []
