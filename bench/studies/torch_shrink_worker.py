"""bench/studies/torch_shrink.py's worker: paced all_reduces until a peer dies, then the
recovery under test and one op on the new group; one JSON line per event on stdout.

$SHRINK_API: "torch" (dist.init_process_group("collectives") with COLLECTIVES_TORCH_ELASTIC=1,
then dist.shrink_group(collectives.torch.failed_ranks())) or "library" (cl.init_process_group,
then pg.reconstruct()). Rank r contributes r + 1; the new group's op must sum to m(m+1)/2.
"""

import json
import os
import time

import numpy as np

PAUSE = 0.02  # s between two all_reduces
COUNT = 4096  # float32: 16 KiB


def emit(**event):
    event["t"] = time.time()
    print(json.dumps(event), flush=True)


def torch_job() -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import collectives.torch as ct

    dist.init_process_group("collectives", timeout=timedelta(seconds=30))
    x = torch.empty(COUNT)
    steps = 0
    while True:
        x.fill_(dist.get_rank() + 1)
        try:
            dist.all_reduce(x)
        except RuntimeError:
            emit(event="failure", rank=dist.get_rank())
            break
        steps += 1
        if steps == 5:
            emit(event="ready", rank=dist.get_rank())
        time.sleep(PAUSE)
    dist.shrink_group(ct.failed_ranks())
    emit(event="shrunk", rank=dist.get_rank())
    x.fill_(dist.get_rank() + 1)
    dist.all_reduce(x)
    m = dist.get_world_size()
    emit(event="first_op", rank=dist.get_rank(), ok=bool((x == m * (m + 1) / 2).all()))
    dist.destroy_process_group()


def library_job() -> None:
    import collectives as cl

    pg = cl.init_process_group(timeout=30.0)
    x = np.empty(COUNT, np.float32)
    steps = 0
    while True:
        x[:] = pg.rank + 1
        try:
            pg.all_reduce(x)
        except cl.PeerFailure:
            emit(event="failure", rank=pg.rank)
            break
        steps += 1
        if steps == 5:
            emit(event="ready", rank=pg.rank)
        time.sleep(PAUSE)
    pg = pg.reconstruct()
    emit(event="shrunk", rank=pg.rank)
    x[:] = pg.rank + 1
    pg.all_reduce(x)
    m = pg.world_size
    emit(event="first_op", rank=pg.rank, ok=bool((x == m * (m + 1) / 2).all()))
    pg.destroy()


if __name__ == "__main__":
    torch_job() if os.environ["SHRINK_API"] == "torch" else library_job()
