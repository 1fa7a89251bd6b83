"""Double binary tree all_reduce (Sanders, Speck & Träff 2009; NCCL's trees): two binary trees,
each reducing and broadcasting half of the buffer, in segments, pipelined.

The first tree is the in-order binary tree over positions 0 .. n-1: position q (1-based q+1)
sits at the level of the lowest set bit of q+1, so every even position (odd q+1) is a leaf and
every odd position is interior. The second tree is the same shape over ranks shifted by one
(rank r at position (r+1) mod n), which puts every odd rank -- the first tree's interior -- on
one of its leaves. So every rank is interior in at most one tree, and adds and forwards for
that tree only. n = 6, the first tree by position = rank, the second by rank:

    tree 0:        3                  tree 1:        2
                 /   \\                             /   \\
                1     5                           0     4
               / \\   /                          / \\   /
              0   2 4                           5   1 3

Each tree carries one half of the buffer, cut into S segments of at most ch.segment_bytes. A
rank runs S + LAG iterations; in iteration j it reduces segment j of both halves up their
trees (adding its children's copies in, child by child, then sending to its parent) and takes
segment j - LAG of both halves down (from its parent, then to its children). A root finishes a
segment (finalize: AVG divides there, once) and sends it down; below it, segments are only
copied, so every rank ends with the roots' bytes.

Cost for N bytes with S segments of s = N/(2S) bytes a half, in the single-port model: per
segment an interior rank with a parent and two children takes three messages of its tree (two
children's copies, then its parent's result) and sends three (one up, two down), and as a leaf
of the other tree takes one and sends one: 4 each way, so each port is busy 4 S (alpha + s beta)
and, with the pipeline's fill and drain,
    T = rounds(n, S) * (alpha + s * beta),   rounds(n, S) = 4 S + fill(n, S)
with a fill of 1 to 10 rounds for n = 4 .. 16. At n = 2 and 3 the busiest ranks are roots, with
no parent: rounds are 2 S and 3 S + 3 (S >= 2). emulate.cost has the figures, and the tests
hold the emulator to them. That is about 2 N beta in all:
the ring's bandwidth term as S grows, with a pipeline fill of O(log n) rounds, where the ring
pays 2(n-1) alphas and the binomial tree's root 2 ceil(log2 n) N beta.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..common.channel import Channel
from ..common.ops import ReduceOp, finalize
from .chunks import segment_elems, segments

PERIOD = 1  # time units between two segments entering the pipeline (see program)


class Node(NamedTuple):
    """One rank's place in one tree: its parent (None at the root) and children, as ranks."""

    parent: int | None
    children: tuple[int, ...]


def _in_order(lo: int, hi: int, parent: int | None, out: dict[int, Node]) -> None:
    """The subtree over positions lo .. hi-1: its root is the position whose 1-based number has
    the most trailing zero bits (one such in any run of consecutive numbers)."""
    if lo >= hi:
        return
    root = max(range(lo, hi), key=lambda q: ((q + 1) & -(q + 1), -q))
    kids = []
    if lo < root:
        kids.append(max(range(lo, root), key=lambda q: ((q + 1) & -(q + 1), -q)))
    if root + 1 < hi:
        kids.append(max(range(root + 1, hi), key=lambda q: ((q + 1) & -(q + 1), -q)))
    out[root] = Node(parent, tuple(kids))
    _in_order(lo, root, root, out)
    _in_order(root + 1, hi, root, out)


def tree_by_position(n: int) -> dict[int, Node]:
    """The in-order binary tree over positions 0 .. n-1 (leaves: the even positions)."""
    out: dict[int, Node] = {}
    _in_order(0, n, None, out)
    return out


def node(rank: int, n: int, tree: int) -> Node:
    """`rank`'s parent and children in tree 0 (position = rank) or tree 1 (position = rank+1
    mod n), as ranks."""
    shift = tree  # tree 1: rank r sits at position (r + 1) mod n
    at = tree_by_position(n)[(rank + shift) % n]

    def rank_of(q: int) -> int:
        return (q - shift) % n

    return Node(
        None if at.parent is None else rank_of(at.parent), tuple(rank_of(c) for c in at.children)
    )


def halves(count: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The elements each tree carries: the first half (rounded up) and the rest."""
    mid = (count + 1) // 2
    return (0, mid), (mid, count)


def _height_depth(n: int) -> tuple[dict[int, int], dict[int, int], int]:
    """Every position's height (leaves 0) and depth (root 0) in tree_by_position(n), and the
    root's height."""
    tree = tree_by_position(n)
    height: dict[int, int] = {}
    depth: dict[int, int] = {}

    def walk(q: int, d: int) -> int:
        depth[q] = d
        height[q] = 1 + max((walk(c, d + 1) for c in tree[q].children), default=-1)
        return height[q]

    root = next(q for q, at in tree.items() if at.parent is None)
    return height, depth, walk(root, 0)


def tree_height(n: int) -> int:
    """The longest path from the root to a leaf, in messages (both trees have one shape)."""
    return _height_depth(n)[2]


class Op(NamedTuple):
    """One step of a rank's program: at `time`, segment `j` of tree `tree` goes up or down."""

    time: int
    down: bool
    tree: int
    j: int


def program(rank: int, n: int, segments_per_tree: tuple[int, int]) -> list[Op]:
    """rank's steps in the order of a pipeline that starts segment j at time PERIOD * j: a rank
    of height h takes segment j up at PERIOD j + h (its children's, of lower height, came
    first), and a rank of depth d takes it down at PERIOD j + H + 1 + d (its parent's, one
    shallower, came first). Every receive's matching send has an earlier time, so ranks that
    each follow their own steps in this order never wait on one another in a cycle."""
    height, depth, top = _height_depth(n)
    ops = []
    for t in (0, 1):
        q = (rank + t) % n
        for j in range(segments_per_tree[t]):
            ops.append(Op(PERIOD * j + height[q], False, t, j))
            ops.append(Op(PERIOD * j + top + 1 + depth[q], True, t, j))
    return sorted(ops)


def all_reduce(ch: Channel, buf: np.ndarray, op: ReduceOp) -> None:
    """Reduce `buf` (1-D, contiguous) across all ranks, in place, on every rank."""
    n, r = ch.size, ch.rank
    if n == 1:
        finalize(op, buf, 1)
        return
    seg = segment_elems(ch, buf.itemsize)
    nodes = [node(r, n, t) for t in (0, 1)]
    pieces = [segments(a, b, seg) for a, b in halves(buf.size)]
    for step in program(r, n, (len(pieces[0]), len(pieces[1]))):
        piece = pieces[step.tree][step.j]
        if step.down:
            _down(ch, buf, nodes[step.tree], piece, step.tree, step.j)
        else:
            _up(ch, buf, op, nodes[step.tree], piece, step.tree, step.j)


def _up(
    ch: Channel, buf: np.ndarray, op: ReduceOp, at: Node, piece: tuple[int, int], t: int, j: int
) -> None:
    a, b = piece
    for c in at.children:  # a fixed order: every root adds the same operands the same way
        ch.recv_reduce(c, buf[a:b], op, phase=f"reduce tree {t}", step=j, chunk=t)
    if at.parent is not None:
        ch.send(at.parent, buf[a:b], phase=f"reduce tree {t}", step=j, chunk=t)
    else:
        finalize(op, buf[a:b], ch.size)


def _down(ch: Channel, buf: np.ndarray, at: Node, piece: tuple[int, int], t: int, j: int) -> None:
    a, b = piece
    if at.parent is not None:
        ch.recv_into(at.parent, buf[a:b], phase=f"broadcast tree {t}", step=j, chunk=t)
    for c in at.children:
        ch.send(c, buf[a:b], phase=f"broadcast tree {t}", step=j, chunk=t)
