"""Explain an algorithm by running it: the run (this module), its text (text.py), its picture
(drawing.py) and the command line (cli.py, `python -m collectives.explain`).

How a buffer can tell its own story: rank r starts with 2**r in every element (int64, SUM), so
any value is a set of ranks written in binary -- 5 = 0b101 is "the sum of ranks 0 and 2". The
run is a real cl.simulate run traced with record_data=True; the text and the picture are
replayed from the trace, round by round (see invariants.port_rounds), and the theory-vs-run
checks of invariants.py are printed at the end. crossover() runs ring, tree and halving-doubling
on emulated links (emulate.py) beside the alpha-beta model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ...algorithms.chunks import chunk_bounds
from ...algorithms.halving_doubling import fold
from ...algorithms.hierarchical import host_groups, leaders_per_host
from .. import invariants as inv
from ..emulate import COSTED, LinkModel, best_double_tree_segments, cost
from ..simulate import simulate
from ..trace import Tracer, match_messages

ALL_REDUCE = ("ring", "tree", "halving_doubling", "double_tree", "naive", "direct", "hierarchical")
ROOTED = ("reduce", "broadcast")
DESCRIPTION = {
    "ring": "ring all_reduce (reduce-scatter, then all-gather)",
    "tree": "binomial tree all_reduce (reduce to rank 0, then broadcast)",
    "halving_doubling": "halving-doubling all_reduce (reduce-scatter by recursive halving, "
    "all-gather by recursive doubling)",
    "double_tree": "double binary tree all_reduce (each of two trees reduces and broadcasts "
    "half the buffer; a rank is interior in at most one)",
    "naive": "naive all_reduce (everything to rank 0, then back)",
    "direct": "direct all_reduce (everyone sends everything to everyone)",
    "hierarchical": "hierarchical all_reduce (each host's leaders take its contributions, "
    "one ring across the hosts per leader, the results back to the host)",
    "reduce": "binomial tree reduce",
    "broadcast": "binomial tree broadcast",
}


def initial(algorithm: str, n: int, count: int, root: int = 0) -> list:
    """Each rank's input: 2**r everywhere (for broadcast: the root holds the full set, the
    others nothing yet)."""
    if algorithm == "broadcast":
        return [np.full(count, (1 << n) - 1 if r == root else 0, np.int64) for r in range(n)]
    return [np.full(count, 1 << r, np.int64) for r in range(n)]


def default_hosts(n: int) -> list:
    """Two hosts, the lower half of the ranks on host 0 (one host for a single rank)."""
    return [r * 2 // n for r in range(n)] if n > 1 else [0]


def parse_hosts(text: str) -> list:
    """'0,0,1,1' -> [0, 0, 1, 1] (the host of each rank)."""
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(
            f"explain: --hosts takes one host number per rank, comma-separated "
            f"(e.g. 0,0,1,1), got {text!r}"
        ) from None


def make_fn(algorithm: str, inputs: list, root: int = 0) -> Callable[[Any], Any]:
    def fn(pg):
        x = inputs[pg.rank].copy()
        if algorithm in ALL_REDUCE:
            pg.all_reduce(x, algorithm=algorithm)
        elif algorithm == "reduce":
            pg.reduce(x, dst=root)
        elif algorithm == "broadcast":
            pg.broadcast(x, src=root)
        else:
            raise ValueError(f"explain: unknown algorithm {algorithm!r}")
        return x

    return fn


@dataclass
class Explained:
    algorithm: str
    n: int
    count: int
    root: int
    events: list  # data events (no confirm messages), each with a "round"
    confirms: int  # how many confirm events were left out
    rounds: int
    # states[k][r]: rank r's working buffer after round k (0 = start); the last round's column
    # is each rank's own buffer as the op returned it (finals)
    states: list
    messages: list  # messages[k]: list of (send event, recv event) taken in round k
    finals: list  # each rank's buffer when the op returned
    report: inv.Report
    tracer: Tracer
    hosts: list | None = None  # the host of each rank, where the run was given a host map
    # ranks whose working buffer was a scratch copy (a tree reduce's interior ranks sum into
    # one, so that their own buffer is unchanged): the replay ends on the copy, the op
    # returned their own buffer
    scratch: list = field(default_factory=list)

    @property
    def chunks(self) -> int:
        """How many chunks the buffer is cut into: one per rank, for hierarchical one per
        host and leader (k parts, one per leader's ring, of H chunks each)."""
        if self.algorithm == "hierarchical" and self.hosts is not None:
            groups = host_groups(self.hosts)
            return len(groups) * leaders_per_host(groups)
        if self.algorithm == "halving_doubling":
            return fold(self.n)[0]  # one chunk per rank of the power of two that runs it
        if self.algorithm == "double_tree":
            return 2 if self.n > 1 else 1  # one half per tree
        return self.n

    @property
    def chunked(self) -> bool:
        """Whether the algorithm cuts the buffer into chunks, each with its own path (the
        pictures colour cells by chunk then; a tree or naive moves the whole buffer)."""
        return self.algorithm in ("ring", "halving_doubling", "double_tree", "hierarchical")

    @property
    def bounds(self) -> list:
        """The chunks' [a, b): hierarchical cuts the buffer into k parts, each into H chunks."""
        if self.algorithm == "hierarchical" and self.hosts is not None:
            groups = host_groups(self.hosts)
            return [
                (p0 + a, p0 + b)
                for p0, p1 in chunk_bounds(self.count, leaders_per_host(groups))
                for a, b in chunk_bounds(p1 - p0, len(groups))
            ]
        return chunk_bounds(self.count, self.chunks)


def explain_run(
    algorithm: str, n: int, count: int, root: int = 0, hosts: Sequence[Any] | None = None
) -> Explained:
    """Run `algorithm` on n simulated ranks and replay it round by round. `hosts` (the host of
    each rank) places the ranks on hosts; hierarchical defaults to two hosts (default_hosts)."""
    if algorithm not in ALL_REDUCE + ROOTED:
        raise ValueError(
            f"explain: unknown algorithm {algorithm!r}; choose one of "
            f"{', '.join(ALL_REDUCE + ROOTED)}"
        )
    if not 1 <= n <= 62:
        raise ValueError(f"explain: world size must be 1..62 (one bit per rank), got {n}")
    if count < 1:
        raise ValueError(f"explain: count must be >= 1, got {count}")
    if hosts is None and algorithm == "hierarchical":
        hosts = default_hosts(n)
    if hosts is not None:
        hosts = list(hosts)
        if len(hosts) != n:
            raise ValueError(
                f"explain: --hosts names {len(hosts)} hosts for a world of size "
                f"{n}: one host per rank"
            )
    if algorithm in ALL_REDUCE:
        root = 0  # all_reduce has no root (tree reduces to rank 0)
    elif not 0 <= root < n:
        raise ValueError(f"explain: root {root} is not a rank of a world of size {n}")
    inputs = initial(algorithm, n, count, root)
    tracer = Tracer(record_data=True, max_data=1 << 16)
    finals = simulate(
        n, make_fn(algorithm, inputs, root), wrappers=[tracer.wrap], timeout=30.0, hosts=hosts
    )
    every = tracer.sorted_events()
    events = inv.data_events(every)
    report = inv.check(
        events,
        algorithm,
        world_size=n,
        count=count,
        itemsize=8,
        root=root,
        finals=finals,
        hosts=hosts,
    )

    # Rounds of the single-port model (invariants.port_rounds, what emulate.LinkModel counts
    # with alpha = 1, beta = 0): a rank's sends, and the messages its port takes, go one a
    # round, so a root's two sends are two rounds. Every algorithm, hierarchical included, is
    # drawn in these rounds; the depth (assign_depth) is the invariants report's other count.
    rounds = inv.port_rounds(events)
    for e in events:
        e["round"] = e["slot"]
    # Replay: after round k, rank r has done every event of round <= k that comes before its
    # first event of a later round.
    by_rank = [[e for e in events if e["rank"] == r] for r in range(n)]
    state = [x.copy() for x in inputs]
    cursor = [0] * n
    states = [[x.copy() for x in state]]
    for k in range(1, rounds + 1):
        for r in range(n):
            evs = by_rank[r]
            while cursor[r] < len(evs) and evs[cursor[r]]["round"] <= k:
                e = evs[cursor[r]]
                if e["kind"] != "send" and e["count"]:
                    state[r][e["offset"] : e["offset"] + e["count"]] = e["data"]
                e["applied"] = k
                cursor[r] += 1
        states.append([x.copy() for x in state])
    # Every op has returned by the end of the last round: that column shows the buffers the
    # op returned. The replay ends elsewhere where a rank did work the trace does not see:
    # direct's local addition of its own buffer, or a reduce's interior rank summing into a
    # scratch copy -- that one returns its input unchanged.
    scratch = [
        r
        for r in range(n)
        if not np.array_equal(state[r], finals[r]) and np.array_equal(finals[r], inputs[r])
    ]
    states[-1] = [f.copy() for f in finals]
    messages = [[] for _ in range(rounds + 1)]  # type: list[list[tuple[dict, dict]]]
    for key, pair in sorted(
        match_messages(events).items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][3])
    ):
        messages[pair["recv"].get("arrival", pair["send"]["round"])].append(
            (pair["send"], pair["recv"])
        )
    return Explained(
        algorithm,
        n,
        count,
        root,
        events,
        len(every) - len(events),
        rounds,
        states,
        messages,
        finals,
        report,
        tracer,
        hosts,
        scratch,
    )


DEFAULT_SIZES = [64 << (2 * i) for i in range(9)]  # 64 B .. 4 MiB


def crossover(
    alpha: float,
    beta: float,
    n: int = 8,
    sizes: Sequence[int] = DEFAULT_SIZES,
    algorithms: Sequence[str] = ("ring", "tree", "halving_doubling"),
    segment_bytes: int | None = None,
) -> list:
    """Rows of (nbytes, {algorithm: (model seconds, emulated seconds)}), float32 buffers.
    double_tree runs in the segments the model prices fastest (best_double_tree_segments),
    or in segment_bytes where given; the others in one segment a message unless given."""
    rows = []
    for nbytes in sizes:
        count = max(1, nbytes // 4)
        row = {}
        for alg in algorithms:
            m = LinkModel(alpha, beta)
            seg = segment_bytes or max(nbytes, 1 << 20)
            model: float | None = None
            if alg == "double_tree":
                half = (count + 1) // 2 * 4
                if segment_bytes:
                    pieces = -(-half // segment_bytes)
                else:
                    pieces = best_double_tree_segments(n, count * 4, alpha, beta)
                    seg = -(-half // pieces)
                model = cost(alg, n, pieces).time(count * 4, alpha, beta)
            elif alg in COSTED:
                model = cost(alg, n).time(count * 4, alpha, beta)
            simulate(
                n,
                lambda pg, alg=alg: pg.all_reduce(
                    np.ones(count, np.float32),  # type: ignore[misc]
                    algorithm=alg,
                ),
                wrappers=[m.wrap],
                segment_bytes=seg,
            )
            row[alg] = (model, m.makespan())
        rows.append((count * 4, row))
    return rows
