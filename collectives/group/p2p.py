"""Point to point on a ProcessGroup: send, recv (blocking or posted) and recv_any. Each pair
of ranks numbers its own messages, so these never disturb the group's collectives. The public
methods, with the docstrings help() shows, are ProcessGroup's (group.py)."""

from __future__ import annotations

from typing import Any, cast

from ..transport.anysource import first_sender
from ..transport.wire import Descriptor
from .buffers import stage
from .core import GroupCore
from ..common.errors import CollectiveTimeout
from ..common.channel import Channel
from ..common.ops import ReduceOp, check_op_dtype
from ..common.types import Buffer
from .work import DeferredWork, Work


class PointToPoint:
    """send, recv and recv_any of one ProcessGroup, over its core; it keeps the numbers of
    the messages to and from each peer."""

    def __init__(self, core: GroupCore):
        self.core = core
        n = core.world_size
        self.send_seq = [0] * n  # per destination: the next message's number
        self.recv_seq = [0] * n  # per source: the next message's number
        self.posted: dict[int, list[Any]] = {}  # src -> posted receives not yet started

    def send(
        self,
        buf: Buffer,
        dst: int,
        async_op: bool,
        timeout: float | None,
        tag: int,
    ) -> Work | None:
        name, core = "send", self.core
        core.check_rank(dst, "dst", name, allow_self=False)
        staged = stage(buf, "buf", name, writable=False)
        arr = staged.array
        check_op_dtype(ReduceOp.SUM, arr.dtype)
        with core.issue_lock:
            seq = self.send_seq[dst]
            self.send_seq[dst] += 1
        desc = Descriptor("send/recv", arr.size, arr.dtype.str, None, "direct", int(tag))

        def run(ch: Channel) -> None:
            ch.send(dst, arr, phase="send")

        return core.submit(name, desc, timeout, async_op, staged, run, p2p=(dst, seq, True))

    def recv(
        self,
        buf: Buffer,
        src: int,
        async_op: bool,
        timeout: float | None,
        tag: int,
    ) -> Work | None:
        name, core = "recv", self.core
        core.check_rank(src, "src", name, allow_self=False)
        staged = stage(buf, "buf", name)
        arr = staged.array
        check_op_dtype(ReduceOp.SUM, arr.dtype)
        with core.issue_lock:
            seq = self.recv_seq[src]
            self.recv_seq[src] += 1
        desc = Descriptor("send/recv", arr.size, arr.dtype.str, None, "direct", int(tag))

        def run(ch: Channel) -> None:
            ch.recv_into(src, arr, phase="receive")

        if async_op:
            # Posted now, run when waited on (DeferredWork): a later send must not queue
            # behind it. Arguments are checked here, before anything is posted.
            timeout = core.check_timeout(name, timeout)
            core.check_live(name)
            posted = self.posted.setdefault(src, [])

            def start() -> Work:
                # Receives from one rank run in the order they were posted, whichever is
                # waited on first: messages from a rank are matched to receives in order.
                for earlier in list(posted):
                    if earlier is work:
                        break
                    earlier.start()
                if work in posted:
                    posted.remove(work)
                return cast(
                    Work,
                    core.submit(name, desc, timeout, True, staged, run, p2p=(src, seq, False)),
                )  # async: a Work

            work = DeferredWork(name, start)
            posted.append(work)
            return work
        for earlier in list(self.posted.get(src, ())):
            earlier.start()  # a blocking recv comes after the ones posted before it
        return core.submit(name, desc, timeout, async_op, staged, run, p2p=(src, seq, False))

    def recv_any(self, buf: Buffer, tag: int, timeout: float | None) -> int:
        name, core = "recv", self.core
        staged = stage(buf, "buf", name)
        check_op_dtype(ReduceOp.SUM, staged.array.dtype)
        timeout = core.check_timeout(name, timeout)
        core.check_live(name)
        got: list[int] = []

        def run() -> None:
            expected = {p: self.recv_seq[p] for p in range(core.world_size) if p != core.rank}
            src = first_sender(core.transport, expected, timeout)
            if src is None:
                raise CollectiveTimeout(
                    f"rank {core.rank} timed out after {timeout:g} s in "
                    f"recv from any source: no rank sent anything",
                    op=name,
                    rank=core.rank,
                    phase="receive",
                    generation=core.generation,
                )
            self.recv(buf, src, False, timeout, tag)
            got.append(src)

        if core.runner.idle() or core.runner.on_worker():
            run()
        else:
            core.runner.submit(Work(name, run), False)
        return got[0]
