"""collectives: collective communication in pure Python over ZeroMQ.

import collectives as cl
pg = cl.init_process_group()          # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
pg.all_reduce(x, op=cl.ReduceOp.SUM)  # numpy array or CPU torch tensor, in place
"""

from importlib import metadata as _metadata

from .common import config as _config
from .common import logs as _logs
from .group.group import ProcessGroup
from .membership.init import (
    all_gather,
    all_reduce,
    all_to_all,
    barrier,
    broadcast,
    default_group,
    destroy_process_group,
    empty,
    gather,
    get_rank,
    get_world_size,
    init_process_group,
    recv,
    reduce,
    reduce_scatter,
    scatter,
    send,
)
from .common.errors import (
    CollectiveError,
    CollectiveMismatch,
    CollectiveTimeout,
    CoordinatorLost,
    Evicted,
    PeerFailure,
    PeerTimeout,
)
from .transport.faults import inject_faults
from .common.ops import ReduceOp
from .transport.zmq.registered import is_registered
from .teaching.simulate import SimulationError, simulate
from .teaching.trace import Tracer
from .group.work import Work

__all__ = [
    "init_process_group",
    "destroy_process_group",
    "default_group",
    "get_rank",
    "get_world_size",
    "all_reduce",
    "reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "gather",
    "scatter",
    "barrier",
    "send",
    "recv",
    "empty",
    "is_registered",
    "ProcessGroup",
    "ReduceOp",
    "Work",
    "simulate",
    "SimulationError",
    "CollectiveError",
    "CollectiveTimeout",
    "CollectiveMismatch",
    "PeerFailure",
    "Evicted",
    "PeerTimeout",
    "CoordinatorLost",
    "inject_faults",
    "Tracer",
]
try:  # one version source: pyproject.toml's, as installed
    __version__ = _metadata.version("collectives")
except _metadata.PackageNotFoundError:  # a source tree on sys.path, never installed
    __version__ = "0+unknown"
_logs.setup(_config.debug_level())  # COLLECTIVES_DEBUG, read once, like NCCL_DEBUG


def __getattr__(name: str) -> type:
    # torch is optional: DataParallel / ElasticTrainer import it only when first asked for.
    if name == "DataParallel":
        from .training.data_parallel import DataParallel

        return DataParallel
    if name == "ElasticTrainer":
        from .training.elastic import ElasticTrainer

        return ElasticTrainer
    raise AttributeError(f"module 'collectives' has no attribute {name!r}")
