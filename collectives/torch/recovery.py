"""After a failure, the calls of a torch user (docs/torch_backend.md, "After a failure"):
which ranks are gone, and the bridge for a group that grows, which torch 2.13 has no call for.

    dist.shrink_group(collectives.torch.failed_ranks())     the survivors (torch's own call)
    collectives.torch.reconfigure(ranks_to_exclude=())      the survivors, + waiting joiners
    collectives.torch.join_process_group()                  a joiner's init_process_group

All three work on the default group of an elastic job (COLLECTIVES_TORCH_ELASTIC=1,
elastic.py); the group each returns is the new default group (world.py).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist

from . import elastic, world
from .backend import CollectivesProcessGroup


def failed_ranks(group: Any = None) -> list[int]:
    """The ranks of `group` (default: the default group) that this rank's failure detector
    has reported gone (a dead process, a rank the coordinator evicted for a stall), in the
    group's numbering: what to pass to dist.shrink_group after an operation failed. [] if
    none is known (an error that names no rank: a timeout nobody was blamed for)."""
    pg = group if group is not None else world.default_group()
    if not isinstance(pg, CollectivesProcessGroup):
        raise TypeError(f"failed_ranks: the group is not a collectives group: {pg!r}")
    return sorted(pg.collectives_group.failed_ranks)


def reconfigure(
    ranks_to_exclude: list[int] | tuple[int, ...] = (),
    group: Any = None,
    shrink_flags: int = 0,
) -> CollectivesProcessGroup:
    """dist.shrink_group's twin for a group that may also grow: the survivors' call. The
    next group holds the ranks of `group` (default: the default group) not in
    `ranks_to_exclude` -- which may be empty -- followed by every joiner that waits in
    join_process_group(); it becomes the default group, as after shrink_group. With nothing
    to exclude and nobody waiting, the group itself comes back. Every survivor calls it with
    the same list (the same checks and errors as shrink_group)."""
    name = "reconfigure"
    old = group if group is not None else world.default_group()
    if not isinstance(old, CollectivesProcessGroup):
        raise TypeError(f"{name}: the group is not a collectives group: {old!r}")
    exclude = sorted(set(ranks_to_exclude))
    if len(exclude) != len(list(ranks_to_exclude)):
        raise ValueError(f"{name}: ranks_to_exclude {list(ranks_to_exclude)} has duplicates")
    for r in exclude:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < old.size():
            raise ValueError(f"{name}: {r!r} is not a rank of the group (size {old.size()})")
    if old.rank() in exclude:
        raise RuntimeError(
            f"{name}: rank {old.rank()} is in ranks_to_exclude and should not call {name}()"
        )
    if shrink_flags not in (0, 1):
        raise ValueError(f"{name}: shrink_flags must be SHRINK_DEFAULT or SHRINK_ABORT")
    new = old.reshaped(tuple(exclude), shrink_flags, name)
    if new is old:
        return old
    return world.install(new, old, None, new.collectives_group.generation)


def join_process_group(
    timeout: timedelta | float = timedelta(minutes=30),
    wait: timedelta | float | None = None,
) -> CollectivesProcessGroup:
    """A joiner's init_process_group: wait (up to `wait`, default `timeout`) to be admitted
    by the survivors' next shrink_group or reconfigure, then return the same default group
    as theirs, in torch's place (dist.get_rank(), DDP, ... work). `timeout` bounds each
    operation, as init_process_group's. Needs COLLECTIVES_TORCH_ELASTIC=1 on every process,
    MASTER_ADDR and MASTER_PORT (torch's store); a warm spare (COLLECTIVES_SPARE=1, which
    `collectives.launch --spares` sets) is admitted only into the place of a lost rank."""
    timeout_s = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    wait_s = (
        timeout_s
        if wait is None
        else (wait.total_seconds() if isinstance(wait, timedelta) else float(wait))
    )
    if dist.is_initialized():
        raise RuntimeError("join_process_group: this process has a default group already")
    root, agreement = elastic.joiner_stores(timeout_s)
    pg = elastic.join(wait_s, agreement)
    pg.timeout = timeout_s
    elastic.check_joined(pg)
    new = CollectivesProcessGroup(
        None, pg.rank, pg.world_size, timeout_s, group=pg, elastic_store=agreement
    )
    return world.install(new, None, root, pg.generation)
