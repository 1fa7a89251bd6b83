"""Putting a new group in torch's place: after dist.shrink_group, collectives.torch.reconfigure
and collectives.torch.join_process_group.

torch 2.13's shrink_group ends in `_finalize_shrunk_group`, which builds a C++ ProcessGroup and
registers the backend's result in it as a C++ `Backend`. A backend written in Python cannot be
one (torch's C++ Backend has no constructor bound to Python), so that step raises for this
backend; torch's own new_group path uses a Python group as the group itself, with no C++
wrapper. `install_shrink_finalizer()` (called by register()) wraps `_finalize_shrunk_group`
so that it does the same for this backend's groups, and leaves every other backend's call to
torch. What it does for ours is what torch does for its own, with torch's helpers: destroy
the other groups when the default one shrinks (their ranks are no longer valid), destroy the
old group, make the new one the default, register it. One difference: the new default group
maps global rank r to group rank r (the new numbering is the new world's; torch would keep the
former global ranks, and would leave out a joiner the new group admitted).

This module is the only one that reads torch's private c10d members (the checker in
tests/unit/docs/test_parts_and_owners.py allows it here and nowhere else): torch 2.13 has no
public API to install a group a Python backend made as the default group. The rest of the
backend asks through the public functions below.
"""

from __future__ import annotations

from typing import Any, Callable

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from . import elastic

BACKEND = "collectives"

# torch's own _finalize_shrunk_group, once install_shrink_finalizer() has wrapped it
_torch_finalize: Callable[..., Any] | None = None


def default_group() -> Any:
    """torch's default group (the one dist.shrink_group works on when given no group)."""
    return c10d._get_default_group()


def group_name(generation: int) -> str:
    """The same name on every member of a generation (survivors and joiners alike)."""
    return f"collectives-generation-{generation}"


def install(new: Any, old: Any | None, root: Any, generation: int) -> Any:
    """Make `new` (a CollectivesProcessGroup) torch's default group in place of `old` (None
    for a joiner, which has no group yet). `root`: the job's store (None: the one under the
    old group's); the store torch keeps with the group is a prefix of it named after the
    generation, the same on every member, so that new_group's keys meet."""
    backend_config = BACKEND
    if old is not None:
        if root is None:
            root = elastic.root_store(c10d._world.pg_map[old][1])
        backend_config = c10d._world.pg_backend_config.get(old, BACKEND)
        c10d._destroy_all_other_groups(exclude_group=old)
        c10d._cleanup_original_group(old, True)
    # new_group names its groups by a per-process count, and a joiner's starts at 0: give
    # every member of this generation the same start, past every name used before
    c10d._world.group_count = max(c10d._world.group_count, generation << 20)
    name = group_name(generation)
    new._set_group_name(name)
    new._set_group_desc("default_pg")
    c10d._update_default_pg(new)
    c10d._register_pg_in_world(
        pg=new,
        backend_name=BACKEND,
        store=dist.PrefixStore(f"{name}/", dist.PrefixStore("default_pg", root)),
        group_name=name,
        backend_config=str(backend_config),
        rank_mapping={r: r for r in range(new.size())},
    )
    return new


def install_shrink_finalizer(owns: type, adopt: Callable[[Any, Any], Any]) -> None:
    """Wrap torch's `_finalize_shrunk_group` once (see the module's docstring): a result of
    type `owns` goes to adopt(new, old) instead, every other to torch."""
    global _torch_finalize
    if _torch_finalize is not None:
        return
    torch_finalize = _torch_finalize = c10d._finalize_shrunk_group

    def finalize(group_info: dict, excluded: set, new_backend: Any) -> dist.ProcessGroup:
        if isinstance(new_backend, owns):
            return adopt(new_backend, group_info["process_group"])
        return torch_finalize(group_info, excluded, new_backend)

    c10d._finalize_shrunk_group = finalize
