"""DataParallel: average a torch model's gradients over a ProcessGroup, in flat buckets.

    dp = cl.DataParallel(model, pg, bucket_mb=25)   # broadcasts params + buffers from rank 0
    loss = loss_fn(dp(x), y); loss.backward()
    dp.sync_gradients()                              # p.grad = average over ranks
    optimizer.step()

Buckets (as in PyTorch DDP): the parameters are taken in *reverse* registration order -- the
order backward produces their gradients -- and cut into buckets of at most `bucket_mb` MiB,
one dtype per bucket. Each bucket owns one flat contiguous buffer: gradients are copied in, the
buffer is all-reduced with ReduceOp.AVG (one collective per bucket instead of one per tensor,
which is what makes small layers cheap), and the result is copied back into p.grad. Bucket
buffers come from pg.alloc_tensor: registered shared memory that a same-host peer reads in
place (transport/zmq/registered.py), which halves the copies of the all_reduce; they stay valid,
and registered, after set_group() to a reconstructed group.

Overlap (overlap=True): a post-accumulate-grad hook on every parameter copies its gradient into
the bucket the moment backward has produced it; when a bucket is full it is launched as an
*async* all_reduce, so communication of the last layers runs while backward still computes the
first ones. Buckets are always launched in bucket order (a full bucket waits for the ones before
it), so every rank issues the same collectives in the same order even if hooks fire in a
different order. sync_gradients() launches whatever is left, waits for every bucket and copies
the averages out. Whether overlap pays is measured, not assumed: see docs/training.md (for the
digits MLP the whole model is one 25 MiB bucket, so there is nothing to overlap; cut into four,
overlap gains nothing measurable either).

Errors: if any bucket's all_reduce fails (e.g. cl.PeerFailure), sync_gradients still waits for
every bucket it launched (none is left running on the old group), resets its state, and raises
the first error. p.grad is then undefined; the caller drops the step (ElasticTrainer does).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from ..group.group import ProcessGroup
from ..common.ops import ReduceOp

MiB = 1 << 20


class _Bucket:
    """A group of parameters whose gradients travel together in one flat buffer."""

    __slots__ = ("params", "offsets", "flat", "ready", "work")

    def __init__(self, params, dtype, flat=None):
        self.params = params
        self.offsets = []
        n = 0
        for p in params:
            self.offsets.append(n)
            n += p.numel()
        self.flat = torch.zeros(n, dtype=dtype) if flat is None else flat
        self.ready = 0  # parameters whose gradient is in `flat` for this step
        self.work = None  # the async all_reduce, once launched

    def copy_in(self, i):
        p, off = self.params[i], self.offsets[i]
        dst = self.flat[off : off + p.numel()]
        if p.grad is None:  # unused in this step's graph: contributes zeros, like DDP
            dst.zero_()
        else:
            dst.copy_(p.grad.detach().reshape(-1))

    def copy_out(self):
        for p, off in zip(self.params, self.offsets):
            avg = self.flat[off : off + p.numel()].view(p.shape)
            if p.grad is None:
                p.grad = avg.clone()
            else:
                p.grad.detach().copy_(avg)


class DataParallel(torch.nn.Module):
    """Wrap `module`; forward() calls it unchanged. See the module docstring."""

    def __init__(
        self,
        module: torch.nn.Module,
        pg: ProcessGroup,
        bucket_mb: float = 25.0,
        *,
        overlap: bool = True,
        broadcast_buffers: bool = True,
        algorithm: str = "auto",
        sync_on_init: bool = True,
        registered: bool = True,
    ) -> None:
        super().__init__()
        if not bucket_mb > 0:
            raise ValueError(f"DataParallel: bucket_mb must be > 0, got {bucket_mb}")
        self.module = module
        self.pg = pg
        self.bucket_bytes = int(bucket_mb * MiB)
        self.overlap = overlap
        self.algorithm = algorithm
        self.registered = registered  # buckets in registered shared memory (pg.alloc_tensor)
        self._enabled = True  # False inside no_sync()
        self._next_launch = 0
        seen, params = set(), []
        for p in module.parameters():
            if p.requires_grad and id(p) not in seen:  # shared weights count once
                seen.add(id(p))
                params.append(p)
        for p in params:
            if p.device.type != "cpu":
                raise ValueError(
                    f"DataParallel: parameters must be on the CPU, found one on {p.device}"
                )
        self.buckets = self._make_buckets(params)
        # id(param) -> (bucket index, index in bucket)
        self._where: dict[int, tuple[int, int]] = {}
        for b, bucket in enumerate(self.buckets):
            for i, p in enumerate(bucket.params):
                self._where[id(p)] = (b, i)
        self._hooks: list[Any] = []
        if overlap:
            for p in params:
                self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad))
        if sync_on_init:  # False for a joiner: its state arrives later (ElasticTrainer)
            self.broadcast_state(src=0, buffers=broadcast_buffers)

    # --- public --------------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def set_group(self, pg: ProcessGroup) -> None:
        """Use another group from now on (after pg.reconstruct()). Drops a half-done step."""
        self.pg = pg
        self._reset()

    def broadcast_state(self, src: int = 0, buffers: bool = True) -> None:
        """Copy parameters (and buffers) from rank `src` to every rank: one broadcast per
        dtype of one flat buffer, not one per tensor."""
        tensors = [p.data for p in self.module.parameters()]
        if buffers:
            tensors += [b.data for b in self.module.buffers()]
        by_dtype: dict[Any, list[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        for dtype in sorted(by_dtype, key=str):  # the same order on every rank
            group = by_dtype[dtype]
            flat: Any = torch.cat([t.reshape(-1) for t in group]) if group else None
            self.pg.broadcast(flat, src=src)
            off = 0
            for t in group:
                t.copy_(flat[off : off + t.numel()].view(t.shape))
                off += t.numel()

    def sync_gradients(self) -> None:
        """Average every parameter's gradient over the group (ReduceOp.AVG), in place."""
        if not self._enabled:
            return
        first_exc = None
        try:
            for b in range(self._next_launch, len(self.buckets)):
                bucket = self.buckets[b]
                for i in range(len(bucket.params)):  # hooks off, or a bucket left short
                    bucket.copy_in(i)
                self._launch(bucket)
            self._next_launch = len(self.buckets)
        except BaseException as exc:  # a launch refused (group destroyed): still wait below
            first_exc = exc
        for bucket in self.buckets:
            if bucket.work is None:
                continue
            try:
                bucket.work.wait()
            except BaseException as exc:
                first_exc = first_exc or exc
        if first_exc is None:
            for bucket in self.buckets:
                bucket.copy_out()
        self._reset()
        if first_exc is not None:
            raise first_exc

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally (no communication) inside the block; the next
        sync_gradients() outside it averages the accumulated sum."""
        prev, self._enabled = self._enabled, False
        try:
            yield
        finally:
            self._enabled = prev

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    # --- internals -----------------------------------------------------------------------------
    def _make_buckets(self, params):
        groups, current, size, dtype = [], [], 0, None  # type: list[Any], list[Any], int, Any
        for p in reversed(params):  # the order backward produces gradients
            nbytes = p.numel() * p.element_size()
            if current and (p.dtype != dtype or size + nbytes > self.bucket_bytes):
                groups.append((current, dtype))
                current, size = [], 0
            current.append(p)
            size += nbytes
            dtype = p.dtype
        if current:
            groups.append((current, dtype))
        # Registered shared memory (group/alloc.py): a same-host peer reads a bucket in place
        # during its all_reduce instead of this rank copying it into a slot first. One
        # allocation per dtype, cut into the buckets (one memfd, however many buckets).
        # A collectives ProcessGroup has alloc_tensor; registered=False: ordinary buffers.
        alloc: Any = getattr(self.pg, "alloc_tensor", None) if self.registered else None
        memory = {}
        for dt in {dt for _, dt in groups} if alloc is not None else ():
            if dt != torch.bfloat16:  # staged through float32 anyway
                memory[dt] = [alloc(sum(p.numel() for g, d in groups if d == dt for p in g), dt), 0]
        buckets = []
        for group, dt in groups:
            flat = None
            if dt in memory:
                n = sum(p.numel() for p in group)
                whole, at = memory[dt]
                flat, memory[dt][1] = whole[at : at + n], at + n
            buckets.append(_Bucket(group, dt, flat))
        return buckets

    def _on_grad(self, p):
        if not self._enabled:
            return
        b, i = self._where[id(p)]
        bucket = self.buckets[b]
        if bucket.work is not None:  # second backward without a sync: sync_gradients redoes
            return
        bucket.copy_in(i)
        bucket.ready += 1
        # Launch full buckets in bucket order only, so all ranks issue the same sequence.
        while self._next_launch < len(self.buckets) and self.buckets[
            self._next_launch
        ].ready == len(self.buckets[self._next_launch].params):
            self._launch(self.buckets[self._next_launch])
            self._next_launch += 1

    def _launch(self, bucket):
        bucket.work = self.pg.all_reduce(
            bucket.flat, op=ReduceOp.AVG, algorithm=self.algorithm, async_op=True
        )

    def _reset(self):
        for bucket in self.buckets:
            bucket.ready = 0
            bucket.work = None
        self._next_launch = 0
