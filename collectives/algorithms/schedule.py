"""A schedule chosen around slow links: which ring order or tree root all_reduce uses.

The coordinator measures every link (membership/failslow.py) and, when some lag their peers,
hands every rank the same Plan to start at the same op (membership/reroute.py). The plan only
renames positions: the ring or tree runs unchanged over SubChannel(ch, order), where position
i is rank order[i]. So the result of every rank is the same bytes (each algorithm's own
guarantee), and differs from the default schedule's only by the order of the reduction.

    ring over order [0, 2, 1, 3]:  0 -> 2 -> 1 -> 3 -> 0     (avoids 0 <-> 1 both ways)
    tree over order [2, 0, 1]:     root 2; 0 and 1 its children (avoids 0 <-> 1)

plan_around(n, slow) picks, among the rings that start at rank 0 (every ring has such a
rotation), one that uses no slow directed link; failing that, a binomial tree (both directions
of each parent-child pair carry data) that uses none; failing both (a rank whose every link is
slow: a slow NIC), the ring that uses the fewest, which the caller may keep or not (`avoids`).
Up to EXHAUSTIVE_MAX ranks every order is tried; above, a greedy walk that takes the next rank
over a fast link where there is one.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from ..common.channel import Channel
from .subgroup import SubChannel
from .tree import children_of

EXHAUSTIVE_MAX = 8  # 7! = 5,040 ring orders at most

Link = tuple[int, int]


class Plan(NamedTuple):
    """The schedule of all_reduce from some op on: a ring over `order`, or, where `root` is
    set, a binomial tree over `order` (order[0] == root)."""

    order: tuple[int, ...]
    tree: bool  # a tree over `order` (rooted at order[0]) rather than a ring
    avoided: tuple[Link, ...]  # the slow links it keeps off
    avoids: bool  # it uses none of the slow links

    def describe(self) -> str:
        shape = f"tree rooted at rank {self.order[0]}" if self.tree else "ring"
        path = " -> ".join(map(str, (*self.order, self.order[0]) if not self.tree else self.order))
        kept = ", ".join(f"{a}->{b}" for a, b in self.avoided)
        how = "avoiding" if self.avoids else "unable to avoid all of"
        return f"{shape} over {path}, {how} {kept}"

    def wire(self) -> list:
        return [list(self.order), self.tree, [list(x) for x in self.avoided], self.avoids]

    @classmethod
    def from_wire(cls, v: Any, n: int) -> Plan | None:
        """A plan as it arrived, checked: None if it is not one for a group of n."""
        try:
            order, tree, avoided, avoids = v
            order = tuple(int(r) for r in order)
            links = tuple((int(a), int(b)) for a, b in avoided)
        except (TypeError, ValueError):
            return None
        if sorted(order) != list(range(n)) or type(tree) is not bool or type(avoids) is not bool:
            return None
        return cls(order, tree, links, avoids)


def ring_links(order: Sequence[int]) -> set[Link]:
    n = len(order)
    return {(order[i], order[(i + 1) % n]) for i in range(n)} if n > 1 else set()


def tree_links(order: Sequence[int]) -> set[Link]:
    out: set[Link] = set()
    n = len(order)
    for v in range(n):
        for c in children_of(v, n):
            out |= {(order[v], order[c]), (order[c], order[v])}
    return out


def _orders(n: int) -> Iterable[tuple[int, ...]]:
    """Every order with rank 0 first (exhaustive), or a handful of greedy ones."""
    return (
        ((0, *rest) for rest in itertools.permutations(range(1, n))) if n <= EXHAUSTIVE_MAX else ()
    )


def _greedy(n: int, slow: frozenset) -> tuple[int, ...]:
    order, left = [0], set(range(1, n))
    while left:
        cur = order[-1]
        nxt = min(left, key=lambda r: ((cur, r) in slow, r))
        order.append(nxt)
        left.discard(nxt)
    return tuple(order)


def plan_around(n: int, slow: Iterable[Link]) -> Plan | None:
    """The schedule for n ranks that keeps off the directed links in `slow` (see the module's
    docstring); None if nothing is slow. The same links give the same plan (kept: the
    coordinator asks again at every judgement)."""
    return _plan(n, frozenset((a, b) for a, b in slow if a != b and 0 <= a < n and 0 <= b < n))


@functools.lru_cache(maxsize=64)
def _plan(n: int, slow: frozenset) -> Plan | None:
    if not slow or n < 2:
        return None
    avoided = tuple(sorted(slow))
    best, best_cost = None, None
    for order in itertools.chain(_orders(n), [_greedy(n, slow)]):
        cost = len(ring_links(order) & slow)
        if best_cost is None or cost < best_cost:
            best, best_cost = order, cost
        if cost == 0:
            return Plan(order, False, avoided, True)
    if n <= EXHAUSTIVE_MAX:
        for root in range(n):
            for rest in itertools.permutations([r for r in range(n) if r != root]):
                order = (root, *rest)
                if not tree_links(order) & slow:
                    return Plan(order, True, avoided, True)
    assert best is not None
    return Plan(best, False, avoided, False)


def view(ch: Channel, plan: Plan) -> SubChannel:
    """The op's channel as the plan's positions see it."""
    return SubChannel(ch, plan.order)


__all__ = ["Plan", "plan_around", "ring_links", "tree_links", "view"]
