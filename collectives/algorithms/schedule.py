"""A schedule chosen around slow links: which ring order or tree root all_reduce uses.

The coordinator measures every link (membership/failslow.py) and, when some lag their peers,
hands every rank the same Plan to start at the same op (membership/reroute.py). The plan only
renames positions: the ring or tree runs unchanged over SubChannel(ch, order), where position
i is rank order[i]. So the result of every rank is the same bytes (each algorithm's own
guarantee), and differs from the default schedule's only by the order of the reduction.

    ring over order [0, 2, 1, 3]:  0 -> 2 -> 1 -> 3 -> 0     (avoids 0 <-> 1 both ways)
    tree over order [2, 0, 1]:     root 2; 0 and 1 its children (avoids 0 <-> 1)

plan_around(n, slow, costs) prices the candidates with the alpha-beta model on the measured
figures (costmodel.py: each slow link at its own throughput and latency, every other link at
its peers'), for an all_reduce of REFERENCE_BYTES: the best ring order (every order starting at
rank 0 up to costmodel.RING_EXHAUSTIVE_MAX ranks, a greedy walk above) and the best binomial
tree (every order up to costmodel.TREE_EXHAUSTIVE_MAX ranks). The faster of the two is the
plan, the tree only where it is predicted faster by costmodel.MARGIN: a ring wherever one
avoids the slow links, since a ring's steps carry N/n where a tree's carry N; at 3 ranks with
one pair slow both ways, where every ring uses one of its directions, the tree rooted at the
third rank where that pair is slow enough to cost the ring more than the tree's larger
messages. No plan (None) where it is not predicted faster, by costmodel.MARGIN, than a default
schedule that a slow link costs (the ring, the tree, direct or naive over 0, 1, ..., n-1):
nothing to gain. A rank whose every link is slow (a slow NIC) gets at most the ring as it is
(unable to avoid them; a tree over them costs more) -- or, from plan_for_nics, the ring in
rank order with its chunks sized by bandwidth (costmodel.nic_weights: the slow rank owns the
larger share, so its two ring links carry less), where that is predicted faster by
costmodel.MARGIN. The plan carries the figures it was chosen on, so that every rank prices the
small-message schedules on the same figures (group/rerouted.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from ..common.channel import Channel
from .costmodel import (
    MARGIN,
    LinkCosts,
    Schedule,
    best_ring,
    best_tree,
    identity,
    links_of,
    lower_bound,
    nic_weights,
    predict,
)
from .subgroup import SubChannel

REFERENCE_BYTES = 4 << 20  # a large all_reduce: where a slow link's throughput is what costs

Link = tuple[int, int]


class Plan(NamedTuple):
    """The schedule of all_reduce from some op on: a ring over `order`, or, where `tree` is
    set, a binomial tree over `order` (rooted at order[0]); `costs`, the figures it was chosen
    on (None: none known)."""

    order: tuple[int, ...]
    tree: bool  # a tree over `order` (rooted at order[0]) rather than a ring
    avoided: tuple[Link, ...]  # the slow links it keeps off
    avoids: bool  # it uses none of the slow links
    costs: LinkCosts | None = None
    weights: tuple[float, ...] = ()  # a ring's chunk shares by position (empty: equal)

    @property
    def schedule(self) -> Schedule:
        return Schedule("tree" if self.tree else "ring", self.order, self.weights)

    def shape(self) -> tuple:
        """What the ranks run (the figures aside): two plans of one shape are one schedule."""
        return (self.order, self.tree, self.avoided, self.avoids, self.weights)

    def describe(self) -> str:
        if self.weights:
            return self._describe_weighted()
        shape = f"tree rooted at rank {self.order[0]}" if self.tree else "ring"
        path = " -> ".join(map(str, (*self.order, self.order[0]) if not self.tree else self.order))
        kept = ", ".join(f"{a}->{b}" for a, b in self.avoided)
        how = "avoiding" if self.avoids else "unable to avoid all of"
        text = f"{shape} over {path}, {how} {kept}"
        if self.costs is not None:
            n, mib = len(self.order), REFERENCE_BYTES / (1 << 20)
            t = predict(self.schedule, REFERENCE_BYTES, self.costs)
            d = predict(Schedule("ring", identity(n)), REFERENCE_BYTES, self.costs)
            text += (
                f" (predicted for a {mib:g} MiB all_reduce: {t * 1e3:.1f} ms, against "
                f"{d * 1e3:.1f} ms on the ring in rank order)"
            )
        return text

    def _describe_weighted(self) -> str:
        text = self.schedule.describe() + ", its chunks sized around " + _links(self.avoided)
        if self.costs is not None:
            n, mib = len(self.order), REFERENCE_BYTES / (1 << 20)
            t = predict(self.schedule, REFERENCE_BYTES, self.costs)
            d = predict(Schedule("ring", identity(n)), REFERENCE_BYTES, self.costs)
            low = lower_bound(REFERENCE_BYTES, self.costs)
            text += (
                f" (predicted for a {mib:g} MiB all_reduce: {t * 1e3:.1f} ms, against "
                f"{d * 1e3:.1f} ms on the ring with equal chunks; no schedule under "
                f"{low * 1e3:.1f} ms)"
            )
        return text

    def wire(self) -> list:
        out = [list(self.order), self.tree, [list(x) for x in self.avoided], self.avoids]
        if self.weights:  # the figures first: an older peer reads a plan of 4 or 5 entries
            costs = self.costs.wire() if self.costs is not None else None
            return out + [costs, list(self.weights)]
        return out + ([self.costs.wire()] if self.costs is not None else [])

    @classmethod
    def from_wire(cls, v: Any, n: int) -> Plan | None:
        """A plan as it arrived, checked: None if it is not one for a group of n."""
        try:
            order, tree, avoided, avoids, *rest = v
            order = tuple(int(r) for r in order)
            links = tuple((int(a), int(b)) for a, b in avoided)
        except (TypeError, ValueError):
            return None
        if sorted(order) != list(range(n)) or type(tree) is not bool or type(avoids) is not bool:
            return None
        if len(rest) > 2:
            return None
        weights: tuple[float, ...] = ()
        if len(rest) == 2:
            try:
                weights = tuple(float(w) for w in rest[1])
            except (TypeError, ValueError):
                return None
            ok = len(weights) == n and all(0.0 <= w <= 1.0 for w in weights) and sum(weights) > 0
            if tree or not ok:
                return None
            rest = rest[:1] if rest[0] is not None else []
        costs = LinkCosts.from_wire(rest[0], n) if rest else None
        if rest and costs is None:
            return None
        return cls(order, tree, links, avoids, costs, weights)


def ring_links(order: Sequence[int]) -> set[Link]:
    return set(links_of(Schedule("ring", tuple(order))))


def tree_links(order: Sequence[int]) -> set[Link]:
    return set(links_of(Schedule("tree", tuple(order))))


def plan_around(
    n: int,
    slow: Iterable[Link],
    costs: LinkCosts | None = None,
    nbytes: int = REFERENCE_BYTES,
) -> Plan | None:
    """The schedule for n ranks around the directed links in `slow`, priced on `costs` (None:
    each slow link 10x slower than the others, costmodel.LinkCosts.of); see the module's
    docstring. None if nothing is slow or nothing is predicted faster than the default. The
    same inputs give the same plan on every caller."""
    slow_set = frozenset((a, b) for a, b in slow if a != b and 0 <= a < n and 0 <= b < n)
    if not slow_set or n < 2:
        return None
    c = costs if costs is not None else LinkCosts.of(n, sorted(slow_set))
    ring, t_ring = best_ring(c, nbytes)
    tree, t_tree = best_tree(c, nbytes)
    use_tree = t_tree <= MARGIN * t_ring  # a ring, unless the tree is clearly faster
    order, t = (tree, t_tree) if use_tree else (ring, t_ring)
    # wanted where it beats a default schedule that some op would run and a slow link costs:
    # direct and naive too (auto's small sizes, and either asked by name), which a plan
    # reroutes (group/rerouted.py) -- a link that neither default ring nor tree uses
    # still slows every direct all_reduce and, at rank 0, every naive one
    defaults = tuple(Schedule(kind, identity(n)) for kind in ("ring", "tree", "direct", "naive"))
    if not any(links_of(d) & slow_set and t <= MARGIN * predict(d, nbytes, c) for d in defaults):
        return None
    used = links_of(Schedule("tree" if use_tree else "ring", order))
    return Plan(order, use_tree, tuple(sorted(slow_set)), not used & slow_set, c)


def plan_for_nics(
    n: int, ranks: Iterable[int], costs: LinkCosts, nbytes: int = REFERENCE_BYTES
) -> Plan | None:
    """The ring in rank order with its chunks sized around the slow NICs of `ranks`
    (costmodel.nic_weights), priced on `costs` (each of those ranks' links at its own figures);
    None where it is not predicted faster by costmodel.MARGIN than the ring with equal chunks,
    or nothing is slow."""
    nics = sorted({r for r in ranks if 0 <= r < n})
    slow = costs.slow()
    links = tuple(sorted(x for x in slow if set(x) & set(nics)))
    if n < 3 or not nics or not links:
        return None
    order = identity(n)
    weights = nic_weights(order, nbytes, costs)
    t = predict(Schedule("ring", order, weights), nbytes, costs)
    if t > MARGIN * predict(Schedule("ring", order), nbytes, costs):
        return None
    return Plan(order, False, links, False, costs, weights)


def _links(links: Sequence[Link]) -> str:
    return ("links " if len(links) > 1 else "link ") + ", ".join(f"{a}->{b}" for a, b in links)


def view(ch: Channel, plan: Plan) -> SubChannel:
    """The op's channel as the plan's positions see it."""
    return SubChannel(ch, plan.order)


__all__ = [
    "REFERENCE_BYTES",
    "Plan",
    "plan_around",
    "plan_for_nics",
    "ring_links",
    "tree_links",
    "view",
]
