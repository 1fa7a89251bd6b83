"""A worker that knows nothing of how it was launched: mpiexec, srun or our launcher.

It calls cl.init_process_group() with no arguments; rank r contributes r + 1 to an all_reduce
(the sum is n(n+1)/2 on every rank) and prints one JSON line: its rank, the world size, the
local rank the library found, and the sum."""
import json

import numpy as np

import collectives as cl
from collectives.core import config

pg = cl.init_process_group(timeout=30)
x = np.full(4, pg.rank + 1, np.float64)
pg.all_reduce(x)
pg.barrier()
print(json.dumps({"rank": pg.rank, "ws": pg.world_size, "sum": float(x[0]),
                  "local_rank": config.launcher_int("LOCAL_RANK")}), flush=True)
pg.destroy()
