"""ProcessGroup: the torch-shaped methods users call.

Each method checks its arguments before any byte moves, describes the operation in a short
descriptor (kind, count, dtype, op, algorithm, root) that travels in every message header so
that ranks calling different things find out, picks an algorithm, and runs it over an
OpChannel for this one operation. Everything about sockets lives in the transport.
"""

from __future__ import annotations

import enum
import functools
import logging
import threading
from typing import Any, Callable

import numpy as np

from . import tuning
from .alloc import Allocations
from .tuning import pick as _pick
from ..algorithms import barrier as barrier_alg
from ..algorithms import commit as commit_alg
from ..algorithms import direct, gloo_ring, hierarchical, naive, ring, tree
from ..algorithms.rooted import release, rooted_broadcast
from ..common.apidoc import BUFFER, COMMON, OPS, sections
from .buffers import stage, stage_in_out
from ..common.errors import CollectiveError, PeerFailure
from ..common.ops import ReduceOp, as_op, check_op_dtype
from ..transport.base import Transport
from ..transport.channel import OpChannel
from ..transport.wire import Descriptor
from .exchanges import Exchanges
from .p2p import PointToPoint
from ..common.types import Buffer
from .work import OpRunner, Work

log = logging.getLogger("collectives")

ALL_REDUCE = {
    "ring": ring.all_reduce,
    "tree": tree.all_reduce,
    "naive": naive.all_reduce,
    "direct": direct.all_reduce,
    "hierarchical": hierarchical.all_reduce,
    "gloo_ring": gloo_ring.all_reduce,
}
NEEDS_HOSTS = ("hierarchical",)  # these take the host map too (transport.hosts)
ROOTED = ("tree",)  # broadcast and reduce
SCATTER_GATHER = ("ring",)  # all_gather and reduce_scatter
_PLANS_MAX = 256  # all_reduce plans kept per group (sizes x dtypes x ops in use)


class GroupState(enum.Enum):
    """Where a ProcessGroup is in its life. Each transition is one method of ProcessGroup:

        ACTIVE   --retire()-->       UNFORMED   reconstruct() closed it for a next generation
        UNFORMED --retire()-->       UNFORMED   (that has not formed yet: it may retry)
        UNFORMED --replaced_by(g)--> REPLACED   the next generation formed: use `successor`
        ACTIVE, UNFORMED --destroy()-->  DESTROYED
        every state but CLOSED --close()--> CLOSED   (local resources released, nothing said)
    Operations run only while ACTIVE; reconstruct() is allowed while ACTIVE or UNFORMED."""

    ACTIVE = "active"
    UNFORMED = "unformed"
    REPLACED = "replaced"
    DESTROYED = "destroyed"
    CLOSED = "closed"


class ProcessGroup(Exchanges, PointToPoint, Allocations):
    """A group of `world_size` ranks. Create with init_process_group (or simulate)."""

    def __init__(
        self,
        transport: Transport,
        timeout: float = 30.0,
        *,
        on_destroy: Callable[[], object] | None = None,
        membership: Any = None,
    ):
        self._t = transport
        self._membership = membership  # init.Membership for groups that can be rebuilt
        self.timeout = float(timeout)
        self._seq = 0
        self._p2p_send_seq = [0] * transport.size
        self._p2p_recv_seq = [0] * transport.size
        self._posted: dict[int, list] = {}  # src -> posted receives not yet started
        self._runner = OpRunner(f"collectives-rank{transport.rank}")
        self._issue_lock = threading.Lock()
        self._noted: set[tuple] = set()  # (kind, count, dtype, algorithm) logged at INFO
        self._on_destroy = on_destroy
        self._state = GroupState.ACTIVE
        self.successor: ProcessGroup | None = None  # the group that replaced this one
        # callables ch -> ch (tracing, fault injection)
        self.channel_wrappers: list[Callable[[Any], Any]] = []
        self._hosts: tuple[int, ...] | None = None
        self._crowded: bool | None = None
        # all_reduce's choice per (count, dtype, op, algorithm asked): (algorithm, function,
        # descriptor). The same inputs pick the same on every call; bounded (_PLANS_MAX).
        self._plans: dict[Any, Any] = {}

    # --- identity -------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._t.rank

    @property
    def world_size(self) -> int:
        return self._t.size

    @property
    def generation(self) -> int:
        return self._t.generation

    def size(self) -> int:
        return self._t.size

    @property
    def hosts(self) -> tuple[int, ...]:
        """The host of every rank as small ints, numbered in order of each host's lowest rank
        (ranks 0 and 1 on one host, 2 on another: (0, 0, 1)); the same tuple on every rank.
        From the transport: the address each rank published over ZeroMQ, the host map given
        to cl.simulate in-process (default: one host)."""
        if self._hosts is None:  # a transport's host map is fixed once it is connected
            hosts = getattr(self._t, "hosts", None)
            if not hosts:
                return (0,) * self._t.size
            labels: dict[Any, int] = {}
            self._hosts = tuple(labels.setdefault(h, len(labels)) for h in hosts)
        return self._hosts

    @property
    def crowded(self) -> bool:
        """Whether some host of the group runs 2+ ranks per CPU they may use (group/tuning.py):
        then small all_reduces go through rank 0 ("naive") and commit rounds too (the star),
        the fewest messages. The same on every rank (from the addresses the ranks published);
        False in-process (cl.simulate)."""
        if self._crowded is None:
            self._crowded = tuning.crowded(self.hosts, getattr(self._t, "cpus", None))
        return self._crowded

    @property
    def state(self) -> GroupState:
        return self._state

    @property
    def transport(self) -> Transport:
        """The transport under this group (read it for diagnostics: routes, counters)."""
        return self._t

    @property
    def failure(self) -> CollectiveError | None:
        """The failure the failure detector reported for this group (a PeerFailure, or an
        abort), or None."""
        return self._t.failure

    @property
    def failed_ranks(self) -> tuple[int, ...]:
        """Ranks of this generation reported gone by failure detection, else ()."""
        f = self._t.failure
        if isinstance(f, PeerFailure) and f.generation in (None, self.generation):
            return f.failed_ranks
        return ()

    def __repr__(self) -> str:
        return (
            f"<ProcessGroup rank={self.rank} world_size={self.world_size} "
            f"generation={self.generation}>"
        )

    # --- collectives ------------------------------------------------------------------------------
    @sections(OPS, BUFFER, COMMON)
    def all_reduce(
        self,
        buf: Buffer,
        op: ReduceOp | str = ReduceOp.SUM,
        algorithm: str = "auto",
        async_op: bool = False,
        timeout: float | None = None,
    ) -> Work | None:
        """Reduce `buf` over all ranks, in place, on every rank (bitwise identical everywhere).

        algorithm: "auto" (default) picks from measured crossovers by size, world size and
        hosts (group/tuning.py): "direct" for small buffers ("naive" on a host crowded with
        2+ ranks per CPU: the fewest messages), then "tree", then "ring"; "hierarchical"
        past the direct crossover when the ranks span hosts. Or name one:
        "ring" (reduce-scatter then all-gather, bandwidth-optimal), "tree" (reduce to rank
        0, broadcast back; fewer rounds), "direct" (one round, every rank sends everyone its
        buffer), "naive" (the reference: gather to rank 0, reduce, broadcast),
        "hierarchical" (within each host, then rings among the hosts' leaders),
        "gloo_ring" (the ring in Gloo's summation order: floats equal Gloo's bit for bit)."""
        name = "all_reduce"
        op = as_op(op)
        staged = stage(buf, "buf", name)
        arr = staged.array
        check_op_dtype(op, arr.dtype)
        key = (arr.size, arr.dtype, op, algorithm)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan_all_reduce(name, arr, op, algorithm)
            if len(self._plans) >= _PLANS_MAX:
                self._plans.clear()
            self._plans[key] = plan
        _, fn, desc = plan
        return self._submit(name, desc, timeout, async_op, staged, lambda ch: fn(ch, arr, op))

    def _plan_all_reduce(
        self, name: str, arr: np.ndarray, op: ReduceOp, algorithm: str
    ) -> tuple[str, Any, Descriptor]:
        """(algorithm, function, descriptor) of an all_reduce of `arr`: what "auto" picks
        and the descriptor every message of the op carries (never modified: shared by the
        calls that reuse the plan)."""
        hosts = self.hosts
        if algorithm == "auto":
            algorithm = tuning.all_reduce_algorithm(
                arr.nbytes, self.world_size, hosts, self.crowded
            )
        fn = _pick(ALL_REDUCE, algorithm, name)
        if algorithm in NEEDS_HOSTS:
            fn = functools.partial(fn, hosts=hosts)
        return algorithm, fn, Descriptor(name, arr.size, arr.dtype.str, op.value, algorithm, None)

    @sections(OPS, BUFFER, COMMON)
    def reduce(
        self,
        buf: Buffer,
        dst: int = 0,
        op: ReduceOp | str = ReduceOp.SUM,
        algorithm: str = "auto",
        async_op: bool = False,
        timeout: float | None = None,
    ) -> Work | None:
        """Reduce `buf` over all ranks into `buf` on rank `dst`; other ranks' buffers are kept.

        algorithm: "auto" (default) or "tree" (a binomial tree rooted at `dst`)."""
        name = "reduce"
        op = as_op(op)
        self._check_rank(dst, "dst", name)
        staged = stage(buf, "buf", name)
        arr = staged.array
        check_op_dtype(op, arr.dtype)
        algorithm = "tree" if algorithm == "auto" else algorithm
        _pick(dict.fromkeys(ROOTED), algorithm, name)
        desc = Descriptor(name, arr.size, arr.dtype.str, op.value, algorithm, dst)

        def run(ch: Any) -> None:
            tree.reduce(ch, arr, op, root=dst)
            release(ch, dst)

        return self._submit(name, desc, timeout, async_op, staged, run)

    @sections(BUFFER, COMMON)
    def broadcast(
        self,
        buf: Buffer,
        src: int = 0,
        algorithm: str = "auto",
        async_op: bool = False,
        timeout: float | None = None,
    ) -> Work | None:
        """Copy `buf` from rank `src` into `buf` on every rank.

        algorithm: "auto" (default) or "tree" (a binomial tree rooted at `src`)."""
        name = "broadcast"
        self._check_rank(src, "src", name)
        staged = stage(buf, "buf", name)
        arr = staged.array
        check_op_dtype(ReduceOp.SUM, arr.dtype)
        algorithm = "tree" if algorithm == "auto" else algorithm
        _pick(dict.fromkeys(ROOTED), algorithm, name)
        desc = Descriptor(name, arr.size, arr.dtype.str, None, algorithm, src)

        def run(ch: Any) -> None:
            rooted_broadcast(ch, arr, src)

        return self._submit(name, desc, timeout, async_op, staged, run)

    @sections(BUFFER, COMMON)
    def all_gather(
        self,
        out: Buffer,
        buf: Buffer,
        algorithm: str = "auto",
        async_op: bool = False,
        timeout: float | None = None,
    ) -> Work | None:
        """out[r] = rank r's `buf`, on every rank. `out`'s first axis is world_size (it holds
        world_size x buf.size elements); `buf` is left unchanged.

        algorithm: "auto" (default) or "ring"."""
        name = "all_gather"
        n = self.world_size
        src, dst = stage_in_out(buf, out, name)
        a, o = src.array, dst.array
        check_op_dtype(ReduceOp.SUM, a.dtype)
        shape: tuple[int, ...] = getattr(out, "shape", ())
        if o.size != n * a.size or (len(shape) and shape[0] != n and a.size):
            raise ValueError(
                f"{name}: out must have world_size ({n}) rows of buf's "
                f"{a.size} elements; got shape {tuple(shape)}"
            )
        algorithm = "ring" if algorithm == "auto" else algorithm
        _pick(dict.fromkeys(SCATTER_GATHER), algorithm, name)
        desc = Descriptor(name, a.size, a.dtype.str, None, algorithm, None)
        r = self.rank

        def run(ch: Any) -> None:
            o[r * a.size : (r + 1) * a.size] = a
            ring.all_gather(ch, o)

        return self._submit(name, desc, timeout, async_op, dst, run)

    @sections(OPS, BUFFER, COMMON)
    def reduce_scatter(
        self,
        out: Buffer,
        buf: Buffer,
        op: ReduceOp | str = ReduceOp.SUM,
        algorithm: str = "auto",
        async_op: bool = False,
        timeout: float | None = None,
    ) -> Work | None:
        """out = the reduction over ranks of chunk `rank` of `buf` (buf has world_size chunks
        of out's size: world_size x out.size elements). `buf` is left unchanged.

        algorithm: "auto" (default) or "ring"."""
        name = "reduce_scatter"
        n = self.world_size
        op = as_op(op)
        src, dst = stage_in_out(buf, out, name)
        a, o = src.array, dst.array
        check_op_dtype(op, a.dtype)
        if a.size != n * o.size:
            raise ValueError(
                f"{name}: buf must hold world_size ({n}) x out.size ({o.size}) = "
                f"{n * o.size} elements, got {a.size}"
            )
        algorithm = "ring" if algorithm == "auto" else algorithm
        _pick(dict.fromkeys(SCATTER_GATHER), algorithm, name)
        desc = Descriptor(name, o.size, o.dtype.str, op.value, algorithm, None)
        r = self.rank

        def run(ch: Any) -> None:
            scratch = a.copy()
            ring.reduce_scatter(ch, scratch, op)
            o[...] = scratch[r * o.size : (r + 1) * o.size]

        return self._submit(name, desc, timeout, async_op, dst, run)

    @sections(COMMON)
    def barrier(self, async_op: bool = False, timeout: float | None = None) -> Work | None:
        """Return only when every rank has entered the barrier (a dissemination barrier:
        ceil(log2 world_size) rounds)."""
        desc = Descriptor("barrier", 0, "", None, "dissemination", None)

        def run(ch: Any) -> None:
            if self._membership is not None:
                ch.hold_result()  # nothing to move: the barrier is its own commit round
            barrier_alg.barrier(ch)

        return self._submit("barrier", desc, timeout, async_op, None, run, commit=False)

    def enqueue(self, name: str, fn: Callable[[], object]) -> Work:
        """Run fn() on this group's op thread, after every operation issued before it; the
        operations fn calls (blocking) run inside it, in order. Returns its Work at once. For
        composite operations (the torch backend: several collectives plus copies per call)."""
        self._check_live(name)
        return self._runner.submit(Work(name, fn), async_op=True)

    # --- membership ------------------------------------------------------------------------------
    def reconstruct(self, timeout: float | None = None) -> "ProcessGroup":
        """Collective among the live members: returns the group of live members plus admitted
        joiners (a new object of a later generation -- generation + 1 unless an attempt to
        form one failed -- ranks dense in the order of the old ranks, joiners last), or this
        very group if nothing changed (one coordinator round trip).
        If the next generation cannot form (a member or joiner vanishes meanwhile) it tries
        again with those left; past the timeout it raises PeerFailure, and this group, closed
        by then, may be reconstructed again.

        After a PeerFailure the data of the aborted operation is undefined in the caller's
        buffer: restore it (or redo the op) on the new group. Raises Evicted on a rank that
        was removed from the group."""
        if self._membership is None:
            raise CollectiveError(
                "reconstruct: this group has no coordinator (groups made by "
                "cl.simulate cannot change membership)",
                op="reconstruct",
                rank=self.rank,
            )
        if self._state not in (GroupState.ACTIVE, GroupState.UNFORMED):
            raise CollectiveError(
                "reconstruct: this group was destroyed or already "
                "reconstructed; use the group reconstruct() returned",
                op="reconstruct",
                rank=self.rank,
            )
        timeout = self.timeout if timeout is None else float(timeout)
        self._runner.drain(timeout)
        return self._membership.reconstruct(self, timeout)

    def leave(self) -> None:
        """Leave the group for good (preemption): the others learn it at once, raise
        PeerFailure and reconstruct without this rank. SIGTERM does this too."""
        if self._membership is not None:
            self._membership.leave()
        self._t.interrupt(
            PeerFailure(
                f"rank {self.rank} left the group",
                op="leave",
                rank=self.rank,
                failed_ranks=[self.rank],
                generation=self.generation,
            )
        )

    def retire(self) -> None:
        """This generation is over (reconstruct() regroups): close its sockets, keep the
        coordinator link. Until the next one forms, the group stays UNFORMED."""
        self._move(GroupState.UNFORMED, GroupState.ACTIVE, GroupState.UNFORMED)
        self._runner.stop()
        self._t.close(linger=0)

    def replaced_by(self, new: "ProcessGroup") -> None:
        """The next generation formed: reconstruct() on this group is an error from now on."""
        self._move(GroupState.REPLACED, GroupState.UNFORMED)
        self.successor = new

    def _move(self, to: GroupState, *allowed: GroupState) -> None:
        if self._state not in allowed:
            raise CollectiveError(
                f"process group of rank {self.rank}: cannot go from "
                f"{self._state.name} to {to.name}",
                rank=self.rank,
            )
        self._state = to

    # --- lifecycle -------------------------------------------------------------------------------
    def destroy(self) -> None:
        """Finish queued operations (bounded by the timeout), then close sockets and threads."""
        if self._state not in (GroupState.ACTIVE, GroupState.UNFORMED):
            return  # an UNFORMED group still holds the coordinator link
        self._state = GroupState.DESTROYED
        self._runner.drain(self.timeout)
        self._runner.stop()
        try:
            if self._membership is not None:
                self._membership.leave()  # the others learn at once that this rank is gone
            self._t.close()
        finally:
            if self._on_destroy is not None:
                self._on_destroy()

    def close(self) -> None:
        """Release this process's resources for the group -- op thread, transport sockets,
        and the coordinator link (heartbeat thread, sockets) that every generation built from
        it by reconstruct() shares -- and tell nobody. For a group this rank was evicted
        from, before it rejoins (ElasticTrainer does this): the coordinator has already
        removed the rank and the process is not leaving the job, so destroy()'s leave()
        would announce a departure that is not one, and destroy() would also stop a
        coordinator this process hosts, which the job still needs (it runs on until the
        process ends). Queued ops are not awaited: an evicted group's ops fail anyway.
        Idempotent; destroy() afterwards does nothing. Not for a rank that is still a member
        (of this or a later generation): the others would learn of its absence only at the
        heartbeat timeout."""
        if self._state is GroupState.CLOSED:
            return
        self._state = GroupState.CLOSED
        self._runner.stop()
        self._t.close(linger=0)
        if self._membership is not None:
            self._membership.close_link()

    def __enter__(self) -> "ProcessGroup":
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    # --- internals -------------------------------------------------------------------------------
    def _check_rank(self, r: int, what: str, name: str, allow_self: bool = True) -> None:
        if not isinstance(r, (int, np.integer)) or isinstance(r, bool):
            raise TypeError(f"{name}: {what} must be an int rank, got {type(r).__name__}")
        if not 0 <= r < self.world_size:
            raise ValueError(
                f"{name}: {what}={r} is not a rank of this group (world_size {self.world_size})"
            )
        if not allow_self and r == self.rank:
            raise ValueError(f"{name}: rank {r} cannot {name} to itself")

    def _check_live(self, name: str) -> None:
        if self._state is not GroupState.ACTIVE:
            raise CollectiveError(
                f"{name}: the process group was destroyed", op=name, rank=self.rank
            )

    def _commits(self) -> bool:
        """Whether a collective of this group ends with a commit round (see _submit)."""
        return self._membership is not None and self.world_size > commit_alg.SKIP_AT_MOST

    def _check_timeout(self, name: str, timeout: float | None) -> float:
        if timeout is None:
            timeout = self.timeout
        elif isinstance(timeout, bool) or not isinstance(timeout, (int, float, np.number)):
            raise TypeError(
                f"{name}: timeout must be a number of seconds or None, got {type(timeout).__name__}"
            )
        else:
            timeout = float(timeout)
        if not timeout > 0:
            raise ValueError(f"{name}: timeout must be > 0 seconds, got {timeout}")
        return timeout

    def _note_algorithm(self, desc: Descriptor) -> None:
        """COLLECTIVES_DEBUG=INFO: the algorithm each op kind and size runs, once each."""
        if not log.isEnabledFor(logging.INFO):
            return
        key = (desc.kind, desc.count, desc.dtype, desc.algorithm)
        if key in self._noted or len(self._noted) >= 256:
            return
        self._noted.add(key)
        what = f"{desc.kind} of {desc.count} x {desc.dtype}" if desc.dtype else desc.kind
        log.info(
            "rank %d of generation %d: %s -> %s", self.rank, self.generation, what, desc.algorithm
        )

    def _submit(
        self,
        name: str,
        desc: Descriptor,
        timeout: float | None,
        async_op: bool,
        staged: Any,
        fn: Callable[[Any], object],
        p2p: tuple[int, int, bool] | None = None,
        commit: bool = True,
    ) -> Work | None:
        """Run `fn` over a fresh OpChannel, now or on the group's op thread. A collective of a
        group that survives failures ends with a commit round (algorithms/commit.py), so that
        an op counts on every survivor or on none."""
        self._check_live(name)
        self._note_algorithm(desc)
        commit = commit and p2p is None and self._commits()
        timeout = self._check_timeout(name, timeout)
        with self._issue_lock:
            if p2p is None:
                seq = self._seq
                self._seq += 1
                peer, sending = None, False
            else:
                peer, seq, sending = p2p

        def run() -> None:
            ch = OpChannel(
                self._t, seq, desc, name, timeout, p2p_peer=peer, p2p_send=sending
            ).begin()
            view = ch
            for wrap in self.channel_wrappers:
                view = wrap(view)
            try:
                fn(view)
                if commit:
                    ch.hold_result()
                    commit_alg.commit(ch, star=self.crowded)
                ch.finish()
            except BaseException as exc:
                ch.abandon()
                if not ch.settle_failure(exc):
                    raise
            if staged is not None:
                staged.done()

        if not async_op and (self._runner.idle() or self._runner.on_worker()):
            run()  # nothing queued (or called from a queued op): run here, no hand-off
            return None
        work = self._runner.submit(Work(name, run), async_op)
        return work if async_op else None
