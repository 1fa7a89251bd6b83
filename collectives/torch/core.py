"""What the torch backend's parts share: the collectives group under it, its timeout, whether
it is broken or shut down, and `run`, which queues one torch call on the group's executor.

CollectivesProcessGroup (backend.py) is torch's face; it and the exchanges it holds
(exchanges.py: all_to_all forms, barriers, point to point) each reach the group through this
one object, by reference.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist

from ..common import config
from ..common.errors import CollectiveError, CollectiveTimeout, PeerFailure
from ..group.group import ProcessGroup
from . import elastic
from .helpers import Reduction
from .work import TorchWork


class BackendCore:
    """The state of one CollectivesProcessGroup (backend.py) and how its operations run."""

    def __init__(
        self,
        pg: ProcessGroup,
        rank: int,
        size: int,
        timeout_s: float,
        elastic_store: Any = None,
    ):
        self.pg = pg
        self.rank = rank
        self.size = size
        self.timeout_s = timeout_s
        self.broken: CollectiveError | None = None  # the error that broke the group
        self.closed = False
        self.gloo_order = config.gloo_order()
        # where the survivors of a shrink agree (elastic.py); None: this group cannot shrink
        self.elastic_store = elastic_store
        self.shrinks = 0  # shrink attempts on this group: every survivor counts alike

    def require_elastic(self, name: str) -> Any:
        """The agreement store, or a clear error for a group that cannot shrink."""
        self.check_open(name)
        if self.elastic_store is None:
            raise RuntimeError(
                f"{name}: rank {self.rank}: this collectives group cannot shrink or grow: only "
                "the default group joins the coordinator that rebuilds groups, and only "
                "where COLLECTIVES_TORCH_ELASTIC=1 (the default where MASTER_PORT or "
                "COLLECTIVES_COORDINATOR is set; this job set it to 0, or named neither, or "
                "this group came from new_group) (docs/torch_backend.md)"
            )
        return self.elastic_store

    def next_group(self, exclude: tuple[int, ...], flags: int, name: str) -> ProcessGroup | None:
        """shrink_group and reconfigure: the next generation without `exclude` (elastic.py),
        after which this group takes no more operations; None if nothing changed."""
        store = self.require_elastic(name)
        self.shrinks += 1
        new = elastic.shrink(self.pg, store, self.shrinks, exclude, flags, self.timeout_s)
        if new is self.pg:
            return None
        self.closed = True
        return new

    def run(self, name: str, fn: Callable[[], Any]) -> TorchWork:
        """Queue fn (which returns the op's output tensors) on the group's executor."""
        self.check_open(name)
        value: list[Any] = []

        def op() -> None:
            if self.broken is not None:
                b = self.broken
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
                self.broken = exc
                raise

        return TorchWork(self.pg.enqueue(name, op), lambda: value[0])

    def check_open(self, name: str) -> None:
        if self.closed:
            raise CollectiveError(
                f"{name}: the collectives process group was shut down", op=name, rank=self.rank
            )

    def algorithm(self, t: torch.Tensor) -> str:
        """all_reduce's schedule for `t`: Gloo's ring (algorithms/gloo_ring.py: Gloo's
        summation order) for a floating tensor when COLLECTIVES_GLOO_ORDER=1, so that results
        equal Gloo's bit for bit (docs/torch_backend.md); else "auto", the fastest, whose
        order may differ from Gloo's (in the last bits only) from 3 ranks up."""
        return "gloo_ring" if self.gloo_order and t.dtype.is_floating_point else "auto"

    def reduction(self, opts: Any, t: torch.Tensor, name: str) -> Reduction:
        """How `opts`' reduce op runs on `t` (helpers.Reduction), checked before any byte
        moves."""
        return Reduction(opts if opts is not None else dist.ReduceOp.SUM, t.dtype, self.size, name)

    def abort(self) -> None:
        """Stop now: an operation in flight raises, queued ones fail, sockets close."""
        if self.closed:
            return
        self.closed = True
        self.pg.interrupt(
            CollectiveError(
                f"rank {self.rank}: the collectives process group was aborted",
                op="abort",
                rank=self.rank,
            )
        )
        self.pg.destroy()

    def shutdown(self) -> None:
        """Finish queued operations (bounded by the timeout), then close sockets."""
        if self.closed:
            return
        self.closed = True
        self.pg.destroy()


def one(tensors: list[torch.Tensor], name: str) -> torch.Tensor:
    """The one tensor of a call that takes exactly one."""
    if len(tensors) != 1:
        raise ValueError(
            f"{name}: the collectives backend takes exactly one tensor per call, got {len(tensors)}"
        )
    return tensors[0]
