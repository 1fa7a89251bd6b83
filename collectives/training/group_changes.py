"""How an ElasticTrainer (elastic.py) follows its group through changes: joiners admitted at
a step boundary (every `admit_every` iterations, or grow()), recovery after a failure
(reconstruct, or rejoin when evicted), the state re-synchronised from the most advanced
member, and every change recorded once. The rules are in elastic.py's docstring. The trainer
holds one GroupChanges (ElasticTrainer.group_changes) and calls it at step boundaries and
after a failure."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ..common.errors import CollectiveError, Evicted, PeerFailure
from ..common.ops import ReduceOp
from ..group.group import GroupState, ProcessGroup
from .data_parallel import DataParallel
from .progress import TrainingProgress
from .state import decode_state, encode_state

log = logging.getLogger("collectives.elastic")


class Trainee(Protocol):
    """What GroupChanges reads and swaps of its trainer (elastic.py, ElasticTrainer)."""

    pg: ProcessGroup  # the trainer's group: swapped on every change
    dp: DataParallel  # ... and its DataParallel's (set_group)
    admit_every: int  # iterations between admissions; set to 0 where nobody can be admitted
    max_recoveries: int
    rejoin: Callable[[], ProcessGroup] | None  # a new group for an evicted rank, if allowed
    display: TrainingProgress  # where a change is reported
    step: int  # committed optimizer steps
    preempted: bool  # SIGTERM came: leave instead of recovering

    @property
    def iters(self) -> int: ...

    def leave(self) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class GroupChanges:
    """An ElasticTrainer's group changes. Owns the admission schedule (last_admit), whether
    this rank still needs the group's state (need_state) and the record of every change
    (changes); swaps the trainer's group (pg, and its DataParallel's) on each change."""

    def __init__(self, trainer: Trainee, need_state: bool):
        self.trainer = trainer
        self.need_state = need_state  # True until this rank has received the group's state
        self.last_admit = 0  # the iteration joiners were last let in at
        self.changes: list[dict] = []  # one dict per group change (for reports and tests)

    def maybe_admit(self, force=False):
        """Every admit_every iterations, let waiting joiners in (cheap when there are none)."""
        tr = self.trainer
        if not tr.admit_every or not hasattr(tr.pg, "reconstruct"):
            return
        if not force and (
            tr.iters == 0 or tr.iters % tr.admit_every or tr.iters == self.last_admit
        ):
            return
        self.last_admit = tr.iters
        t0 = time.monotonic()
        old = tr.pg
        try:
            new = old.reconstruct()
        except CollectiveError as exc:
            if isinstance(exc, PeerFailure) or old.state is GroupState.UNFORMED:
                # a failure, or the group was closed for a next generation that did not
                # form: never go on with it (ElasticTrainer._guarded recovers from what it can)
                raise
            # a group without a coordinator (cl.simulate) cannot admit anyone: stop asking
            log.info("not admitting joiners: %s", exc)
            tr.admit_every = 0
            return
        if new is not old and (
            new.generation != old.generation or new.world_size != old.world_size
        ):
            # Somebody left between two collectives (e.g. preempted): the old group's failure
            # notice, if it came before the regroup, names them.
            left = old.failed_ranks
            self._adopt(new)
            self.sync_state(joiner=False)
            self._record(
                old,
                new,
                left,
                t0,
                "left at a step boundary"
                if left
                else "admitted joiner(s)"
                if new.world_size > old.world_size
                else "membership changed at a step boundary",
            )

    def grow(self, world_size: int, timeout: float = 60.0, interval: float = 0.2) -> bool:
        """ElasticTrainer.grow (elastic.py): reconstruct every `interval` s until the group
        has `world_size` members or `timeout` passes; True if it did."""
        tr = self.trainer
        for _ in range(max(1, int(timeout / interval))):
            if tr.pg.world_size >= world_size:
                return True
            self.last_admit = -1
            t0, old = time.monotonic(), tr.pg
            new = old.reconstruct()
            if new is not old:
                self._adopt(new)
                self.sync_state(joiner=False)
                self._record(old, new, (), t0, "admitted joiner(s)")
            else:
                time.sleep(interval)
        return tr.pg.world_size >= world_size

    def recover(self, exc, t_iter):
        """Reconstruct (or, if evicted, rejoin), then re-synchronise. A further PeerFailure
        while doing so starts over, at most max_recoveries times; a rejoin that is not admitted
        in time (CollectiveTimeout from init_process_group) is final and raised."""
        tr = self.trainer
        t0 = time.monotonic()
        detect = t0 - t_iter if t_iter is not None else 0.0
        first = tr.pg
        if not isinstance(exc, Evicted):
            # what ended the step, as this rank saw it; the step is done again on the new group
            tr.display.write(
                f"[collectives] rank {first.rank} of generation {first.generation}: "
                f"iteration {tr.iters} dropped: {type(exc).__name__}: {exc}"
            )
        left = tuple(getattr(exc, "failed_ranks", ()))
        evicted = False
        for _ in range(tr.max_recoveries):
            if tr.preempted:  # SIGTERM meanwhile: leave instead of recovering
                tr.leave()
                return
            try:
                if isinstance(exc, Evicted):
                    if tr.rejoin is None:
                        raise exc
                    evicted = True
                    self.need_state = True
                    if not self._rejoin():  # SIGTERM while waiting to be readmitted
                        return
                    self.sync_state(joiner=True)
                else:
                    self._adopt(tr.pg.reconstruct())
                    self.sync_state(joiner=self.need_state)
                break
            except PeerFailure as again:
                if again is exc:
                    raise
                exc = again
                left += tuple(getattr(again, "failed_ranks", ()))
        else:
            raise exc
        self._record(
            first,
            tr.pg,
            () if evicted else left,
            t0,
            "evicted, rejoined" if evicted else type(exc).__name__,
            detect,
        )

    def _rejoin(self) -> bool:
        """This rank was evicted: close the old group and join again as a new member. The old
        group is closed, not destroyed (ProcessGroup.close): its heartbeat thread and sockets
        go, but no departure is announced (the process stays) and a coordinator this process
        hosts keeps running. False if preempted meanwhile: SIGTERM during the admission wait
        abandons it (init.py), and after admission this rank leaves the new group at once."""
        tr = self.trainer
        close = getattr(tr.pg, "close", None)
        if close is not None:
            close()
        if tr.preempted:  # SIGTERM already: do not start a wait to abandon
            return False
        try:
            new = tr.rejoin()  # type: ignore[misc]  # not None: recover checked
        except CollectiveError:
            if tr.preempted:  # the abandoned join raised, its request withdrawn
                return False
            raise
        self._adopt(new)
        if tr.preempted:  # SIGTERM after admission: the handler left the old group
            tr.leave()
            return False
        return True

    def _adopt(self, pg):
        tr = self.trainer
        tr.pg = pg
        tr.dp.set_group(pg)

    def _record(self, old, new, left, t0, why, detect=0.0):
        """`detect`: seconds from the start of the failed iteration to the error (the wait
        for failure detection); recovery: from the error to the state re-synchronised."""
        tr = self.trainer
        dt = time.monotonic() - t0
        survivors = old.world_size - len(set(left))
        joined = max(0, new.world_size - survivors)
        change = {
            "from_generation": old.generation,
            "generation": new.generation,
            "left": sorted(set(left)),
            "joined": joined,
            "from_world_size": old.world_size,
            "world_size": new.world_size,
            "recovery_s": dt,
            "detect_s": detect,
            "step": tr.step,
            "reason": why,
        }
        self.changes.append(change)
        lost = f", detected after {detect:.3f} s" if detect else ""
        msg = (
            f"[collectives] group change gen {old.generation} -> {new.generation}: "
            f"left (old ranks) {sorted(set(left)) or 'none'}, joined {joined}, world size "
            f"{old.world_size} -> {new.world_size}, recovery {dt:.3f} s{lost} at step "
            f"{tr.step} ({why}); now rank {new.rank}"
        )
        if new.rank == 0:
            tr.display.write(msg)  # one line per change, from the new group's rank 0
        else:
            log.info(msg)

    def sync_state(self, joiner: bool) -> bool:
        """Make every member hold the state of the most advanced one (see module docstring)."""
        tr = self.trainer
        pg = tr.pg
        big = np.iinfo(np.int64).max // 4
        mine = -1 if joiner else tr.iters
        v = np.array([mine, -big if joiner else -mine, 1 if joiner else 0], np.int64)
        pg.all_reduce(v, op=ReduceOp.MAX)
        most, least, any_joiner = int(v[0]), int(-v[1]), int(v[2])
        if not any_joiner and most == least:
            self.last_admit = tr.iters
            self.need_state = False
            return False
        who = np.array([pg.rank if (not joiner and tr.iters == most) else big], np.int64)
        pg.all_reduce(who, op=ReduceOp.MIN)
        src = int(who[0])
        if pg.rank == src:
            header, payload = encode_state(tr.state_dict())
            sizes = np.array([len(header), len(payload)], np.int64)
        else:
            sizes = np.zeros(2, np.int64)
        pg.broadcast(sizes, src=src)
        hbuf = (
            np.frombuffer(header, np.uint8).copy()
            if pg.rank == src
            else np.empty(int(sizes[0]), np.uint8)
        )
        pbuf = (
            np.frombuffer(payload, np.uint8).copy()
            if pg.rank == src
            else np.empty(int(sizes[1]), np.uint8)
        )
        pg.broadcast(hbuf, src=src)
        if pbuf.size:
            pg.broadcast(pbuf, src=src)
        if pg.rank != src:
            tr.load_state_dict(decode_state(hbuf.tobytes(), pbuf))
        self.need_state = False
        # the admission schedule restarts here on every member alike (a rejoined rank's own
        # memory of the last admission would otherwise differ from the members')
        self.last_admit = tr.iters
        return True
