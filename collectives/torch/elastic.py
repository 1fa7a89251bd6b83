"""The elastic default group: a torch job that can lose ranks and admit new ones.

With COLLECTIVES_TORCH_ELASTIC=1 the default group of dist.init_process_group("collectives")
is not rendezvoused through torch's store alone: it joins the job's coordinator, as
cl.init_process_group does (membership/init.py), at $COLLECTIVES_COORDINATOR (the launcher
sets it), else one rank 0 hosts at MASTER_ADDR:MASTER_PORT + 1 (any free port where that one
is taken; the port goes through torch's store). So it is a group the library can rebuild, and
these work on it:

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
        agreement = agreement_store(store)
        return first_group(rank, size, timeout_s, agreement), agreement
    return rendezvous.connect(store, rank, size, timeout_s), None


def first_group(rank: int, size: int, timeout_s: float, agreement: dist.Store) -> ProcessGroup:
    """Generation 0 of the job, through the coordinator: the one $COLLECTIVES_COORDINATOR
    names, else one rank 0 hosts at MASTER_PORT + 1, or on any free port where that one is
    taken (another job's, say); rank 0 writes the port it got into torch's store, where the
    others (and later joiners) read it."""
    host, port = config.torch_coordinator_address()
    if config.coordinator_named():
        return init.init_process_group(
            rank, size, master_addr=host, master_port=port, timeout=timeout_s
        )
    key = _coordinator_key()
    if rank == 0:
        return init.init_process_group(
            rank,
            size,
            master_addr=host,
            master_port=port,
            timeout=timeout_s,
            announce=lambda got: agreement.set(key, str(got)),
        )
    port = _announced_port(agreement, key, timeout_s, rank)
    return init.init_process_group(
        rank, size, master_addr=host, master_port=port, timeout=timeout_s
    )


def join(wait_s: float, agreement: dist.Store) -> ProcessGroup:
    """A joiner's group: admitted at the members' next reconstruction, within `wait_s`."""
    host, port = config.torch_coordinator_address()
    if not config.coordinator_named():
        port = _announced_port(agreement, _coordinator_key(), wait_s, None)
    return init.init_process_group(master_addr=host, master_port=port, timeout=wait_s, join=True)


def _coordinator_key() -> str:
    """Where rank 0 writes its coordinator's port: one key per torchrun restart, since the
    agent's store outlives the workers it restarts (and a stale port must not be read)."""
    return f"coordinator-port/{config.torchrun_restart()}"


def _announced_port(agreement: dist.Store, key: str, timeout_s: float, rank: int | None) -> int:
    """The port rank 0 wrote under `key`, waiting up to `timeout_s` for it (rank None: a
    joiner's wait)."""
    who = f"rank {rank}" if rank is not None else "a joiner"
    try:
        agreement.wait([key], timedelta(seconds=timeout_s))
        raw = agreement.get(key)
    except Exception as exc:  # torch's store says "timeout" in its own words
        raise CollectiveError(
            f"init_process_group: {who}: rank 0 wrote no coordinator port into torch's "
            f"store within {timeout_s:g} s (is rank 0 running, with "
            f'init_process_group("collectives")?): {exc}',
            op="init_process_group",
            rank=rank,
        ) from exc
    try:
        port = int(raw)
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        raise CollectiveError(
            f"init_process_group: {who}: torch's store holds {raw!r} under {_PREFIX}{key}, "
            "not a coordinator port",
            op="init_process_group",
            rank=rank,
        )
    return port


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
