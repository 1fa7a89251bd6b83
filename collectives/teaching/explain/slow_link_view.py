"""A slow link, taught (`python -m collectives.explain slowlink`): one link ten times slower
than the others, priced by emulated runs of the real schedules (emulate.LinkModel), drawn as
the failure views are (a graph model: panels.py draws it, html.py plays it).

The lesson: a ring sends one chunk over every one of its links at every step, and each step
waits for the previous, so one slow link paces the whole ring -- every step takes as long as
that link's message. A tree uses only its own edges: a slow link off them costs it nothing,
one on them costs it once per message that crosses it. Which is why the library, rather than
wait, changes the schedule: a ring in another order that leaves the slow link out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..emulate import LinkModel
from ..simulate import simulate
from ..trace import Tracer
from .graph_model import ALIVE, BLUE, GREY, RED, circle, node

ALGORITHMS = ("ring", "tree", "halving_doubling")


@dataclass(frozen=True)
class Case:
    """One emulated all_reduce: `algorithm` with link `slow` (src, dst) `factor` times slower
    in alpha and beta (None: every link alike)."""

    algorithm: str
    slow: tuple[int, int] | None
    seconds: float
    uses_link: bool  # the schedule sent at least one message over the slow link


@dataclass
class SlowLink:
    n: int
    nbytes: int
    alpha: float
    beta: float
    factor: float
    links: tuple  # the slow links tried, one at a time
    rerouted: tuple  # a ring order that leaves links[0] out
    cases: list = field(default_factory=list)

    def case(self, algorithm: str, slow: tuple[int, int] | None) -> Case:
        return next(c for c in self.cases if c.algorithm == algorithm and c.slow == slow)

    def rerouted_seconds(self) -> float:
        """The ring in the rerouted order with links[0] slow: the same as the natural ring
        with the slow link moved to where that order puts it (positions, not ranks)."""
        pos = {r: i for i, r in enumerate(self.rerouted)}
        a, b = self.links[0]
        return _emulate(
            "ring", self.n, self.nbytes, self.alpha, self.beta, self.factor, (pos[a], pos[b])
        )[0]


def _emulate(
    algorithm: str,
    n: int,
    nbytes: int,
    alpha: float,
    beta: float,
    factor: float,
    slow: tuple[int, int] | None,
) -> tuple[float, bool]:
    links = {slow: (factor * alpha, factor * beta)} if slow else None
    model = LinkModel(alpha, beta, links=links)
    tracer = Tracer()
    count = max(1, nbytes // 4)
    simulate(
        n,
        lambda pg: pg.all_reduce(np.ones(count, np.float32), algorithm=algorithm),
        wrappers=[model.wrap, tracer.wrap],
        segment_bytes=max(nbytes, 1 << 20),  # unpipelined, as the closed forms
    )
    used = slow is not None and any(
        e["kind"] == "send" and (e["rank"], e["peer"]) == slow for e in tracer.events
    )
    return model.makespan(), used


def _reroute(n: int, link: tuple[int, int]) -> tuple:
    """A ring order with no edge `link`: swap the link's destination with its successor."""
    order = list(range(n))
    b = link[1]
    i = order.index(b)
    j = (i + 1) % n
    order[i], order[j] = order[j], order[i]
    return tuple(order)


def slow_link(
    n: int = 8,
    nbytes: int = 1 << 20,
    alpha: float = 50e-6,
    beta: float = 1e-9,
    factor: float = 10.0,
    links: tuple = ((3, 4), (0, 4)),
) -> SlowLink:
    """Every algorithm of ALGORITHMS, healthy and with each of `links` slow in turn."""
    if n < 4:
        raise ValueError(f"explain slowlink: needs at least 4 ranks (a tree with a path), got {n}")
    for a, b in links:
        if not (0 <= a < n and 0 <= b < n) or a == b:
            raise ValueError(
                f"explain slowlink: link {a}->{b} is not a link between two of {n} ranks"
            )
    s = SlowLink(n, nbytes, alpha, beta, factor, tuple(links), _reroute(n, links[0]))
    for alg in ALGORITHMS:
        for slow in (None, *links):
            t, used = _emulate(alg, n, nbytes, alpha, beta, factor, slow)
            s.cases.append(Case(alg, slow, t, used))
    return s


def _ms(t: float) -> str:
    return f"{t * 1e3:.2f} ms"


def _times(s: SlowLink, slow: tuple[int, int] | None) -> list:
    out = []
    for alg in ALGORITHMS:
        c, h = s.case(alg, slow), s.case(alg, None)
        if slow is None:
            out.append(f"{alg:<17} {_ms(c.seconds)}")
        else:
            on = "uses it" if c.uses_link else "never uses it"
            out.append(f"{alg:<17} {_ms(c.seconds)}  ({c.seconds / h.seconds:.2f}x; {on})")
    return out


def _tree_edges(n: int) -> list[tuple[int, int]]:
    """(child, parent) for every edge of the binomial tree rooted at 0."""
    return [(v, v & (v - 1)) for v in range(1, n)]


def slow_link_model(s: SlowLink) -> dict:
    """The lesson as a graph model: the healthy ring, the slow link on the ring, the same
    link beside the tree, a link on the tree's path, and the schedule change."""
    n, xy = s.n, circle(s.n)
    (a1, b1), (a2, b2) = s.links[0], s.links[1 % len(s.links)]
    f = f"{s.factor:g}x"

    def nodes(hot=()):
        return [
            node(
                f"rank {r}", xy[r], RED if r in hot else ALIVE, text="#fff" if r in hot else "#000"
            )
            for r in range(n)
        ]

    def arrow(src, dst, color=GREY, dashed=False, label="", bend=0.12):
        return {
            "src": src,
            "dst": dst,
            "color": color,
            "dashed": dashed,
            "label": label,
            "bend": bend,
        }

    def ring(order, slow):
        out = []
        for i in range(n):
            a, b = order[i], order[(i + 1) % n]
            near = (b - a) % n in (1, n - 1)  # neighbours on the circle: a short arc
            out.append(
                arrow(
                    a,
                    b,
                    RED if (a, b) == slow else BLUE,
                    label=f if (a, b) == slow else "",
                    bend=0.12 if near else -0.45,  # round the outside, clear of the rank between
                )
            )
        return out

    def tree(slow):
        out = []
        for v, p in _tree_edges(n):
            on = slow in ((p, v), (v, p))
            out.append(arrow(p, v, RED if on else BLUE, label=f if on else "", bend=0.0))
        if slow not in [(p, v) for v, p in _tree_edges(n)] + _tree_edges(n):
            out.append(arrow(slow[0], slow[1], RED, dashed=True, label=f"{f}, unused", bend=0.5))
        return out

    ring_h, ring_s = s.case("ring", None).seconds, s.case("ring", s.links[0]).seconds
    tree_h, tree_s2 = s.case("tree", None).seconds, s.case("tree", s.links[1 % len(s.links)])
    order = " ".join(map(str, s.rerouted))
    frames = [
        {
            "title": f"{n} ranks, every link alike",
            "note": f"all_reduce of {s.nbytes:,} B, alpha {s.alpha * 1e6:g} us, "
            f"{1 / s.beta / 1e9:g} GB/s a link",
            "nodes": nodes(),
            "arrows": ring(tuple(range(n)), None),
            "text": _times(s, None),
        },
        {
            "title": f"link {a1}->{b1} {f} slower: it paces the whole ring",
            "note": f"ring {_ms(ring_h)} -> {_ms(ring_s)}: every step sends a chunk over "
            f"{a1}->{b1}, and the next step waits for it",
            "nodes": nodes((a1, b1)),
            "arrows": ring(tuple(range(n)), (a1, b1)),
            "text": _times(s, s.links[0]),
        },
        {
            "title": "the same link and the tree: off its path, no cost",
            "note": f"tree {_ms(tree_h)} -> {_ms(s.case('tree', s.links[0]).seconds)}: "
            f"{a1}->{b1} is not one of its edges",
            "nodes": nodes((a1, b1)),
            "arrows": tree((a1, b1)),
            "text": _times(s, s.links[0]),
        },
        {
            "title": f"link {a2}->{b2} {f} slower: on the tree's path",
            "note": f"tree {_ms(tree_h)} -> {_ms(tree_s2.seconds)}: it pays for each message "
            f"that crosses {a2}->{b2}; the ring never uses it",
            "nodes": nodes((a2, b2)),
            "arrows": tree((a2, b2)),
            "text": _times(s, s.links[1 % len(s.links)]),
        },
        {
            "title": "what the library does: change the schedule",
            "note": f"a ring in the order {order} leaves {a1}->{b1} out: "
            f"{_ms(s.rerouted_seconds())} with the link still slow",
            "nodes": nodes((a1, b1)),
            "arrows": ring(s.rerouted, (a1, b1)),
            "text": [
                "Every op times each link it uses; a link far behind the others (compared",
                "with each other, never with a constant: a busy CPU slows them all) is",
                "named, the ring is reordered to leave it out, and it is put back once it",
                "recovers (fail-slow rerouting; docs/faults.md).",
            ],
        },
    ]
    return {
        "kind": "graph",
        "title": f"A slow link: one link {f} slower, {n} ranks (emulated, {s.nbytes:,} B)",
        "legend": "blue: the links the algorithm uses; red: the slow link (dashed: not used)",
        "frames": frames,
        "summary": "\n".join(
            [f"healthy: {', '.join(_times(s, None))}"]
            + [f"{a}->{b} slow: {'; '.join(_times(s, (a, b)))}" for a, b in s.links]
        ),
    }
