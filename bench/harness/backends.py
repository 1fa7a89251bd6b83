"""One adapter per backend, all driven the same way by the worker loop.

    setup(ctx)        once per process, in the same order on every rank (groups are collective)
    bind(lay)         this size's buffers -> a callable that runs the collective once
    sync()            wait for the device (NCCL); a no-op on CPU
    load(lay)/result(lay)  copy inputs in / results out where the backend has its own buffers

Names: ring, tree, auto, direct, naive, halving_doubling, double_tree are this library's algorithms (one
process group shared by all of them, its sockets authenticated as always; a collective that has
one algorithm, like all_to_all's pairwise exchange, runs under auto and the other names are
skipped; torch's Gloo runs its ring only: torch.distributed does not expose Gloo's own
halving-doubling, so halving_doubling has no Gloo row of its own to stand beside);
NAME-insecure is the same algorithm on a second group with COLLECTIVES_INSECURE=1 (no CURVE:
what authentication costs, `--insecure`); gloo and nccl are torch.distributed;
torch-collectives is this library through torch.distributed (the "collectives" backend,
called as Gloo is: the tensor forms all_gather_into_tensor, reduce_scatter_tensor,
all_to_all_single, with what staging and the executor cost); mpi is mpi4py over MPICH
(bench/harness/mpi_worker.py); `limit` is bench/floors/limit.py, `floor` and `copy` bench/floors/collective.py. A
backend that cannot run here raises Skip with the reason, which the report prints instead of
a row.
"""

from __future__ import annotations

import datetime
import os
import warnings

from ..floors.limit import SEGMENTS
from .spec import Layout

LIBRARY = ("ring", "tree", "auto", "direct", "naive", "halving_doubling", "double_tree")
INSECURE = tuple(f"{n}-insecure" for n in LIBRARY)
TORCH = ("gloo", "nccl", "torch-collectives")
# Run in processes of their own, not by the workers: mpi is mpi4py over MPICH under mpiexec
# (bench/harness/mpi_worker.py, launched by the runner before and after the workers).
EXTERNAL = ("mpi",)
KNOWN = LIBRARY + INSECURE + TORCH + EXTERNAL


class Skip(Exception):
    """This backend cannot run in this configuration; str(exc) says why."""


def cuda_gpus() -> tuple[int, str]:
    """(number of CUDA GPUs usable by NCCL, reason if fewer than 2)."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return 0, "torch is not installed"
    if not dist.is_nccl_available():
        return 0, f"this torch build ({torch.__version__}) has no NCCL"
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < 2:
        return n, f"NCCL needs 2 or more CUDA GPUs; {n} visible"
    return n, ""


# --- this library --------------------------------------------------------------------------------
class Library:
    """collectives' ProcessGroup with algorithm=<name>; the group is built once per process
    (twice with --insecure: a second group without authentication for the NAME-insecure
    backends, on a coordinator of its own)."""

    _pgs: dict = {}  # "secure" / "insecure" -> ProcessGroup

    def __init__(self, name, spec):
        self.name, self.spec = name, spec
        self.insecure = name.endswith("-insecure")
        self.algorithm = name[: -len("-insecure")] if self.insecure else name

    def setup(self, ctx):
        kind = "insecure" if self.insecure else "secure"
        if kind not in Library._pgs:
            import collectives as cl

            if not hasattr(cl, "init_process_group"):
                raise Skip(
                    "collectives.init_process_group is not available yet "
                    "(the ZeroMQ transport has not landed)"
                )
            # the runner hosts the coordinators (rank 0 finds the port taken and hosts none)
            if self.insecure:
                os.environ["COLLECTIVES_INSECURE"] = "1"
            try:
                Library._pgs[kind] = cl.init_process_group(
                    rank=ctx.rank,
                    world_size=ctx.size,
                    master_addr="127.0.0.1",
                    master_port=ctx.ports[
                        "collectives_insecure" if self.insecure else "collectives"
                    ],
                    timeout=self.spec.timeout,
                    transport=self.spec.transport,
                )
            finally:
                os.environ.pop("COLLECTIVES_INSECURE", None)
        import collectives as cl

        self.pg = Library._pgs[kind]
        self.op = cl.ReduceOp[self.spec.op.upper()]

    def bind(self, lay: Layout):
        pg, a, op, buf = self.pg, self.algorithm, self.op, lay.buf
        c = self.spec.collective
        if c == "all_reduce":
            return lambda: pg.all_reduce(buf, op=op, algorithm=a)
        if c == "broadcast":
            return lambda: pg.broadcast(buf, src=0, algorithm=a)
        if c == "reduce":
            return lambda: pg.reduce(buf, dst=0, op=op, algorithm=a)
        if c == "all_gather":
            out = lay.out.reshape(lay.n, -1)
            return lambda: pg.all_gather(out, buf, algorithm=a)
        if c == "all_to_all":
            out, inp = lay.out.reshape(lay.n, -1), buf.reshape(lay.n, -1)
            return lambda: pg.all_to_all(out, inp, algorithm=a)
        out = lay.out
        return lambda: pg.reduce_scatter(out, buf, op=op, algorithm=a)

    def sync(self):
        pass

    def load(self, lay):
        pass

    def result(self, lay):
        return lay.result()

    def close(self):
        pg = Library._pgs.pop("insecure" if self.insecure else "secure", None)
        if pg is not None:
            pg.destroy()


# --- torch.distributed ---------------------------------------------------------------------------
class Torch:
    """torch.distributed gloo or torch-collectives (CPU tensors sharing the numpy buffers: no
    copies) or nccl (CUDA tensors of the same values; inputs copied in and results out outside
    the timed loop)."""

    def __init__(self, name, spec):
        self.name, self.spec = name, spec

    def setup(self, ctx):
        warnings.filterwarnings("ignore", category=FutureWarning)  # all_gather_into_tensor
        try:
            import torch
            import torch.distributed as dist
        except ImportError:
            raise Skip("torch is not installed") from None
        self.torch, self.dist = torch, dist
        if self.name == "nccl":
            n, why = cuda_gpus()
            if why:
                raise Skip(why)
            self.device = torch.device("cuda", ctx.rank % n)
            torch.cuda.set_device(self.device)
        if not dist.is_initialized():
            if ctx.ports["gloo"] is None:
                raise Skip("no TCPStore: torch could not be imported by the runner")
            # a client of the store the runner hosts
            store = dist.TCPStore(
                "127.0.0.1",
                ctx.ports["gloo"],
                ctx.size,
                False,
                timeout=datetime.timedelta(seconds=self.spec.timeout),
            )
            dist.init_process_group(
                "gloo",
                store=store,
                rank=ctx.rank,
                world_size=ctx.size,
                timeout=datetime.timedelta(seconds=self.spec.timeout),
            )
        self.group = None
        if self.name == "nccl":
            self.group = dist.new_group(backend="nccl")
        elif self.name == "torch-collectives":
            os.environ["COLLECTIVES_TRANSPORT"] = self.spec.transport
            import collectives.torch  # noqa: F401  (registers the backend)

            self.group = dist.new_group(
                backend="collectives", timeout=datetime.timedelta(seconds=self.spec.timeout)
            )
        self.op = getattr(dist.ReduceOp, self.spec.op.upper())
        self.tensors = {}

    def _t(self, arr):
        t = self.torch.from_numpy(arr)
        return t.to(self.device) if self.name == "nccl" else t

    def bind(self, lay: Layout):
        dist, op, g, c = self.dist, self.op, self.group, self.spec.collective
        buf = self._t(lay.buf)
        out = self._t(lay.out) if lay.out is not None else None
        self.tensors = {"buf": buf, "out": out}
        if c == "all_reduce":
            return lambda: dist.all_reduce(buf, op=op, group=g)
        if c == "broadcast":
            return lambda: dist.broadcast(buf, src=0, group=g)
        if c == "reduce":
            return lambda: dist.reduce(buf, dst=0, op=op, group=g)
        if c == "all_gather":
            fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            return lambda: fn(out, buf, group=g)
        if c == "all_to_all":
            return lambda: dist.all_to_all_single(out, buf, group=g)
        fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: fn(out, buf, op=op, group=g)

    def sync(self):
        if self.name == "nccl":
            self.torch.cuda.synchronize(self.device)

    def load(self, lay):
        if self.name == "nccl":
            self.tensors["buf"].copy_(self.torch.from_numpy(lay.buf))
            if self.tensors["out"] is not None:
                self.tensors["out"].zero_()

    def result(self, lay):
        if self.name != "nccl":
            return lay.result()
        t = self.tensors["out"] if self.tensors["out"] is not None else self.tensors["buf"]
        return t.cpu().numpy()

    def close(self):
        if self.dist.is_initialized():
            self.dist.destroy_process_group()


# --- the loopback limit --------------------------------------------------------------------------
class Limit:
    """Raw pyzmq ring exchange moving busbw_factor x size bytes per rank (see limit.py), with
    one segment size; the runner keeps the best segment size at each size as `limit`."""

    def __init__(self, spec, ring, factor, segment):
        self.spec, self.ring, self.factor, self.segment = spec, ring, factor, segment
        self.name = f"limit/{segment}"

    def applies(self, lay: Layout) -> bool:
        """Larger segments only matter once there is more than one smaller segment to send."""
        smaller = [s for s in SEGMENTS if s < self.segment]
        return not smaller or self.factor * lay.nbytes > max(smaller)

    def setup(self, ctx):
        pass

    def bind(self, lay: Layout):
        nbytes, segment, ring = round(self.factor * lay.nbytes), self.segment, self.ring
        return lambda: ring.exchange(nbytes, segment)

    def sync(self):
        pass

    def load(self, lay):
        pass

    def result(self, lay):
        return None  # nothing is computed, nothing to check

    def close(self):
        pass


def make(name, spec):
    if name in LIBRARY or name in INSECURE:
        return Library(name, spec)
    if name in TORCH:
        return Torch(name, spec)
    raise ValueError(f"unknown backend {name!r}; choose from {', '.join(KNOWN)}")
