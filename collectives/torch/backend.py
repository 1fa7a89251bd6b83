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

Threads: the group's operations run on the collectives group's own executor (core/work.py:
one thread, issue order, every rank numbers them the same way), each one blocking and bounded
by the group's timeout (the init_process_group timeout: torch has no watchdog for Python
backends, the deadline is ours). What torch gets back is a TorchWork (work.py) whose future
completes when the op does. After an op times out or a peer fails, the group is broken, as
after an NCCL watchdog timeout: later ops fail at once instead of one timeout each.
"""
from __future__ import annotations

import logging
import math
import time
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
_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")


def _torch_op(opts) -> ReduceOp:
    """The library's ReduceOp for a torch ReduceOp (or an options object carrying one)."""
    op = getattr(opts, "reduceOp", opts)
    for name in _OPS:
        if op == getattr(dist.ReduceOp, name):
            return ReduceOp[name]
    raise ValueError(f"the collectives backend does not support reduce op {op!r} "
                     f"(supported: {', '.join(_OPS)})")


def _timeout(opts) -> float | None:
    """The per-call timeout in torch's options, in seconds, or None (the group's)."""
    t = getattr(opts, "timeout", None)
    if isinstance(t, timedelta) and t.total_seconds() > 0:
        return t.total_seconds()
    return None


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
        pg, timeout = self._pg, _timeout(opts)

        def run():
            for t in tensors:
                if t.is_sparse:
                    _sparse_all_reduce(pg, t, op, timeout)
                else:
                    pg.all_reduce(t, op=op, timeout=timeout)
            return tensors
        return self._run("all_reduce", run)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        tensors = _as_list(tensors)
        root = opts.rootRank if opts is not None else 0
        pg, timeout = self._pg, _timeout(opts)

        def run():
            for t in tensors:
                pg.broadcast(t, src=root, timeout=timeout)
            return tensors
        return self._run("broadcast", run)

    def reduce(self, tensors, opts=None):
        tensors = _as_list(tensors)
        root = opts.rootRank if opts is not None else 0
        op = _torch_op(opts if opts is not None else dist.ReduceOp.SUM)
        pg, timeout = self._pg, _timeout(opts)

        def run():
            for t in tensors:
                pg.reduce(t, dst=root, op=op, timeout=timeout)
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
        """output_lists[r][i] = rank r's input_tensors[i]: all of them in one all_gather of
        the inputs laid end to end."""
        n, pg, name = self.size(), self._pg, "all_gather_coalesced"
        inputs = list(input_tensors)
        if len(output_lists) != n:
            raise ValueError(f"{name}: expected world_size ({n}) output lists, got "
                             f"{len(output_lists)}")
        for r, outs in enumerate(output_lists):
            if len(outs) != len(inputs):
                raise ValueError(f"{name}: output list {r} has {len(outs)} tensors for "
                                 f"{len(inputs)} inputs")
            for i, (o, t) in enumerate(zip(outs, inputs)):
                if o.numel() != t.numel() or o.dtype != t.dtype:
                    raise ValueError(f"{name}: output_lists[{r}][{i}] has {o.numel()} "
                                     f"elements of {o.dtype}, input {i} has {t.numel()} of "
                                     f"{t.dtype}")
        if len({t.dtype for t in inputs}) > 1:
            raise TypeError(f"{name}: the collectives backend needs one dtype for all "
                            f"inputs, got {sorted({str(t.dtype) for t in inputs})}")
        sizes = [t.numel() for t in inputs]

        def run():
            dtype = inputs[0].dtype if inputs else torch.float32
            flat = torch.cat([t.reshape(-1) for t in inputs]) if inputs else \
                torch.empty(0, dtype=dtype)
            tmp = torch.empty((n, flat.numel()), dtype=dtype)
            pg.all_gather(tmp, flat, timeout=_timeout(opts))
            for r in range(n):
                for o, piece in zip(output_lists[r], tmp[r].split(sizes)):
                    o.copy_(piece.view(o.shape))
            return output_lists
        return self._run(name, run)

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
        root, n, pg, me = opts.rootRank, self.size(), self._pg, self.rank()
        inp = self._one(input_tensors, "gather")
        if me == root:
            _check_parts(self._one(output_lists, "gather"), inp, n, "gather")

        def run():
            tmp = torch.empty((n, *inp.shape), dtype=inp.dtype) if me == root else None
            pg.gather(tmp, inp.contiguous(), dst=root, timeout=_timeout(opts))
            if me == root:
                for r in range(n):
                    output_lists[0][r].copy_(tmp[r])
            return output_lists
        return self._run("gather", run)

    def scatter(self, output_tensors, input_lists, opts=None):
        root, n, pg, me = opts.rootRank, self.size(), self._pg, self.rank()
        out = self._one(output_tensors, "scatter")
        if me == root:
            _check_parts(self._one(input_lists, "scatter"), out, n, "scatter")

        def run():
            buf = torch.stack([x.reshape(out.shape) for x in input_lists[0]]) \
                if me == root else None
            _into(out, lambda o: pg.scatter(o, buf, src=root, timeout=_timeout(opts)))
            return output_tensors
        return self._run("scatter", run)

    # --- all_to_all ---------------------------------------------------------------------------
    def alltoall(self, output_tensors, input_tensors, opts=None):
        """dist.all_to_all: input_tensors[p] goes to rank p, output_tensors[p] comes from
        rank p; sizes may differ per pair (the uneven form of pg.all_to_all)."""
        n, pg, name = self.size(), self._pg, "all_to_all"
        outs, ins = list(output_tensors), list(input_tensors)
        if len(outs) != n or len(ins) != n:
            raise ValueError(f"{name}: expected world_size ({n}) output and input tensors, "
                             f"got {len(outs)} and {len(ins)}")
        dtypes = {t.dtype for t in outs + ins}
        if len(dtypes) != 1:
            raise TypeError(f"{name}: every tensor must have the same dtype, got "
                            f"{sorted(str(d) for d in dtypes)}")
        dtype = dtypes.pop()
        out_splits, in_splits = [t.numel() for t in outs], [t.numel() for t in ins]

        def run():
            buf = torch.cat([t.reshape(-1) for t in ins])
            flat = torch.empty(sum(out_splits), dtype=dtype)
            pg.all_to_all(flat, buf, out_splits=out_splits, in_splits=in_splits,
                          timeout=_timeout(opts))
            for o, piece in zip(outs, flat.split(out_splits)):
                o.copy_(piece.view(o.shape))
            return output_tensors
        return self._run(name, run)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes,
                          opts=None):
        """dist.all_to_all_single: rows (first dimension) of `input` go out in blocks of
        input_split_sizes rows (equal blocks when empty), rows of `output` come in blocks of
        output_split_sizes."""
        n, pg, name = self.size(), self._pg, "all_to_all_single"
        if output.dtype != input.dtype:
            raise TypeError(f"{name}: output has dtype {output.dtype}, input {input.dtype}")
        in_splits = _row_splits(input, input_split_sizes, n, "input", name)
        out_splits = _row_splits(output, output_split_sizes, n, "output", name)
        uneven = bool(list(input_split_sizes or ())) or bool(list(output_split_sizes or ()))
        if not uneven and output.numel() != input.numel():
            raise ValueError(f"{name}: output has {output.numel()} elements, input "
                             f"{input.numel()}; equal splits need the same")

        def run():
            src = input.contiguous()
            if uneven:
                _into(output, lambda o: pg.all_to_all(o, src, out_splits=out_splits,
                                                      in_splits=in_splits,
                                                      timeout=_timeout(opts)))
            else:
                _into(output, lambda o: pg.all_to_all(o.view(n, -1), src.view(n, -1),
                                                      timeout=_timeout(opts)))
            return [output]
        return self._run(name, run)

    alltoall_base = all_to_all_single

    def barrier(self, opts=None):
        pg, timeout = self._pg, _timeout(opts)
        return self._run("barrier", lambda: (pg.barrier(timeout=timeout), [])[1])

    def monitored_barrier(self, timeout=None, wait_all_ranks: bool = False):
        """Gloo's monitored barrier: every rank reports to rank 0, which waits for each in
        turn until `timeout` (default the group's) and then answers every rank. Rank 0 names
        the first rank that did not report in time ("Rank 2 failed to pass monitoredBarrier
        in 1000 ms"), or with wait_all_ranks every one ("Ranks 1, 2 failed ..."), or says
        that its own time ran out first ("Rank 0 timed out in monitoredBarrier"); the others
        raise too when rank 0's answer says the barrier failed, or does not come within
        `timeout` plus the group's timeout.
        Rank 0 takes one message from, and answers, every rank whatever happens, so that the
        point-to-point messages between each pair stay in step afterwards. Blocking."""
        secs = (timeout.total_seconds() if isinstance(timeout, timedelta)
                else self._timeout_s if timeout is None else float(timeout))
        pg, me, n, name = self._pg, self.rank(), self.size(), "monitored_barrier"
        ms = int(round(secs * 1000))
        wait = max(secs, 1e-3)

        def run():
            token = torch.zeros(1, dtype=torch.uint8)
            if me != 0:
                # Rank 0 may take the whole `timeout` before it answers: wait for its answer
                # that long plus the group's timeout (Gloo waits the group's).
                pg.send(token, 0, tag=_MONITORED_TAG, timeout=wait + self._timeout_s)
                try:
                    pg.recv(token, 0, tag=_MONITORED_TAG, timeout=wait + self._timeout_s)
                except CollectiveTimeout as exc:
                    raise CollectiveTimeout(
                        f"Rank {me} successfully reached monitoredBarrier, but received errors "
                        f"while waiting for send/recv from rank 0: it did not answer ({exc})",
                        op=name, rank=me, peer=0) from exc
                if token.item():
                    raise CollectiveError(
                        f"Rank {me} successfully reached monitoredBarrier, but received errors "
                        "while waiting for send/recv from rank 0: the monitored barrier failed "
                        "there (rank 0's error names the ranks that did not report)",
                        op=name, rank=me, peer=0)
                return []
            deadline = time.monotonic() + secs
            failed, exhausted = [], False
            for p in range(1, n):
                left = deadline - time.monotonic()
                exhausted = exhausted or (left <= 0 and not failed)
                try:
                    pg.recv(token, p, tag=_MONITORED_TAG, timeout=max(left, 1e-3))
                except CollectiveTimeout:
                    failed.append(p)
            token.fill_(1 if failed or exhausted else 0)
            for p in range(1, n):
                pg.send(token, p, tag=_MONITORED_TAG)
            if exhausted and not wait_all_ranks:
                raise CollectiveTimeout(f"Rank 0 timed out in monitoredBarrier after {ms} ms",
                                        op=name, rank=0, peer=failed[0] if failed else None)
            if failed:
                who = (f"Ranks {', '.join(map(str, failed))}" if wait_all_ranks
                       else f"Rank {failed[0]}")
                raise CollectiveTimeout(f"{who} failed to pass monitoredBarrier in {ms} ms",
                                        op=name, rank=0, peer=failed[0])
            return []
        # Not through _run: a rank that fails a monitored barrier is reported; the group is
        # not broken by it (as with Gloo).
        self._check_open(name)
        value = []
        work = self._pg.enqueue(name, lambda: value.append(run()))
        TorchWork(work, lambda: value[0]).wait()

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
        """recv without src: from whichever rank's message comes first; the Work's
        _source_rank() says which (as Gloo's)."""
        t, pg, src = self._one(tensors, "recv"), self._pg, []
        work = self._run("recv", lambda: (src.append(pg.recv_any(t, tag=tag)), tensors)[1])
        work.source = lambda: src[0] if src else -1
        return work

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


_MONITORED_TAG = -7331   # send/recv tag of monitored_barrier's messages (users' tags are >= 0)


def _row_splits(t, split_sizes, n, what, name):
    """Element counts per rank for `t` cut along its first dimension: split_sizes rows each,
    or world_size equal blocks when split_sizes is empty."""
    rows = t.shape[0] if t.dim() else 1
    row = math.prod(t.shape[1:])            # elements per row (1 for a 1-D tensor)
    splits = list(split_sizes or ())
    if not splits:
        if rows % n:
            raise ValueError(f"{name}: {what} has {rows} rows, not a multiple of world_size "
                             f"({n}); pass {what}_split_sizes")
        return [rows // n * row] * n
    if len(splits) != n or any(int(s) < 0 for s in splits) or sum(splits) != rows:
        raise ValueError(f"{name}: {what}_split_sizes must be world_size ({n}) row counts "
                         f"adding up to {what}'s {rows} rows, got {splits}")
    return [int(s) * row for s in splits]


def _sparse_all_reduce(pg, t, op, timeout):
    """A sparse COO tensor's SUM over the ranks, as Gloo's: every rank's (indices, values)
    are gathered (padded to the largest count), laid end to end in rank order and coalesced,
    so every rank computes the same sum the same way; the result replaces `t`'s contents."""
    if op is not ReduceOp.SUM:
        raise ValueError(f"all_reduce: sparse tensors take ReduceOp.SUM only (as Gloo), got "
                         f"{op!r}")
    n = pg.world_size
    c = t.detach().coalesce()
    idx, val = c.indices().contiguous(), c.values().contiguous()
    nnz = idx.shape[1]
    counts = torch.empty((n, 1), dtype=torch.int64)
    pg.all_gather(counts, torch.tensor([nnz], dtype=torch.int64), timeout=timeout)
    m = int(counts.max())
    pad_idx = torch.zeros((idx.shape[0], m), dtype=idx.dtype)
    pad_idx[:, :nnz] = idx
    pad_val = torch.zeros((m, *val.shape[1:]), dtype=val.dtype)
    pad_val[:nnz] = val
    all_idx = torch.empty((n, *pad_idx.shape), dtype=idx.dtype)
    all_val = torch.empty((n, *pad_val.shape), dtype=val.dtype)
    pg.all_gather(all_idx, pad_idx, timeout=timeout)
    pg.all_gather(all_val, pad_val, timeout=timeout)
    k = [int(x) for x in counts.reshape(-1)]
    total = torch.sparse_coo_tensor(torch.cat([all_idx[r][:, :k[r]] for r in range(n)], 1),
                                    torch.cat([all_val[r][:k[r]] for r in range(n)]),
                                    c.shape).coalesce()
    with torch.no_grad():
        t.copy_(total)


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
