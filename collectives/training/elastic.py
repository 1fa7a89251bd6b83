"""ElasticTrainer: data-parallel training that keeps going when members die, leave or join.

    pg = cl.init_process_group()
    trainer = cl.ElasticTrainer(model, optimizer, pg, (X, y), global_batch=64, epochs=5)
    summary = trainer.fit()

One step, on every member of the current group:
  1. take this rank's shard of the next global batch (rule below), forward, backward;
  2. all-reduce the gradients (DataParallel, ReduceOp.AVG in flat buckets);
  3. commit vote: every member contributes flag=1 if its step is sound (finite loss); the
     optimizer steps only if *all* flags are 1 (the vote is MIN over the flags; it rides in the
     same all_reduce as the loss/accuracy statistics, as a SUM compared to the world size, to
     save one round trip per step);
  4. a cl.PeerFailure anywhere in 1-3 drops the step: no optimizer step, no position advance.
     The survivors call pg.reconstruct(), then re-synchronise (below) and carry on from the
     model they hold -- no restart, no reload from disk.

Sharding rule (why no sample is skipped or used twice within an epoch):
  - epoch e visits the samples in the order perm_e = RandomState(seed + e).permutation(N),
    identical on every rank;
  - the trainer state holds the global position `pos` in perm_e; a step consumes the next
    global batch perm_e[pos:pos + B] (B = global_batch, independent of the world size), and
    rank r of k takes the contiguous slice [r*b//k, (r+1)*b//k) of it (b = len of that batch);
  - `pos` advances by b only when the step completes (committed or skipped by the vote), so a
    step lost to a failure is redone with the same samples, re-split over the new world size.
  Each rank's loss is sum(per-sample loss) * k / b, so the AVG over ranks is exactly the mean
  over the global batch whatever k is: training is the same function of the data at 1 or 4 ranks.

Re-synchronisation after every group change (and for joiners before their first step):
  every member contributes its progress (completed iterations) to an all_reduce MAX; if all
  agree and nobody is a joiner, nothing moves. Otherwise the lowest rank with the most progress
  broadcasts model, optimizer state and trainer position (msgpack skeleton + raw tensor bytes;
  no pickle) and everybody adopts it. This also settles the one race a vote cannot: a failure
  during the vote's own all_reduce can leave some survivors committed and others not; they
  all adopt the committed state.

Joiners: started with cl.init_process_group(join=True) and ElasticTrainer(..., joiner=True);
members call pg.reconstruct() every `admit_every` iterations (a cheap coordinator round trip
when nothing changed), which admits waiting joiners. An evicted rank (cl.Evicted) rejoins as a
joiner if `rejoin` (a callable returning a new group) is given, else it re-raises; it first
closes the group it was evicted from (ProcessGroup.close: sockets and heartbeat thread go,
no departure is announced), so evictions do not pile up threads and sockets.
Preemption: SIGTERM (handler installed by fit(), replacing the library's exit-on-SIGTERM one
until fit() returns; a rejoin adds none, and the library's, one per process, leaves whatever
group the process is in when it runs) calls pg.leave() at once, so the others learn it
without waiting for a heartbeat timeout; an op of this rank in flight fails, a recovery in
progress is abandoned (a preempted rank never rejoins; one that waits to be readmitted stops
waiting within 0.1 s and withdraws its join request), and fit() returns at the step boundary
with summary["left"] = True (the process is not killed: the script decides what to do).

Every group change is logged once, by the new group's rank 0, and kept in trainer.changes:
who left (old ranks), how many joined, the world sizes, "detected after" (from the start of
the failed iteration to the error: the failure detection wait) and "recovery" (from the
error to training again: reconstruct + state re-synchronisation).

Checkpoint (optional): rank 0 writes `checkpoint` at the end of every epoch, atomically
(torch.save to a temporary file in the same directory, then os.replace). With resume=True a
rank that finds the file loads it; the first re-synchronisation spreads it.

This file holds the loop, the trainer's state and preemption. The trainer holds two parts
and calls them: group_changes.py (GroupChanges) follows the group through its changes
(admission, recovery, re-synchronisation) and keeps their record; progress.py
(TrainingProgress) shows the progress.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Callable  # noqa: F401  (Any: in a type comment below)

import numpy as np
import torch
import torch.nn.functional as F

from ..common.errors import CollectiveTimeout, PeerFailure
from ..group.group import ProcessGroup
from ..common.ops import ReduceOp
from .data_parallel import DataParallel
from .group_changes import GroupChanges
from .progress import TrainingProgress


def shard_bounds(batch_len: int, world_size: int, rank: int) -> tuple[int, int]:
    """Rank `rank`'s slice [lo, hi) of a global batch of `batch_len` samples."""
    return rank * batch_len // world_size, (rank + 1) * batch_len // world_size


def _sum_loss(out, target):
    return F.cross_entropy(out, target, reduction="sum")


class ElasticTrainer:
    """See the module docstring. `data` is (inputs, targets), indexable by a LongTensor."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        pg: ProcessGroup,
        data: tuple,
        *,
        global_batch: int = 64,
        epochs: int = 1,
        seed: int = 0,
        loss_fn: Callable = _sum_loss,
        bucket_mb: float = 25.0,
        overlap: bool = True,
        checkpoint: str | None = None,
        resume: bool = False,
        progress: bool = True,
        admit_every: int = 10,
        on_step: Callable | None = None,
        rejoin: Callable | None = None,
        joiner: bool = False,
        max_steps: int | None = None,
        max_recoveries: int = 20,
    ) -> None:
        if global_batch < 1:
            raise ValueError(f"ElasticTrainer: global_batch must be >= 1, got {global_batch}")
        self.model, self.optimizer, self.pg = model, optimizer, pg
        self.inputs, self.targets = data
        self.n = len(self.inputs)
        self.global_batch, self.epochs, self.seed = global_batch, epochs, seed
        self.loss_fn = loss_fn
        self.checkpoint, self.progress = checkpoint, progress
        self.admit_every, self.on_step, self.rejoin = admit_every, on_step, rejoin
        self.max_steps, self.max_recoveries = max_steps, max_recoveries
        self.joiner = joiner
        # trainer position: this is what a joiner receives with the model
        self.epoch = 0
        self.pos = 0  # global position in this epoch's permutation
        self.step = 0  # committed optimizer steps
        self.skipped = 0  # iterations the vote rejected
        self.left = False
        self._left_group = None  # type: ProcessGroup | None  # left by leave() (rejoin: a new one)
        self.preempted = False
        self._t_iter: float | None = None  # when this iteration started (time lost to a fault)
        self._old_sigterm = None  # type: Any
        self.group_changes = GroupChanges(self, need_state=joiner)
        self.display = TrainingProgress(self)
        # A joiner must not take part in the start-up broadcast: the members are not doing one.
        self.dp = DataParallel(
            model, pg, bucket_mb=bucket_mb, overlap=overlap, sync_on_init=not joiner
        )
        if resume and checkpoint and os.path.exists(checkpoint):
            self.load_state_dict(torch.load(checkpoint))

    # --- the loop ------------------------------------------------------------------------------
    @property
    def iters(self) -> int:
        return self.step + self.skipped

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.n // self.global_batch)

    @property
    def changes(self) -> list[dict]:
        """One dict per group change (group_changes.py, GroupChanges._record)."""
        return self.group_changes.changes

    def grow(self, world_size: int, timeout: float = 60.0, interval: float = 0.2) -> bool:
        """Collective among the members: reconstruct every `interval` s until the group has
        `world_size` members (joiners admitted) or `timeout` passes; True if it did. Every
        member makes the same number of attempts (each reconstruct returns the same group to
        all), so they stop together."""
        return self.group_changes.grow(world_size, timeout, interval)

    def fit(self) -> dict:
        self._install_sigterm()
        try:
            changes = self.group_changes
            self._guarded(lambda: changes.sync_state(joiner=changes.need_state))
            self.joiner = False
            while self.epoch < self.epochs and not self.left:
                if self.max_steps is not None and self.iters >= self.max_steps:
                    break
                if self.preempted:
                    self.leave()
                    break
                if self.pos >= self.n:
                    self._end_epoch()
                    if self.epoch >= self.epochs:  # let a late joiner in to finish with us
                        changes.last_admit = -1
                        self._guarded(lambda: changes.maybe_admit(force=True))
                    continue
                if self.on_step is not None:
                    self.on_step(self)
                self._guarded(self._iteration)
            if self.preempted:
                self.leave()
        finally:
            self._restore_sigterm()
            self.display.close()
        return self.summary()

    def summary(self) -> dict:
        return {
            "rank": self.pg.rank,
            "world_size": self.pg.world_size,
            "generation": self.pg.generation,
            "step": self.step,
            "epoch": self.epoch,
            "skipped": self.skipped,
            "left": self.left,
            "changes": list(self.changes),
        }

    def _guarded(self, fn):
        """Run fn; on PeerFailure reconstruct, re-synchronise and return (the caller's loop
        redoes the dropped iteration)."""
        try:
            fn()
        except (PeerFailure, CollectiveTimeout) as exc:
            # A bare CollectiveTimeout (no culprit named) is treated as a failure too:
            # reconstruct() tells us whether we are still a member (else Evicted -> rejoin).
            if self.preempted:  # our own leave() interrupted the op: just go
                return
            self.group_changes.recover(exc, self._t_iter)

    def _iteration(self):
        self._t_iter = time.monotonic()
        self.group_changes.maybe_admit()
        pg, k = self.pg, self.pg.world_size
        perm = self._perm(self.epoch)
        batch = perm[self.pos : self.pos + self.global_batch]
        b = len(batch)
        lo, hi = shard_bounds(b, k, pg.rank)
        idx = torch.from_numpy(batch[lo:hi])
        x, y = self.inputs[idx], self.targets[idx]
        self.model.train()
        self.optimizer.zero_grad(set_to_none=False)
        out = self.dp(x)
        loss_sum = self.loss_fn(out, y)
        (loss_sum * (k / b)).backward()
        self.dp.sync_gradients()  # may raise PeerFailure
        with torch.no_grad():
            correct = float((out.argmax(1) == y).sum()) if out.ndim == 2 else 0.0
        loss_val = float(loss_sum.detach())
        ok = 1.0 if np.isfinite(loss_val) else 0.0
        stats = np.array([ok, loss_val if ok else 0.0, correct], np.float64)
        pg.all_reduce(stats, op=ReduceOp.SUM)  # the vote (+ stats); may raise
        if stats[0] == k:  # min(flag) == 1: all committed
            self.optimizer.step()
            self.step += 1
        else:
            self.skipped += 1
        self.pos += b
        self.display.show(stats[1] / b, stats[2] / b)

    def _end_epoch(self):
        self.epoch += 1
        self.pos = 0
        if self.checkpoint and self.pg.rank == 0:
            self.save_checkpoint(self.checkpoint)

    # --- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "trainer": {
                "epoch": self.epoch,
                "pos": self.pos,
                "step": self.step,
                "skipped": self.skipped,
                "seed": self.seed,
                "global_batch": self.global_batch,
            },
            "model": self.model.state_dict(),
            "optim": self.optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        t = state["trainer"]
        if t["global_batch"] != self.global_batch or t["seed"] != self.seed:
            raise ValueError(
                f"ElasticTrainer: received state for global_batch "
                f"{t['global_batch']} seed {t['seed']}, this rank runs "
                f"global_batch {self.global_batch} seed {self.seed}"
            )
        self.epoch, self.pos, self.step, self.skipped = (
            t["epoch"],
            t["pos"],
            t["step"],
            t["skipped"],
        )
        with torch.no_grad():
            self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optim"])

    def save_checkpoint(self, path: str) -> None:
        """Atomic: a reader sees the old file or the new one, never half of one."""
        tmp = f"{path}.tmp.{os.getpid()}"
        torch.save(self.state_dict(), tmp)
        os.replace(tmp, path)

    def _perm(self, epoch: int) -> np.ndarray:
        return np.random.RandomState(self.seed + epoch).permutation(self.n)

    # --- preemption ----------------------------------------------------------------------------
    def _install_sigterm(self):
        if threading.current_thread() is not threading.main_thread():
            return

        def on_term(signum, frame):
            # Announce at once (the others reconstruct without waiting for a heartbeat
            # timeout); an op of ours in flight fails, and fit() returns at the step boundary.
            self.preempted = True
            self.leave()

        self._old_sigterm = signal.signal(signal.SIGTERM, on_term)

    def _restore_sigterm(self):
        """Outside fit() SIGTERM does what it did before (the library's: leave, then exit)."""
        if self._old_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None

    def leave(self) -> None:
        """Leave the current group, once per group: a rank preempted while it rejoined has
        left its old group and must leave the new one too."""
        pg = self.pg
        if self._left_group is pg:
            return
        self.left = True
        self._left_group = pg
        leave = getattr(pg, "leave", None)
        if leave is not None:
            leave()
