"""The torch backend's all_to_all forms, barriers and point to point: a part of
CollectivesProcessGroup (backend.py), kept apart so that each file reads in one sitting."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, cast

import torch

from ..common.errors import CollectiveError, CollectiveTimeout
from ..group.work import Work
from .helpers import _MONITORED_TAG, _into, _row_splits, _timeout
from .work import TorchWork

if TYPE_CHECKING:
    from ..group.group import ProcessGroup

log = logging.getLogger("collectives")


class ExchangeOps:
    """Mixed into CollectivesProcessGroup (backend.py), whose _run, _one, _check_open and
    collectives group it uses."""

    if TYPE_CHECKING:  # what CollectivesProcessGroup (backend.py) provides, for mypy only
        _pg: ProcessGroup
        _timeout_s: float
        _broken: CollectiveError | None

        def rank(self) -> int: ...
        def size(self) -> int: ...
        def _run(self, name: str, fn: Callable[[], Any]) -> TorchWork: ...
        def _check_open(self, name: str) -> None: ...
        @staticmethod
        def _one(tensors: list[torch.Tensor], name: str) -> torch.Tensor: ...

    # --- all_to_all ---------------------------------------------------------------------------
    def alltoall(
        self,
        output_tensors: list[torch.Tensor],
        input_tensors: list[torch.Tensor],
        opts: Any = None,
    ) -> TorchWork:
        """dist.all_to_all: input_tensors[p] goes to rank p, output_tensors[p] comes from
        rank p; sizes may differ per pair (the uneven form of pg.all_to_all)."""
        n, pg, name = self.size(), self._pg, "all_to_all"
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

        return self._run(name, run)

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
        n, pg, name = self.size(), self._pg, "all_to_all_single"
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

        return self._run(name, run)

    alltoall_base = all_to_all_single

    def barrier(self, opts: Any = None) -> TorchWork:
        pg, timeout = self._pg, _timeout(opts)
        return self._run("barrier", lambda: (pg.barrier(timeout=timeout), [])[1])

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
        secs = (
            timeout.total_seconds()
            if isinstance(timeout, timedelta)
            else self._timeout_s
            if timeout is None
            else float(timeout)
        )
        pg, me, n, name = self._pg, self.rank(), self.size(), "monitored_barrier"
        ms = int(round(secs * 1000))
        wait = max(secs, 1e-3)

        def run() -> Any:
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

        # Not through _run: a rank that fails a monitored barrier is reported; the group is
        # not broken by it (as with Gloo).
        self._check_open(name)
        value: list[Any] = []
        work = self._pg.enqueue(name, lambda: value.append(run()))
        TorchWork(work, lambda: value[0]).wait()

    # --- point to point -----------------------------------------------------------------------
    # A send returns once the transport has the message (as Gloo's). A receive is posted when
    # issued -- its place among the messages from src_rank is fixed then -- but it takes the
    # group's (one-at-a-time) executor only when its Work is waited on or polled. So
    # `req = irecv(t, peer); send(x, peer); req.wait()` on both ranks works, as over Gloo.
    def send(self, tensors: list[torch.Tensor], dst_rank: int, tag: int = 0) -> TorchWork:
        t, pg = self._one(tensors, "send"), self._pg
        return self._run("send", lambda: (pg.send(t, dst_rank, tag=tag), tensors)[1])

    def recv(self, tensors: list[torch.Tensor], src_rank: int, tag: int = 0) -> TorchWork:
        t, pg = self._one(tensors, "recv"), self._pg
        self._check_open("recv")
        if self._broken is not None:
            return TorchWork(
                Work.failed(
                    "recv",
                    CollectiveError(
                        f"recv: not run, the group is broken since an earlier operation failed: "
                        f"{self._broken}",
                        op="recv",
                        rank=self.rank(),
                    ),
                ),
                lambda: tensors,
            )
        # posted now (its place among src_rank's messages is fixed), run when waited on
        return TorchWork(cast(Work, pg.recv(t, src_rank, tag=tag, async_op=True)), lambda: tensors)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> TorchWork:
        """recv without src: from whichever rank's message comes first; the Work's
        _source_rank() says which (as Gloo's)."""
        t, pg, src = self._one(tensors, "recv"), self._pg, cast("list[int]", [])
        work = self._run(
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
