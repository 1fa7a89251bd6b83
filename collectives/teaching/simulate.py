"""Run a function on every rank of an in-process group: one thread per rank, no sockets.

    results = cl.simulate(3, lambda pg: (pg.all_reduce(x := np.ones(4)), x)[1])

Deterministic: each rank's result depends only on the schedule, not on thread timing.
"""
from __future__ import annotations

import threading

from ..core.group import ProcessGroup
from ..transport.inproc import InprocWorld


class SimulationError(RuntimeError):
    """One or more ranks raised; `errors` maps rank -> exception."""

    def __init__(self, errors: dict):
        first = min(errors)
        super().__init__(f"{len(errors)} rank(s) failed; rank {first}: {errors[first]!r}")
        self.errors = errors


def simulate(world_size: int, fn, *, timeout: float = 30.0, segment_bytes: int | None = None,
             wrappers=(), return_errors: bool = False, step: bool = False):
    """Run fn(pg) on `world_size` threads; return [result of rank 0, rank 1, ...].

    If any rank raises, raise SimulationError (or, with return_errors, return the exception
    objects in place of the results). Threads are joined with a deadline: a schedule that
    deadlocks fails with the ranks that were still running named.

    step=True returns at once a step.Stepper with every rank paused before its first send or
    receive (s.step() lets one event happen, s.results() runs to the end); paused ranks do not
    time out, so `timeout` is not used then.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"simulate: world_size must be a positive int, got {world_size!r}")
    if step:
        from .step import Stepper
        return Stepper(world_size, fn, wrappers=wrappers, segment_bytes=segment_bytes)
    world = InprocWorld(world_size)
    results: list = [None] * world_size
    errors: dict = {}

    def body(rank):
        t = world.transport(rank)
        if segment_bytes is not None:
            t.segment_bytes = segment_bytes
        pg = ProcessGroup(t, timeout=timeout)
        for wrap in wrappers:
            pg.channel_wrappers.append(wrap)
        try:
            results[rank] = fn(pg)
        except BaseException as exc:
            errors[rank] = exc
        finally:
            pg.destroy()

    threads = [threading.Thread(target=body, args=(r,), daemon=True, name=f"sim-rank{r}")
               for r in range(world_size)]
    for th in threads:
        th.start()
    for r, th in enumerate(threads):
        th.join(timeout + 10)
        if th.is_alive():
            errors.setdefault(r, TimeoutError(f"simulate: rank {r} still running after "
                                              f"{timeout + 10:g} s"))
    if errors and not return_errors:
        raise SimulationError(errors)
    for r, exc in errors.items():
        results[r] = exc
    return results
