"""torch.distributed backend "collectives": this library as a (pure Python) c10d process group.

    import collectives.torch                      # registers the backend (or call register())
    torch.distributed.init_process_group("collectives", init_method="env://", timeout=...)

How torch 2.13 drives a Python backend (distributed_c10d._new_process_group_helper):
  * `Backend.register_backend(name, creator, devices=[...])` stores `creator`; for a group on
    this backend torch calls `creator(prefix_store, group_rank, group_size, timeout)` and, since
    what it returns is a subclass of `torch.distributed.ProcessGroup`, uses that object itself
    as the group (the "Python process group" path torch's own test_c10d_pypg.py exercises).
  * Python code (dist.all_reduce, dist.reduce, ...) calls our methods directly by name, e.g.
    `group.allreduce([t], opts)`; C++ callers (DDP's reducer, its parameter broadcast and shape
    check) reach the ones the pybind trampoline forwards: allreduce, allgather, broadcast,
    barrier, reduce_scatter, send, recv and a few coalesced ones.
  * Every method returns a `torch.distributed.Work` subclass whose wait() and get_future()
    torch calls; the future's value is the list of output tensors, as Gloo's is.
  * A per-call timeout in the options (barrier(timeout=...), ...) bounds that call; else the
    group's. A timeout's message keeps its detail and says " Timed out ", as Gloo's do
    (work.py), since that is what torch's own tests and users match.
  * dist.monitored_barrier refuses every backend but Gloo before it reaches us; the group's
    own monitored_barrier (group.monitored_barrier(timeout, wait_all_ranks)) works as Gloo's.

Rendezvous: through the c10d store torch hands us (rendezvous.py).

Threads: the group's operations run on the collectives group's own executor (group/work.py:
one thread, issue order, every rank numbers them the same way), each one blocking and bounded
by the group's timeout (the init_process_group timeout: torch has no watchdog for Python
backends, the deadline is ours). What torch gets back is a TorchWork (work.py) whose future
completes when the op does. After an op times out or a peer fails, the group is broken, as
after an NCCL watchdog timeout: later ops fail at once instead of one timeout each.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from ..common import config
from ..common.errors import CollectiveError, CollectiveTimeout, PeerFailure
from ..group.group import ProcessGroup as _ClProcessGroup
from .exchanges import ExchangeOps
from .helpers import Reduction, _as_list, _check_parts, _into, _sparse_all_reduce, _timeout
from .rendezvous import connect
from .work import TorchWork

BACKEND_NAME = "collectives"


# --- the process group -------------------------------------------------------------------------
class CollectivesProcessGroup(ExchangeOps, dist.ProcessGroup):
    """torch.distributed.ProcessGroup over a collectives.ProcessGroup (ZeroMQ transport)."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta | float):
        super().__init__(rank, size)
        self._timeout_s = (
            timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        )
        self._pg = connect(store, rank, size, self._timeout_s)
        self._broken: CollectiveError | None = None  # the error that broke the group
        self._closed = False
        self._group_name = self._group_desc = ""
        self._devices = _device_types()
        self._gloo_order = config.gloo_order()

    # --- identity ---------------------------------------------------------------------------
    def getBackendName(self) -> str:
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    # torch's C++ ProcessGroup keeps its name in its backends, and a Python group has none:
    # keep name and description here (abort and destroy of a subgroup look them up).
    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        return self._group_name

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = desc

    @property
    def group_desc(self) -> str:
        return self._group_desc

    # --- devices ----------------------------------------------------------------------------
    # torch registers a C++ backend per device type on a ProcessGroup (_register_backend), and
    # _device_types, _get_pg_default_device(), _get_object_coll_device() and DCP's async_save
    # read that table. A backend written in Python cannot go in it (torch's C++ Backend has
    # no constructor bound to Python), and torch uses a Python group as it is, with an empty
    # table. So the group answers those lookups itself, with the device types torch would
    # have registered for "collectives": those of register()'s devices (cpu, and cuda staged
    # through the host), from torch's own BackendConfig, as Gloo's group on this machine
    # reports cpu and cuda.
    @property
    def _device_types(self) -> list[torch.device]:
        return list(self._devices)

    def _get_backend(self, device: Any) -> CollectivesProcessGroup:
        """The backend serving `device`: this group itself, for each of its device types;
        RuntimeError for another, with torch's message."""
        dev = torch.device(device)
        if torch.device(dev.type) not in self._devices:
            raise RuntimeError(f"No backend type associated with device type {dev.type}")
        return self

    # What torch asks of a backend (_get_backend's result) besides the collectives.
    supports_splitting = False
    supports_coalescing = False
    supports_shrinking = False
    supports_time_estimate = False

    def supports_tensor_alloc(self, device: Any) -> bool:
        return False

    @property
    def collectives_group(self) -> _ClProcessGroup:
        """The underlying collectives.ProcessGroup (for channel wrappers, tracing, tests)."""
        return self._pg

    def __repr__(self) -> str:
        return f"<CollectivesProcessGroup rank={self.rank()} size={self.size()}>"

    # --- plumbing ---------------------------------------------------------------------------
    def _run(self, name: str, fn: Callable[[], Any]) -> TorchWork:
        """Queue fn (which returns the op's output tensors) on the group's executor."""
        self._check_open(name)
        value: list[Any] = []

        def op() -> None:
            if self._broken is not None:
                b = self._broken
                raise CollectiveError(
                    f"{name}: not run, the group is broken since an earlier operation failed: {b}",
                    op=name,
                    rank=b.rank,
                    peer=b.peer,
                    generation=b.generation,
                )
            try:
                value.append(fn())
            except (CollectiveTimeout, PeerFailure) as exc:
                # A peer is dead or stuck: as after an NCCL watchdog timeout, the group is
                # unusable; what is queued now fails at once rather than one timeout each.
                self._broken = exc
                raise

        return TorchWork(self._pg.enqueue(name, op), lambda: value[0])

    def _check_open(self, name: str) -> None:
        if self._closed:
            raise CollectiveError(
                f"{name}: the collectives process group was shut down", op=name, rank=self.rank()
            )

    def _algorithm(self, t: torch.Tensor) -> str:
        """all_reduce's schedule for `t`: Gloo's ring (algorithms/gloo_ring.py: Gloo's
        summation order) for a floating tensor when COLLECTIVES_GLOO_ORDER=1, so that results
        equal Gloo's bit for bit (docs/torch_backend.md); else "auto", the fastest, whose
        order may differ from Gloo's (in the last bits only) from 3 ranks up."""
        return "gloo_ring" if self._gloo_order and t.dtype.is_floating_point else "auto"

    def _reduction(self, opts: Any, t: torch.Tensor, name: str) -> Reduction:
        """How `opts`' reduce op runs on `t` (helpers.Reduction), checked before any byte
        moves."""
        return Reduction(
            opts if opts is not None else dist.ReduceOp.SUM, t.dtype, self.size(), name
        )

    @staticmethod
    def _one(tensors: list[torch.Tensor], name: str) -> torch.Tensor:
        if len(tensors) != 1:
            raise ValueError(
                f"{name}: the collectives backend takes exactly one tensor per "
                f"call, got {len(tensors)}"
            )
        return tensors[0]

    # --- collectives ------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> TorchWork:
        tensors = _as_list(tensors)
        plans = [self._reduction(opts, t, "all_reduce") for t in tensors]
        pg, timeout = self._pg, _timeout(opts)

        def run() -> Any:
            for t, plan in zip(tensors, plans):
                if t.is_sparse:
                    _sparse_all_reduce(pg, t, plan.op, timeout)
                    continue
                if plan.scale is not None:
                    with torch.no_grad():
                        t.copy_(plan.prepare(t))  # all_reduce's input is its output
                pg.all_reduce(t, op=plan.op, timeout=timeout, algorithm=self._algorithm(t))
                plan.finish(t)
            return tensors

        return self._run("all_reduce", run)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> TorchWork:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> TorchWork:
        tensors = _as_list(tensors)
        root = opts.rootRank if opts is not None else 0
        pg, timeout = self._pg, _timeout(opts)

        def run() -> Any:
            for t in tensors:
                pg.broadcast(t, src=root, timeout=timeout)
            return tensors

        return self._run("broadcast", run)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> TorchWork:
        tensors = _as_list(tensors)
        root = opts.rootRank if opts is not None else 0
        plans = [self._reduction(opts, t, "reduce") for t in tensors]
        pg, timeout = self._pg, _timeout(opts)

        def run() -> Any:
            for t, plan in zip(tensors, plans):
                buf = plan.prepare(t)  # PREMUL_SUM: a scaled copy
                pg.reduce(buf, dst=root, op=plan.op, timeout=timeout)
                if self.rank() == root:
                    plan.finish(buf)
                    if buf is not t:
                        with torch.no_grad():
                            t.copy_(buf)
            return tensors

        return self._run("reduce", run)

    def allgather(
        self,
        output_tensors: list[list[torch.Tensor]],
        input_tensors: list[torch.Tensor],
        opts: Any = None,
    ) -> TorchWork:
        n, pg = self.size(), self._pg
        for outs, inp in zip(output_tensors, input_tensors):
            _check_parts(outs, inp, n, "all_gather")

        def run() -> Any:
            for outs, inp in zip(output_tensors, input_tensors):
                tmp = torch.empty((n, *inp.shape), dtype=inp.dtype)  # host staging
                pg.all_gather(tmp, inp.contiguous())
                for r in range(n):
                    outs[r].copy_(tmp[r])
            return output_tensors

        return self._run("all_gather", run)

    def allgather_coalesced(
        self,
        output_lists: list[list[torch.Tensor]],
        input_tensors: list[torch.Tensor],
        opts: Any = None,
    ) -> TorchWork:
        """output_lists[r][i] = rank r's input_tensors[i]: all of them in one all_gather of
        the inputs laid end to end."""
        n, pg, name = self.size(), self._pg, "all_gather_coalesced"
        inputs = list(input_tensors)
        if len(output_lists) != n:
            raise ValueError(
                f"{name}: expected world_size ({n}) output lists, got {len(output_lists)}"
            )
        for r, outs in enumerate(output_lists):
            if len(outs) != len(inputs):
                raise ValueError(
                    f"{name}: output list {r} has {len(outs)} tensors for {len(inputs)} inputs"
                )
            for i, (o, t) in enumerate(zip(outs, inputs)):
                if o.numel() != t.numel() or o.dtype != t.dtype:
                    raise ValueError(
                        f"{name}: output_lists[{r}][{i}] has {o.numel()} "
                        f"elements of {o.dtype}, input {i} has {t.numel()} of "
                        f"{t.dtype}"
                    )
        if len({t.dtype for t in inputs}) > 1:
            raise TypeError(
                f"{name}: the collectives backend needs one dtype for all "
                f"inputs, got {sorted({str(t.dtype) for t in inputs})}"
            )
        sizes = [t.numel() for t in inputs]

        def run() -> Any:
            dtype = inputs[0].dtype if inputs else torch.float32
            flat = (
                torch.cat([t.reshape(-1) for t in inputs])
                if inputs
                else torch.empty(0, dtype=dtype)
            )
            tmp = torch.empty((n, flat.numel()), dtype=dtype)
            pg.all_gather(tmp, flat, timeout=_timeout(opts))
            for r in range(n):
                for o, piece in zip(output_lists[r], tmp[r].split(sizes)):
                    o.copy_(piece.view(o.shape))
            return output_lists

        return self._run(name, run)

    def all_gather_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> TorchWork:
        n, pg = self.size(), self._pg
        if output.numel() != n * input.numel() or output.dtype != input.dtype:
            raise ValueError(
                f"all_gather_into_tensor: output must hold world_size ({n}) x "
                f"{input.numel()} elements of {input.dtype}, got "
                f"{output.numel()} of {output.dtype}"
            )

        def run() -> Any:
            if output.is_contiguous():
                pg.all_gather(output.view(n, -1), input.contiguous())
            else:
                tmp = torch.empty((n, input.numel()), dtype=input.dtype)
                pg.all_gather(tmp, input.contiguous())
                output.copy_(tmp.view(output.shape))
            return [output]

        return self._run("all_gather_into_tensor", run)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> TorchWork:
        n, pg = self.size(), self._pg

        def run() -> Any:
            for out, inp in zip(outputs, inputs):
                tmp = torch.empty((n, inp.numel()), dtype=inp.dtype)
                pg.all_gather(tmp, inp.contiguous())
                out.copy_(tmp.view(out.shape))
            return outputs

        return self._run("all_gather_into_tensor_coalesced", run)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(
        self,
        output_tensors: list[torch.Tensor],
        input_lists: list[list[torch.Tensor]],
        opts: Any = None,
    ) -> TorchWork:
        n, pg = self.size(), self._pg
        for out, ins in zip(output_tensors, input_lists):
            _check_parts(ins, out, n, "reduce_scatter")
        plans = [self._reduction(opts, out, "reduce_scatter") for out in output_tensors]

        def run() -> Any:
            for out, ins, plan in zip(output_tensors, input_lists, plans):
                buf = plan.prepare(torch.cat([x.reshape(-1) for x in ins]))
                _into(out, lambda o: pg.reduce_scatter(o, buf, op=plan.op))
                plan.finish(out)
            return output_tensors

        return self._run("reduce_scatter", run)

    def reduce_scatter_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> TorchWork:
        n, pg = self.size(), self._pg
        if input.numel() != n * output.numel() or output.dtype != input.dtype:
            raise ValueError(
                f"reduce_scatter_tensor: input must hold world_size ({n}) x "
                f"{output.numel()} elements of {output.dtype}, got "
                f"{input.numel()} of {input.dtype}"
            )
        plan = self._reduction(opts, output, "reduce_scatter_tensor")

        def run() -> Any:
            buf = plan.prepare(input.contiguous())
            _into(output, lambda o: pg.reduce_scatter(o, buf, op=plan.op))
            plan.finish(output)
            return [output]

        return self._run("reduce_scatter_tensor", run)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> TorchWork:
        pg = self._pg
        plans = [self._reduction(opts, out, "reduce_scatter_tensor_coalesced") for out in outputs]

        def run() -> Any:
            for out, inp, plan in zip(outputs, inputs, plans):
                buf = plan.prepare(inp.contiguous())
                _into(out, lambda o, buf=buf, plan=plan: pg.reduce_scatter(o, buf, op=plan.op))
                plan.finish(out)
            return outputs

        return self._run("reduce_scatter_tensor_coalesced", run)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def gather(
        self,
        output_lists: list[list[torch.Tensor]],
        input_tensors: list[torch.Tensor],
        opts: Any = None,
    ) -> TorchWork:
        root, n, pg, me = opts.rootRank, self.size(), self._pg, self.rank()
        inp = self._one(input_tensors, "gather")
        if me == root:
            _check_parts(self._one(output_lists, "gather"), inp, n, "gather")

        def run() -> Any:
            tmp: Any = torch.empty((n, *inp.shape), dtype=inp.dtype) if me == root else None
            pg.gather(tmp, inp.contiguous(), dst=root, timeout=_timeout(opts))
            if me == root:
                for r in range(n):
                    output_lists[0][r].copy_(tmp[r])
            return output_lists

        return self._run("gather", run)

    def scatter(
        self,
        output_tensors: list[torch.Tensor],
        input_lists: list[list[torch.Tensor]],
        opts: Any = None,
    ) -> TorchWork:
        root, n, pg, me = opts.rootRank, self.size(), self._pg, self.rank()
        out = self._one(output_tensors, "scatter")
        if me == root:
            _check_parts(self._one(input_lists, "scatter"), out, n, "scatter")

        def run() -> Any:
            buf = (
                torch.stack([x.reshape(out.shape) for x in input_lists[0]]) if me == root else None
            )
            _into(out, lambda o: pg.scatter(o, buf, src=root, timeout=_timeout(opts)))
            return output_tensors

        return self._run("scatter", run)

    # --- lifecycle --------------------------------------------------------------------------
    def abort(self) -> None:
        """Stop now: an operation in flight raises, queued ones fail, sockets close."""
        if self._closed:
            return
        self._closed = True
        self._pg.transport.interrupt(
            CollectiveError(
                f"rank {self.rank()}: the collectives process group was aborted",
                op="abort",
                rank=self.rank(),
            )
        )
        self._pg.destroy()

    def shutdown(self) -> None:
        """Finish queued operations (bounded by the timeout), then close sockets."""
        if self._closed:
            return
        self._closed = True
        self._pg.destroy()

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout_s = timeout.total_seconds()
        self._pg.timeout = self._timeout_s


# --- registration ------------------------------------------------------------------------------
def _create(
    store: dist.Store, rank: int, size: int, timeout: timedelta | float
) -> CollectivesProcessGroup:
    return CollectivesProcessGroup(store, rank, size, timeout)


def _device_types() -> tuple[torch.device, ...]:
    """The device types torch would register a "collectives" backend for (cpu, cuda)."""
    config = dist.distributed_c10d.BackendConfig(dist.Backend(BACKEND_NAME))
    return tuple(torch.device(d) for d in config.get_device_backend_map())


def register() -> None:
    """Make "collectives" a torch.distributed backend (idempotent).

    devices includes "cuda": CUDA tensors are staged through host memory (buffers.py), so this
    can serve as the fallback group on a GPU machine without NCCL.
    """
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])
