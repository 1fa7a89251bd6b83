"""One thread per rank over an in-process world: the engine under cl.simulate and the stepper.

No sockets: each rank's ProcessGroup runs over an InprocTransport, so the algorithms are the
very ones that run across processes, and a stall is diagnosed as it is there (diagnose.blame).
"""

from __future__ import annotations

import threading

from ..group.group import ProcessGroup
from ..membership.diagnose import blame
from ..transport.inproc import InprocWorld


class SimulationError(RuntimeError):
    """One or more ranks raised; `errors` maps rank -> exception."""

    def __init__(self, errors: dict):
        first = min(errors)
        super().__init__(f"{len(errors)} rank(s) failed; rank {first}: {errors[first]!r}")
        self.errors = errors


def run_ranks(
    world_size: int,
    fn,
    *,
    timeout: float = 30.0,
    segment_bytes: int | None = None,
    wrappers=(),
    return_errors: bool = False,
    hosts=None,
) -> list:
    """Run fn(pg) on `world_size` threads; see simulate()."""
    world = InprocWorld(world_size, blame=blame, hosts=hosts)
    results: list = [None] * world_size
    errors: dict = {}

    def body(rank):
        t = world.transport(rank)
        if segment_bytes is not None:
            t.segment_bytes = segment_bytes
        pg = ProcessGroup(t, timeout=timeout, judge=world)  # a stall judged on every rank
        for wrap in wrappers:
            pg.channel_wrappers.append(wrap)
        try:
            results[rank] = fn(pg)
        except BaseException as exc:
            errors[rank] = exc
        finally:
            pg.destroy()

    threads = [
        threading.Thread(target=body, args=(r,), daemon=True, name=f"sim-rank{r}")
        for r in range(world_size)
    ]
    for th in threads:
        th.start()
    for r, th in enumerate(threads):
        th.join(timeout + 10)
        if th.is_alive():
            errors.setdefault(
                r, TimeoutError(f"simulate: rank {r} still running after {timeout + 10:g} s")
            )
    if errors and not return_errors:
        raise SimulationError(errors)
    for r, exc in errors.items():
        results[r] = exc
    return results
