"""What the backend returns to torch: a torch.distributed.Work over one of core's Work handles.

The operation itself runs on the group's own executor (group/work.py: OpRunner, in issue
order; a posted receive is a DeferredWork that starts when first waited on or polled). This
adapter only gives torch its interface: wait(), get_future(), is_completed(), exception().

torch's Future.set_exception(exc) does not put the C++ future into an error state: it stores
`exc` as the *value* and raises it only when Python unwraps it. DDP's C++ reducer reads that
value as a tensor list and crashes the process. So the future handed to torch is a chained one,
`source.then(_unwrap)`: when the op fails, _unwrap raises inside the chain, which torch records
as a real C++ error -- value() and wait() raise it, in Python (RuntimeError naming the
CollectiveError) and in C++ (DDP's backward raises). Work.wait() raises the original exception,
with its own type. A successful op's future holds the list of output tensors, as Gloo's does
(never None: DDP's reducer would take it for a tensor list and crash).

A timeout reaches torch as the same exception (class and attributes) with its message
prefixed "[collectives] Timed out in <op>: ": torch's tests and users recognise a timeout by
" Timed out " in the message, as Gloo writes it; the detail that follows is ours (who waited
on whom, in which phase).
"""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any, Callable

import torch.distributed as dist
from torch.futures import Future

from ..common.errors import CollectiveError, CollectiveTimeout
from ..group.work import Work


class TorchWork(dist.Work):
    """torch's Work over `work`; its future's value is value() (the op's output tensors),
    read once the op has succeeded."""

    def __init__(self, work: Work, value: Callable[[], Any]):
        super().__init__()
        self._work = work
        self._source: Future = Future()
        self._future = self._source.then(_unwrap)
        work.add_done_callback(lambda done: self._complete(done.exception(), value))

    def _complete(self, exc: BaseException | None, value: Callable[[], Any]) -> None:
        if exc is None:
            self._source.set_result((True, value()))
            return
        if not isinstance(exc, Exception):  # KeyboardInterrupt etc. in the op thread
            exc = CollectiveError(f"{self._work.name}: {exc!r}", op=self._work.name)
        self._source.set_result((False, as_torch_error(exc, self._work.name)))

    def wait(self, timeout: timedelta | None = None) -> bool:
        # The op itself has a deadline (the group timeout), so it always ends; a non-zero
        # `timeout` from the caller only bounds this wait further.
        limit = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        try:
            self._work.wait(limit if limit and limit > 0 else None)  # raises the op's error
        except CollectiveTimeout as exc:
            raise as_torch_error(exc, self._work.name) from exc
        self._future.wait()
        return True

    def get_future(self) -> Future:
        self._work.is_completed()  # whoever holds the future will wait: a posted recv starts
        return self._future

    def is_completed(self) -> bool:
        return self._work.is_completed() and self._future.done()

    def _source_rank(self) -> int:
        """The rank a receive from any source got its message from (-1 until known)."""
        source = getattr(self, "source", None)
        return source() if source is not None else -1

    def is_success(self) -> bool:
        return self._work.is_success()

    def exception(self) -> BaseException | None:
        return self._work.exception()

    def result(self) -> Any:
        self.wait()
        return self._future.value()


def as_torch_error(exc: BaseException, name: str) -> BaseException:
    """`exc`, or for a timeout a copy of it (same class and attributes) whose message starts
    "[collectives] Timed out in <op>: " and goes on with the original."""
    if not isinstance(exc, CollectiveTimeout) or " Timed out " in str(exc):
        return exc
    out = copy.copy(exc)
    out.args = (f"[collectives] Timed out in {getattr(exc, 'op', None) or name}: {exc}",)
    out.__cause__ = exc.__cause__
    return out


def _unwrap(source: Future) -> Any:
    ok, value = source.value()
    if not ok:
        raise value
    return value
