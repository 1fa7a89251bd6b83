"""Hierarchical all_reduce: reduce within each host, rings across the hosts, share back within
each host (Horovod's hierarchical allreduce; NCCL's intra-node / inter-node split, with one
cross-host ring per local rank as NCCL runs one per NIC/channel).

`hosts[r]` names the host of rank r (any labels: equal labels, one host). The ranks of a host,
in rank order, form a local group; its first k ranks are its leaders, where k is the smallest
number of ranks any host has. Leader j of every host (local rank j) forms ring j across the
hosts, which all_reduces part j of the buffer (the buffer is cut into k parts, and each part
into H chunks, one per host, for its ring):

  1. host reduce-scatter: every rank sends part j of its buffer to its host's leader j (the
                          leaders keep their own part); leader j adds its host's contributions
                          in local rank order, so the result does not depend on timing.
  2. leaders' rings:      ring all_reduce (ring.py) over leader j of the H hosts, on part j,
                          for every j at once: only this phase crosses the hosts' links, and
                          its bytes and their cipher (CURVE, on each process's ZeroMQ I/O
                          thread) are spread over k processes per host instead of one.
  3. host all-gather:     leader j sends the final part j to the other ranks of its host.

  hosts = [0, 0, 1, 1] (k = 2 leaders per host; parts p0 = c0 c1 and p1 = c2 c3):
      host reduce-scatter:  r1 -p0-> r0, r0 -p1-> r1        r3 -p0-> r2, r2 -p1-> r3
      leaders' rings:       ring 0: r0 <-> r2 on p0;  ring 1: r1 <-> r3 on p1   (the links)
      host all-gather:      r0 -p0-> r1, r1 -p1-> r0        r2 -p0-> r3, r3 -p1-> r2

Below the channel's leaders_min_bytes (1 MiB over ZeroMQ, transport/zmq/transport.py; 0 in-process) the
schedule runs with k = 1 whatever the hosts: at 64-256 KiB the one leader's trees beat k
leaders' exchanges by a third (measured; the figures are beside leaders_min_bytes), and the
cipher's share is small there. With k = 1 (some host has one rank, or a small buffer) the host
phases are binomial trees (tree.py) into and out of the one leader per host, as in Horovod: a
host's other ranks then have no ring of their own, so they can wait in a tree's inner nodes.
With k >= 2 every leader is busy in its ring, so the host phases are direct: each rank's sends
go out before it waits for anything (sends do not wait), and nobody forwards for anyone.

The phases are pipelined piece by piece (a piece: one segment of a chunk; across hosts the
segment is the channel's link_segment_bytes where that is smaller: 1 MiB over ZeroMQ, whose
cipher takes a message whole, so smaller pieces reach the link sooner). The ring tells when
it first needs a piece and when a piece is final (ring.all_reduce's ready and final hooks):
a leader adds its host's contributions into a piece just before its ring sends it or adds into
it, and sends a piece to its host as soon as it is final, while the next one crosses the link.
Each rank sends its pieces of the other parts in the order their leaders will want them
(ring.touch_order): a rank that leads no ring all at once, a leader its t-th pieces just before
its own ring wants its t-th (all rings want their t-th piece at the same point: a host has the
same place on every ring). Then each takes the results in the order they become final.

Tree and ring run unchanged on sub-channels (subgroup.py) that map a sub-group's indices to
global ranks. Messages are matched per pair of ranks in order, so no pair may mix two phases
in different orders on its two sides: two leaders of different hosts meet in one ring only;
two ranks of a host exchange all their phase-1 messages before any of phase 3 (a rank sends
the last of its contributions before its first result, and receives results only after its
ring ended, while a leader receives contributions only during its ring). Nor can the pieces
sent late deadlock: leader j waits for our t-th piece at its t-th, which we send at our t-th
at the latest, and what a ring waits for across the link at its t-th piece the other host's
leader sent at an earlier one.

Cost for N bytes, H hosts with at most m ranks each and k leaders each; alpha_l, beta_l within
a host (shared memory), alpha_x, beta_x across hosts:
    unpipelined, k = 1:  T = 2 ceil(log2 m)(alpha_l + N beta_l) + 2(H-1) alpha_x + 2(H-1)/H N beta_x
    unpipelined, k >= 2: T = 2(m-1)(alpha_l + N/k beta_l) + 2(H-1) alpha_x + 2(H-1)/H N beta_x
    pipelined:           T -> 2(H-1)/H * N beta_x + the first and last pieces' host terms, when
                         the link is the slowest part
Over each host's link its k leaders send 2(H-1)/H * N bytes together (2(H-1)/H * N/k each) and
no other rank sends anything; a flat ring over all n = H m ranks sends 2(n-1)/n * N over each
host's link (2 hosts x 2 ranks: N against 1.5 N), and its 2(n-1) steps each pay alpha_x. With
the cipher on, the time a host's link waits for its encryption and decryption of the first and
last pieces is divided by k, and so is each I/O thread's share of the 2N bytes of cipher work.

Bitwise identical everywhere: each piece is reduced within each host once (by its leader),
then across hosts once (by its ring, whose owner completes each chunk and copies it), and then
only copied. AVG is summed everywhere and divided by n once, by the ring's owner of each chunk.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from ..common.channel import Channel
from ..common.ops import ReduceOp
from . import ring, tree
from .chunks import Bounds, chunk_bounds, segments
from .subgroup import SubChannel


def host_groups(hosts: Sequence[Hashable]) -> list[list[int]]:
    """The ranks of each host, in rank order; hosts ordered by their lowest rank (the leader).

    >>> host_groups(["b", "a", "b", "c"])
    [[0, 2], [1], [3]]
    """
    groups: dict[Hashable, list[int]] = {}
    for r, h in enumerate(hosts):
        groups.setdefault(h, []).append(r)
    return list(groups.values())


def leaders_per_host(groups: list[list[int]]) -> int:
    """k: as many leaders per host as the smallest host has ranks (ring j needs a local rank j
    on every host)."""
    return min(len(g) for g in groups)


def all_reduce(ch: Channel, buf: np.ndarray, op: ReduceOp, hosts: Sequence[Hashable]) -> None:
    """Reduce `buf` (1-D, contiguous) over all ranks, in place, on every rank; `hosts` has one
    host label per rank, the same on every rank."""
    n = ch.size
    if len(hosts) != n:
        raise ValueError(
            f"hierarchical all_reduce: the host map has {len(hosts)} entries for {n} ranks"
        )
    groups = host_groups(hosts)
    k = leaders_per_host(groups)
    # Every phase is cut into the same pieces (the host phases feed the rings piece by
    # piece): the channel's segment, or its link_segment_bytes across hosts if smaller.
    piece = ch.segment_bytes
    if len(groups) > 1:
        piece = min(piece, ch.link_segment_bytes or piece)
    # Small buffers: one leader, whose trees send fewer messages than k leaders' exchanges
    # (the channel's leaders_min_bytes; the same on every rank, as is buf.nbytes).
    if k == 1 or buf.nbytes < ch.leaders_min_bytes:
        _one_leader(ch, buf, op, groups, piece)
    else:
        _k_leaders(ch, buf, op, groups, k, piece)


def _k_leaders(
    ch: Channel, buf: np.ndarray, op: ReduceOp, groups: list[list[int]], k: int, piece: int
) -> None:
    n = ch.size
    mine = next(g for g in groups if ch.rank in g)
    h, i, v = len(groups), groups.index(mine), mine.index(ch.rank)  # i: place on every ring
    local = SubChannel(ch, mine, "host", segment_bytes=piece)
    sum_op = ReduceOp.SUM if op is ReduceOp.AVG else op
    parts = chunk_bounds(buf.size, k)  # part j: ring j's, led by local rank j
    seg = max(1, piece // buf.itemsize)
    wants, finals = ring.touch_order(i, h)  # the same on every ring: i is our place

    def pieces(
        j: int, chunk_order: list[int]
    ) -> Bounds:  # part j's pieces, absolute, in that order
        p0, p1 = parts[j]
        bounds = chunk_bounds(p1 - p0, h)
        return [(p0 + a, p0 + b) for c in chunk_order for a, b in segments(*bounds[c], seg)]

    others = [j for j in range(k) if j != v]  # the leaders of the parts not ours
    # 1. host reduce-scatter, our side: our pieces of the other parts, to their leaders, in
    #    the order their rings want them. Every ring wants its t-th piece at the same point of
    #    the schedule (our host has the same place on all), so a leader sends its t-th pieces
    #    just before it waits for its own t-th (sends do not wait): the first piece crosses the
    #    link after one piece's copy, not after copying 1/k of the buffer. The rest goes before
    #    our first result does, so that each pair exchanges all of phase 1 before phase 3.
    up = sorted((t, j, a, b) for j in others for t, (a, b) in enumerate(pieces(j, wants)))
    sent = 0

    def send_up_to(t: int) -> None:
        nonlocal sent
        while sent < len(up) and up[sent][0] <= t:
            _, j, a, b = up[sent]
            local.send(j, buf[a:b], phase="reduce-scatter", step=0, chunk=a)
            sent += 1

    if v >= k:  # no ring of ours to wait for: all now
        send_up_to(len(up))
    else:  # we lead part v, on ring v
        p0, p1 = parts[v]
        part = buf[p0:p1]
        wanted = 0

        def ready(
            a: int, b: int
        ) -> None:  # 1. the host's contributions to this piece, in local rank order
            nonlocal wanted
            send_up_to(wanted)
            wanted += 1
            for u in range(len(mine)):
                if u != v:
                    local.recv_reduce(
                        u, part[a:b], sum_op, phase="reduce-scatter", step=0, chunk=p0 + a
                    )

        def final(
            a: int, b: int
        ) -> None:  # 3. host all-gather: the piece to the host, as soon as final
            send_up_to(len(up))
            for u in range(len(mine)):
                if u != v:
                    local.send(u, part[a:b], phase="all-gather", step=0, chunk=p0 + a)

        cross = SubChannel(ch, [g[v] for g in groups], "leaders", piece)  # 2. across hosts
        ring.all_reduce(cross, part, op, ready=ready, final=final, divide_by=n)
    # 3. host all-gather, our side: the other parts, from their leaders, as they become final.
    for j in others:
        for a, b in pieces(j, finals):
            local.recv_into(j, buf[a:b], phase="all-gather", step=0, chunk=a)


def _one_leader(
    ch: Channel, buf: np.ndarray, op: ReduceOp, groups: list[list[int]], piece: int
) -> None:
    """k = 1: tree into each host's one leader, the leaders' ring, tree out of it."""
    n = ch.size
    mine = next(g for g in groups if ch.rank in g)
    leaders = [g[0] for g in groups]
    h, i = len(leaders), groups.index(mine)  # i: this host's place on the ring
    local = SubChannel(ch, mine, "host", piece)  # local rank 0 is the leader: the tree's root
    sum_op = ReduceOp.SUM if op is ReduceOp.AVG else op

    def host_reduce(a: int, b: int) -> None:  # 1. this host's sum of buf[a:b], at the leader
        tree.reduce(local, buf[a:b], sum_op, root=0, keep_input=False)

    def host_broadcast(a: int, b: int) -> None:  # 3. the final buf[a:b], from the leader
        tree.broadcast(local, buf[a:b], root=0)

    if ch.rank != mine[0]:
        # Not a leader: every piece goes up first (sends do not wait), in the order the
        # leader's ring first needs them; then the results come down as they become final.
        bounds = chunk_bounds(buf.size, h)
        seg = max(1, piece // buf.itemsize)
        wants, finals = ring.touch_order(i, h)
        for c in wants:
            for a, b in segments(*bounds[c], seg):
                host_reduce(a, b)
        for c in finals:
            for a, b in segments(*bounds[c], seg):
                host_broadcast(a, b)
        return
    cross = SubChannel(ch, leaders, "leaders", piece)  # 2. across the hosts
    ring.all_reduce(cross, buf, op, ready=host_reduce, final=host_broadcast, divide_by=n)
