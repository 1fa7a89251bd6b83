"""ProcessGroup: the torch-shaped methods users call.

This is the public face of a group, with the signatures and the docstrings help() shows. The
work is done by collaborators it holds, each over the group's core (core.py: state, checks,
op submission, life): the collectives (collective.py), the exchanges (exchanges.py), point to
point (p2p.py) and registered buffers (alloc.py). Each method checks its arguments before any
byte moves, describes the operation in a descriptor that travels in every message header, and
runs it over an OpChannel for this one operation. Everything about sockets lives in the
transport.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import numpy as np

from .alloc import Allocations, is_registered
from .collective import ALL_REDUCE, ROOTED, SCATTER_GATHER, Collectives
from . import rerouted
from .core import GroupCore, GroupState, MembershipLink
from .exchanges import Exchanges
from .judge import Arbiter, Judge
from .p2p import PointToPoint
from .schedbook import ScheduleBook
from ..common.apidoc import BUFFER, COMMON, OPS, sections
from ..common.errors import CollectiveError, PeerFailure
from ..common.ops import ReduceOp
from ..common.types import Buffer
from ..transport.base import Transport
from ..transport.wrapper import OpView
from .work import Work

# The algorithm tables stay importable from here, beside the docstrings that name them.
__all__ = ["ALL_REDUCE", "ROOTED", "SCATTER_GATHER", "GroupState", "Membership", "ProcessGroup"]


class Membership(MembershipLink, Protocol):
    """What a group calls on the membership of its process (membership/lifecycle.py): the
    group knows nothing of membership/, only this."""

    def reconstruct(
        self, pg: ProcessGroup, timeout: float, *, exclude: tuple[int, ...] = ()
    ) -> ProcessGroup:
        """The next generation of `pg`, or `pg` itself if nothing changed
        (ProcessGroup.reconstruct)."""
        ...


class ProcessGroup:
    """A group of `world_size` ranks. Create with init_process_group (or simulate)."""

    def __init__(
        self,
        transport: Transport,
        timeout: float = 30.0,
        *,
        on_destroy: Callable[[], object] | None = None,
        membership: Membership | None = None,
        judge: Judge | None = None,
        arbiter: Arbiter | None = None,
        schedules: ScheduleBook | None = None,
    ):
        """judge, arbiter: who judges a stalled op and settles a failed one (judge.py);
        without them the peer waited on is blamed, and a failed op is dropped here.
        schedules: the generation's schedule book (schedbook.py), which the membership
        writes; None: a book of the group's own, which keeps the default schedules."""
        core = GroupCore(
            transport,
            timeout,
            on_destroy=on_destroy,
            membership=membership,
            judge=judge,
            arbiter=arbiter,
            schedules=schedules,
        )
        self._core = core
        self._member = membership
        self._collectives = Collectives(core)
        self._exchanges = Exchanges(core)
        self._p2p = PointToPoint(core)
        self._alloc = Allocations(core)
        self.successor: ProcessGroup | None = None  # the group that replaced this one

    # --- identity -------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._core.rank

    @property
    def world_size(self) -> int:
        return self._core.world_size

    @property
    def generation(self) -> int:
        return self._core.generation

    def size(self) -> int:
        return self._core.world_size

    @property
    def hosts(self) -> tuple[int, ...]:
        """The host of every rank as small ints, numbered in order of each host's lowest rank
        (ranks 0 and 1 on one host, 2 on another: (0, 0, 1)); the same tuple on every rank.
        From the transport: the address each rank published over ZeroMQ, the host map given
        to cl.simulate in-process (default: one host)."""
        return self._core.hosts

    @property
    def crowded(self) -> bool:
        """Whether some host of the group runs 2+ ranks per CPU they may use (group/tuning.py):
        then small all_reduces go through rank 0 ("naive") and commit rounds too (the star),
        the fewest messages. The same on every rank (from the addresses the ranks published);
        False in-process (cl.simulate)."""
        return self._core.crowded

    @property
    def rerouted(self) -> str | None:
        """The schedule all_reduce runs around slow links, as the coordinator chose it for
        every rank (group/rerouted.py: "ring over 0 -> 2 -> 1 -> 3 -> 0, avoiding 0->1"), or
        None while the default schedules run."""
        return rerouted.describe(self._core.schedules)

    @property
    def state(self) -> GroupState:
        return self._core.state

    @property
    def transport(self) -> Transport:
        """The transport under this group (read it for diagnostics: routes, counters)."""
        return self._core.transport

    @property
    def failure(self) -> CollectiveError | None:
        """The failure the failure detector reported for this group (a PeerFailure, or an
        abort), or None."""
        return self._core.transport.failure

    @property
    def failed_ranks(self) -> tuple[int, ...]:
        """Ranks of this generation reported gone by failure detection, else ()."""
        f = self._core.transport.failure
        if isinstance(f, PeerFailure) and f.generation in (None, self.generation):
            return f.failed_ranks
        return ()

    @property
    def timeout(self) -> float:
        """Seconds an operation may take unless it says otherwise (init_process_group's
        `timeout`); assign to change it for the operations issued from then on."""
        return self._core.timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        # checked here, once, so that an op issued without a timeout of its own need not
        self._core.timeout = self._core.check_timeout("timeout", value)

    @property
    def channel_wrappers(self) -> list[Callable[[OpView], OpView]]:
        """Callables ch -> ch that each operation's channel passes through before the
        algorithm sees it (tracing, fault injection: transport/wrapper.py); append to it."""
        return self._core.channel_wrappers

    @channel_wrappers.setter
    def channel_wrappers(self, value: list[Callable[[OpView], OpView]]) -> None:
        self._core.channel_wrappers = value

    def __repr__(self) -> str:
        return (
            f"<ProcessGroup rank={self.rank} world_size={self.world_size} "
            f"generation={self.generation}>"
        )

    # --- collectives (collective.py) ------------------------------------------------------------
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
        0, broadcast back: 2 ceil(log2 n) rounds, 2 floor(log2 n) messages deep, against the
        ring's 2(n-1)),
        "direct" (one message deep, every rank sends everyone its buffer), "naive" (the
        reference: gather to rank 0, reduce, broadcast),
        "hierarchical" (within each host, then rings among the hosts' leaders),
        "gloo_ring" (the ring in Gloo's summation order: floats equal Gloo's bit for bit),
        "halving_doubling" (recursive halving then doubling: the tree's rounds and the
        ring's bytes when the world size is a power of two), "double_tree" (two binary
        trees, each reducing and broadcasting half the buffer in pipelined segments)."""
        return self._collectives.all_reduce(buf, op, algorithm, async_op, timeout)

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
        return self._collectives.reduce(buf, dst, op, algorithm, async_op, timeout)

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
        return self._collectives.broadcast(buf, src, algorithm, async_op, timeout)

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
        return self._collectives.all_gather(out, buf, algorithm, async_op, timeout)

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
        return self._collectives.reduce_scatter(out, buf, op, algorithm, async_op, timeout)

    @sections(COMMON)
    def barrier(self, async_op: bool = False, timeout: float | None = None) -> Work | None:
        """Return only when every rank has entered the barrier (a dissemination barrier:
        ceil(log2 world_size) rounds)."""
        return self._collectives.barrier(async_op, timeout)

    # --- exchanges (exchanges.py) ---------------------------------------------------------------
    @sections(BUFFER, COMMON)
    def all_to_all(
        self,
        out: Buffer,
        buf: Buffer,
        out_splits: Sequence[int] | None = None,
        in_splits: Sequence[int] | None = None,
        algorithm: str = "auto",
        async_op: bool = False,
        timeout: float | None = None,
    ) -> Work | None:
        """Rank r sends block p of `buf` to rank p, and block p of `out` receives what rank p
        sent to r (MPI_Alltoall). Without splits the blocks are equal: `buf` and `out` have
        world_size rows (first axis) of the same size. With splits the blocks may differ
        (MPI_Alltoallv, torch's all_to_all_single with split sizes): `in_splits[p]` elements
        of the flattened `buf` go to rank p, in rank order, and `out_splits[p]` elements come
        from rank p; a side given as None is cut into equal blocks. Every rank uses the same
        form (all pass splits, or none), and rank p's in_splits[r] must equal rank r's
        out_splits[p] (else CollectiveMismatch on every rank). `buf` is left unchanged; `out`
        and `buf` must not overlap.

        algorithm: "auto" (default) or "pairwise" (world_size - 1 rounds of exchanges)."""
        return self._exchanges.all_to_all(
            out, buf, out_splits, in_splits, algorithm, async_op, timeout
        )

    @sections(BUFFER, COMMON)
    def gather(
        self,
        out: Buffer | None,
        buf: Buffer,
        dst: int = 0,
        algorithm: str = "auto",
        async_op: bool = False,
        timeout: float | None = None,
    ) -> Work | None:
        """out[r] = rank r's `buf`, on rank `dst` only. On `dst`, `out` has world_size rows
        (first axis) of buf's size; elsewhere it is not used (pass None).

        algorithm: "auto" (default) or "linear" (every rank sends to `dst`)."""
        return self._exchanges.gather(out, buf, dst, algorithm, async_op, timeout)

    @sections(BUFFER, COMMON)
    def scatter(
        self,
        out: Buffer,
        buf: Buffer | None = None,
        src: int = 0,
        algorithm: str = "auto",
        async_op: bool = False,
        timeout: float | None = None,
    ) -> Work | None:
        """out = row `rank` of `buf` on rank `src`. On `src`, `buf` has world_size rows (first
        axis) of out's size; elsewhere it is not used (pass None).

        algorithm: "auto" (default) or "linear" (`src` sends to every rank)."""
        return self._exchanges.scatter(out, buf, src, algorithm, async_op, timeout)

    # --- point to point (p2p.py) ----------------------------------------------------------------
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
        return self._p2p.send(buf, dst, async_op, timeout, tag)

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
        return self._p2p.recv(buf, src, async_op, timeout, tag)

    def recv_any(self, buf: Buffer, tag: int = 0, timeout: float | None = None) -> int:
        """Receive into `buf` the next message of whichever rank's message arrives first
        (MPI_ANY_SOURCE; torch's recv without src) and return that rank. Blocking. Each
        rank's messages still come in the order it sent them (transport/anysource.py)."""
        return self._p2p.recv_any(buf, tag, timeout)

    # --- registered buffers (alloc.py) ----------------------------------------------------------
    def alloc(self, shape: int | tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        """A zero-filled numpy array that same-host peers read in place in collectives
        (registered shared memory) where this group's transport can lend it, else ordinary
        memory. Use it like any array; results are the same bytes either way."""
        return self._alloc.alloc(shape, dtype)

    def alloc_tensor(self, shape: int | tuple[int, ...], dtype: Any = None) -> Any:
        """alloc() as a CPU torch tensor (torch.from_numpy over the same memory). dtype: a
        torch dtype (default torch.float32). Requires torch to be imported."""
        return self._alloc.alloc_tensor(shape, dtype)

    @staticmethod
    def is_registered(buf: Any) -> bool:
        """True if `buf` (numpy array or CPU tensor) lives in registered shared memory."""
        return is_registered(buf)

    def enqueue(self, name: str, fn: Callable[[], object]) -> Work:
        """Run fn() on this group's op thread, after every operation issued before it; the
        operations fn calls (blocking) run inside it, in order. Returns its Work at once. For
        composite operations (the torch backend: several collectives plus copies per call)."""
        return self._core.enqueue(name, fn)

    # --- membership (core.py: GroupState) -------------------------------------------------------
    def reconstruct(
        self, timeout: float | None = None, *, exclude: Sequence[int] = ()
    ) -> "ProcessGroup":
        """Collective among the live members: returns the group of live members plus admitted
        joiners (a new object of a later generation -- generation + 1 unless an attempt to
        form one failed -- ranks dense in the order of the old ranks, joiners last), or this
        very group if nothing changed (one coordinator round trip).
        If the next generation cannot form (a member or joiner vanishes meanwhile) it tries
        again with those left; past the timeout it raises PeerFailure, and this group, closed
        by then, may be reconstructed again.

        After a PeerFailure the data of the aborted operation is undefined in the caller's
        buffer: restore it (or redo the op) on the new group. Raises Evicted on a rank that
        was removed from the group.

        exclude: ranks of this group to drop now, alive or not (torch's shrink_group). Every
        member outside the list calls with the same list; once all have, the live ranks in
        it are removed at once (their next operation raises Evicted) and the group forms
        without waiting for them. Lists that differ: every caller gets CollectiveError naming
        them, and nothing changes."""
        timeout = self._core.prepare_reconstruct(timeout)
        drop = tuple(sorted(set(exclude)))
        for r in drop:
            if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < self.world_size:
                raise ValueError(
                    f"reconstruct: rank {self.rank}: exclude names {r!r}, not a rank of the "
                    f"group (world_size {self.world_size})"
                )
        if self.rank in drop:
            raise ValueError(f"reconstruct: rank {self.rank} cannot exclude itself")
        assert self._member is not None  # prepare_reconstruct raised otherwise
        return self._member.reconstruct(self, timeout, exclude=drop)

    def interrupt(self, failure: CollectiveError) -> None:
        """Make the operation in flight and every later one raise `failure` now (an abort):
        a wait on the transport and a wait for a schedule's decision alike."""
        self._core.interrupt(failure)

    def leave(self) -> None:
        """Leave the group for good (preemption): the others learn it at once, raise
        PeerFailure and reconstruct without this rank. SIGTERM does this too."""
        self._core.leave()

    def retire(self) -> None:
        """This generation is over (reconstruct() regroups): close its sockets, keep the
        coordinator link. Until the next one forms, the group stays UNFORMED."""
        self._core.retire()

    def replaced_by(self, new: "ProcessGroup") -> None:
        """The next generation formed: reconstruct() on this group is an error from now on."""
        self._core.move(GroupState.REPLACED, GroupState.UNFORMED)
        self.successor = new

    # --- lifecycle ------------------------------------------------------------------------------
    def destroy(self) -> None:
        """Finish queued operations (bounded by the timeout), then close sockets and threads."""
        self._core.destroy()

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
        self._core.close()

    def __enter__(self) -> "ProcessGroup":
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    # --- internals that tests, benchmarks and examples read -------------------------------------
    @property
    def _seq(self) -> int:
        """The next collective's sequence number (fault injection targets "@op=N")."""
        return self._core.seq

    @property
    def _plans(self) -> dict[Any, Any]:
        """all_reduce's plans: which algorithm "auto" chose per size, dtype and op."""
        return self._collectives.plans

    @property
    def _membership(self) -> Membership | None:
        return self._member

    def _commits(self) -> bool:
        """Whether a collective of this group ends with a commit round."""
        return self._core.commits()

    @property
    def _crowded(self) -> bool:
        return self._core.crowded

    @_crowded.setter
    def _crowded(self, value: bool | None) -> None:
        self._core.crowded = value  # a benchmark times the other schedule's commit round

    @property
    def _spin(self) -> float:
        return self._core.spin

    @_spin.setter
    def _spin(self, value: float | None) -> None:
        self._core.spin = value  # a benchmark or a test: small receives spin this long

    @property
    def _spin_yields(self) -> bool:
        return self._core.spin_yields

    @_spin_yields.setter
    def _spin_yields(self, value: bool) -> None:
        self._core.spin_yields = value  # a benchmark or a test: that spin gives its CPU away
