"""Hierarchical all_reduce: reduce within each host, ring among the hosts, broadcast within each
host (Horovod's hierarchical allreduce; NCCL's intra-node / inter-node split).

`hosts[r]` names the host of rank r (any labels: equal labels, one host). The ranks of a host,
in rank order, form a local group whose leader is its lowest rank; the H leaders, in rank order,
form a ring across the hosts, and the buffer is cut into H chunks, one per leader:

  1. host reduce:     binomial tree (tree.py) over the host's ranks, into the leader. Each rank
                      adds its children's contributions in a fixed order (the tree's), so the
                      result does not depend on timing.
  2. leaders ring:    ring all_reduce (ring.py) over the H leaders: only this phase crosses the
                      hosts' links.
  3. host broadcast:  binomial tree from the leader to the rest of its host.

  hosts = [0, 0, 1, 1] (leaders: rank 0 on host 0, rank 2 on host 1; chunks c0, c1):
      host reduce:      r1 -> r0                 r3 -> r2         (within each host)
      leaders ring:     r0 <-> r2   reduce-scatter 1 step, all-gather 1 step
      host broadcast:   r0 -> r1                 r2 -> r3

The phases are pipelined piece by piece (a piece: one segment of a chunk). The ring tells when
it first needs a piece and when a piece is final (ring.all_reduce's ready and final hooks):
the leader reduces its host's contributions into a piece just before the ring sends it or
adds into it, and broadcasts a piece to its host as soon as it is final. So while one piece
crosses the link, the leader is already summing the next; the other ranks of a host send all
their pieces up front, in the order the leader will want them (ring.touch_order), and then
take the results in the order they become final.

Tree and ring run unchanged on sub-channels (subgroup.py) that map a sub-group's indices to
global ranks. A pair of ranks talks in one phase only (two ranks of a host in the tree, two
leaders in the ring), so the phases never mix up their messages.

Cost for N bytes, H hosts with at most k ranks each; alpha_l, beta_l within a host (shared
memory), alpha_x, beta_x across hosts:
    unpipelined:  T = 2 ceil(log2 k) (alpha_l + N beta_l) + 2(H-1) alpha_x + 2(H-1)/H * N beta_x
    pipelined:    T -> 2(H-1)/H * N beta_x + the first and last pieces' host terms, when the
                  link is the slowest part
Over the hosts' links each leader sends 2(H-1)/H * N bytes and no other rank sends anything;
a flat ring over all n = H k ranks sends 2(n-1)/n * N over each host's link (2 hosts x 2
ranks: N against 1.5 N), and its 2(n-1) steps each pay alpha_x.

Bitwise identical everywhere: each piece is reduced within each host once (by the tree), then
across hosts once (by the ring, whose owner completes each chunk and copies it), and then only
copied. AVG is summed everywhere and divided by n once, by the ring's owner of each chunk.
"""
from __future__ import annotations

import numpy as np

from ..core.ops import ReduceOp
from . import ring, tree
from .chunks import chunk_bounds, segment_elems, segments
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
    h, i = len(leaders), groups.index(mine)         # i: this host's place on the ring
    local = SubChannel(ch, mine, "host")            # local rank 0 is the leader: the tree's root
    sum_op = ReduceOp.SUM if op is ReduceOp.AVG else op

    def host_reduce(a, b):                          # 1. this host's sum of buf[a:b], at the leader
        tree.reduce(local, buf[a:b], sum_op, root=0, keep_input=False)

    def host_broadcast(a, b):                       # 3. the final buf[a:b], from the leader
        tree.broadcast(local, buf[a:b], root=0)

    if ch.rank != mine[0]:
        # Not a leader: every piece goes up first (sends do not wait), in the order the
        # leader's ring first needs them; then the results come down as they become final.
        bounds = chunk_bounds(buf.size, h)
        seg = segment_elems(ch, buf.itemsize)
        wants, finals = ring.touch_order(i, h)
        for c in wants:
            for a, b in segments(*bounds[c], seg):
                host_reduce(a, b)
        for c in finals:
            for a, b in segments(*bounds[c], seg):
                host_broadcast(a, b)
        return
    cross = SubChannel(ch, leaders, "leaders")      # 2. across the hosts
    ring.all_reduce(cross, buf, op, ready=host_reduce, final=host_broadcast, divide_by=n)
