"""One rank of a benchmark run: a real process that runs every backend on every size.

Interleaving (so that machine noise hits all backends alike): sizes go one by one; at each size
every backend is first checked and warmed up, then the timed repeats go round-robin over the
backends, starting each lap one backend later. Every timed repeat starts right after a barrier
on the raw sockets (no backend under test is involved in synchronising the others), runs
`iters` back-to-back operations and records the mean per operation. The runner takes the
slowest rank per repeat (an operation is done when every rank is done) and the median over
repeats.
"""

from __future__ import annotations

import time
import traceback
import types

import numpy as np

from collectives.algorithms.commit import SKIP_AT_MOST

from .backends import EXTERNAL, TORCH, Limit, Skip, make
from ..floors.collective import CopyFloor, LatencyFloor, PairMesh
from ..floors.limit import SEGMENTS, RawRing
from .spec import Layout, Spec, busbw_factor, iters_for


def main(rank: int, spec_fields: dict, ports: dict, conn):
    """Entry point of a spawned worker; reports ('done', payload) or ('error', text) on conn."""
    try:
        conn.send(("done", run(rank, Spec(**spec_fields), ports, conn)))
    except BaseException:
        conn.send(("error", f"rank {rank}:\n{traceback.format_exc()}"))
    finally:
        conn.close()


def run(rank: int, spec: Spec, ports: dict, conn) -> dict:
    ctx = types.SimpleNamespace(rank=rank, size=spec.nproc, ports=ports)
    ring = RawRing(rank, spec.nproc, spec.transport, timeout=spec.timeout)
    conn.send(("address", ring.address))
    ring.connect(conn.recv())
    skipped: dict[str, str] = {}
    active = []
    # torch first: importing it can hold the GIL for seconds, which must not happen while this
    # library's group is up and its heartbeats are due.
    mesh = (
        PairMesh(rank, spec.nproc, str(ports["collectives"]), spec.timeout) if spec.limit else None
    )
    for name in sorted(
        (b for b in spec.backends if b not in EXTERNAL), key=lambda b: b not in TORCH
    ):
        backend = make(name, spec)
        try:
            backend.setup(ctx)
            active.append(backend)
        except Skip as exc:
            skipped[name] = str(exc)
        ring.barrier()  # group construction is collective: keep the ranks in step
    active.sort(key=lambda b: spec.backends.index(b.name))
    if spec.limit:
        factor = busbw_factor(spec.collective, spec.nproc)
        active += [Limit(spec, ring, factor, seg) for seg in SEGMENTS]
        # the library's group has a coordinator here: 2+ ranks end each op with a commit
        active += [LatencyFloor(spec, mesh, rank, spec.nproc > SKIP_AT_MOST), CopyFloor(spec)]

    opened = list(active)
    bar = _progress(rank, spec)
    records = []
    try:
        for size in spec.sizes:
            lay = Layout(spec, size, rank)
            if bar is not None:
                bar.set_postfix_str(f"size {size} B")
            if lay.empty:
                if bar is not None:
                    bar.update(spec.repeats)
                continue
            iters = iters_for(lay.nbytes, spec.iters)
            ready = []
            for backend in list(active):
                if not getattr(backend, "applies", lambda lay: True)(lay):
                    continue
                try:
                    ready.append((backend, *_check_and_warm(backend, lay, ring, spec.warmup)))
                except Exception as exc:  # e.g. an algorithm this collective does not have
                    # Not closed here: its group may be shared (ring/tree, gloo/nccl).
                    skipped[backend.name] = f"{type(exc).__name__}: {exc}".splitlines()[0]
                    active.remove(backend)
                    ring.barrier()
            times = {b.name: [] for b, _, _ in ready}
            for rep in range(spec.repeats):
                k = rep % max(len(ready), 1)
                for backend, fn, _ in ready[k:] + ready[:k]:
                    lay.fill()
                    backend.load(lay)
                    ring.barrier()
                    t0 = time.perf_counter()
                    # An in-place sum run `iters` times doubles the values each time (float32
                    # overflows to inf after ~128): only the timing counts here, the result was
                    # checked once above, so numpy's overflow warning is noise.
                    with np.errstate(over="ignore", invalid="ignore"):
                        for _ in range(iters):
                            fn()
                        backend.sync()
                    times[backend.name].append((time.perf_counter() - t0) / iters)
                if bar is not None:
                    bar.update(1)
            for backend, _, wrong in ready:
                records.append(
                    {
                        "backend": backend.name,
                        "size": lay.nbytes,
                        "count": lay.count,
                        "iters": iters,
                        "wrong": wrong,
                        "times": times[backend.name],
                    }
                )
        ring.barrier()  # nobody tears down a group another rank is still using
    finally:
        if bar is not None:
            bar.close()
        for backend in opened:
            _close(backend)
        ring.close()
        if mesh is not None:
            mesh.close()
    return {"records": records, "skipped": skipped}


def _check_and_warm(backend, lay, ring, warmup):
    """Run once on known inputs and count wrong elements, then warm up. Untimed."""
    fn = backend.bind(lay)
    lay.fill()
    backend.load(lay)
    ring.barrier()
    fn()
    backend.sync()
    got = backend.result(lay)
    wrong = None if got is None else lay.wrong(got)
    for _ in range(warmup):
        fn()
    backend.sync()
    return fn, wrong


def _close(backend):
    try:
        backend.close()
    except Exception:  # teardown of one backend must not hide the results of the others
        pass


def _progress(rank, spec):
    if rank != 0 or not spec.progress:
        return None
    from tqdm import tqdm

    return tqdm(
        total=len(spec.sizes) * spec.repeats, unit="lap", desc=spec.collective, dynamic_ncols=True
    )
