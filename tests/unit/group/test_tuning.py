"""A crowded host (2+ ranks per CPU they may use): small all_reduces go through rank 0 ("naive")
and commit rounds are a star, the schedules with the fewest messages (group/tuning.py). The
rule itself here; the crowded schedules across real processes in test_zmq_processes.py (a
world pinned to one CPU)."""

from __future__ import annotations

import pytest

from collectives.algorithms.commit import commit
from collectives.group import tuning
from collectives.transport.zmq.addresses import cpu_mask, parse_cpu_mask

pytestmark = pytest.mark.fast


def test_crowded_counts_each_hosts_ranks_against_the_union_of_their_cpus():
    two = 0b11
    assert tuning.crowded(["a"] * 4, [two] * 4)  # 4 ranks on 2 CPUs
    assert not tuning.crowded(["a"] * 3, [two] * 3)  # 1.5 a CPU
    assert not tuning.crowded(["a"] * 4, [1, 2, 4, 8])  # pinned one each: 4 CPUs
    assert tuning.crowded(["a"] * 4, [1, 1, 2, 2])  # pinned two per CPU
    assert not tuning.crowded(["a", "a", "b", "b"], [two] * 4)  # 2 hosts of 2 CPUs
    assert tuning.crowded(["a", "b", "b", "b", "b"], [1, two, two, two, two])  # host b is
    assert not tuning.crowded(["a"] * 4, [two, two, None, two])  # one mask unknown: no
    assert not tuning.crowded(None, None) and not tuning.crowded(["a"], [1])


def test_a_small_receive_spins_only_where_every_rank_of_a_host_has_a_cpu():
    two = 0b11
    assert tuning.spins(["a"] * 2, [two] * 2)  # 2 ranks on 2 CPUs
    assert not tuning.spins(["a"] * 3, [two] * 3)  # 3 on 2: a spinner takes a peer's CPU
    assert tuning.spins(["a"] * 4, [1, 2, 4, 8])  # pinned one each
    assert not tuning.spins(["a"] * 2, [1, 1])  # both pinned to one CPU
    assert tuning.spins(["a", "a", "b", "b"], [two] * 4)  # 2 hosts of 2 CPUs
    assert not tuning.spins(["a", "a", "b", "b", "b"], [two] * 5)  # host b has 3 on 2
    assert not tuning.spins(["a"] * 2, [two, None])  # one mask unknown: no
    assert not tuning.spins(None, None) and not tuning.spins(["a"], [1])


def test_a_small_receive_yields_where_its_own_host_has_fewer_cpus_than_ranks():
    two = 0b11
    assert tuning.yields(["a"] * 3, [two] * 3, 0)  # 3 on 2
    assert tuning.yields(["a"] * 8, [two] * 8, 7)
    assert not tuning.yields(["a"] * 2, [two] * 2, 1)  # a CPU each: it spins instead
    assert tuning.yields(["a"] * 2, [1, 1], 0)  # both pinned to one CPU
    hosts = ["a", "a", "b", "b", "b"]  # host b has 3 ranks on 2 CPUs, host a 2 on 2
    assert [tuning.yields(hosts, [two] * 5, r) for r in range(5)] == [False] * 2 + [True] * 3
    assert not tuning.yields(["a"] * 3, [two, None, two], 0)  # one mask unknown: no
    assert not tuning.yields(None, None, 0) and not tuning.yields(["a"], [1], 0)


def test_auto_takes_naive_only_when_crowded_and_small():
    f = tuning.all_reduce_algorithm
    assert f(4, 4, crowded=True) == "naive" and f(4, 4) == "direct"
    assert f(4, 2, crowded=True) == "direct"  # 2 ranks: direct is the same 2 messages
    assert f(32 << 10, 4, crowded=True) == "naive"
    assert f(64 << 10, 4, crowded=True) == f(64 << 10, 4) == "tree"  # past the crossover
    assert f(4, 4, ["a", "a", "b", "b"], crowded=True) == "naive"


def test_cpu_mask_round_trips_and_bad_masks_are_unknown():
    mask = parse_cpu_mask(cpu_mask())
    assert mask and bin(mask).count("1") >= 1
    for bad in (None, "", "zz", "-1", "0", 7):
        assert parse_cpu_mask(bad) is None, bad


class Recorder:
    """A channel that records what a rank would send and receive, in order."""

    def __init__(self, rank, size):
        self.rank, self.size, self.log = rank, size, []

    def send(self, peer, buf, **tags):
        self.log.append(("send", peer))

    def recv_into(self, peer, buf, **tags):
        self.log.append(("recv", peer))


@pytest.mark.parametrize("n", [3, 4, 8])
def test_star_commit_goes_through_rank_0(n):
    """Rank 0 releases nobody before it has heard from everybody; the others hear only from
    rank 0: 2(n-1) messages in all, against n(n-1) for the all-to-all commit."""
    logs = []
    for r in range(n):
        ch = Recorder(r, n)
        commit(ch, star=True)
        logs.append(ch.log)
    assert logs[0] == [("recv", p) for p in range(1, n)] + [("send", p) for p in range(1, n)]
    for r in range(1, n):
        assert logs[r] == [("send", 0), ("recv", 0)]
    assert sum(op == "send" for log in logs for op, _ in log) == 2 * (n - 1)
