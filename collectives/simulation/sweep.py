"""Run one seed, or many: each run's properties checked (properties.py); a failing seed is
run again with its trace (the same seed gives the same run)."""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass

from .properties import Violation, check
from .world import World


@dataclass(frozen=True)
class Outcome:
    seed: int
    violations: tuple[Violation, ...]


def run_seed(seed: int) -> Outcome:
    return Outcome(seed, tuple(check(World(seed).run())))


def _chunk(bounds: tuple[int, int]) -> list[Outcome]:
    return [o for o in map(run_seed, range(*bounds)) if o.violations]


def sweep(first: int, last: int, jobs: int = 1, chunk: int = 500) -> tuple[list[Outcome], float]:
    """Seeds first..last-1; (the failing ones, seconds taken)."""
    t0 = time.perf_counter()
    pieces = [(a, min(a + chunk, last)) for a in range(first, last, chunk)]
    failing: list[Outcome] = []
    if jobs <= 1:
        for piece in pieces:
            failing += _chunk(piece)
    else:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            for found in pool.imap(_chunk, pieces):
                failing += found
    return failing, time.perf_counter() - t0


def traced(seed: int) -> tuple[World, list[Violation]]:
    w = World(seed, trace=True).run()
    return w, check(w)


def summary(w: World) -> str:
    c = w.cfg
    lines = [
        f"seed {w.seed}: {c.n} ranks, {c.ops} steps, {c.algorithm} all_reduce of {c.count} "
        f"floats, op timeout {c.op_timeout:g} s, fail-slow policy {c.failslow}",
        *(f"  fault: {f.describe()}" for f in w.faults),
        *(f"  rank {p.lid}: {p.status} ({p.why})" for p in w.procs),
    ]
    return "\n".join(lines)
