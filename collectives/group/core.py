"""The core of a ProcessGroup: what every part of it shares.

A ProcessGroup (group.py) is the public face; its operations live in collaborators that each
hold this core by reference -- the collectives (collective.py), the exchanges (exchanges.py),
point to point (p2p.py) and registered buffers (alloc.py). The core owns the group's state:
its transport, sequence numbers, op thread, timeout and channel wrappers; its identity (rank,
world size, generation, hosts); the argument checks every method shares; `submit`, the one
path every operation takes to its channel; and the group's life (GroupState), so that each
collaborator sees one small, typed object instead of the whole group.
"""

from __future__ import annotations

import enum
import logging
import threading
from typing import Any, Callable, Protocol

import numpy as np

from . import tuning
from ..algorithms import commit as commit_alg
from ..common import config
from ..common.errors import CollectiveError, PeerFailure
from ..transport.base import Transport
from ..transport.channel import OpChannel
from ..transport.stall import Stall, Stalled
from ..transport.wire import Descriptor, HeaderForms
from ..transport.wrapper import OpView
from . import judge as judging
from .judge import Arbiter, Judge
from .schedbook import ScheduleBook
from .work import OpRunner, Work

log = logging.getLogger("collectives")


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


class MembershipLink(Protocol):
    """What the core calls on the process's membership (membership/lifecycle.py), the link to
    the coordinator that a group able to change has; group.py's Membership adds reconstruct."""

    def leave(self) -> None:
        """Tell the coordinator this rank leaves the job for good."""
        ...

    def close_link(self) -> None:
        """Close the coordinator link and nothing else (ProcessGroup.close)."""
        ...


class GroupCore:
    """The state, checks, op submission and life of one ProcessGroup (group.py), shared by
    reference with the collaborators that implement its operations."""

    def __init__(
        self,
        transport: Transport,
        timeout: float,
        *,
        on_destroy: Callable[[], object] | None = None,
        membership: MembershipLink | None = None,
        judge: Judge | None = None,
        arbiter: Arbiter | None = None,
        schedules: ScheduleBook | None = None,
    ):
        self.transport = transport
        # the schedules the coordinator hands out around slow links, and the op each starts
        # at (schedbook.py): this generation's, read by all_reduce (rerouted.py), written by
        # the membership that made the book and handed it here too (membership/lifecycle.py);
        # a group without a coordinator keeps the default schedules in a book of its own
        if schedules is None:
            schedules = ScheduleBook(transport.generation)
        elif schedules.generation != transport.generation:
            raise ValueError(
                f"process group of rank {transport.rank}: a schedule book of generation "
                f"{schedules.generation} for a transport of generation {transport.generation}"
            )
        self.schedules = schedules
        # the coordinator link of a group that can be rebuilt (membership/lifecycle.py's
        # Membership); None for groups made by cl.simulate
        self.membership = membership
        # who judges a stalled op and settles a failed one (judge.py): the coordinator's
        # client, injected with the membership; None: the peer waited on is blamed, and a
        # failed op is dropped here
        self.judge = judge
        self.arbiter = arbiter
        self.timeout = float(timeout)
        self.timeout = self.check_timeout("timeout", self.timeout)  # once: submit relies on it
        self.seq = 0  # the next collective's sequence number
        self.runner = OpRunner(f"collectives-rank{transport.rank}")
        # numbers operations in issue order (collectives here, point to point in p2p.py)
        self.issue_lock = threading.Lock()
        # callables ch -> ch (tracing, fault injection)
        self.channel_wrappers: list[Callable[[OpView], OpView]] = []
        self._noted: set[tuple[Any, ...]] = set()  # (kind, count, dtype, algorithm) logged at INFO
        self._on_destroy = on_destroy
        self._state = GroupState.ACTIVE
        self._hosts: tuple[int, ...] | None = None
        self._crowded: bool | None = None
        # read here: a bad value fails the group's start
        self._small_spin = config.small_spin()
        self._small_yield = config.small_yield()
        self._spin: float | None = None
        self._spin_yields = False

    # --- identity -------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.transport.rank

    @property
    def world_size(self) -> int:
        return self.transport.size

    @property
    def generation(self) -> int:
        return self.transport.generation

    @property
    def hosts(self) -> tuple[int, ...]:
        """The host of every rank as small ints (ProcessGroup.hosts says how)."""
        if self._hosts is None:  # a transport's host map is fixed once it is connected
            hosts = self.transport.hosts
            if not hosts:
                return (0,) * self.transport.size
            labels: dict[Any, int] = {}
            self._hosts = tuple(labels.setdefault(h, len(labels)) for h in hosts)
        return self._hosts

    @property
    def crowded(self) -> bool:
        """Whether some host runs 2+ ranks per CPU they may use (ProcessGroup.crowded)."""
        if self._crowded is None:
            self._crowded = tuning.crowded(self.hosts, self.transport.cpus)
        return self._crowded

    @crowded.setter
    def crowded(self, value: bool | None) -> None:
        # A benchmark times the other schedule by flipping this; None measures it again.
        self._crowded = value

    @property
    def spin(self) -> float:
        """Seconds a small receive may read its peer's link before it sleeps in a poll:
        config.small_spin where every host has a CPU for each of its ranks (tuning.spins);
        config.small_yield, its CPU given away between reads (spin_yields), where this
        rank's host runs more ranks than CPUs (tuning.yields); else 0."""
        if self._spin is None:
            self._pick_spin()
        assert self._spin is not None
        return self._spin

    @spin.setter
    def spin(self, value: float | None) -> None:
        # A benchmark or a test sets it (a spin that keeps its CPU); None asks the host's
        # CPUs again.
        self._spin = value
        self._spin_yields = False

    @property
    def spin_yields(self) -> bool:
        """Whether a small receive's spin gives its CPU away between reads (see spin)."""
        if self._spin is None:
            self._pick_spin()
        return self._spin_yields

    @spin_yields.setter
    def spin_yields(self, value: bool) -> None:
        # A benchmark or a test sets it, after spin.
        self._spin_yields = value

    def _pick_spin(self) -> None:
        """spin and spin_yields from the hosts' CPUs (see spin)."""
        hosts, cpus = self.hosts, self.transport.cpus
        self._spin_yields = False
        if tuning.spins(hosts, cpus):
            self._spin = self._small_spin
        elif tuning.yields(hosts, cpus, self.transport.rank):
            self._spin, self._spin_yields = self._small_yield, True
        else:
            self._spin = 0.0

    @property
    def state(self) -> GroupState:
        return self._state

    # --- checks ---------------------------------------------------------------------------------
    def check_rank(self, r: int, what: str, name: str, allow_self: bool = True) -> None:
        if not isinstance(r, (int, np.integer)) or isinstance(r, bool):
            raise TypeError(f"{name}: {what} must be an int rank, got {type(r).__name__}")
        if not 0 <= r < self.world_size:
            raise ValueError(
                f"{name}: {what}={r} is not a rank of this group (world_size {self.world_size})"
            )
        if not allow_self and r == self.rank:
            raise ValueError(f"{name}: rank {r} cannot {name} to itself")

    def check_live(self, name: str) -> None:
        if self._state is not GroupState.ACTIVE:
            raise CollectiveError(
                f"{name}: the process group was destroyed", op=name, rank=self.rank
            )

    def commits(self) -> bool:
        """Whether a collective of this group ends with a commit round (see submit)."""
        return self.membership is not None and self.world_size > commit_alg.SKIP_AT_MOST

    def check_timeout(self, name: str, timeout: float | None) -> float:
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

    def note_algorithm(self, desc: Descriptor) -> None:
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

    # --- running an operation -------------------------------------------------------------------
    def submit(
        self,
        name: str,
        desc: Descriptor,
        timeout: float | None,
        async_op: bool,
        staged: Any,
        fn: Callable[..., object],
        p2p: tuple[int, int, bool] | None = None,
        commit: bool = True,
        own_commit: bool = False,
        headers: HeaderForms | None = None,
        args: tuple[Any, ...] = (),
    ) -> Work | None:
        """Run `fn` over a fresh OpChannel (fn(channel, *args)), now or on the group's op
        thread. A collective of a
        group that survives failures ends with a commit round (algorithms/commit.py), so that
        an op counts on every survivor or on none; own_commit: the op's schedule is its own
        commit round (a barrier moves nothing), so its result is held from the start. A
        collective that stalls is judged here, by the group's judge, and one that fails is
        settled here, by its arbiter (judge.py): the channel only reports the stall."""
        if self._state is not GroupState.ACTIVE:
            self.check_live(name)  # raises
        if log.isEnabledFor(logging.INFO):
            self.note_algorithm(desc)
        # commits(), written out: once per op
        commit = (
            commit
            and p2p is None
            and self.membership is not None
            and self.transport.size > commit_alg.SKIP_AT_MOST
        )
        # the group's own timeout was checked when it was set
        timeout = self.timeout if timeout is None else self.check_timeout(name, timeout)
        with self.issue_lock:
            if p2p is None:
                seq = self.seq
                self.seq += 1
                peer, sending = None, False
            else:
                peer, seq, sending = p2p

        def run() -> None:
            ch = OpChannel(
                self.transport,
                seq,
                desc,
                name,
                timeout,
                p2p_peer=peer,
                p2p_send=sending,
                headers=headers,
            ).begin()
            if own_commit and self.membership is not None:
                ch.hold_result()
            if commit:
                ch.commit_owed = True
                ch.commit_star = self._crowded if self._crowded is not None else self.crowded
            ch.spin = self._spin if self._spin is not None else self.spin
            ch.spin_yields = self._spin_yields
            view: OpView = ch
            for wrap in self.channel_wrappers:
                view = wrap(view)
            try:
                stall: Stall | None = None
                try:
                    fn(view, *args)
                    if ch.commit_owed:  # not run by the algorithm's small-op path already
                        ch.hold_result()
                        commit_alg.commit(ch, star=ch.commit_star)
                    ch.finish()
                except Stalled as stalled:
                    stall = stalled.stall  # judged below, outside this handler: the error
                    # the verdict calls for is raised as the op's own, not as a second one
                if stall is not None:  # the op is still in progress, waiting on stall.peer
                    ch.fail_stalled(stall, judging.blame(self.judge, self.transport, ch, stall))
            except BaseException as exc:
                ch.abandon()
                if not judging.settle(self.arbiter, self.transport, ch, exc):
                    raise
            if staged is not None:
                staged.done()

        if not async_op and (self.runner.idle() or self.runner.on_worker()):
            run()  # nothing queued (or called from a queued op): run here, no hand-off
            return None
        work = self.runner.submit(Work(name, run), async_op)
        return work if async_op else None

    def enqueue(self, name: str, fn: Callable[[], object]) -> Work:
        """Run fn() on the op thread after every operation issued before it (ProcessGroup)."""
        self.check_live(name)
        return self.runner.submit(Work(name, fn), async_op=True)

    # --- life -----------------------------------------------------------------------------------
    def prepare_reconstruct(self, timeout: float | None) -> float:
        """reconstruct()'s checks, then this generation's queue drained: the timeout to give
        the membership, which forms the next generation (ProcessGroup.reconstruct)."""
        if self.membership is None:
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
        self.runner.drain(timeout)
        return timeout

    def interrupt(self, failure: CollectiveError) -> None:
        """The group is broken: the op in flight and every later one raise `failure`, whether
        it waits on the transport or on a schedule's decision (the book)."""
        self.transport.interrupt(failure)
        self.schedules.interrupt(failure)

    def leave(self) -> None:
        if self.membership is not None:
            self.membership.leave()
        self.interrupt(
            PeerFailure(
                f"rank {self.rank} left the group",
                op="leave",
                rank=self.rank,
                failed_ranks=[self.rank],
                generation=self.generation,
            )
        )

    def retire(self) -> None:
        self.move(GroupState.UNFORMED, GroupState.ACTIVE, GroupState.UNFORMED)
        self.runner.stop()
        self.transport.close(linger=0)

    def move(self, to: GroupState, *allowed: GroupState) -> None:
        if self._state not in allowed:
            raise CollectiveError(
                f"process group of rank {self.rank}: cannot go from "
                f"{self._state.name} to {to.name}",
                rank=self.rank,
            )
        self._state = to

    def destroy(self) -> None:
        if self._state not in (GroupState.ACTIVE, GroupState.UNFORMED):
            return  # an UNFORMED group still holds the coordinator link
        self._state = GroupState.DESTROYED
        self.runner.drain(self.timeout)
        self.runner.stop()
        try:
            if self.membership is not None:
                self.membership.leave()  # the others learn at once that this rank is gone
            self.transport.close()
        finally:
            if self._on_destroy is not None:
                self._on_destroy()

    def close(self) -> None:
        if self._state is GroupState.CLOSED:
            return
        self._state = GroupState.CLOSED
        self.runner.stop()
        self.transport.close(linger=0)
        if self.membership is not None:
            self.membership.close_link()
