"""Evidence about links, and the fewest ranks that explain it: pure functions for diagnose.py.

A stalled op shows some bad links (diagnose.stalled_links: r waits on p while p's message is
somewhere on the wire). When that picture cannot single out one rank -- one stalled link, whose
two ends tie -- the coordinator has every rank in the stall send a timed probe to every other
rank over the same data links the ops use (transport/linkprobe.py), and each rank reports how
long after it began listening each peer's probe arrived:

    heard[r][p] = 0.004      p's probe reached r 4 ms into r's window: the link p -> r works
    heard[r][p] = None       nothing from p within the window: p -> r is slow (or dead)

The bad links are then the stalled ones that the probes did not show healthy, plus those the
probes found slow. The culprits are a *minimum vertex cover* of the bad links: the fewest ranks
that touch every bad link, so that removing them leaves the largest group whose links are all
healthy. Two slowed links 2->0 and 0->1 have one such cover, {0}; a single slow link 2->0 has
two, {0} and {2}: the evidence cannot decide between them, and diagnose.py says so before it
applies its rule.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import combinations

EXACT_UP_TO = 16  # ranks on bad links for which every minimum cover is searched


def probe_links(
    heard: dict[int, dict[int, float | None]],
) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    """(slow, healthy): directed links (p, r) that the probe reports `heard` show slow or
    healthy. heard: rank r -> {peer p: seconds, or None when nothing came in the window};
    only links between two ranks that both took part are judged (a rank that did not probe
    tells nothing about the links into it, nor did it send on the links out of it)."""
    took_part = set(heard)
    slow: set[tuple[int, int]] = set()
    healthy: set[tuple[int, int]] = set()
    for r, row in heard.items():
        for p, seconds in row.items():
            if p == r or p not in took_part:
                continue
            (slow if seconds is None else healthy).add((p, r))
    return slow, healthy


def min_covers(links: Iterable[tuple[int, int]]) -> list[tuple[int, ...]]:
    """Every minimum vertex cover of the undirected graph of `links` ((a, b) pairs), as
    sorted tuples. Exact while at most EXACT_UP_TO ranks touch a link (a stall's few bad
    links); above that, one greedy cover (the rank on the most links first)."""
    edges = {(min(a, b), max(a, b)) for a, b in links if a != b}
    if not edges:
        return [()]
    ranks = sorted({r for e in edges for r in e})
    if len(ranks) > EXACT_UP_TO:
        return [_greedy_cover(edges)]
    for k in range(1, len(ranks) + 1):
        found = [c for c in combinations(ranks, k) if all(a in c or b in c for a, b in edges)]
        if found:
            return found
    return [tuple(ranks)]  # not reached: all ranks always cover


def _greedy_cover(edges: set[tuple[int, int]]) -> tuple[int, ...]:
    left, cover = set(edges), []
    while left:
        degree: dict[int, int] = {}
        for a, b in left:
            degree[a] = degree.get(a, 0) + 1
            degree[b] = degree.get(b, 0) + 1
        r = max(degree, key=lambda x: (degree[x], x))
        cover.append(r)
        left = {e for e in left if r not in e}
    return tuple(sorted(cover))


def named(links: Iterable[tuple[int, int]]) -> str:
    """'2->0, 0->1': links in a stable order, for messages."""
    return ", ".join(f"{p}->{r}" for p, r in sorted(links, key=lambda link: (link[1], link[0])))
