"""The elastic default group: a torch job that can lose ranks and admit new ones.

With COLLECTIVES_TORCH_ELASTIC=1 the default group of dist.init_process_group("collectives")
is not rendezvoused through torch's store alone: it joins the job's coordinator, as
cl.init_process_group does (membership/init.py), at $COLLECTIVES_COORDINATOR (the launcher
sets it) or MASTER_ADDR:MASTER_PORT + 1 (rank 0 hosts one there). So it is a group the
library can rebuild, and these work on it:

  dist.shrink_group(ranks_to_exclude)     the survivors, renumbered (shrink.py)
  collectives.torch.reconfigure(...)      the same, with an empty list allowed: the survivors
                                          plus the joiners that wait (a grown group)
  collectives.torch.join_process_group()  a joiner (a replacement, or a warm spare from
                                          `collectives.launch --spares`): waits to be admitted
                                          by the survivors' next shrink_group or reconfigure,
                                          then holds the same default group as they do

Groups made by new_group stay rendezvoused through the store and cannot shrink.

The survivors agree on the list through torch's own store (shrink.py). Under env:// that
store lives in rank 0's process, so rank 0's death ends the job there; torchrun's agent hosts
its store itself.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist

from ..common import config
from ..common.errors import CollectiveError
from ..group.group import ProcessGroup
from ..membership import init
from . import rendezvous
from . import shrink as shrinking

_PREFIX = "collectives-elastic/"


def connect(store: Any, rank: int, size: int, timeout_s: float) -> tuple[ProcessGroup, Any]:
    """A new group on torch's call: (the group, its agreement store or None). The default
    group of an elastic job joins the coordinator; every other rendezvouses through the
    store (rendezvous.py) and cannot shrink."""
    if config.torch_elastic() and not dist.is_initialized():
        return first_group(rank, size, timeout_s), agreement_store(store)
    return rendezvous.connect(store, rank, size, timeout_s), None


def first_group(rank: int, size: int, timeout_s: float) -> ProcessGroup:
    """Generation 0 of the job, through the coordinator (rank 0 hosts one if nobody does)."""
    host, port = config.torch_coordinator_address()
    return init.init_process_group(
        rank, size, master_addr=host, master_port=port, timeout=timeout_s
    )


def join(wait_s: float) -> ProcessGroup:
    """A joiner's group: admitted at the members' next reconstruction, within `wait_s`."""
    host, port = config.torch_coordinator_address()
    return init.init_process_group(master_addr=host, master_port=port, timeout=wait_s, join=True)


def check_joined(pg: ProcessGroup) -> None:
    """A joiner's side of the survivors' check on the new group (shrink.py, step 4)."""
    shrinking.check_members(pg, shrinking.JOINER, None)


def root_store(store: Any) -> Any:
    """The store under torch's PrefixStores (the job's TCPStore)."""
    for _ in range(16):
        under = getattr(store, "underlying_store", None)
        if under is None:
            return store
        store = under
    return store


def agreement_store(store: Any) -> dist.Store:
    """Where the survivors of every generation write their lists: one key space for the
    whole job, whichever group's store it is reached from (a joiner's included)."""
    return dist.PrefixStore(_PREFIX, root_store(store))


def joiner_stores(timeout_s: float) -> tuple[dist.Store, dist.Store]:
    """(the job's store, the agreement store) for a joiner: a client of the TCPStore at
    MASTER_ADDR:MASTER_PORT, as env:// makes it."""
    host = config.master_addr() or "127.0.0.1"
    port = config.required_int("MASTER_PORT")
    root = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))
    return root, dist.PrefixStore(_PREFIX, root)


def shrink(
    pg: ProcessGroup,
    store: Any,
    attempt: int,
    exclude: tuple[int, ...],
    flags: int,
    timeout_s: float,
) -> ProcessGroup:
    """The next generation without `exclude` (plus any joiner that waits): shrink.py's
    steps, in order. Raises with nothing changed if the survivors disagree."""
    if flags & shrinking.SHRINK_ABORT:
        shrinking.interrupt(pg, pg.rank)
    shrinking.drain(pg, timeout_s)
    req = shrinking.ShrinkRequest(pg.rank, pg.world_size, pg.generation, attempt, exclude)
    shrinking.agree(store, req, timeout_s, lambda: pg.failed_ranks)
    try:
        new = pg.reconstruct(timeout_s, exclude=exclude)
    except CollectiveError as exc:
        # A rank that counted fewer survivors than another went ahead alone: say why.
        shrinking.name_disagreement(store, req, exc)
        raise
    if new is pg:  # nobody failed, nobody joined: the coordinator saw no change
        if not exclude:
            return pg  # reconfigure() with nothing to do
        raise CollectiveError(
            f"shrink_group: rank {pg.rank}: the coordinator formed no new group: ranks "
            f"{list(exclude)} are still members and no joiner waits",
            op="shrink_group",
            rank=pg.rank,
            generation=pg.generation,
        )
    shrinking.check_members(new, pg.rank, req.survivors)
    return new
