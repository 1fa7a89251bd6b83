"""What an all_reduce schedule costs on links that are not all alike: the alpha-beta model per
directed link, and the schedule it predicts fastest. Pure: no I/O, no clock, no randomness, so
every rank (and the coordinator) that asks with the same figures gets the same answer.

The figures (LinkCosts) are the coordinator's (membership/failslow.py): a healthy link's
throughput and latency -- the median of the links measured -- and, for each link measured
behind its peers, its own. A link not listed runs at the healthy pace. A message of b bytes on
link s->d costs

    c(s, d, b) = alpha[s, d] + b / rate[s, d]

and the schedules are priced as emulate.py runs them (Hockney's model, one message at a time
through each rank's send port and each rank's receive port, unpipelined), so the predictions
below are the emulated makespans (tests/unit/algorithms/test_costmodel.py holds them to
emulate.LinkModel):

    ring over `order`      2(n-1) steps, each as long as the slowest link of the ring carrying
                           N/n: one slow link paces every step.
                           T = 2(n-1) * max_i c(order[i], order[i+1], N/n)
    ring with `weights`    the same ring with position i owning a share weights[i] of the
                           buffer (c_i bytes): link i -> i+1 carries every chunk but c_i in the
                           reduce-scatter and every chunk but c_{i+1} in the all-gather, the
                           chunks pipelined in segments of S bytes, so the slowest link's
                           load paces it, and a segment's trip round the ring fills the pipe:
                           T = max_i (2(n-1) alpha_i + (2N - c_i - c_{i+1}) / rate_i)
                               + sum_i c(order[i], order[i+1], S)
                           (a link's pieces go out back to back, so their latencies overlap:
                           each step's is paid once, as in the ring, and the fill once a hop;
                           S = 0: equal shares give the ring's T above). A rank whose NIC is
                           slow gets the larger share, so its two ring links carry less
                           (nic_weights).
    tree over `order`      binomial tree rooted at order[0] (position v's parent is v with its
                           lowest bit cleared): reduce up, broadcast down, N bytes a message;
                           a slow edge costs each message that crosses it, and only those.
    naive over `order`     a star: every rank sends N to order[0], which sends the result back:
                           2(n-1) messages through one rank's ports.
    direct                 every rank sends N to every other: every link, once.
    hierarchical           one leader per host (k with leaders_k): the host's ranks to their
                           leader (a binomial tree; k >= 2: directly), a ring across the hosts'
                           leaders, and back.

The model's own ranking of healthy schedules is not what `auto` goes by: the measured
crossovers are (group/tuning.py), and on healthy links they disagree with it (this model puts
direct behind the tree at 4 ranks, which the measurements do not). So choose() never predicts
an alternative faster than the default schedule's healthy time: what the model contributes is
what the slow links add, and an alternative is taken only where the default pays for a slow
link more than the alternative's whole predicted time. Where nothing is predicted faster, the
default stays.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from . import double_tree
from .tree import children_of

Link = tuple[int, int]

DEFAULT_RATE = 1e9  # bytes/s for a healthy link where nothing was measured
DEFAULT_ALPHA = 100e-6  # s a message where no latency was measured (a pyzmq one-way trip)
RING_EXHAUSTIVE_MAX = 8  # every ring order up to this many ranks (7! = 5,040)
TREE_EXHAUSTIVE_MAX = 4  # every tree order up to this many ranks (4! = 24); a heuristic above
MARGIN = 0.9  # an alternative must be predicted at most this share of the default's time
# A ring with sized chunks runs in pieces this large (group/rerouted.py): one rank's chunk may
# be most of the buffer, forwarded hop by hop, and each hop waits for a whole piece.
SIZED_RING_SEGMENT = 256 << 10


def _figures(rate: float, alpha: float) -> bool:
    """A throughput and a latency a link can have: finite, rate > 0, alpha >= 0."""
    return math.isfinite(rate) and math.isfinite(alpha) and rate > 0 and alpha >= 0


def _sig(x: float) -> float:
    """Three significant figures: what a plan carries (the same on every rank, and short)."""
    return float(f"{x:.3g}")


class LinkFigure(NamedTuple):
    """One directed link's own figures: throughput (bytes/s) and latency (s a message)."""

    src: int
    dst: int
    rate: float
    alpha: float


@dataclass(frozen=True)
class LinkCosts:
    """The figures a schedule is priced on, for a group of n ranks."""

    n: int
    rate: float = DEFAULT_RATE  # a healthy link (the median of its peers)
    alpha: float = DEFAULT_ALPHA
    links: tuple[LinkFigure, ...] = ()  # the links off the healthy pace, sorted
    _table: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        if self.n < 1 or not _figures(self.rate, self.alpha):
            raise ValueError(f"LinkCosts: bad figures n={self.n} rate={self.rate} {self.alpha}")
        for f in self.links:
            if not (0 <= f.src < self.n and 0 <= f.dst < self.n and f.src != f.dst):
                raise ValueError(f"LinkCosts: link {f.src}->{f.dst} is not one of {self.n} ranks")
            if not _figures(f.rate, f.alpha):
                raise ValueError(f"LinkCosts: bad figures for link {f.src}->{f.dst}: {f}")
            self._table[(f.src, f.dst)] = (f.alpha, 1.0 / f.rate)

    @classmethod
    def of(
        cls,
        n: int,
        slow: dict[Link, float] | Iterable[Link],
        rate: float = DEFAULT_RATE,
        alpha: float = DEFAULT_ALPHA,
        latency: dict[Link, float] | None = None,
    ) -> LinkCosts:
        """Figures rounded to 3 significant digits: `slow` maps a link to its rate (or lists
        links, taken 10x slower than `rate`); latency: a link's own alpha, where measured."""
        rates = slow if isinstance(slow, dict) else {k: rate / 10 for k in slow}
        latency = latency or {}
        figs = tuple(
            LinkFigure(a, b, _sig(max(r, 1.0)), _sig(latency.get((a, b), alpha)))
            for (a, b), r in sorted(rates.items())
            if a != b and 0 <= a < n and 0 <= b < n
        )
        return cls(n, _sig(rate), _sig(alpha), figs)

    def cost(self, src: int, dst: int, nbytes: float) -> float:
        a, inv = self._table.get((src, dst), (self.alpha, 1.0 / self.rate))
        return a + nbytes * inv

    def rate_of(self, src: int, dst: int) -> float:
        """The link's throughput (bytes/s)."""
        return 1.0 / self._table.get((src, dst), (self.alpha, 1.0 / self.rate))[1]

    def slow(self) -> frozenset[Link]:
        """The links listed as off the healthy pace (slower than it)."""
        return frozenset((f.src, f.dst) for f in self.links if f.rate < self.rate)

    def healthy(self) -> LinkCosts:
        return LinkCosts(self.n, self.rate, self.alpha)

    def wire(self) -> list:
        return [self.n, self.rate, self.alpha, [list(f) for f in self.links]]

    @classmethod
    def from_wire(cls, v: Any, n: int) -> LinkCosts | None:
        """Figures as they arrived, checked: None if they are not figures for n ranks."""
        try:
            size, rate, alpha, rows = v
            figs = tuple(
                LinkFigure(int(a), int(b), float(r), float(al)) for a, b, r, al in rows[: n * n]
            )
            if type(size) is not int or size != n:
                return None
            return cls(n, float(rate), float(alpha), figs)
        except (TypeError, ValueError):
            return None

    def text(self) -> str:
        return (
            "; ".join(f"{f.src}->{f.dst} at {_mbit(f.rate)}" for f in self.links)
            + f" (healthy links {_mbit(self.rate)}, {self.alpha * 1e6:.0f} us a message)"
        )


def _mbit(rate: float) -> str:
    return f"{rate * 8 / 1e6:.0f} Mbit/s" if rate * 8 < 1e10 else f"{rate * 8 / 1e9:.1f} Gbit/s"


# --- the schedules -----------------------------------------------------------------------------
KINDS = ("ring", "tree", "naive", "direct", "hierarchical")


class Schedule(NamedTuple):
    """An all_reduce schedule: `kind` run over `order` (position i is rank order[i]; a tree's
    and a star's root is order[0]); a ring's `weights`: position i's share of the buffer (empty:
    equal chunks)."""

    kind: str
    order: tuple[int, ...]
    weights: tuple[float, ...] = ()

    def describe(self) -> str:
        if self.kind == "ring" and self.weights:
            shares = ", ".join(f"{r}: {w:.0%}" for r, w in zip(self.order, self.weights))
            path = " -> ".join(map(str, (*self.order, self.order[0])))
            return f"ring over {path} with chunks sized by bandwidth ({shares})"
        if self.kind == "ring":
            return "ring over " + " -> ".join(map(str, (*self.order, self.order[0])))
        if self.kind in ("tree", "naive"):
            what = "tree" if self.kind == "tree" else "star (naive)"
            return f"{what} rooted at rank {self.order[0]} over " + " ".join(map(str, self.order))
        return f"{self.kind} over " + " ".join(map(str, self.order))


def identity(n: int) -> tuple[int, ...]:
    return tuple(range(n))


def ring_time(order: Sequence[int], nbytes: float, c: LinkCosts) -> float:
    n = len(order)
    if n < 2:
        return 0.0
    chunk = nbytes / n
    worst = max(c.cost(order[i], order[(i + 1) % n], chunk) for i in range(n))
    return 2 * (n - 1) * worst


def weighted_ring_time(
    order: Sequence[int],
    weights: Sequence[float],
    nbytes: float,
    c: LinkCosts,
    segment: float = SIZED_RING_SEGMENT,
) -> float:
    """The ring over `order` with position i owning weights[i] of the buffer, in segments of
    `segment` bytes (the module's docstring); equal weights and segment 0 give ring_time."""
    n = len(order)
    if n < 2:
        return 0.0
    total = sum(weights)
    share = [nbytes * w / total for w in weights]
    worst, fill = 0.0, 0.0
    for i in range(n):
        a, b = order[i], order[(i + 1) % n]
        load = 2 * nbytes - share[i] - share[(i + 1) % n]
        worst = max(worst, 2 * (n - 1) * c.cost(a, b, 0.0) + load / c.rate_of(a, b))
        fill += c.cost(a, b, min(segment, nbytes)) if segment > 0 else 0.0
    return worst + fill


def nic_weights(order: Sequence[int], nbytes: float, c: LinkCosts) -> tuple[float, ...]:
    """The chunk shares for a ring over `order` around slow NICs: the positions whose two ring
    links are both slower than the healthy pace (a slow NIC's rank) share a part a of the
    buffer equally, the others the rest. The predicted time is convex in a (a maximum of lines
    in it), so a ternary search finds the best a; the shares are rounded to thousandths (what
    a plan carries). Equal shares where no position is so slow."""
    n = len(order)
    slow = c.slow()
    heavy = [
        i
        for i in range(n)
        if (order[i - 1], order[i]) in slow and (order[i], order[(i + 1) % n]) in slow
    ]
    if n < 2 or not heavy or len(heavy) == n:
        return tuple([round(1.0 / n, 3)] * n)

    def shares(a: float) -> list[float]:
        h, rest = a / len(heavy), (1.0 - a) / (n - len(heavy))
        return [h if i in heavy else rest for i in range(n)]

    lo, hi = 0.0, 1.0
    for _ in range(60):
        m1, m2 = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        if weighted_ring_time(order, shares(m1), nbytes, c) <= weighted_ring_time(
            order, shares(m2), nbytes, c
        ):
            hi = m2
        else:
            lo = m1
    # thousandths of the buffer: what a plan carries, and no crumbs (a share of 1e-12)
    return tuple(round(w, 3) for w in shares((lo + hi) / 2))


def lower_bound(nbytes: float, c: LinkCosts) -> float:
    """No all_reduce of nbytes on these figures can take less (alpha aside, one message at a
    time through each rank's send port and its receive port, as the model runs them): the
    healthy bound 2(n-1)/n N / rate (Patarasuk and Yuan: slower links never make it shorter),
    and, for each rank, N / its fastest outbound link and N / its fastest inbound link -- the
    others cannot have the sum without N bytes of the rank's own vector, nor the rank without
    N bytes of theirs."""
    n = c.n
    if n < 2:
        return 0.0
    out = [max(c.rate_of(r, p) for p in range(n) if p != r) for r in range(n)]
    into = [max(c.rate_of(p, r) for p in range(n) if p != r) for r in range(n)]
    healthy = 2 * (n - 1) / n * nbytes / c.rate
    return max([healthy] + [nbytes / x for x in out + into])


def _port_model(
    n: int,
    programs: list[list[tuple[str, int, float]]],
    c: LinkCosts,
    order: Sequence[int],
) -> float:
    """Run per-position programs of ("send"|"recv", peer position, bytes) through emulate.py's
    port model; the makespan. Every schedule here is deadlock free, so a round-robin over the
    positions that runs each one as far as it can finishes."""
    clock = [0.0] * n
    port_free = [0.0] * n
    inflight: dict[tuple[int, int], list[tuple[float, float]]] = {}
    pc = [0] * n
    left = sum(len(p) for p in programs)
    while left:
        moved = False
        for v in range(n):
            prog = programs[v]
            while pc[v] < len(prog):
                kind, peer, b = prog[pc[v]]
                if kind == "send":
                    busy = c.cost(order[v], order[peer], b)
                    clock[v] += busy
                    inflight.setdefault((v, peer), []).append((clock[v], busy))
                else:
                    q = inflight.get((peer, v))
                    if not q:
                        break
                    earliest, busy = q.pop(0)
                    arrival = max(earliest, port_free[v] + busy)
                    port_free[v] = arrival
                    clock[v] = max(clock[v], arrival)
                pc[v] += 1
                left -= 1
                moved = True
        if not moved:  # pragma: no cover - the schedules below never deadlock
            raise RuntimeError("costmodel: a schedule that cannot finish")
    return max(clock)


def tree_time(order: Sequence[int], nbytes: float, c: LinkCosts) -> float:
    """tree.py's all_reduce, one segment: reduce to position 0, then broadcast; the port
    model of _port_model, position by position (a tree's messages depend on its parent's or
    its children's only)."""
    n = len(order)
    if n < 2:
        return 0.0
    kids = [children_of(v, n) for v in range(n)]
    clock = [0.0] * n
    port = [0.0] * n  # when each position's receive port took its last message
    for v in range(n - 1, -1, -1):  # children have higher positions: done before their parent
        for k in reversed(kids[v]):  # the smallest subtree first, as tree.reduce takes them
            busy = c.cost(order[k], order[v], nbytes)
            sent = clock[k]  # k's clock after its send to v (below, when k was done)
            arrival = max(sent, port[v] + busy)
            port[v] = arrival
            clock[v] = max(clock[v], arrival)
        if v:
            clock[v] += c.cost(order[v], order[v & (v - 1)], nbytes)  # its send to the parent
    for v in range(n):  # parents before children
        for k in kids[v]:
            busy = c.cost(order[v], order[k], nbytes)
            clock[v] += busy
            arrival = max(clock[v], port[k] + busy)
            port[k] = arrival
            clock[k] = max(clock[k], arrival)
    return max(clock)


def _naive_programs(n: int, nbytes: float) -> list[list[tuple[str, int, float]]]:
    progs: list[list[tuple[str, int, float]]] = [[] for _ in range(n)]
    progs[0] = [("recv", p, nbytes) for p in range(1, n)] + [
        ("send", p, nbytes) for p in range(1, n)
    ]
    for p in range(1, n):
        progs[p] = [("send", 0, nbytes), ("recv", 0, nbytes)]
    return progs


def naive_time(order: Sequence[int], nbytes: float, c: LinkCosts) -> float:
    n = len(order)
    return 0.0 if n < 2 else _port_model(n, _naive_programs(n, nbytes), c, order)


def direct_time(order: Sequence[int], nbytes: float, c: LinkCosts) -> float:
    n = len(order)
    if n < 2:
        return 0.0
    progs: list[list[tuple[str, int, float]]] = []
    for r in range(n):
        sends = [("send", p, nbytes) for p in range(n) if p != r]
        recvs = [("recv", p, nbytes) for p in range(n) if p != r]
        progs.append(sends + recvs)
    return _port_model(n, progs, c, order)


def double_tree_programs(
    n: int, nbytes: float, segments: int = 1
) -> list[list[tuple[str, int, float]]]:
    """double_tree.py's all_reduce as per-position programs for _port_model: each half of
    nbytes in `segments` equal segments, every rank's steps in double_tree.program's order."""
    s = nbytes / (2 * segments)
    progs: list[list[tuple[str, int, float]]] = []
    for r in range(n):
        nodes = [double_tree.node(r, n, t) for t in (0, 1)]
        prog: list[tuple[str, int, float]] = []
        for step in double_tree.program(r, n, (segments, segments)):
            at = nodes[step.tree]
            up = [] if at.parent is None else [at.parent]
            if step.down:
                prog += [("recv", p, s) for p in up] + [("send", c, s) for c in at.children]
            else:
                prog += [("recv", c, s) for c in at.children] + [("send", p, s) for p in up]
        progs.append(prog)
    return progs


def double_tree_time(order: Sequence[int], nbytes: float, c: LinkCosts, segments: int = 1) -> float:
    """double_tree.py's all_reduce with each half in `segments` segments, in the port model."""
    n = len(order)
    return 0.0 if n < 2 else _port_model(n, double_tree_programs(n, nbytes, segments), c, order)


def host_groups(hosts: Sequence[Hashable]) -> list[list[int]]:
    """Positions per host, hosts in the order of their first position (hierarchical.py's)."""
    groups: dict[Hashable, list[int]] = {}
    for v, h in enumerate(hosts):
        groups.setdefault(h, []).append(v)
    return list(groups.values())


def hierarchical_time(
    order: Sequence[int],
    nbytes: float,
    c: LinkCosts,
    hosts: Sequence[Hashable],
    leaders_k: int = 1,
) -> float:
    """hosts[v]: the host of position v. k = leaders_k leaders per host (1 below the
    transport's leaders_min_bytes): ring j runs over every host's j-th rank on N/k bytes."""
    groups = host_groups(hosts)
    k = max(1, min(leaders_k, min(len(g) for g in groups)))
    part = nbytes / k
    cross = max(ring_time([order[g[j]] for g in groups], part, c) for j in range(k))
    local = 0.0
    for g in groups:
        ranks = [order[v] for v in g]
        if k == 1:
            t = tree_time(ranks, nbytes, c)  # reduce up and broadcast down, as the host's
        else:
            t = 2 * max(
                (len(ranks) - 1) * c.cost(a, b, part) for a in ranks for b in ranks if a != b
            )
        local = max(local, t)
    return local + cross


def predict(
    s: Schedule,
    nbytes: float,
    c: LinkCosts,
    hosts: Sequence[Hashable] | None = None,
    leaders_k: int = 1,
) -> float:
    """The predicted seconds of one all_reduce of nbytes under schedule s."""
    if s.kind == "ring" and s.weights:
        return weighted_ring_time(s.order, s.weights, nbytes, c)
    if s.kind == "ring":
        return ring_time(s.order, nbytes, c)
    if s.kind == "tree":
        return tree_time(s.order, nbytes, c)
    if s.kind == "naive":
        return naive_time(s.order, nbytes, c)
    if s.kind == "direct":
        return direct_time(s.order, nbytes, c)
    if s.kind == "hierarchical":
        if hosts is None:
            raise ValueError("costmodel: a hierarchical schedule is priced with its host map")
        return hierarchical_time(s.order, nbytes, c, [hosts[r] for r in s.order], leaders_k)
    raise ValueError(f"costmodel: no model for {s.kind!r}; one of {', '.join(KINDS)}")


def links_of(s: Schedule, hosts: Sequence[Hashable] | None = None) -> frozenset[Link]:
    """The directed links s sends anything over (k = 1 for hierarchical)."""
    o, n = s.order, len(s.order)
    if n < 2:
        return frozenset()
    if s.kind == "ring":
        return frozenset((o[i], o[(i + 1) % n]) for i in range(n))
    if s.kind == "tree":
        pairs = [(o[v], o[k]) for v in range(n) for k in children_of(v, n)]
        return frozenset(pairs + [(b, a) for a, b in pairs])
    if s.kind == "naive":
        return frozenset([(o[0], x) for x in o[1:]] + [(x, o[0]) for x in o[1:]])
    if s.kind == "direct":
        return frozenset((a, b) for a in o for b in o if a != b)
    assert hosts is not None
    groups = host_groups([hosts[r] for r in o])
    out: set[Link] = set(links_of(Schedule("ring", tuple(o[g[0]] for g in groups))))
    for g in groups:
        out |= links_of(Schedule("tree", tuple(o[v] for v in g)))
    return frozenset(out)


# --- the search --------------------------------------------------------------------------------
def best_ring(c: LinkCosts, nbytes: float) -> tuple[tuple[int, ...], float]:
    """The ring order (starting at rank 0) with the cheapest slowest link; the first in
    lexicographic order among equals (a depth-first search that drops a partial ring as soon
    as its slowest link is no cheaper than the best whole one's). Above RING_EXHAUSTIVE_MAX
    ranks, a greedy walk."""
    n = c.n
    if n > RING_EXHAUSTIVE_MAX:
        order = _greedy(c, nbytes)
        return order, ring_time(order, nbytes, c)
    if n < 2:
        return identity(n), 0.0
    chunk = nbytes / n
    w = [[c.cost(a, b, chunk) for b in range(n)] for a in range(n)]
    floor = c.alpha + chunk / c.rate  # a healthy link: no ring does better
    best: list = [identity(n), max(w[i][(i + 1) % n] for i in range(n))]
    path, free = [0], set(range(1, n))

    def walk(worst: float) -> bool:  # True: a ring at the floor was found, stop
        last = path[-1]
        if not free:
            total = max(worst, w[last][0])
            if total < best[1]:
                best[0], best[1] = tuple(path), total
            return best[1] <= floor
        for r in sorted(free):
            m = max(worst, w[last][r])
            if m < best[1]:
                path.append(r)
                free.discard(r)
                done = walk(m)
                free.add(r)
                path.pop()
                if done:
                    return True
        return False

    if best[1] > floor:
        walk(0.0)
    return best[0], 2 * (n - 1) * best[1]


def _greedy(c: LinkCosts, nbytes: float) -> tuple[int, ...]:
    order, left = [0], set(range(1, c.n))
    while left:
        cur = order[-1]
        nxt = min(left, key=lambda r: (c.cost(cur, r, nbytes), r))
        order.append(nxt)
        left.discard(nxt)
    return tuple(order)


def _tree_orders(c: LinkCosts) -> Iterable[tuple[int, ...]]:
    n = c.n
    if n <= TREE_EXHAUSTIVE_MAX:
        return itertools.permutations(range(n))
    # each root; the other ranks, those on the fewest slow links first, to the inner positions
    # (even ones: they have children), the rest to the leaves (odd positions)
    slow = c.slow()
    touches = {r: sum(r in link for link in slow) for r in range(n)}
    places = [v for v in range(2, n, 2)] + [v for v in range(1, n, 2)]
    out = []
    for root in sorted(range(n), key=lambda r: (touches[r], r)):
        rest = sorted((r for r in range(n) if r != root), key=lambda r: (touches[r], r))
        order = [root] * n
        for v, r in zip(places, rest):
            order[v] = r
        out.append(tuple(order))
    return out


def best_tree(c: LinkCosts, nbytes: float) -> tuple[tuple[int, ...], float]:
    """The tree order with the least predicted time; the first found among equals."""
    best, best_t = identity(c.n), tree_time(identity(c.n), nbytes, c)
    for order in _tree_orders(c):
        t = tree_time(order, nbytes, c)
        if t < best_t:
            best, best_t = tuple(order), t
    return best, best_t


def best_star(c: LinkCosts, nbytes: float) -> tuple[tuple[int, ...], float]:
    """The naive (star) schedule rooted where it is predicted fastest (lowest rank of equals)."""
    n = c.n
    best, best_t = identity(n), naive_time(identity(n), nbytes, c)
    for root in range(1, n):
        order = (root, *(r for r in range(n) if r != root))
        t = naive_time(order, nbytes, c)
        if t < best_t:
            best, best_t = order, t
    return best, best_t


def leaders_off_slow(c: LinkCosts, hosts: Sequence[Hashable]) -> tuple[int, ...]:
    """An order for hierarchical that makes leaders of the ranks on the fewest slow links:
    each host's ranks keep their places (hosts in order of first rank), the ones on slow links
    last."""
    slow = c.slow()
    touches = {r: sum(r in link for link in slow) for r in range(c.n)}
    groups = host_groups(hosts)
    return tuple(r for g in groups for r in sorted(g, key=lambda r: (touches[r], r)))


class Choice(NamedTuple):
    schedule: Schedule
    predicted: float  # s, floored at the default's healthy time (see the module's docstring)
    default: Schedule
    default_predicted: float  # s, on these figures

    @property
    def kept(self) -> bool:
        return self.schedule == self.default


def choose(
    default: Schedule,
    candidates: Iterable[Schedule],
    nbytes: float,
    c: LinkCosts,
    hosts: Sequence[Hashable] | None = None,
    leaders_k: int = 1,
) -> Choice:
    """The schedule predicted fastest for nbytes on figures c: the default unless a candidate
    is predicted at most MARGIN of its time (ties: the lower unfloored prediction, then the
    first candidate). A candidate's
    prediction is floored at the default's healthy time (the measured crossovers chose the
    default for healthy links; see the module's docstring)."""
    d = predict(default, nbytes, c, hosts, leaders_k)
    floor = predict(default, nbytes, c.healthy(), hosts, leaders_k)
    best, best_key = default, (d, d)
    for s in candidates:
        if s == default:
            continue
        raw = predict(s, nbytes, c, hosts, leaders_k)
        key = (max(raw, floor), raw)  # floored equals: the model's own ranking decides
        if key[0] <= MARGIN * d and key < best_key:
            best, best_key = s, key
    return Choice(best, best_key[0], default, d)


def candidates(
    c: LinkCosts, nbytes: float, hosts: Sequence[Hashable] | None = None
) -> list[Schedule]:
    """The schedules worth pricing for an op of nbytes: the best ring, the best tree and the
    best star on these figures (and, across hosts, hierarchical with leaders off slow links)."""
    out = [
        Schedule("ring", best_ring(c, nbytes)[0]),
        Schedule("tree", best_tree(c, nbytes)[0]),
        Schedule("naive", best_star(c, nbytes)[0]),
    ]
    if hosts is not None:
        out.append(Schedule("hierarchical", leaders_off_slow(c, hosts)))
    return out


def speedup(choice: Choice) -> float:
    """How many times faster the chosen schedule is predicted than the default (>= 1)."""
    return choice.default_predicted / max(choice.predicted, 1e-12) if choice.predicted else 1.0


__all__ = [
    "SIZED_RING_SEGMENT",
    "Choice",
    "LinkCosts",
    "LinkFigure",
    "Schedule",
    "best_ring",
    "best_star",
    "best_tree",
    "candidates",
    "choose",
    "direct_time",
    "hierarchical_time",
    "leaders_off_slow",
    "links_of",
    "lower_bound",
    "naive_time",
    "nic_weights",
    "predict",
    "ring_time",
    "speedup",
    "tree_time",
    "weighted_ring_time",
]
