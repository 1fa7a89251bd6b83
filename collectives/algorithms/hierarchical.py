"""Hierarchical all_reduce: reduce within each host, ring among the hosts, broadcast within each
host (Horovod's hierarchical allreduce; NCCL's intra-node / inter-node split).

`hosts[r]` names the host of rank r (any labels: equal labels, one host). The ranks of a host,
in rank order, form a local group whose leader is its lowest rank; the leaders, in rank order,
form a ring across the hosts. The buffer is worked through in blocks of H segments (H hosts,
one segment per leader's ring chunk):

  1. host reduce:     binomial tree (tree.py) over the host's ranks, into the leader. Each rank
                      adds its children's contributions in a fixed order (the tree's), so the
                      result does not depend on timing.
  2. leaders ring:    ring all_reduce (ring.py) over the H leaders, one chunk per leader: only
                      this phase crosses the hosts' links.
  3. host broadcast:  binomial tree from the leader to the rest of its host.

  hosts = [0, 0, 1, 1] (leaders: rank 0 on host 0, rank 2 on host 1):
      host reduce:      r1 -> r0                 r3 -> r2         (within each host)
      leaders ring:     r0 <-> r2   reduce-scatter 1 step, all-gather 1 step
      host broadcast:   r0 -> r1                 r2 -> r3

Tree and ring run unchanged on sub-channels (subgroup.py) that map a sub-group's indices to
global ranks. A pair of ranks talks in one phase only (two ranks of a host in the tree, two
leaders in the ring), so the phases never mix up their messages.

Cost for N bytes, H hosts with at most k ranks each; alpha_l, beta_l within a host (shared
memory), alpha_x, beta_x across hosts:
    T = 2 ceil(log2 k) (alpha_l + N beta_l) + 2(H-1) alpha_x + 2(H-1)/H * N beta_x
Over the hosts' links each leader sends 2(H-1)/H * N bytes and no other rank sends anything;
a flat ring over all n = H k ranks sends 2(n-1)/n * N over each host's link (2 hosts x 2
ranks: N against 1.5 N), and its 2(n-1) steps each pay alpha_x. Pipelining hides most of the
intra-host terms behind the link: the non-leaders send every block's contribution up front,
and a leader's broadcast of block b leaves while it works on block b+1.

Bitwise identical everywhere: a block is reduced within each host once (by the tree), then
across hosts once (by the ring, whose owner reduces each chunk and copies it), and then only
copied. AVG runs as SUM and every leader divides the same bytes by n once.
"""
from __future__ import annotations

import numpy as np

from ..core.ops import ReduceOp, finalize
from . import ring, tree
from .chunks import segment_elems, segments
from .subgroup import SubChannel


def host_groups(hosts) -> list[list[int]]:
    """The ranks of each host, in rank order; hosts ordered by their lowest rank (the leader).

    >>> host_groups(["b", "a", "b", "c"])
    [[0, 2], [1], [3]]
    """
    groups: dict = {}
    for r, h in enumerate(hosts):
        groups.setdefault(h, []).append(r)
    return list(groups.values())


def all_reduce(ch, buf: np.ndarray, op: ReduceOp, hosts) -> None:
    """Reduce `buf` (1-D, contiguous) over all ranks, in place, on every rank; `hosts` has one
    host label per rank, the same on every rank."""
    n = ch.size
    if len(hosts) != n:
        raise ValueError(f"hierarchical all_reduce: the host map has {len(hosts)} entries for "
                         f"{n} ranks")
    groups = host_groups(hosts)
    mine = next(g for g in groups if ch.rank in g)
    leaders = [g[0] for g in groups]
    local = SubChannel(ch, mine, "host")            # local rank 0 is the leader: the tree's root
    wire_op = ReduceOp.SUM if op is ReduceOp.AVG else op
    block = segment_elems(ch, buf.itemsize) * len(leaders)
    blocks = segments(0, buf.size, block)

    if ch.rank != mine[0]:
        # Not a leader: every block's contribution goes up first (sends do not wait), then the
        # results come down, block by block, in the same order as the leader sends them.
        for a, b in blocks:
            tree.reduce(local, buf[a:b], wire_op, root=0, keep_input=False)
        for a, b in blocks:
            tree.broadcast(local, buf[a:b], root=0)
        return

    cross = SubChannel(ch, leaders, "leaders")
    for a, b in blocks:
        part = buf[a:b]
        tree.reduce(local, part, wire_op, root=0, keep_input=False)   # 1. this host's sum
        ring.all_reduce(cross, part, wire_op)                         # 2. across the hosts
        finalize(op, part, n)                     # AVG: the same division on every leader
        tree.broadcast(local, part, root=0)                           # 3. back to the host
