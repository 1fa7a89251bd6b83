"""Run a function on every rank of an in-process group: one thread per rank, no sockets.

    results = cl.simulate(3, lambda pg: (pg.all_reduce(x := np.ones(4)), x)[1])
    cl.simulate(4, fn, hosts=[0, 0, 1, 1])       # ranks 0, 1 on one host, 2, 3 on another

Deterministic: each rank's result depends only on the schedule, not on thread timing.
"""

from __future__ import annotations

from typing import Any, Callable, Literal, Sequence, overload

from ..group.group import ProcessGroup
from .step import Stepper
from .threads import SimulationError, run_ranks

__all__ = ["simulate", "SimulationError"]


@overload
def simulate(
    world_size: int,
    fn: Callable[[ProcessGroup], Any],
    *,
    timeout: float = 30.0,
    segment_bytes: int | None = None,
    wrappers: Sequence[Callable[[Any], Any]] = (),
    return_errors: bool = False,
    step: Literal[False] = False,
    hosts: Sequence[Any] | None = None,
) -> list[Any]: ...


@overload
def simulate(
    world_size: int,
    fn: Callable[[ProcessGroup], Any],
    *,
    timeout: float = 30.0,
    segment_bytes: int | None = None,
    wrappers: Sequence[Callable[[Any], Any]] = (),
    return_errors: bool = False,
    step: Literal[True],
    hosts: Sequence[Any] | None = None,
) -> Stepper: ...


def simulate(
    world_size: int,
    fn: Callable[[ProcessGroup], Any],
    *,
    timeout: float = 30.0,
    segment_bytes: int | None = None,
    wrappers: Sequence[Callable[[Any], Any]] = (),
    return_errors: bool = False,
    step: bool = False,
    hosts: Sequence[Any] | None = None,
) -> list[Any] | Stepper:
    """Run fn(pg) on `world_size` threads; return [result of rank 0, rank 1, ...].

    If any rank raises, raise SimulationError (or, with return_errors, return the exception
    objects in place of the results). Threads are joined with a deadline: a schedule that
    deadlocks fails with the ranks that were still running named.

    hosts: the host of each rank, e.g. [0, 0, 1, 1] for two hosts of two ranks (default: one
    host). It is what the ranks' groups see as pg.hosts, so algorithm="hierarchical" (and
    "auto") treat the threads as ranks on those hosts.

    step=True returns at once a step.Stepper with every rank paused before its first send or
    receive (s.step() lets one event happen, s.results() runs to the end); paused ranks do not
    time out, so `timeout` is not used then.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"simulate: world_size must be a positive int, got {world_size!r}")
    if step:
        return Stepper(world_size, fn, wrappers=wrappers, segment_bytes=segment_bytes, hosts=hosts)
    return run_ranks(
        world_size,
        fn,
        timeout=timeout,
        segment_bytes=segment_bytes,
        wrappers=wrappers,
        return_errors=return_errors,
        hosts=hosts,
    )
