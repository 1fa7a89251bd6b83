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
from typing import Any

import torch
import torch.distributed as dist

from ..group.group import ProcessGroup as _ClProcessGroup
from . import elastic
from .core import BackendCore, one
from .exchanges import ExchangeOps
from .helpers import _as_list, _check_parts, _into, _sparse_all_reduce, _timeout
from .work import TorchWork

BACKEND_NAME = "collectives"


# --- the process group -------------------------------------------------------------------------
class CollectivesProcessGroup(dist.ProcessGroup):
    """torch.distributed.ProcessGroup over a collectives.ProcessGroup (ZeroMQ transport).

    Its state and the way its operations run live in its core (core.py: the collectives
    group, the timeout, broken or shut down); the all_to_all forms, barriers and point to
    point in the ExchangeOps it holds (exchanges.py). Both are held by reference."""

    def __init__(
        self,
        store: dist.Store | None,
        rank: int,
        size: int,
        timeout: timedelta | float,
        *,
        group: _ClProcessGroup | None = None,
        elastic_store: dist.Store | None = None,
    ):
        """torch's call connects a new group (elastic.connect); `group` wraps one that a
        shrink or a joiner's admission formed, `elastic_store` where survivors agree."""
        super().__init__(rank, size)
        timeout_s = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        if group is None:
            group, elastic_store = elastic.connect(store, rank, size, timeout_s)
        self._core = BackendCore(group, rank, size, timeout_s, elastic_store)
        self._pg = self._core.pg  # the collectives group, which every method calls
        self._exchanges = ExchangeOps(self._core)
        self._group_name = self._group_desc = ""
        self._devices = _device_types()

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
    supports_shrinking = True  # dist.shrink_group: the elastic default group (elastic.py)
    supports_time_estimate = False

    def supports_tensor_alloc(self, device: Any) -> bool:
        return False

    @property
    def collectives_group(self) -> _ClProcessGroup:
        """The underlying collectives.ProcessGroup (for channel wrappers, tracing, tests)."""
        return self._pg

    def __repr__(self) -> str:
        return f"<CollectivesProcessGroup rank={self.rank()} size={self.size()}>"

    # --- collectives ------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> TorchWork:
        tensors = _as_list(tensors)
        plans = [self._core.reduction(opts, t, "all_reduce") for t in tensors]
        pg, timeout = self._pg, _timeout(opts)

        def run() -> Any:
            for t, plan in zip(tensors, plans):
                if t.is_sparse:
                    _sparse_all_reduce(pg, t, plan.op, timeout)
                    continue
                if plan.scale is not None:
                    with torch.no_grad():
                        t.copy_(plan.prepare(t))  # all_reduce's input is its output
                pg.all_reduce(t, op=plan.op, timeout=timeout, algorithm=self._core.algorithm(t))
                plan.finish(t)
            return tensors

        return self._core.run("all_reduce", run)

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

        return self._core.run("broadcast", run)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> TorchWork:
        tensors = _as_list(tensors)
        root = opts.rootRank if opts is not None else 0
        plans = [self._core.reduction(opts, t, "reduce") for t in tensors]
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

        return self._core.run("reduce", run)

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

        return self._core.run("all_gather", run)

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

        return self._core.run(name, run)

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

        return self._core.run("all_gather_into_tensor", run)

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

        return self._core.run("all_gather_into_tensor_coalesced", run)

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
        plans = [self._core.reduction(opts, out, "reduce_scatter") for out in output_tensors]

        def run() -> Any:
            for out, ins, plan in zip(output_tensors, input_lists, plans):
                buf = plan.prepare(torch.cat([x.reshape(-1) for x in ins]))
                _into(out, lambda o: pg.reduce_scatter(o, buf, op=plan.op))
                plan.finish(out)
            return output_tensors

        return self._core.run("reduce_scatter", run)

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
        plan = self._core.reduction(opts, output, "reduce_scatter_tensor")

        def run() -> Any:
            buf = plan.prepare(input.contiguous())
            _into(output, lambda o: pg.reduce_scatter(o, buf, op=plan.op))
            plan.finish(output)
            return [output]

        return self._core.run("reduce_scatter_tensor", run)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> TorchWork:
        pg = self._pg
        plans = [
            self._core.reduction(opts, out, "reduce_scatter_tensor_coalesced") for out in outputs
        ]

        def run() -> Any:
            for out, inp, plan in zip(outputs, inputs, plans):
                buf = plan.prepare(inp.contiguous())
                _into(out, lambda o, buf=buf, plan=plan: pg.reduce_scatter(o, buf, op=plan.op))
                plan.finish(out)
            return outputs

        return self._core.run("reduce_scatter_tensor_coalesced", run)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def gather(
        self,
        output_lists: list[list[torch.Tensor]],
        input_tensors: list[torch.Tensor],
        opts: Any = None,
    ) -> TorchWork:
        root, n, pg, me = opts.rootRank, self.size(), self._pg, self.rank()
        inp = one(input_tensors, "gather")
        if me == root:
            _check_parts(one(output_lists, "gather"), inp, n, "gather")

        def run() -> Any:
            tmp: Any = torch.empty((n, *inp.shape), dtype=inp.dtype) if me == root else None
            pg.gather(tmp, inp.contiguous(), dst=root, timeout=_timeout(opts))
            if me == root:
                for r in range(n):
                    output_lists[0][r].copy_(tmp[r])
            return output_lists

        return self._core.run("gather", run)

    def scatter(
        self,
        output_tensors: list[torch.Tensor],
        input_lists: list[list[torch.Tensor]],
        opts: Any = None,
    ) -> TorchWork:
        root, n, pg, me = opts.rootRank, self.size(), self._pg, self.rank()
        out = one(output_tensors, "scatter")
        if me == root:
            _check_parts(one(input_lists, "scatter"), out, n, "scatter")

        def run() -> Any:
            buf = (
                torch.stack([x.reshape(out.shape) for x in input_lists[0]]) if me == root else None
            )
            _into(out, lambda o: pg.scatter(o, buf, src=root, timeout=_timeout(opts)))
            return output_tensors

        return self._core.run("scatter", run)

    # --- all_to_all, barriers, point to point (exchanges.py) --------------------------------
    def alltoall(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[torch.Tensor],
        opts: Any = None,
    ) -> TorchWork:
        """dist.all_to_all: input_tensors[p] goes to rank p, output_tensors[p] comes from
        rank p; sizes may differ per pair (the uneven form of pg.all_to_all)."""
        return self._exchanges.alltoall(output_tensors, input_tensors, opts)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int] | None,
        input_split_sizes: list[int] | None,
        opts: Any = None,
    ) -> TorchWork:
        """dist.all_to_all_single: rows (first dimension) of `input` go out in blocks of
        input_split_sizes rows (equal blocks when empty), rows of `output` come in blocks of
        output_split_sizes."""
        return self._exchanges.all_to_all_single(
            output, input, output_split_sizes, input_split_sizes, opts
        )

    alltoall_base = all_to_all_single

    def barrier(self, opts: Any = None) -> TorchWork:
        return self._exchanges.barrier(opts)

    def monitored_barrier(
        self, timeout: timedelta | float | None = None, wait_all_ranks: bool = False
    ) -> None:
        """Gloo's monitored barrier: every rank reports to rank 0, which waits for each in
        turn until `timeout` (default the group's) and then answers every rank. Rank 0 names
        the first rank that did not report in time ("Rank 2 failed to pass monitoredBarrier
        in 1000 ms"), or with wait_all_ranks every one ("Ranks 1, 2 failed ..."), or says
        that its own time ran out first ("Rank 0 timed out in monitoredBarrier"); the others
        raise too when rank 0's answer says the barrier failed, or does not come within
        `timeout` plus the group's timeout.
        Rank 0 takes one message from, and answers, every rank whatever happens, so that the
        point-to-point messages between each pair stay in step afterwards. Blocking."""
        self._exchanges.monitored_barrier(timeout, wait_all_ranks)

    def send(self, tensors: list[torch.Tensor], dst_rank: int, tag: int = 0) -> TorchWork:
        return self._exchanges.send(tensors, dst_rank, tag)

    def recv(self, tensors: list[torch.Tensor], src_rank: int, tag: int = 0) -> TorchWork:
        return self._exchanges.recv(tensors, src_rank, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> TorchWork:
        """recv without src: from whichever rank's message comes first; the Work's
        _source_rank() says which (as Gloo's)."""
        return self._exchanges.recv_anysource(tensors, tag)

    # --- lifecycle --------------------------------------------------------------------------
    def abort(self) -> None:
        """Stop now: an operation in flight raises, queued ones fail, sockets close."""
        self._core.abort()

    def shutdown(self) -> None:
        """Finish queued operations (bounded by the timeout), then close sockets."""
        self._core.shutdown()

    # --- shrink and grow (elastic.py, shrink.py) --------------------------------------------
    def shrink(
        self, ranks_to_exclude: list[int], shrink_flags: int = 0, opts: Any = None
    ) -> CollectivesProcessGroup:
        """dist.shrink_group's backend call, after torch's checks (elastic.py, shrink.py)."""
        return self.reshaped(tuple(sorted(ranks_to_exclude)), shrink_flags, "shrink_group")

    def reshaped(self, exclude: tuple[int, ...], flags: int, name: str) -> CollectivesProcessGroup:
        """The next group without `exclude`, with any joiner that waits; self if none formed."""
        new = self._core.next_group(exclude, flags, name)
        if new is None:
            return self
        timeout, store = self._core.timeout_s, self._core.elastic_store
        return CollectivesProcessGroup(
            None, new.rank, new.world_size, timeout, group=new, elastic_store=store
        )

    def set_timeout(self, timeout: timedelta) -> None:
        self._core.timeout_s = timeout.total_seconds()
        self._pg.timeout = self._core.timeout_s


# --- devices ---------------------------------------------------------------------------------
def _device_types() -> tuple[torch.device, ...]:
    """The device types torch would register a "collectives" backend for (cpu, cuda)."""
    config = dist.distributed_c10d.BackendConfig(dist.Backend(BACKEND_NAME))
    return tuple(torch.device(d) for d in config.get_device_backend_map())
