"""`import collectives.torch` registers the "collectives" torch.distributed backend.

    import collectives.torch
    torch.distributed.init_process_group("collectives", init_method="env://")

(This module's name does not shadow the real torch: every module of the package uses absolute
imports, so `import torch` anywhere in collectives means the PyTorch package.)
"""

from .backend import BACKEND_NAME, CollectivesProcessGroup
from .recovery import failed_ranks, join_process_group, reconfigure
from .registration import register

register()

__all__ = [
    "BACKEND_NAME",
    "CollectivesProcessGroup",
    "failed_ranks",
    "join_process_group",
    "reconfigure",
    "register",
]
