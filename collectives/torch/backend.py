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

Rendezvous: through the c10d store torch hands us (rendezvous.py).

Threads: the group's operations run on the collectives group's own executor (core/work.py:
one thread, issue order, every rank numbers them the same way), each one blocking and bounded
by the group's timeout (the init_process_group timeout: torch has no watchdog for Python
backends, the deadline is ours). What torch gets back is a TorchWork (work.py) whose future
completes when the op does. After an op times out or a peer fails, the group is broken, as
after an NCCL watchdog timeout: later ops fail at once instead of one timeout each.
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from ..core.errors import CollectiveError, CollectiveTimeout, PeerFailure
from ..core.group import ProcessGroup as _ClProcessGroup
from ..core.ops import ReduceOp
from ..core.work import Work
from .rendezvous import connect
from .work import TorchWork

BACKEND_NAME = "collectives"


# --- reduce ops ------------------------------------------------------------------------------
def _torch_op(opts) -> ReduceOp:
    """The library's ReduceOp for a torch ReduceOp (or an options object carrying one)."""
    op = getattr(opts, "reduceOp", opts)
    for name in ("SUM", "AVG", "PRODUCT", "MIN", "MAX"):
        if op == getattr(dist.ReduceOp, name):
            return ReduceOp[name]
    raise ValueError(f"the collectives backend does not support reduce op {op!r} "
                     "(supported: SUM, AVG, PRODUCT, MIN, MAX)")


# --- the process group -------------------------------------------------------------------------
class CollectivesProcessGroup(dist.ProcessGroup):
    """torch.distributed.ProcessGroup over a collectives.ProcessGroup (ZeroMQ transport)."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta | float):
        super().__init__(rank, size)
        self._timeout_s = (timeout.total_seconds() if isinstance(timeout, timedelta)
                           else float(timeout))
        self._pg = connect(store, rank, size, self._timeout_s)
        self._broken: BaseException | None = None   # the error that broke the group
        self._closed = False
        self._group_name = self._group_desc = ""

    # --- identity ---------------------------------------------------------------------------
    def getBackendName(self) -> str:
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    # torch's C++ ProcessGroup keeps its name in its backends, and a Python group has none:
    # keep name and description here (abort and destroy of a subgroup look them up).
    def _set_group_name(self, name: str):
        self._group_name = name

    @property
    def group_name(self) -> str:
        return self._group_name

    def _set_group_desc(self, desc: str):
        self._group_desc = desc

    @property
    def group_desc(self) -> str:
        return self._group_desc

    @property
    def collectives_group(self) -> _ClProcessGroup:
        """The underlying collectives.ProcessGroup (for channel wrappers, tracing, tests)."""
        return self._pg

    def __repr__(self):
        return f"<CollectivesProcessGroup rank={self.rank()} size={self.size()}>"

    # --- plumbing ---------------------------------------------------------------------------
    def _run(self, name: str, fn) -> TorchWork:
        """Queue fn (which returns the op's output tensors) on the group's executor."""
        self._check_open(name)
        value = []

        def op():
            if self._broken is not None:
                b = self._broken
                raise CollectiveError(f"{name}: not run, the group is broken since an "
                                      f"earlier operation failed: {b}", op=name, rank=b.rank,
                                      peer=b.peer, generation=b.generation)
            try:
                value.append(fn())
            except (CollectiveTimeout, PeerFailure) as exc:
                # A peer is dead or stuck: as after an NCCL watchdog timeout, the group is
                # unusable; what is queued now fails at once rather than one timeout each.
                self._broken = exc
                raise
        return TorchWork(self._pg.enqueue(name, op), lambda: value[0])

    def _check_open(self, name):
        if self._closed:
            raise CollectiveError(f"{name}: the collectives process group was shut down",
                                  op=name, rank=self.rank())

    @staticmethod
    def _one(tensors, name):
        if len(tensors) != 1:
            raise ValueError(f"{name}: the collectives backend takes exactly one tensor per "
                             f"call, got {len(tensors)}")
        return tensors[0]

    # --- collectives ------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        tensors = _as_list(tensors)
        op = _torch_op(opts if opts is not None else dist.ReduceOp.SUM)
        pg = self._pg

        def run():
            for t in tensors:
                pg.all_reduce(t, op=op)
            return tensors
        return self._run("all_reduce", run)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        tensors = _as_list(tensors)
        root = opts.rootRank if opts is not None else 0
        pg = self._pg

        def run():
            for t in tensors:
                pg.broadcast(t, src=root)
            return tensors
        return self._run("broadcast", run)

    def reduce(self, tensors, opts=None):
        tensors = _as_list(tensors)
        root = opts.rootRank if opts is not None else 0
        op = _torch_op(opts if opts is not None else dist.ReduceOp.SUM)
        pg = self._pg

        def run():
            for t in tensors:
                pg.reduce(t, dst=root, op=op)
            return tensors
        return self._run("reduce", run)

    def allgather(self, output_tensors, input_tensors, opts=None):
        n, pg = self.size(), self._pg
        for outs, inp in zip(output_tensors, input_tensors):
            _check_parts(outs, inp, n, "all_gather")

        def run():
            for outs, inp in zip(output_tensors, input_tensors):
                tmp = torch.empty((n, *inp.shape), dtype=inp.dtype)   # host staging
                pg.all_gather(tmp, inp.contiguous())
                for r in range(n):
                    outs[r].copy_(tmp[r])
            return output_tensors
        return self._run("all_gather", run)

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        return self.allgather(output_lists, input_tensors, opts)

    def all_gather_single(self, output, input, opts=None):
        n, pg = self.size(), self._pg
        if output.numel() != n * input.numel() or output.dtype != input.dtype:
            raise ValueError(f"all_gather_into_tensor: output must hold world_size ({n}) x "
                             f"{input.numel()} elements of {input.dtype}, got "
                             f"{output.numel()} of {output.dtype}")

        def run():
            if output.is_contiguous():
                pg.all_gather(output.view(n, -1), input.contiguous())
            else:
                tmp = torch.empty((n, input.numel()), dtype=input.dtype)
                pg.all_gather(tmp, input.contiguous())
                output.copy_(tmp.view(output.shape))
            return [output]
        return self._run("all_gather_into_tensor", run)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        n, pg = self.size(), self._pg

        def run():
            for out, inp in zip(outputs, inputs):
                tmp = torch.empty((n, inp.numel()), dtype=inp.dtype)
                pg.all_gather(tmp, inp.contiguous())
                out.copy_(tmp.view(out.shape))
            return outputs
        return self._run("all_gather_into_tensor_coalesced", run)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        op = _torch_op(opts if opts is not None else dist.ReduceOp.SUM)
        n, pg = self.size(), self._pg
        for out, ins in zip(output_tensors, input_lists):
            _check_parts(ins, out, n, "reduce_scatter")

        def run():
            for out, ins in zip(output_tensors, input_lists):
                buf = torch.cat([x.reshape(-1) for x in ins])
                _into(out, lambda o: pg.reduce_scatter(o, buf, op=op))
            return output_tensors
        return self._run("reduce_scatter", run)

    def reduce_scatter_single(self, output, input, opts=None):
        op = _torch_op(opts if opts is not None else dist.ReduceOp.SUM)
        n, pg = self.size(), self._pg
        if input.numel() != n * output.numel() or output.dtype != input.dtype:
            raise ValueError(f"reduce_scatter_tensor: input must hold world_size ({n}) x "
                             f"{output.numel()} elements of {output.dtype}, got "
                             f"{input.numel()} of {input.dtype}")

        def run():
            _into(output, lambda o: pg.reduce_scatter(o, input.contiguous(), op=op))
            return [output]
        return self._run("reduce_scatter_tensor", run)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        op = _torch_op(opts if opts is not None else dist.ReduceOp.SUM)
        pg = self._pg

        def run():
            for out, inp in zip(outputs, inputs):
                _into(out, lambda o, inp=inp: pg.reduce_scatter(o, inp.contiguous(), op=op))
            return outputs
        return self._run("reduce_scatter_tensor_coalesced", run)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def gather(self, output_lists, input_tensors, opts=None):
        # Through all_gather (every rank receives everything): simple and correct; gather is
        # rare in training code. Non-roots pass empty output lists.
        root, n, pg, me = opts.rootRank, self.size(), self._pg, self.rank()
        inp = self._one(input_tensors, "gather")
        if me == root:
            _check_parts(self._one(output_lists, "gather"), inp, n, "gather")

        def run():
            tmp = torch.empty((n, *inp.shape), dtype=inp.dtype)
            pg.all_gather(tmp, inp.contiguous())
            if me == root:
                for r in range(n):
                    output_lists[0][r].copy_(tmp[r])
            return output_lists
        return self._run("gather", run)

    def scatter(self, output_tensors, input_lists, opts=None):
        # The root broadcasts the concatenation; each rank keeps its own slice.
        root, n, pg, me = opts.rootRank, self.size(), self._pg, self.rank()
        out = self._one(output_tensors, "scatter")
        if me == root:
            _check_parts(self._one(input_lists, "scatter"), out, n, "scatter")

        def run():
            if me == root:
                buf = torch.cat([x.reshape(-1) for x in input_lists[0]])
            else:
                buf = torch.empty(n * out.numel(), dtype=out.dtype)
            pg.broadcast(buf, src=root)
            k = out.numel()
            out.copy_(buf[me * k:(me + 1) * k].view(out.shape))
            return output_tensors
        return self._run("scatter", run)

    def barrier(self, opts=None):
        pg = self._pg
        return self._run("barrier", lambda: (pg.barrier(), [])[1])

    # --- point to point -----------------------------------------------------------------------
    # A send returns once the transport has the message (as Gloo's). A receive is posted when
    # issued -- its place among the messages from src_rank is fixed then -- but it takes the
    # group's (one-at-a-time) executor only when its Work is waited on or polled. So
    # `req = irecv(t, peer); send(x, peer); req.wait()` on both ranks works, as over Gloo.
    def send(self, tensors, dst_rank: int, tag: int = 0):
        t, pg = self._one(tensors, "send"), self._pg
        return self._run("send", lambda: (pg.send(t, dst_rank, tag=tag), tensors)[1])

    def recv(self, tensors, src_rank: int, tag: int = 0):
        t, pg = self._one(tensors, "recv"), self._pg
        self._check_open("recv")
        if self._broken is not None:
            return TorchWork(Work.failed("recv", CollectiveError(
                f"recv: not run, the group is broken since an earlier operation failed: "
                f"{self._broken}", op="recv", rank=self.rank())), lambda: tensors)
        # posted now (its place among src_rank's messages is fixed), run when waited on
        return TorchWork(pg.recv(t, src_rank, tag=tag, async_op=True), lambda: tensors)

    def recv_anysource(self, tensors, tag: int = 0):
        raise NotImplementedError("the collectives backend has no recv from any source: "
                                  "pass src=")

    # --- lifecycle --------------------------------------------------------------------------
    def abort(self):
        """Stop now: an operation in flight raises, queued ones fail, sockets close."""
        if self._closed:
            return
        self._closed = True
        self._pg.transport.interrupt(CollectiveError(
            f"rank {self.rank()}: the collectives process group was aborted", op="abort",
            rank=self.rank()))
        self._pg.destroy()

    def shutdown(self):
        """Finish queued operations (bounded by the timeout), then close sockets."""
        if self._closed:
            return
        self._closed = True
        self._pg.destroy()

    def set_timeout(self, timeout: timedelta):
        self._timeout_s = timeout.total_seconds()
        self._pg.timeout = self._timeout_s


def _as_list(tensors):
    """torch's own groups accept pg.allreduce(tensor) as well as pg.allreduce([tensor])."""
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def _check_parts(parts, whole, n, name):
    if len(parts) != n:
        raise ValueError(f"{name}: expected a list of world_size ({n}) tensors, got {len(parts)}")
    for r, p in enumerate(parts):
        if p.numel() != whole.numel() or p.dtype != whole.dtype:
            raise ValueError(f"{name}: tensor {r} has {p.numel()} elements of {p.dtype}; the "
                             f"collectives backend needs equal sizes ({whole.numel()} of "
                             f"{whole.dtype})")


def _into(out, fn):
    """Run fn(o) with o a contiguous tensor, then make sure the result is in `out`."""
    if out.is_contiguous():
        fn(out)
    else:
        tmp = out.contiguous()
        fn(tmp)
        out.copy_(tmp)


# --- registration ------------------------------------------------------------------------------
def _create(store, rank, size, timeout):
    return CollectivesProcessGroup(store, rank, size, timeout)


def register() -> None:
    """Make "collectives" a torch.distributed backend (idempotent).

    devices includes "cuda": CUDA tensors are staged through host memory (buffers.py), so this
    can serve as the fallback group on a GPU machine without NCCL.
    """
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])
