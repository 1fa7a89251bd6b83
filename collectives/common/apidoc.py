"""What every collective's docstring says alike, written once: `help(pg.all_reduce)` and
`help(cl.all_reduce)` show the method's own text followed by these sections (the README's API
section says the same; tests/unit/test_typing.py checks that both name every op and algorithm).
Nothing here runs at call time: the decorator only extends __doc__ when the class is made."""

from __future__ import annotations

import inspect
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)

BUFFER = """\
Buffers: a contiguous, writable numpy.ndarray or CPU torch.Tensor, updated in place. dtypes:
bool, int8..uint64, float16/32/64, and torch.bfloat16 (reduced as float32, rounded once)."""

OPS = """\
op: ReduceOp.SUM (default), AVG, PRODUCT, MIN, MAX, BAND, BOR or BXOR -- or its name ("sum"),
or a torch.distributed.ReduceOp. AVG needs a floating dtype (else ValueError); BAND, BOR and
BXOR are bitwise, for integer and bool dtypes (else TypeError); on bool SUM and MAX are "or",
PRODUCT and MIN "and". The result is bitwise identical on every rank."""

COMMON = """\
async_op: False (default) returns None once the operation is over on this rank. True returns
a Work at once -- wait(timeout=None), is_completed(), exception() -- the operation running on
the group's op thread, in issue order; wait() re-raises its error.
timeout: seconds this operation may take (default: the group's, init_process_group's
`timeout`); every blocking wait in it has this deadline, so it never hangs.

Raises: ValueError or TypeError for a bad argument (buffer, dtype, op, rank, algorithm), before
any byte moves; CollectiveMismatch on every rank when ranks called different things (kind,
count, dtype, op, algorithm, root); CollectiveTimeout past the deadline, naming the operation,
this rank, the peer waited on and the phase; PeerFailure when a member failed or left (its
failed_ranks and generation; call reconstruct() to go on), Evicted on a rank that was removed;
CollectiveError once the group is destroyed."""


def sections(*parts: str) -> Callable[[F], F]:
    """Append `parts` (BUFFER, OPS, COMMON) to the decorated function's docstring."""

    def extend(fn: F) -> F:
        fn.__doc__ = "\n\n".join([inspect.cleandoc(fn.__doc__ or ""), *parts])
        return fn

    return extend
