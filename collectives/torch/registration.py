"""Registration: `import collectives.torch` makes "collectives" a torch.distributed backend.

For every group on this backend torch calls `_create(store, rank, size, timeout)` (backend.py
says how torch drives a Python backend); dist.shrink_group's last step goes to `_adopt_shrunk`
for this backend's groups (world.py says why).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist

from . import world
from .backend import BACKEND_NAME, CollectivesProcessGroup


def _create(
    store: dist.Store, rank: int, size: int, timeout: timedelta | float
) -> CollectivesProcessGroup:
    return CollectivesProcessGroup(store, rank, size, timeout)


def _adopt_shrunk(new: CollectivesProcessGroup, old: Any) -> CollectivesProcessGroup:
    """dist.shrink_group's last step for this backend: `new` becomes the default group."""
    return world.install(new, old, None, new.collectives_group.generation)


def register() -> None:
    """Make "collectives" a torch.distributed backend (idempotent).

    devices includes "cuda": CUDA tensors are staged through host memory (buffers.py), so this
    can serve as the fallback group on a GPU machine without NCCL.
    """
    world.install_shrink_finalizer(CollectivesProcessGroup, _adopt_shrunk)
    if BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])
