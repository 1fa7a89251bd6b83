"""The torch backend's all_to_all forms, barriers and point to point, kept apart from
CollectivesProcessGroup (backend.py) so that each file reads in one sitting. The group holds
an ExchangeOps and hands each of these calls to it; ExchangeOps reaches the collectives group
through the backend's core (core.py), which it holds by reference. The docstrings torch's
users see are CollectivesProcessGroup's."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any, cast

import torch

from ..common.errors import CollectiveError, CollectiveTimeout
from ..group.work import Work
from .core import BackendCore, one
from .helpers import _MONITORED_TAG, _into, _row_splits, _timeout
from .work import TorchWork

log = logging.getLogger("collectives")


class ExchangeOps:
    """all_to_all, all_to_all_single, barrier, monitored_barrier, send, recv and
    recv_anysource of one CollectivesProcessGroup (backend.py), over its core."""

    def __init__(self, core: BackendCore):
        self.core = core

    # --- all_to_all ---------------------------------------------------------------------------
    def alltoall(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[torch.Tensor],
        opts: Any,
    ) -> TorchWork:
        core = self.core
        n, pg, name = core.size, core.pg, "all_to_all"
        outs, ins = list(output_tensors), list(input_tensors)
        if len(outs) != n or len(ins) != n:
            raise ValueError(
                f"{name}: expected world_size ({n}) output and input tensors, "
                f"got {len(outs)} and {len(ins)}"
            )
        dtypes = {t.dtype for t in outs + ins}
        if len(dtypes) != 1:
            raise TypeError(
                f"{name}: every tensor must have the same dtype, got "
                f"{sorted(str(d) for d in dtypes)}"
            )
        dtype = dtypes.pop()
        out_splits, in_splits = [t.numel() for t in outs], [t.numel() for t in ins]

        def run() -> Any:
            buf = torch.cat([t.reshape(-1) for t in ins])
            flat = torch.empty(sum(out_splits), dtype=dtype)
            pg.all_to_all(
                flat, buf, out_splits=out_splits, in_splits=in_splits, timeout=_timeout(opts)
            )
            for o, piece in zip(outs, flat.split(out_splits)):
                o.copy_(piece.view(o.shape))
            return output_tensors

        return core.run(name, run)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int] | None,
        input_split_sizes: list[int] | None,
        opts: Any,
    ) -> TorchWork:
        core = self.core
        n, pg, name = core.size, core.pg, "all_to_all_single"
        if output.dtype != input.dtype:
            raise TypeError(f"{name}: output has dtype {output.dtype}, input {input.dtype}")
        in_splits = _row_splits(input, input_split_sizes, n, "input", name)
        out_splits = _row_splits(output, output_split_sizes, n, "output", name)
        uneven = bool(list(input_split_sizes or ())) or bool(list(output_split_sizes or ()))
        if not uneven and output.numel() != input.numel():
            raise ValueError(
                f"{name}: output has {output.numel()} elements, input "
                f"{input.numel()}; equal splits need the same"
            )

        def run() -> Any:
            src = input.contiguous()
            if uneven:
                _into(
                    output,
                    lambda o: pg.all_to_all(
                        o, src, out_splits=out_splits, in_splits=in_splits, timeout=_timeout(opts)
                    ),
                )
            else:
                _into(
                    output,
                    lambda o: pg.all_to_all(o.view(n, -1), src.view(n, -1), timeout=_timeout(opts)),
                )
            return [output]

        return core.run(name, run)

    def barrier(self, opts: Any) -> TorchWork:
        core = self.core
        pg, timeout = core.pg, _timeout(opts)
        return core.run("barrier", lambda: (pg.barrier(timeout=timeout), [])[1])

    def monitored_barrier(self, timeout: timedelta | float | None, wait_all_ranks: bool) -> None:
        core = self.core
        secs = (
            timeout.total_seconds()
            if isinstance(timeout, timedelta)
            else core.timeout_s
            if timeout is None
            else float(timeout)
        )
        pg, me, n, name = core.pg, core.rank, core.size, "monitored_barrier"
        ms = int(round(secs * 1000))
        wait = max(secs, 1e-3)

        def run() -> Any:
            token = torch.zeros(1, dtype=torch.uint8)
            if me != 0:
                # Rank 0 may take the whole `timeout` before it answers: wait for its answer
                # that long plus the group's timeout (Gloo waits the group's).
                pg.send(token, 0, tag=_MONITORED_TAG, timeout=wait + core.timeout_s)
                try:
                    pg.recv(token, 0, tag=_MONITORED_TAG, timeout=wait + core.timeout_s)
                except CollectiveTimeout as exc:
                    raise CollectiveTimeout(
                        f"Rank {me} successfully reached monitoredBarrier, but received errors "
                        f"while waiting for send/recv from rank 0: it did not answer ({exc})",
                        op=name,
                        rank=me,
                        peer=0,
                    ) from exc
                if token.item():
                    raise CollectiveError(
                        f"Rank {me} successfully reached monitoredBarrier, but received errors "
                        "while waiting for send/recv from rank 0: the monitored barrier failed "
                        "there (rank 0's error names the ranks that did not report)",
                        op=name,
                        rank=me,
                        peer=0,
                    )
                return []
            deadline = time.monotonic() + secs
            failed: list[int] = []
            exhausted = False
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
                raise CollectiveTimeout(
                    f"Rank 0 timed out in monitoredBarrier after {ms} ms",
                    op=name,
                    rank=0,
                    peer=failed[0] if failed else None,
                )
            if failed:
                who = (
                    f"Ranks {', '.join(map(str, failed))}"
                    if wait_all_ranks
                    else f"Rank {failed[0]}"
                )
                raise CollectiveTimeout(
                    f"{who} failed to pass monitoredBarrier in {ms} ms",
                    op=name,
                    rank=0,
                    peer=failed[0],
                )
            return []

        # Not through core.run: a rank that fails a monitored barrier is reported; the group is
        # not broken by it (as with Gloo).
        core.check_open(name)
        value: list[Any] = []
        work = core.pg.enqueue(name, lambda: value.append(run()))
        TorchWork(work, lambda: value[0]).wait()

    # --- point to point -----------------------------------------------------------------------
    # A send returns once the transport has the message (as Gloo's). A receive is posted when
    # issued -- its place among the messages from src_rank is fixed then -- but it takes the
    # group's (one-at-a-time) executor only when its Work is waited on or polled. So
    # `req = irecv(t, peer); send(x, peer); req.wait()` on both ranks works, as over Gloo.
    def send(self, tensors: list[torch.Tensor], dst_rank: int, tag: int) -> TorchWork:
        core = self.core
        t, pg = one(tensors, "send"), core.pg
        return core.run("send", lambda: (pg.send(t, dst_rank, tag=tag), tensors)[1])

    def recv(self, tensors: list[torch.Tensor], src_rank: int, tag: int) -> TorchWork:
        core = self.core
        t, pg = one(tensors, "recv"), core.pg
        core.check_open("recv")
        if core.broken is not None:
            return TorchWork(
                Work.failed(
                    "recv",
                    CollectiveError(
                        f"recv: not run, the group is broken since an earlier operation failed: "
                        f"{core.broken}",
                        op="recv",
                        rank=core.rank,
                    ),
                ),
                lambda: tensors,
            )
        # posted now (its place among src_rank's messages is fixed), run when waited on
        return TorchWork(cast(Work, pg.recv(t, src_rank, tag=tag, async_op=True)), lambda: tensors)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> TorchWork:
        core = self.core
        t, pg, src = one(tensors, "recv"), core.pg, cast("list[int]", [])
        work = core.run(
            "recv",
            lambda: (
                src.append(  # type: ignore[func-returns-value]
                    pg.recv_any(t, tag=tag)
                ),
                tensors,
            )[1],
        )
        work.source = lambda: src[0] if src else -1
        return work
