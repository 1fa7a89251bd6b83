"""Rooted ops (broadcast, reduce) over the binomial tree, with the confirmations that make a
mismatch visible on every rank.

They add empty "confirm" messages to the tree's schedule, so that
every rank learns whether all ranks called the same op (and raises CollectiveMismatch if
not) before it returns -- without them a broadcast root, or a reduce leaf, would return
before the rank that differs, or never shows up, is found. They add one hop to the depth,
and in the single-port model n - 1 rounds at the root's port (one empty message from, or to,
every other rank: alpha each).
"""

from __future__ import annotations

import numpy as np

from ..common.channel import Channel
from . import tree

_EMPTY = np.empty(0, np.uint8)


def rooted_broadcast(ch: Channel, arr: np.ndarray, root: int) -> None:
    """Every rank first tells the root it is here (its descriptor rides on the message), and
    the root sends data only once all have: a rank that differs is found before any data
    moves, and an ABORT reaches the others instead. With two ranks the data can go at once:
    the only receiver checks it itself, and its note reaches the root meanwhile."""
    if ch.rank != root:
        ch.send(root, _EMPTY, phase="confirm")
        tree.broadcast(ch, arr, root=root)
        return
    others = [p for p in range(ch.size) if p != root]
    if ch.size == 2:
        tree.broadcast(ch, arr, root=root)
    for peer in others:
        ch.recv_into(peer, _EMPTY, phase="confirm")
    if ch.size > 2:
        tree.broadcast(ch, arr, root=root)


def release(ch: Channel, root: int) -> None:
    """After a reduce, the root (which has seen every rank's contribution, each checked by
    the rank it came to) tells every rank that the op is complete; they wait for it."""
    if ch.rank == root:
        for peer in range(ch.size):
            if peer != root:
                ch.send(peer, _EMPTY, phase="confirm")
    else:
        ch.recv_into(root, _EMPTY, phase="confirm")
