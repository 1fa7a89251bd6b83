"""Collective algorithms: pure functions over a channel.

Each function takes a `Channel` (common/channel.py, exported here): `ch.rank`, `ch.size`,
`ch.send(peer, buf)`, `ch.recv_into(peer, buf)` and `ch.recv_reduce(peer, buf, op)` (each
transfer also labelled with phase, step and chunk for traces and error messages), plus
`ch.segment_bytes`, the size in which large buffers are pipelined, and what hierarchical.py reads
of a group that spans hosts (`link_segment_bytes`, `leaders_min_bytes`). No algorithm imports
sockets, threads or queues, so the same code runs on threads in one process
(transport/inproc.py) and across hosts (transport/zmq/transport.py).

    naive.py    gather to rank 0, reduce in rank order, send back   (the reference; the
                fewest messages, so "auto" on a crowded host)
    direct.py   everyone sends everything to everyone, reduces in rank order (depth 1)
    ring.py     reduce-scatter then all-gather around a ring (bandwidth-optimal)
    tree.py     binomial tree reduce and broadcast; all_reduce = reduce + broadcast
    halving_doubling.py  recursive halving then doubling (the tree's rounds and the ring's
                bytes together for n a power of two; other n pay a fold: 2 rounds, N bytes)
    double_tree.py  two binary trees, each reducing and broadcasting half the buffer in
                pipelined segments (every rank interior in at most one)
    hierarchical.py  tree reduce within each host, ring among the hosts' leaders, tree
                broadcast within each host (for groups that span several hosts)
    barrier.py  dissemination barrier (ceil(log2 n) rounds of empty messages)
    rooted.py   broadcast and reduce over the tree, with the confirmations that make a
                mismatch visible on every rank
    chunks.py   how buffers are cut into chunks and pipelined segments
    subgroup.py a channel seen by a subset of its ranks (hierarchical.py runs tree and ring
                on such sub-channels)
    commit.py   the commit round that ends every collective of a group that survives failures
"""

from ..common.channel import Channel

__all__ = ["Channel"]
