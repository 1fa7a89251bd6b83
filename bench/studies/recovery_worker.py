"""bench/studies/recovery.py's worker: paced all_reduces at the library's default settings,
reconstructing at every step boundary; one JSON line per event on stdout.

Rank r contributes r+1; each step checks the sum n(n+1)/2 ("ok"). A replacement
(COLLECTIVES_JOIN=1, no RANK) skips its first reconstruct: the members' reconstruct admitted
it. Ends when $STOP_FILE exists.
"""

import json
import os
import time

import numpy as np

import collectives as cl

PAUSE = float(os.environ.get("RECOVERY_PAUSE", "0.05"))  # s between two all_reduces


def emit(**event):
    event["t"] = time.time()
    event["pid"] = os.getpid()
    print(json.dumps(event), flush=True)


def main() -> int:
    joiner = "RANK" not in os.environ
    # a replacement waits to be admitted for long; its ops then get the default deadline
    pg = cl.init_process_group(timeout=300.0) if joiner else cl.init_process_group()
    pg.timeout = 30.0  # init_process_group's default
    emit(event="joined", rank=pg.rank, ws=pg.world_size, gen=pg.generation, joiner=joiner)
    stop = os.environ.get("STOP_FILE", "/nonexistent")
    x = np.empty(4096, np.float32)
    skip = joiner
    while not os.path.exists(stop):
        try:
            if not skip:
                pg = pg.reconstruct()
            skip = False
            x[:] = pg.rank + 1
            pg.all_reduce(x)
            n = pg.world_size
            emit(
                event="step",
                rank=pg.rank,
                ws=n,
                gen=pg.generation,
                ok=bool((x == n * (n + 1) / 2).all()),
            )
            time.sleep(PAUSE)
        except cl.Evicted as e:
            emit(event="evicted", error=str(e)[:300])
            return 3
        except cl.PeerFailure as e:
            emit(event="failure", gen=pg.generation, failed=list(e.failed_ranks))
        except cl.CollectiveError as e:
            emit(event="error", gen=pg.generation, error=str(e)[:300])
    pg.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
