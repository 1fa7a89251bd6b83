"""Calls into torch's c10d store that end by a deadline of the caller's own.

torch's TCPStore honours a wait's timeout only while its server answers: with the server's
process stopped (SIGSTOP, a debugger, a host that hangs) a client's wait, check, get or set
blocks in a receive that has no deadline at all, past the wait's timeout and past the store's
own. Every store call of the backend therefore runs on a helper thread that the caller waits
for, up to the deadline plus a grace for the store's own timeout to fire first; past it the
caller raises, naming the op, the rank and what it waited for, and the helper, still blocked
in torch, is left behind (a daemon thread: it holds nothing of ours and ends with the
process). The store's client is unusable after that, as it is after any store error.
"""

from __future__ import annotations

import threading
from typing import Callable, TypeVar

from ..common.errors import CollectiveError, CollectiveTimeout

T = TypeVar("T")

GRACE_S = 2.0  # past the deadline: time for the store's own timeout error to arrive first


def bounded(call: Callable[[], T], timeout_s: float, *, op: str, rank: int, what: str) -> T:
    """call()'s result; its exception (the store's own timeout, say) as a CollectiveError
    naming `what`; a CollectiveTimeout if it has not returned after timeout_s + GRACE_S."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:  # handed to the caller's thread
            error.append(exc)

    helper = threading.Thread(target=run, name=f"c10d store: {what}", daemon=True)
    helper.start()
    helper.join(timeout_s + GRACE_S)
    if helper.is_alive():
        raise CollectiveTimeout(
            f"{op}: rank {rank}: the c10d store did not answer within {timeout_s + GRACE_S:g} s "
            f"while this rank waited for {what} (is the process that hosts the store's server "
            "stopped or unreachable?)",
            op=op,
            rank=rank,
        )
    if error:
        exc = error[0]
        raise CollectiveError(
            f"{op}: rank {rank}: the c10d store failed (deadline {timeout_s:g} s) while this "
            f"rank waited for {what}: {exc}",
            op=op,
            rank=rank,
        ) from exc
    return result[0]
