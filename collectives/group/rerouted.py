"""all_reduce under the schedule the coordinator chose around slow links (algorithms/schedule.py).

Every all_reduce asks its transport's ScheduleBook (transport/schedbook.py) for the plan in
force at its op sequence number -- the same answer on every rank, by the book's agreement --
and a ring or tree all_reduce then runs over the plan's order: a ring in the plan's order, or,
where the plan is a tree, the binomial tree rooted at the plan's first rank. Other algorithms
(direct, naive, hierarchical, ...) use every link or their own layout, and run as they are.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np

from ..algorithms import ring, tree
from ..algorithms.schedule import Plan, view
from ..common.ops import ReduceOp
from ..transport.base import Transport
from ..transport.wrapper import OpView

log = logging.getLogger("collectives")
REROUTABLE = ("ring", "tree")


def all_reduce(
    transport: Transport, algorithm: str, fn: Callable[..., Any]
) -> Callable[[Any, np.ndarray, ReduceOp], None]:
    """`fn` (the planned all_reduce of `algorithm`), run under the plan in force at each op."""
    if algorithm not in REROUTABLE:
        return fn
    book = transport.schedules

    def run(ch: OpView, arr: np.ndarray, op: ReduceOp) -> None:
        plan: Plan | None = book.for_op(ch.seq, ch.deadline, "all_reduce")
        if plan is None:
            fn(ch, arr, op)
        elif plan.tree:
            tree.all_reduce(view(ch, plan), arr, op)
        else:
            ring.all_reduce(view(ch, plan), arr, op)

    return run


def describe(transport: Transport) -> str | None:
    """The plan in force now, in words; None for the default schedules."""
    plan = transport.schedules.last()
    return plan.describe() if isinstance(plan, Plan) else None


__all__ = ["REROUTABLE", "all_reduce", "describe"]
