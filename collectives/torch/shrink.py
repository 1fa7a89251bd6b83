"""dist.shrink_group over this backend: the survivors agree, then the library reconstructs.

torch validates the call (a non-empty list of ranks of the group, not the caller's own) and
then hands the backend `shrink(ranks_to_exclude, flags, options)`; what comes back becomes the
new group (world.py registers it). Here, in order:

  1. SHRINK_ABORT: the operation in flight on this rank raises at once (the transport is
     interrupted, as abort() does), queued ones fail. SHRINK_DEFAULT lets them finish or
     fail on their own (bounded by the group's timeout).
  2. Agreement, through torch's own c10d store: each survivor writes the list it excludes
     under a key of this generation and attempt, and reads the lists of every rank it
     counts as a survivor. Any list unlike its own: every rank that sees one raises
     CollectiveMismatch naming both (and nothing has changed: call again with the same
     list). A rank the failure detector has already reported gone but that the list leaves
     in: the same kind of error, naming it. A survivor that never writes: CollectiveTimeout
     after the timeout, naming it.
  3. The library's reconstruct(exclude=the list): the coordinator forms the next generation
     of the members that call it. A dead rank is already out; a live rank that the survivors
     exclude is removed as soon as every survivor has asked with the list (not at the
     round's deadline) and gets Evicted on its next operation; a joiner that waits (a warm
     spare) is admitted, ranked last. The coordinator checks the lists too: askers whose
     lists differ all get an error naming them.
  4. A check on the new group, its first operation: an all_gather of every member's former
     rank (-1 for a joiner), which must be the survivors in order, then the joiners. So every
     member knows that all of them formed the same group from the same list.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import msgpack
import numpy as np

from ..common.errors import CollectiveError, CollectiveMismatch, CollectiveTimeout
from ..group.group import ProcessGroup
from .store_calls import bounded

SHRINK_ABORT = 0x01  # torch.distributed.SHRINK_ABORT
JOINER = -1  # the former rank a joiner reports in the check (step 4)
_KEY = "shrink/{generation}/{attempt}/{rank}"


@dataclass(frozen=True)
class ShrinkRequest:
    """One rank's call: which group (generation, size), which attempt on it, what it excludes."""

    rank: int
    size: int
    generation: int
    attempt: int
    exclude: tuple[int, ...]

    @property
    def survivors(self) -> tuple[int, ...]:
        return tuple(r for r in range(self.size) if r not in self.exclude)

    def key(self, rank: int) -> str:
        return _KEY.format(generation=self.generation, attempt=self.attempt, rank=rank)


def _names(ranks: Any) -> str:
    return "[" + ", ".join(str(r) for r in sorted(ranks)) + "]"


def agree(
    store: Any,
    req: ShrinkRequest,
    timeout_s: float,
    gone: Callable[[], tuple[int, ...]],
) -> None:
    """Step 2: return once every survivor has written the same list as this rank's."""
    name = "shrink_group"
    deadline = time.monotonic() + timeout_s

    def call(fn: Callable[[], Any], key: str) -> Any:
        # store_calls.py: a store whose server stopped would hold torch's call for good
        left = max(deadline - time.monotonic(), 0.0)
        return bounded(fn, left, op=name, rank=req.rank, what=f"the store's {key!r}")

    mine = req.key(req.rank)
    call(lambda: store.set(mine, msgpack.packb(list(req.exclude))), mine)
    pending = set(req.survivors) - {req.rank}
    seen: dict[int, tuple[int, ...]] = {}
    pause = 0.002
    while True:
        for r in sorted(pending):
            key = req.key(r)
            if call(lambda: store.check([key]), key):
                raw = call(lambda: store.get(key), key)
                seen[r] = tuple(int(x) for x in msgpack.unpackb(raw))
                pending.discard(r)
        differ = {r: e for r, e in seen.items() if e != req.exclude}
        if differ:
            parts = "; ".join(
                f"rank {r} excludes {_names(e)} (it also excludes "
                f"{_names(set(e) - set(req.exclude))}, leaves in "
                f"{_names(set(req.exclude) - set(e))})"
                for r, e in sorted(differ.items())
            )
            raise CollectiveMismatch(
                f"{name}: rank {req.rank}: the ranks disagree about ranks_to_exclude: this rank "
                f"excludes {_names(req.exclude)}; {parts}. Nothing changed: call shrink_group "
                "again on every survivor with the same list",
                op=name,
                rank=req.rank,
                peer=min(differ),
                generation=req.generation,
            )
        lost = set(gone()) - set(req.exclude)
        if lost:
            raise CollectiveMismatch(
                f"{name}: rank {req.rank}: rank(s) {_names(lost)} failed too (the failure "
                f"detector reported them gone) but ranks_to_exclude {_names(req.exclude)} "
                f"keeps them: exclude {_names(set(req.exclude) | lost)}",
                op=name,
                rank=req.rank,
                peer=min(lost),
                generation=req.generation,
            )
        if not pending:
            return
        if time.monotonic() > deadline:
            raise CollectiveTimeout(
                f"{name}: rank {req.rank} timed out after {timeout_s:g} s waiting for rank(s) "
                f"{_names(pending)} to call shrink_group (ranks_to_exclude "
                f"{_names(req.exclude)} counts them as survivors: are they gone too?)",
                op=name,
                rank=req.rank,
                peer=min(pending),
                generation=req.generation,
            )
        time.sleep(pause)
        pause = min(2 * pause, 0.05)


def name_disagreement(store: Any, req: ShrinkRequest, exc: CollectiveError) -> None:
    """After reconstruct() failed: if a rank this one excluded wrote another list for the
    same attempt (it called shrink_group too, counting itself a survivor), raise that
    disagreement instead of the coordinator's plainer error."""
    for r in req.exclude:
        if store.check([req.key(r)]):
            theirs = tuple(int(x) for x in msgpack.unpackb(store.get(req.key(r))))
            raise CollectiveMismatch(
                f"shrink_group: rank {req.rank}: the ranks disagree about ranks_to_exclude: "
                f"this rank excludes {_names(req.exclude)}, rank {r} (excluded here) called "
                f"shrink_group excluding {_names(theirs)} ({exc})",
                op="shrink_group",
                rank=req.rank,
                peer=r,
                generation=req.generation,
            ) from exc


def check_members(new: ProcessGroup, former: int, expected: tuple[int, ...] | None) -> None:
    """Step 4 on `new`: every member's former rank (JOINER for a joiner), gathered. A
    survivor passes `expected` (the survivors' former ranks in order); a joiner None."""
    name = "shrink_group"
    out = np.empty((new.world_size, 1), dtype=np.int64)
    new.all_gather(out, np.array([former], dtype=np.int64))
    got = [int(x) for x in out[:, 0]]
    olds = [r for r in got if r != JOINER]
    joiners = got[len(olds) :]
    ok = got == olds + joiners and all(r == JOINER for r in joiners)
    if expected is not None:
        ok = ok and tuple(olds) == expected
    if not ok:
        raise CollectiveError(
            f"{name}: rank {new.rank} of generation {new.generation}: the new group holds the "
            f"former ranks {got} (-1: a joiner), but the survivors agreed on "
            f"{list(expected) if expected is not None else '?'}: a rank was lost while the "
            "group formed; the job cannot go on with this group",
            op=name,
            rank=new.rank,
            generation=new.generation,
        )


def interrupt(pg: ProcessGroup, rank: int) -> None:
    """SHRINK_ABORT: the operation in flight raises at once, queued ones fail."""
    pg.interrupt(
        CollectiveError(
            f"rank {rank}: the operation was aborted by shrink_group(SHRINK_ABORT)",
            op="shrink_group",
            rank=rank,
            generation=pg.generation,
        )
    )


def drain(pg: ProcessGroup, timeout_s: float) -> None:
    """Let the queued operations finish or fail (bounded by the timeout); their errors went
    to their own Works."""
    marker = pg.enqueue("shrink_group", lambda: None)
    try:
        marker.wait(timeout_s)
    except CollectiveError:
        pass
