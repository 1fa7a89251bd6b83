"""Point to point on a ProcessGroup: send, recv (blocking or posted) and recv_any. Each pair
of ranks numbers its own messages, so these never disturb the group's collectives."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ..transport.anysource import first_sender
from ..transport.wire import Descriptor
from ..common.apidoc import BUFFER, COMMON, sections
from .buffers import stage
from ..common.errors import CollectiveTimeout
from ..common.ops import ReduceOp, check_op_dtype
from ..common.types import Buffer
from .work import DeferredWork, Work

if TYPE_CHECKING:
    import threading

    from ..transport.base import Transport
    from .work import OpRunner


class PointToPoint:
    """Mixed into ProcessGroup (group.py), whose _submit, _check_rank and counters it uses."""

    if TYPE_CHECKING:  # what ProcessGroup (group.py) provides, for the type checker only
        _t: Transport
        _issue_lock: threading.Lock
        _p2p_send_seq: list[int]
        _p2p_recv_seq: list[int]
        _posted: dict[int, list]
        _runner: OpRunner

        @property
        def rank(self) -> int: ...
        @property
        def world_size(self) -> int: ...
        @property
        def generation(self) -> int: ...
        def _check_rank(self, r: int, what: str, name: str, allow_self: bool = True) -> None: ...
        def _check_live(self, name: str) -> None: ...
        def _check_timeout(self, name: str, timeout: float | None) -> float: ...
        def _submit(
            self,
            name: str,
            desc: Descriptor,
            timeout: float | None,
            async_op: bool,
            staged: Any,
            fn: Any,
            p2p: tuple[int, int, bool] | None = None,
            commit: bool = True,
        ) -> Work | None: ...

    # --- point to point --------------------------------------------------------------------------
    @sections(BUFFER, COMMON)
    def send(
        self,
        buf: Buffer,
        dst: int,
        async_op: bool = False,
        timeout: float | None = None,
        tag: int = 0,
    ) -> Work | None:
        """Send `buf` to rank `dst`. Returns once the message is handed to the transport and
        `buf` may be reused (as Gloo's send); it does not wait for `dst` to receive it, so
        `w = send(x, right, async_op=True); recv(y, left); w.wait()` works on every rank."""
        name = "send"
        self._check_rank(dst, "dst", name, allow_self=False)
        staged = stage(buf, "buf", name, writable=False)
        arr = staged.array
        check_op_dtype(ReduceOp.SUM, arr.dtype)
        with self._issue_lock:
            seq = self._p2p_send_seq[dst]
            self._p2p_send_seq[dst] += 1
        desc = Descriptor("send/recv", arr.size, arr.dtype.str, None, "direct", int(tag))

        def run(ch: Any) -> None:
            ch.send(dst, arr, phase="send")

        return self._submit(name, desc, timeout, async_op, staged, run, p2p=(dst, seq, True))

    @sections(BUFFER, COMMON)
    def recv(
        self,
        buf: Buffer,
        src: int,
        async_op: bool = False,
        timeout: float | None = None,
        tag: int = 0,
    ) -> Work | None:
        """Receive into `buf` what rank `src` sends. A size/dtype/tag mismatch raises
        CollectiveMismatch here, on the receiver (the sender has already returned).

        With async_op=True the receive is posted: it gets the next message from `src` in
        posting order, but runs only once its Work is waited on or polled (DeferredWork), so
        a send issued after it is not stuck behind it."""
        name = "recv"
        self._check_rank(src, "src", name, allow_self=False)
        staged = stage(buf, "buf", name)
        arr = staged.array
        check_op_dtype(ReduceOp.SUM, arr.dtype)
        with self._issue_lock:
            seq = self._p2p_recv_seq[src]
            self._p2p_recv_seq[src] += 1
        desc = Descriptor("send/recv", arr.size, arr.dtype.str, None, "direct", int(tag))

        def run(ch: Any) -> None:
            ch.recv_into(src, arr, phase="receive")

        if async_op:
            # Posted now, run when waited on (DeferredWork): a later send must not queue
            # behind it. Arguments are checked here, before anything is posted.
            timeout = self._check_timeout(name, timeout)
            self._check_live(name)
            posted = self._posted.setdefault(src, [])

            def start() -> Work:
                # Receives from one rank run in the order they were posted, whichever is
                # waited on first: messages from a rank are matched to receives in order.
                for earlier in list(posted):
                    if earlier is work:
                        break
                    earlier._started()
                if work in posted:
                    posted.remove(work)
                return cast(
                    Work,
                    self._submit(name, desc, timeout, True, staged, run, p2p=(src, seq, False)),
                )  # async: a Work

            work = DeferredWork(name, start)
            posted.append(work)
            return work
        for earlier in list(self._posted.get(src, ())):
            earlier._started()  # a blocking recv comes after the ones posted before it
        return self._submit(name, desc, timeout, async_op, staged, run, p2p=(src, seq, False))

    def recv_any(self, buf: Buffer, tag: int = 0, timeout: float | None = None) -> int:
        """Receive into `buf` the next message of whichever rank's message arrives first
        (MPI_ANY_SOURCE; torch's recv without src) and return that rank. Blocking. Each
        rank's messages still come in the order it sent them (transport/anysource.py)."""
        name = "recv"
        staged = stage(buf, "buf", name)
        check_op_dtype(ReduceOp.SUM, staged.array.dtype)
        timeout = self._check_timeout(name, timeout)
        self._check_live(name)
        got: list[int] = []

        def run() -> None:
            expected = {p: self._p2p_recv_seq[p] for p in range(self.world_size) if p != self.rank}
            src = first_sender(self._t, expected, timeout)
            if src is None:
                raise CollectiveTimeout(
                    f"rank {self.rank} timed out after {timeout:g} s in "
                    f"recv from any source: no rank sent anything",
                    op=name,
                    rank=self.rank,
                    phase="receive",
                    generation=self.generation,
                )
            self.recv(buf, src, timeout=timeout, tag=tag)
            got.append(src)

        if self._runner.idle() or self._runner.on_worker():
            run()
        else:
            self._runner.submit(Work(name, run), False)
        return got[0]
