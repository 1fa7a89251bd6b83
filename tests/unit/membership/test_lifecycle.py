"""reconstruct()'s client half, in-process (membership/lifecycle.py): a group it closed is never
handed back, and the group it returns keeps the caller's op timeout. With real processes and a
coordinator: tests/system/test_formation.py.
"""

from __future__ import annotations

from collectives.membership.protocol import Regroup

import pytest

import collectives as cl
from collectives.membership.init import Membership


class _OneFailedAttempt:
    """A coordinator link whose first regroup leads nowhere and whose retry is answered
    'unchanged': what an older coordinator did after a joiner vanished."""

    mid, rank = "x", 0

    def __init__(self):
        self.answers = [Regroup(rank=0, world_size=2, generation=1), None]

    def regroup(self, generation, timeout, exclude=()):
        return self.answers.pop(0)

    def close(self):
        pass


@pytest.mark.timeout(30)
@pytest.mark.fast
def test_unchanged_after_a_failed_formation_is_refused(monkeypatch):
    """The client half of the guarantee, whatever the coordinator answers: the group that
    reconstruct() closed is never handed back: a group handed back would raise 'the process
    group was destroyed' at its next op."""
    from collectives.transport.inproc import InprocWorld

    def unformed(self, rank, world_size, generation, timeout):
        raise cl.PeerFailure(
            "reconstruct: rank 0: generation 1 did not form: new rank 1 "
            "(a joiner) sent no heartbeat for 1.0 s",
            failed_ranks=(),
        )

    monkeypatch.setattr(Membership, "_group", unformed)
    membership = Membership(_OneFailedAttempt(), "127.0.0.1", 5.0, "tcp", None, None)
    world = InprocWorld(1)
    pg = cl.ProcessGroup(world.transport(0), timeout=5.0, membership=membership)
    try:
        with pytest.raises(cl.CollectiveError, match="refusing to return the closed group"):
            pg.reconstruct()
    finally:
        pg.close()


@pytest.mark.fast
@pytest.mark.timeout(10)
def test_reconstruct_carries_the_groups_op_timeout_over():
    """The group reconstruct() returns has the op timeout the caller set on the old one
    (pg.timeout = 3 after init), not the timeout init_process_group was given -- for a
    joiner that is its long admission wait, and its ops after a regroup waited 120 s for
    ranks that had moved on (bench.stress.chaos)."""
    from collectives.group.group import GroupState

    class Client:
        def regroup(self, generation, timeout, exclude=()):
            return Regroup(rank=0, world_size=2, generation=generation + 1)

    class Group:
        def __init__(self, timeout, generation):
            self.timeout, self.generation, self.rank, self.world_size = timeout, generation, 0, 2
            self.state = GroupState.ACTIVE

        def retire(self):
            self.state = GroupState.UNFORMED

        def replaced_by(self, new):
            self.state = GroupState.REPLACED

    m = Membership.__new__(Membership)  # no coordinator link: only reconstruct's logic
    m.client, m.timeout = Client(), 120.0
    m._group = lambda rank, world_size, generation, timeout: Group(m.timeout, generation)
    old = Group(120.0, 4)
    old.timeout = 3.0
    new = m.reconstruct(old, timeout=3.0)
    assert new.generation == 5 and new.timeout == 3.0


@pytest.mark.fast
@pytest.mark.timeout(30)
def test_reconstructs_exclusion_list_is_checked_then_reaches_the_coordinator_sorted():
    """pg.reconstruct(exclude=...): a rank outside the group, or the caller's own, is a
    ValueError before any message; a good list reaches the coordinator link sorted, once."""
    from collectives.transport.inproc import InprocWorld

    class Client:
        mid, rank = "x", 1

        def __init__(self):
            self.asked: list[tuple[int, ...]] = []

        def regroup(self, generation, timeout, exclude=()):
            self.asked.append(exclude)
            return None  # 'unchanged'

        def close(self):
            pass

    client = Client()
    membership = Membership(client, "127.0.0.1", 5.0, "tcp", None, None)
    world = InprocWorld(3)
    pg = cl.ProcessGroup(world.transport(1), timeout=5.0, membership=membership)
    try:
        for bad, says in ([3], "not a rank of the group"), ([1], "cannot exclude itself"):
            with pytest.raises(ValueError, match=says):
                pg.reconstruct(exclude=bad)
        assert client.asked == []
        assert pg.reconstruct(exclude=[2, 0]) is pg
        assert pg.reconstruct() is pg  # the pinned call, unchanged
        assert client.asked == [(0, 2), ()]
    finally:
        pg.close()
