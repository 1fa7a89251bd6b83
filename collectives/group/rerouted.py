"""all_reduce under the schedule the coordinator chose around slow links (algorithms/schedule.py).

Every all_reduce asks its group's ScheduleBook (schedbook.py) for the plan in
force at its op sequence number -- the same answer on every rank, by the book's agreement --
and then prices its schedules on the figures the plan carries (algorithms/costmodel.py: the
slow links' throughput and latency, every other link at its peers'), for its own size:

    algorithm="auto"   the schedule tuning.py picked (direct, naive, tree, ring, hierarchical)
                       against the plan's ring or tree, the best ring, the best tree, the star
                       (naive) rooted where it is fastest and, across hosts, hierarchical with
                       leaders off the slow links. So a small buffer, which auto sends
                       "direct" over every link, goes round a link slow enough to cost it --
                       a 32 KiB message over a 40 Mbit/s link takes 6.5 ms, 50 times its
                       healthy time -- to a star or tree that does not use it; a 4 B one, all
                       latency, stays direct (the model: the slow link adds nothing to it).
    "ring", "tree"     the plan's ring or tree, where it is predicted faster than the asked
                       algorithm in rank order.
    "naive"            the star rooted where it is predicted fastest; where every root has
                       a slow link (two slow pairs across a 4-rank ring, say), also the
                       best ring and the best tree, as for "direct".
    "direct"           direct uses every link, so no order avoids one: where the slow links
                       cost it, the best ring, tree or star that keeps off them (a 1 MiB
                       direct over one 40 Mbit/s pair takes 0.2 s, a ring round it a few ms);
                       a small one, all latency, stays direct.
    "hierarchical"     the leaders off the slow links.
    (the others)       as asked.

So an algorithm asked by name names its results (the same on every rank), not its messages,
once the coordinator has flagged a link: as "ring" may run the plan's tree, "direct" and
"naive" may run another kind where their own cannot keep off the slow links.

An alternative is taken only where predicted at least 10 % faster than the default, and never
predicted faster than the default's healthy time (the measured crossovers rank healthy
schedules, not the model: costmodel.py). Every rank makes the same choice: the same plan, the
same size, the same host map, pure arithmetic. The chosen schedule is an algorithm run
unchanged over the plan's order (SubChannel), so every rank gets the same bytes, differing
from the default schedule's only by the reduction's order. A plan without figures (from a
coordinator that sent none) reroutes ring and tree as its order says, and nothing else.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Hashable, Sequence
from typing import Any, Callable

import numpy as np

from ..algorithms import costmodel, direct, hierarchical, naive, ring, tree
from ..algorithms.chunks import weighted_bounds
from ..algorithms.costmodel import Schedule, identity
from ..algorithms.schedule import Plan
from ..algorithms.subgroup import SubChannel
from ..common.ops import ReduceOp
from ..transport.wrapper import OpView
from .schedbook import ScheduleBook

log = logging.getLogger("collectives")
REROUTABLE = ("ring", "tree")  # follow the plan's shape when asked by name
REORDERED = ("naive", "hierarchical")  # asked by name: the same algorithm in a better order
REPLACED = ("direct",)  # asked by name: another kind where its own pattern cannot keep off


def all_reduce(
    book: ScheduleBook,
    algorithm: str,
    fn: Callable[..., Any],
    auto: bool = False,
    hosts: Sequence[Hashable] | None = None,
) -> Callable[[Any, np.ndarray, ReduceOp], None]:
    """`fn` (the planned all_reduce of `algorithm`; auto: "auto" picked it), run under the
    plan in force at each op."""
    if not auto and algorithm not in REROUTABLE + REORDERED + REPLACED:
        return fn
    host_map = tuple(hosts) if hosts is not None else None

    def run(ch: OpView, arr: np.ndarray, op: ReduceOp) -> None:
        plan: Plan | None = book.for_op(ch.seq, ch.deadline, "all_reduce")
        s = None
        if plan is not None:
            k = 1
            if algorithm == "hierarchical" and host_map is not None:
                k = _leaders(host_map) if arr.nbytes >= ch.leaders_min_bytes else 1
            s = choose(plan, algorithm, auto, arr.nbytes, host_map, k)
        if s is None:
            fn(ch, arr, op)
        else:
            run_schedule(s, ch, arr, op, host_map)

    return run


def _leaders(hosts: Sequence[Hashable]) -> int:
    return min(len(g) for g in costmodel.host_groups(hosts))


@functools.lru_cache(maxsize=256)
def choose(
    plan: Plan,
    algorithm: str,
    auto: bool,
    nbytes: int,
    hosts: tuple[Any, ...] | None = None,
    leaders_k: int = 1,
) -> Schedule | None:
    """The schedule an all_reduce of nbytes runs under `plan` (None: the default, as picked);
    see the module's docstring. Pure, so the same on every rank."""
    if plan.costs is None:
        return plan.schedule if algorithm in REROUTABLE else None
    got = choice(plan, algorithm, auto, nbytes, hosts, leaders_k)
    return None if got is None or got.kept else got.schedule


def choice(
    plan: Plan,
    algorithm: str,
    auto: bool,
    nbytes: int,
    hosts: tuple[Any, ...] | None = None,
    leaders_k: int = 1,
) -> costmodel.Choice | None:
    """The model's choice behind choose(), with its predictions; None where the algorithm is
    run as asked whatever the figures (direct, and the others not rerouted)."""
    c = plan.costs
    if c is None or (algorithm == "hierarchical" and hosts is None):
        return None
    n = len(plan.order)
    default = Schedule(algorithm, identity(n))
    where = hosts if algorithm == "hierarchical" else None
    if auto:
        cands = [plan.schedule, *costmodel.candidates(c, nbytes, where)]
    elif algorithm in REROUTABLE:
        cands = [plan.schedule]
    elif algorithm == "naive":
        star = Schedule("naive", costmodel.best_star(c, nbytes)[0])
        cands = [star, *_off_slow(star, c, nbytes)]
    elif algorithm == "direct":
        cands = _off_slow(default, c, nbytes)
    elif algorithm == "hierarchical":
        assert where is not None
        cands = [Schedule("hierarchical", costmodel.leaders_off_slow(c, where))]
    else:
        return None
    return costmodel.choose(default, cands, nbytes, c, where, leaders_k)


def _off_slow(asked: Schedule, c: costmodel.LinkCosts, nbytes: int) -> list[Schedule]:
    """The schedules of another kind worth pricing against `asked`, which no order of its
    own keeps off the slow links: the best ring, tree and star (none where it uses no slow
    link)."""
    slow = {(f.src, f.dst) for f in c.links}
    if not costmodel.links_of(asked) & slow:
        return []
    return costmodel.candidates(c, nbytes)


def run_schedule(
    s: Schedule, ch: OpView, arr: np.ndarray, op: ReduceOp, hosts: Sequence[Hashable] | None
) -> None:
    """Schedule `s` run over the op's channel (the simulator records it the same way:
    collectives/simulation/programs.py)."""
    if s.kind == "ring" and s.weights:
        # one rank's chunk may be most of the buffer, forwarded hop by hop: cut fine enough
        # that the hops overlap (as the model prices it: costmodel.weighted_ring_time)
        piece = min(ch.segment_bytes, costmodel.SIZED_RING_SEGMENT)
        sub = SubChannel(ch, s.order, segment_bytes=piece)
        ring.all_reduce(sub, arr, op, bounds=weighted_bounds(arr.size, s.weights))
        return
    sub = SubChannel(ch, s.order)
    if s.kind == "ring":
        ring.all_reduce(sub, arr, op)
    elif s.kind == "tree":
        tree.all_reduce(sub, arr, op)
    elif s.kind == "naive":
        naive.all_reduce(sub, arr, op)
    elif s.kind == "direct":
        direct.all_reduce(sub, arr, op)
    else:
        assert hosts is not None
        # the same cuts across hosts as the default's (a SubChannel's are for a flat schedule)
        sub.link_segment_bytes = ch.link_segment_bytes
        sub.leaders_min_bytes = ch.leaders_min_bytes
        hierarchical.all_reduce(sub, arr, op, hosts=[hosts[r] for r in s.order])


def describe(book: ScheduleBook) -> str | None:
    """The plan in force now, in words; None for the default schedules."""
    plan = book.last()
    return plan.describe() if isinstance(plan, Plan) else None


__all__ = [
    "REORDERED",
    "REPLACED",
    "REROUTABLE",
    "all_reduce",
    "choice",
    "choose",
    "describe",
    "run_schedule",
]
