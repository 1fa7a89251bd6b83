"""A worker that knows nothing of how it was launched: mpiexec, srun, torchrun or our launcher.

It calls cl.init_process_group() with no arguments; rank r contributes r + 1 to an all_reduce
(the sum is n(n+1)/2 on every rank) and prints one JSON line: its rank, the world size, the
local rank the library found, the sum, the tcp address it advertises (its host's) and the kind
of link (tcp, ipc, shm) to each peer.

With --torch it then does the same through torch.distributed.init_process_group("collectives")
(the store torchrun's agent hosts at MASTER_ADDR:MASTER_PORT) and adds the torch sum."""

import json
import sys

import numpy as np

import collectives as cl
from collectives.common import config

pg = cl.init_process_group(timeout=30)
x = np.full(4, pg.rank + 1, np.float64)
pg.all_reduce(x)
pg.barrier()
said = {
    "rank": pg.rank,
    "ws": pg.world_size,
    "sum": float(x[0]),
    "local_rank": config.launcher_int("LOCAL_RANK"),
    "endpoint": pg.transport.tcp_endpoint,
    "kinds": {str(p): k for p, k in pg.transport.kinds.items()},
}
pg.destroy()
if "--torch" in sys.argv[1:]:
    import torch
    import torch.distributed as dist

    import collectives.torch  # noqa: F401  (registers the "collectives" backend)

    dist.init_process_group("collectives")
    t = torch.full((4,), float(dist.get_rank() + 1), dtype=torch.float64)
    dist.all_reduce(t)
    dist.barrier()
    said.update(torch_rank=dist.get_rank(), torch_sum=float(t[0]))
    dist.destroy_process_group()
print(json.dumps(said), flush=True)
