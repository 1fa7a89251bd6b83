"""Theory vs run: check a trace against what an algorithm promises.

    report = check(tracer.events, "ring", world_size=3, count=6, itemsize=8, finals=results)
    print(report); assert report.ok

What is checked (the confirm messages of rooted ops are left out: they are bookkeeping):
* rounds -- the run's time in the single-port model with alpha = 1 and beta = 0, what the
  alpha term of the cost counts (see `port_rounds`: each rank sends one message at a time and
  receives one at a time, each taking a round): emulate.cost's rounds for the all_reduces
  (ring 2(n-1), tree 2 ceil(log2 n), halving-doubling 2 log2 n, naive 2(n-1), direct 2n-3);
  tree reduce and broadcast ceil(log2 n); pairwise all_to_all n-1; linear gather and scatter
  n-1 (the root's port takes or gives one block a round);
* depth -- the length of the longest chain of messages, each sent after the previous one
  arrived (see `assign_depth`), what a model with unlimited ports would call rounds: ring
  all_reduce 2(n-1); tree all_reduce 2*floor(log2 n) (the root's ceil(log2 n) children are
  one hop away, but its port takes them one after another: that is why rounds differ);
  halving-doubling 2 log2 n (+2 for the fold); naive 2; direct 1; hierarchical with one
  leader per host (a host of one rank)
  2 floor(log2 m) + 2(H-1) for H hosts of m ranks each (uneven hosts: the longest chain
  through the trees and the leaders' ring), with k >= 2 leaders per host 2H; the exchanges
  n-1 (pairwise) and 1 (linear);
* messages and bytes sent by each rank -- ring: 2(n-1) messages, 2N - |chunk r| - |chunk r+1|
  bytes (2(n-1)/n * N when n divides the count); tree: one to the parent and one per child, N
  bytes each; halving-doubling: 2 log2 p messages, 2(p-1)/p * N bytes among the p = 2^k
  ranks that run it, one more of N bytes from each rank 2i+1 that stands in for a fold pair,
  and from the rank 2i it stands in for only that one message of N bytes; naive: rank 0 sends
  n-1 buffers, the others one; direct: n-1 buffers each;
* reductions -- how many received contributions were added into each element, over all ranks:
  n-1 (each chunk reduced exactly n-1 times) for ring, tree, halving-doubling, naive and
  hierarchical (n-H in
  the hosts' trees, H-1 in the leaders' ring); (n-1)^2 on the wire for
  direct, which recomputes the whole sum on every rank; 0 for the exchanges;
* the exchanges (count = elements per block, M its bytes): pairwise all_to_all n-1 rounds,
  n-1 messages of M bytes from every rank; linear gather and scatter a depth of 1 (n-1
  rounds), one message of M
  bytes from every non-root (gather) or n-1 from the root (scatter);
* same bytes -- with `finals` (each rank's buffer after the op), all ranks hold identical bytes.

Counts assume every chunk fits in one segment. Pipelining splits a message into several, which
changes the rounds, the depth and the message counts but not the bytes: pass segmented=True to
check only what holds either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..algorithms import double_tree as dt
from ..algorithms import halving_doubling as hd
from ..algorithms.chunks import chunk_bounds
from ..algorithms.hierarchical import host_groups, leaders_per_host
from ..algorithms.tree import children_of
from .emulate import cost
from .rounds import assign_depth, port_rounds
from .trace import match_messages

__all__ = ["assign_depth", "port_rounds", "expected", "check", "Report", "ALGORITHMS"]

ALGORITHMS = (
    "ring",
    "tree",
    "halving_doubling",
    "double_tree",
    "naive",
    "direct",
    "hierarchical",
    "reduce",
    "broadcast",
    "all_to_all",
    "gather",
    "scatter",
)


def data_events(events):
    return [e for e in events if e["phase"] != "confirm"]


def _floor_log2(n: int) -> int:
    return n.bit_length() - 1


@dataclass
class Expected:
    depth: int  # the longest chain of messages (assign_depth)
    messages: list  # per rank
    nbytes: list  # per rank
    reductions: int  # per element, summed over ranks
    formulas: dict = field(default_factory=dict)
    port_rounds: int | None = None  # rounds in the single-port model (port_rounds), if known


def _k_leaders(n: int, count: int, itemsize: int, groups, k: int) -> Expected:
    """k >= 2 leaders per host (algorithms/hierarchical.py): part j of the buffer goes to local
    rank j of each host, ring j over those H leaders, part j back to the host; every chunk of
    a part is one piece. Phase 1's first pieces are one message deep (a leader sends its later
    ones as its ring gets to them, never later than the ring's own step), ring j's 2(H-1)
    steps follow (depths 2 .. 2H-1), and the last final piece reaches the host at depth 2H."""
    N = count * itemsize
    h = len(groups)
    parts = [(b - a) for a, b in chunk_bounds(count, k)]
    msgs, nbytes = [0] * n, [0] * n
    for i, g in enumerate(groups):
        for v, r in enumerate(g):
            others = [j for j in range(k) if j != v]
            msgs[r] += h * len(others)  # 1. a piece per chunk of each part
            nbytes[r] += sum(parts[j] for j in others) * itemsize
            if v < k:
                sizes = [(b - a) * itemsize for a, b in chunk_bounds(parts[v], h)]
                if h > 1:  # 2. ring v over the hosts
                    msgs[r] += 2 * (h - 1)
                    nbytes[r] += 2 * parts[v] * itemsize - sizes[i] - sizes[(i + 1) % h]
                msgs[r] += h * (len(g) - 1)  # 3. each final piece to the host
                nbytes[r] += parts[v] * itemsize * (len(g) - 1)
    return Expected(
        2 * h,
        msgs,
        nbytes,
        n - 1,
        {
            "depth": f"2H: 1 into the leaders, 2(H-1) round the rings, 1 back; H={h}, k={k}",
            "messages": "H to each other leader of the host; a leader + 2(H-1) + H(m-1)",
            "bytes": f"N/k to each other leader; a leader + 2(H-1)/H*N/k = "
            f"{2 * (h - 1) / h * N / k:g} across + (m-1)*N/k back",
            "reductions": "n-1 (n-H in the hosts, H-1 in the rings)",
        },
    )


def _hierarchical(n: int, count: int, itemsize: int, hosts) -> Expected:
    """k = 1: tree within each host, ring over the H leaders, tree back
    (algorithms/hierarchical.py), for a buffer whose chunks are one piece each: the trees run
    once per chunk. k >= 2: _k_leaders."""
    N = count * itemsize
    groups = host_groups(hosts if hosts is not None else [0] * n)
    if leaders_per_host(groups) > 1:
        return _k_leaders(n, count, itemsize, groups, leaders_per_host(groups))
    h = len(groups)
    sizes = [(b - a) * itemsize for a, b in chunk_bounds(count, h)]
    msgs, nbytes = [0] * n, [0] * n
    depth = [_floor_log2(len(g)) for g in groups]
    for i, g in enumerate(groups):
        for v, r in enumerate(g):
            # the host's trees run once per piece: one piece per chunk (H chunks) here
            tree_msgs = (1 if v else 0) + len(children_of(v, len(g)))
            msgs[r] += tree_msgs * h
            nbytes[r] += tree_msgs * N
        if h > 1:
            msgs[g[0]] += 2 * (h - 1)
            nbytes[g[0]] += 2 * N - sizes[i] - sizes[(i + 1) % h]
    # Depth: the longest chain of messages. Leader i has seen depth[i] when its tree is
    # reduced; its ring send of step t is 1 + the deepest message it has seen, and it
    # receives leader i-1's step t before it sends step t+1; the broadcast adds depth[i].
    seen = list(depth)
    for _ in range(2 * (h - 1)):
        sent = [s + 1 for s in seen]
        seen = [max(seen[i], sent[i - 1]) for i in range(h)]
    longest = max(s + d for s, d in zip(seen, depth))
    even = len({len(g) for g in groups}) == 1
    return Expected(
        longest,
        msgs,
        nbytes,
        n - 1,
        {
            "depth": (
                "2 floor(log2 k) + 2(H-1)"
                if even
                else "down a tree, round the leaders' ring, down a tree"
            )
            + f", H={h}",
            "messages": "H x (tree: 1 up + 1 per child); leaders + 2(H-1)",
            "bytes": f"N per tree; leaders + 2(H-1)/H*N = {2 * (h - 1) / h * N:g}",
            "reductions": "n-1 (n-H in the hosts, H-1 in the ring)",
        },
    )


def _halving_doubling(n: int, count: int, itemsize: int) -> Expected:
    """algorithms/halving_doubling.py, every range one segment: the p = 2^k ranks that run
    the halving send, over the k steps, every chunk but their own, and over the doubling the
    same ranges back; in a fold pair rank 2i sends only its buffer, and 2i+1 sends the
    result back to it: one buffer more."""
    N = count * itemsize
    p, e = hd.fold(n)
    bounds = chunk_bounds(count, p)

    def size(chunks):
        return (bounds[chunks[1] - 1][1] - bounds[chunks[0]][0]) * itemsize

    msgs, nbytes = [0] * n, [0] * n
    for r in range(n):
        v = hd.virtual_rank(r, n)
        if v is None:
            msgs[r], nbytes[r] = 1, N
            continue
        steps = hd.schedule(v, p)
        msgs[r] = 2 * len(steps) + (1 if r < 2 * e else 0)
        nbytes[r] = sum(size(g) + size(k) for _, g, k in steps) + (N if r < 2 * e else 0)
    depth = 2 * (p.bit_length() - 1) + (2 if e else 0)
    return Expected(
        depth,
        msgs,
        nbytes,
        n - 1,
        {
            "depth": "2 log2 n" if not e else f"2 log2 p + 2 (the fold), p={p}",
            "messages": "2 log2 p" if not e else "2 log2 p (+1 from a pair's 2i+1; 2i: 1)",
            # Each of the p sends every chunk but its own, each way: 2(N - |own chunk|), which
            # is 2(p-1)/p*N only where p divides the count.
            "bytes": (
                f"2(p-1)/p*N = {2 * (p - 1) / p * N:g}"
                if count % p == 0
                else "2(N - |own chunk|), uneven chunks"
            )
            + (" (+N from a pair's 2i+1; 2i: N)" if e else ""),
            "reductions": "n-1",
        },
    )


def _double_tree(n: int, count: int, itemsize: int) -> Expected:
    """algorithms/double_tree.py, each half one segment: in each tree a rank sends its half
    once up (but the root) and once to each child; the chain is a deepest leaf's half up to
    the root and back down to a deepest leaf."""
    halves = [(b - a) * itemsize for a, b in dt.halves(count)]
    msgs, nbytes = [0] * n, [0] * n
    for r in range(n):
        for t in (0, 1):
            at = dt.node(r, n, t)
            m = (0 if at.parent is None else 1) + len(at.children)
            msgs[r] += m
            nbytes[r] += m * halves[t]
    top = dt.tree_height(n)
    return Expected(
        2 * top,
        msgs,
        nbytes,
        n - 1,
        {
            "depth": f"2 x the trees' height, {top}",
            "messages": "per tree: 1 up (not at its root) + 1 per child",
            "bytes": "N/2 per message",
            "reductions": "n-1",
        },
    )


def expected(
    algorithm: str, n: int, count: int, itemsize: int, root: int = 0, hosts=None
) -> Expected:
    """What `algorithm` (all_reduce by ring, tree, halving_doubling, naive, direct,
    hierarchical -- over the host map `hosts`; tree reduce / broadcast; pairwise all_to_all,
    linear gather / scatter) must do on n ranks for `count` elements of `itemsize` bytes (for
    the exchanges: per block)."""
    exp = _expected(algorithm, n, count, itemsize, root, hosts)
    k = max(n - 1, 0).bit_length()
    if n == 1:
        ports, formula = 0, "0 (one rank)"
    elif algorithm in ("ring", "tree", "halving_doubling", "naive", "direct", "double_tree"):
        c = cost(algorithm, n)
        ports, formula = c.rounds, c.rounds_formula
    elif algorithm in ("reduce", "broadcast"):
        ports, formula = k, "ceil(log2 n)"
    elif algorithm in ("all_to_all", "gather", "scatter"):
        ports, formula = n - 1, "n-1"
    else:
        return exp
    exp.port_rounds = ports
    exp.formulas["port_rounds"] = formula
    return exp


def _expected(algorithm: str, n: int, count: int, itemsize: int, root: int, hosts) -> Expected:
    N = count * itemsize
    if n == 1:
        return Expected(0, [0], [0], 0, {"depth": "0 (one rank)"})
    if algorithm == "hierarchical":
        return _hierarchical(n, count, itemsize, hosts)
    if algorithm == "halving_doubling":
        return _halving_doubling(n, count, itemsize)
    if algorithm == "double_tree":
        return _double_tree(n, count, itemsize)
    if algorithm == "ring":
        sizes = [(b - a) * itemsize for a, b in chunk_bounds(count, n)]
        return Expected(
            2 * (n - 1),
            [2 * (n - 1)] * n,
            [2 * N - sizes[r] - sizes[(r + 1) % n] for r in range(n)],
            n - 1,
            {
                "depth": "2(n-1)",
                "messages": "2(n-1)",
                "bytes": f"2(n-1)/n*N = {2 * (n - 1) / n * N:g}",
                "reductions": "n-1",
            },
        )
    if algorithm in ("tree", "reduce", "broadcast"):
        kids = [len(children_of((r - root) % n, n)) for r in range(n)]
        up = [0 if r == root else 1 for r in range(n)]
        depth = _floor_log2(n)
        if algorithm == "tree":
            msgs = [u + k for u, k in zip(up, kids)]
            return Expected(
                2 * depth,
                msgs,
                [m * N for m in msgs],
                n - 1,
                {
                    "depth": "2 floor(log2 n)",
                    "messages": "1 up + 1 per child",
                    "bytes": "N per message",
                    "reductions": "n-1",
                },
            )
        msgs = up if algorithm == "reduce" else kids
        return Expected(
            depth,
            msgs,
            [m * N for m in msgs],
            n - 1 if algorithm == "reduce" else 0,
            {
                "depth": "floor(log2 n)",
                "messages": "1 to the parent" if algorithm == "reduce" else "1 per child",
                "bytes": "N per message",
                "reductions": "n-1" if algorithm == "reduce" else "0",
            },
        )
    if algorithm == "naive":
        msgs = [n - 1] + [1] * (n - 1)
        return Expected(
            2,
            msgs,
            [m * N for m in msgs],
            n - 1,
            {
                "depth": "2",
                "messages": "n-1 from rank 0, 1 from the others",
                "bytes": "N per message",
                "reductions": "n-1",
            },
        )
    if algorithm == "direct":
        return Expected(
            1,
            [n - 1] * n,
            [(n - 1) * N] * n,
            (n - 1) ** 2,
            {
                "depth": "1",
                "messages": "n-1",
                "bytes": "(n-1)*N",
                "reductions": "(n-1)^2 on the wire (+ 1 local per rank > 0)",
            },
        )
    if algorithm == "all_to_all":
        return Expected(
            n - 1,
            [n - 1] * n,
            [(n - 1) * N] * n,
            0,
            {
                "depth": "n-1",
                "messages": "n-1 (one per step)",
                "bytes": "(n-1)*M, M per block",
                "reductions": "0",
            },
        )
    if algorithm in ("gather", "scatter"):
        msgs = (
            [0 if r == root else 1 for r in range(n)]
            if algorithm == "gather"
            else [n - 1 if r == root else 0 for r in range(n)]
        )
        return Expected(
            1,
            msgs,
            [m * N for m in msgs],
            0,
            {
                "depth": "1",
                "messages": (
                    "1 from every non-root" if algorithm == "gather" else "n-1 from the root"
                ),
                "bytes": "M per message",
                "reductions": "0",
            },
        )
    raise ValueError(f"invariants: unknown algorithm {algorithm!r}; one of {', '.join(ALGORITHMS)}")


@dataclass
class Report:
    algorithm: str
    world_size: int
    rows: list = field(default_factory=list)  # (what, formula, expected, got, ok)

    @property
    def ok(self) -> bool:
        return all(r[4] for r in self.rows)

    def failures(self) -> list:
        return [r for r in self.rows if not r[4]]

    def __str__(self) -> str:
        head = ("check", "theory", "expected", "run", "")
        rows = [head] + [
            (w, f, str(e), str(g), "ok" if ok else "FAIL") for w, f, e, g, ok in self.rows
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = [f"theory vs run: {self.algorithm}, world size {self.world_size}"]
        for r in rows:
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        return "\n".join(lines)


def _per_rank(values: list) -> str:
    return ",".join(map(str, values)) if len(set(values)) > 1 else f"{values[0]} each"


def check(
    events,
    algorithm: str,
    *,
    world_size: int,
    count: int,
    itemsize: int,
    root: int = 0,
    finals=None,
    segmented: bool = False,
    hosts=None,
) -> Report:
    """Compare the events of ONE operation with `expected(...)`."""
    n = world_size
    evs = data_events(events)
    if len({e["opkey"] for e in evs}) > 1:
        raise ValueError(
            "invariants.check: the trace holds several operations; pass one "
            "(filter the events by their 'opkey')"
        )
    exp = expected(algorithm, n, count, itemsize, root, hosts)
    rep = Report(algorithm, n)
    f = exp.formulas

    if exp.port_rounds is not None and not segmented:
        got_ports = port_rounds(evs)
        rep.rows.append(
            (
                "rounds (one message in, one out)",
                f.get("port_rounds", ""),
                exp.port_rounds,
                got_ports,
                got_ports == exp.port_rounds,
            )
        )
    got_depth = assign_depth(evs)  # also gives every event its "depth", always
    if not segmented:
        rep.rows.append(
            (
                "depth (longest chain)",
                f.get("depth", ""),
                exp.depth,
                got_depth,
                got_depth == exp.depth,
            )
        )

    sends = [e for e in evs if e["kind"] == "send"]
    msgs = [sum(1 for e in sends if e["rank"] == r) for r in range(n)]
    if not segmented:
        rep.rows.append(
            (
                "messages sent per rank",
                f.get("messages", ""),
                _per_rank(exp.messages),
                _per_rank(msgs),
                msgs == exp.messages,
            )
        )
    sent = [sum(e["nbytes"] for e in sends if e["rank"] == r) for r in range(n)]
    rep.rows.append(
        (
            "bytes sent per rank",
            f.get("bytes", ""),
            _per_rank(exp.nbytes),
            _per_rank(sent),
            sent == exp.nbytes,
        )
    )

    received = len(evs) - len(sends)
    pairs = match_messages(evs)
    unmatched = [k for k, p in pairs.items() if len(p) != 2]
    rep.rows.append(
        (
            "every message received once",
            "sends = receives",
            len(sends),
            received,
            received == len(sends) and not unmatched,
        )
    )

    hits = np.zeros(max(count, 1), dtype=np.int64)
    for e in evs:
        if e["kind"] == "reduce" and e["count"]:
            hits[e["offset"] : e["offset"] + e["count"]] += 1
    hits = hits[:count]
    lo, hi = (int(hits.min()), int(hits.max())) if count else (exp.reductions, exp.reductions)
    got = str(lo) if lo == hi else f"{lo}..{hi}"
    rep.rows.append(
        (
            "reductions per element",
            f.get("reductions", ""),
            exp.reductions,
            got,
            lo == hi == exp.reductions,
        )
    )

    if finals is not None:
        if algorithm in ("all_to_all", "gather", "scatter"):
            raise ValueError(
                "invariants.check: an exchange ends with different bytes on "
                "every rank; check its blocks instead (explain/exchange.py)"
            )
        if algorithm == "reduce":
            same, what = True, "n/a (only the root has the result)"
        else:
            blobs = [np.ascontiguousarray(b).tobytes() for b in finals]
            same = all(b == blobs[0] for b in blobs)
            what = (
                "identical"
                if same
                else "DIFFER on ranks "
                + ",".join(str(r) for r, b in enumerate(blobs) if b != blobs[0])
            )
        rep.rows.append(("same bytes on every rank", "bitwise", "identical", what, same))
    return rep
