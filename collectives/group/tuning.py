"""Which all_reduce algorithm "auto" picks, by buffer size and world size.

The crossovers below come from measurements on a 2-core machine (ipc, float32 SUM;
bench/results/all_reduce/{2,4}ranks_ipc.json): `python -m bench --backends direct,tree,ring
--nproc N --transport ipc --json r.json`, then `python -m bench costmodel r.json --write`,
which fits alpha + beta x size per algorithm and stores the crossovers here. The 3-rank entry
was not measured: it is set between the 2- and 4-rank ones. The same fit on the shared-memory
runs (bench/results/all_reduce/{2,4}ranks_shm.json, now the default transport on one host)
puts the direct crossover at 1.8 MiB (2 ranks) and 34 KB (4 ranks), and tree and ring within
noise of each other above 1 MiB at 4 ranks, so these numbers stand for both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

# Up to this many bytes per rank, everyone-to-everyone ("direct", one message deep) beats any
# deeper schedule; its traffic grows as n^2, so the limit shrinks with the world size.
DIRECT_MAX_BYTES = {2: 1 << 20, 3: 32 << 10, 4: 32 << 10}
DIRECT_MAX_BYTES_DEFAULT = 4 << 10
DIRECT_MAX_RANKS = 16

# Across hosts, above the direct crossover: "hierarchical" (each host's k leaders take its
# contributions, one ring across the hosts per leader), whenever the group spans hosts and some
# host has 2+ of its ranks.

# Across hosts, hierarchical.py runs k leaders per host from 1 MiB and one below: that
# crossover is the transport's (ZmqTransport.leaders_min_bytes, transport/zmq/transport.py), as the
# in-process transports show the k-leader schedule at any size.

# Between direct and ring, the binomial tree's log2(n) latency wins up to this size.
TREE_MAX_BYTES = 2 << 20

# "double_tree" is never chosen: the alpha-beta model never prices it under all of ring, tree
# and halving_doubling at 2-16 ranks, and measured at 4 and 8 ranks it won once, at 4 ranks and 1 MiB, within the
# run's noise (bench/results/all_reduce/double_tree_{4,8}ranks.txt).

# A host is crowded when it runs at least this many ranks per CPU they may use. There the ranks
# take turns on the cores, so an op costs the sum of every rank's per-message work, not the
# longest chain of messages: the schedule with the fewest messages wins, even with more rounds.
# Below the direct crossover that is "naive" (everyone to rank 0, the result back: 2(n-1)
# messages, against direct's n(n-1)), and a commit round through rank 0 (commit.py, star:
# 2(n-1) against n(n-1) or n log2 n). Measured on a 2-core machine, 4 B-16 KiB, each
# schedule interleaved with the other (`python -m bench smallop --nproc N --flip-crowded`;
# bench/results/smallop/crowded_schedules_flip.txt): 4 ranks 586 -> 519 us at 4 B
# (0.79-0.84x over the sizes), 8 ranks 2145 -> 1114 us (0.52-0.62x below the tree); 3 ranks
# (1.5 a core) gained nothing: not crowded. With a core per rank, direct's depth of one message
# beats naive's two (each message on the critical path a latency), so the rule looks at the
# cores.
CROWDED_RANKS_PER_CPU = 2

_T = TypeVar("_T")


def spans_hosts(hosts) -> bool:
    """The group spans more than one host and some host holds two or more of its ranks: then
    a hierarchical schedule keeps all but a host's leaders off the hosts' links."""
    if not hosts:
        return False
    per_host: dict[Any, int] = {}
    for h in hosts:
        per_host[h] = per_host.get(h, 0) + 1
    return len(per_host) > 1 and max(per_host.values()) > 1


def crowded(hosts, cpus) -> bool:
    """Some host runs CROWDED_RANKS_PER_CPU or more ranks per CPU: `hosts` and `cpus` (one
    host label and one CPU affinity bit mask per rank, the same on every rank) count the
    ranks of each host against the union of their masks. False where a rank's mask is
    unknown (None), or for a single rank."""
    return any(r >= CROWDED_RANKS_PER_CPU * c for r, c in _ranks_and_cpus(hosts, cpus).values())


def spins(hosts, cpus) -> bool:
    """Every host runs at most one rank per CPU its ranks may use, so a rank waiting for a
    small frame may spin a few microseconds on its peer's link before it sleeps
    (config.small_spin): its peer has a CPU to send from meanwhile. `hosts` and `cpus` as
    crowded's; False where a rank's mask is unknown (None), or for a single rank."""
    per_host = _ranks_and_cpus(hosts, cpus).values()
    return bool(per_host) and all(r <= c for r, c in per_host)


def yields(hosts, cpus, rank: int) -> bool:
    """`rank`'s host runs more ranks than the CPUs they may use, so a rank waiting for a small
    frame reads its peer's link, yielding its CPU between reads, before it sleeps
    (config.small_yield): a rank that sleeps must be woken by its peer's send, which on a
    host with more ranks than CPUs every receive would pay (2 cores, 8 ranks, 4 B: 771-1076
    us an op sleeping, 658-748 yielding for up to 500 us; bench/results/smallop/README.md).
    Only the rank's own host counts: the peers its fast links read are there. `hosts` and
    `cpus` as crowded's; False where a rank's mask is unknown (None), or for a single rank."""
    got = _ranks_and_cpus(hosts, cpus).get(hosts[rank]) if hosts else None
    return got is not None and got[0] > got[1]


def _ranks_and_cpus(hosts, cpus) -> dict[Any, tuple[int, int]]:
    """(ranks, CPUs they may use) of every host, `hosts` and `cpus` as crowded's; none where
    a rank's mask is unknown (None), or for a single rank."""
    if (
        not hosts
        or not cpus
        or len(hosts) != len(cpus)
        or len(hosts) < 2
        or any(not c for c in cpus)
    ):
        return {}
    ranks: dict[Any, int] = {}
    masks: dict[Any, int] = {}
    for h, c in zip(hosts, cpus):
        ranks[h] = ranks.get(h, 0) + 1
        masks[h] = masks.get(h, 0) | c
    return {h: (ranks[h], bin(masks[h]).count("1")) for h in ranks}


def all_reduce_algorithm(nbytes: int, world_size: int, hosts=None, crowded: bool = False) -> str:
    """The algorithm "auto" runs; `hosts` (one host label per rank) and `crowded` are the
    same on every rank, so every rank picks the same."""
    if world_size <= DIRECT_MAX_RANKS and nbytes <= DIRECT_MAX_BYTES.get(
        world_size, DIRECT_MAX_BYTES_DEFAULT
    ):
        return "naive" if crowded and world_size >= 3 else "direct"
    if spans_hosts(hosts):
        # Past the direct crossover, only the leaders cross the hosts' links (a flat ring
        # or tree sends as much over every link as hierarchical sends over the leaders').
        return "hierarchical"
    if world_size > 2 and nbytes <= TREE_MAX_BYTES:
        return "tree"
    return "ring"


def pick(table: Mapping[str, _T], algorithm: str, name: str) -> _T:
    """table[algorithm], or a ValueError naming the algorithms there are (checked before any
    byte moves)."""
    if algorithm not in table:
        raise ValueError(
            f"{name}: unknown algorithm {algorithm!r}; choose one of {', '.join(['auto', *table])}"
        )
    return table[algorithm]
