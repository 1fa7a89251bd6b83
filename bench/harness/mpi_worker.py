"""One rank of the `mpi` backend: mpi4py over MPICH, launched by the runner with mpiexec.

    mpiexec -n N python -m bench.harness.mpi_worker SPEC.json OUT.json

Same sizes, buffers, inputs and check as the other backends (spec.Layout), the MPI twin of
each collective: Allreduce (in place), Reduce (in place at the root), Bcast, Allgather,
Reduce_scatter_block, Alltoall. Each timed repeat starts after an MPI Barrier and records the
mean time of `iters` back-to-back operations; rank 0 writes every rank's records (the worker
payload format, bench/harness/worker.py) to OUT.json, and the runner aggregates them with the rest.
MPICH's ranks poll while they wait; on a loaded 2-core machine that costs them, which is
part of what this measures.
"""

from __future__ import annotations

import json
import sys
import time

from .spec import Layout, Spec, iters_for


def main(spec_path: str, out_path: str) -> int:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    with open(spec_path) as f:
        fields = json.load(f)
    fields["backends"] = tuple(fields["backends"])
    fields["sizes"] = tuple(fields["sizes"])
    spec = Spec(**fields)
    if comm.Get_size() != spec.nproc:
        raise SystemExit(
            f"bench.harness.mpi_worker: launched with {comm.Get_size()} ranks, spec "
            f"says {spec.nproc}"
        )
    op = {"sum": MPI.SUM, "avg": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "product": MPI.PROD}[
        spec.op
    ]
    records = []
    skipped = {}
    if spec.op == "avg":
        skipped["mpi"] = "MPI has no AVG reduction"
    else:
        for size in spec.sizes:
            lay = Layout(spec, size, rank)
            if lay.empty:
                continue
            fn = _bind(comm, MPI, spec.collective, lay, op)
            lay.fill()
            comm.Barrier()
            fn()
            wrong = lay.wrong()
            for _ in range(spec.warmup):
                fn()
            iters = iters_for(lay.nbytes, spec.iters)
            times = []
            for _ in range(spec.repeats):
                lay.fill()
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    fn()
                times.append((time.perf_counter() - t0) / iters)
            records.append(
                {
                    "backend": "mpi",
                    "size": lay.nbytes,
                    "count": lay.count,
                    "iters": iters,
                    "wrong": wrong,
                    "times": times,
                }
            )
    payloads = comm.gather({"records": records, "skipped": skipped}, root=0)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(payloads, f)
    return 0


def _bind(comm, MPI, collective, lay, op):
    buf, out = lay.buf, lay.out
    if collective == "all_reduce":
        return lambda: comm.Allreduce(MPI.IN_PLACE, buf, op)
    if collective == "reduce":
        if comm.Get_rank() == 0:
            return lambda: comm.Reduce(MPI.IN_PLACE, buf, op, root=0)
        return lambda: comm.Reduce(buf, None, op, root=0)
    if collective == "broadcast":
        return lambda: comm.Bcast(buf, root=0)
    if collective == "all_gather":
        return lambda: comm.Allgather(buf, out)
    if collective == "reduce_scatter":
        return lambda: comm.Reduce_scatter_block(buf, out, op)
    return lambda: comm.Alltoall(buf, out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
