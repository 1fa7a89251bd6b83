"""The floors under a collective, measured in the same run as the backends (printed as limit
rows beside `limit`, the raw ring of limit.py):

* `floor`, the latency floor: the bare pyzmq exchange of the algorithm's pattern at each size.
  Every rank sends, step by step, what the algorithm this library runs for that collective
  and size ("auto") sends -- to the same peers, the same number of bytes -- and receives what
  it receives, over PAIR sockets on ipc: no header, no check, no reduction, no copy out. In a
  step each rank sends all its messages of that step, then takes all its receives, so a step
  is one message deep, not one of the cost model's rounds (where a rank's port takes one
  message a round: docs/tutorial.md's glossary). A group of 3+ ranks with a coordinator ends
  every collective with the commit (collectives/algorithms/commit.py): its empty messages are
  one more step here (all to all, up to its ALL_TO_ALL_MAX ranks) or ceil(log2 n) steps
  (dissemination), since an op must pay for them. Patterns, each as many steps as the
  library's algorithm is deep: direct = one step to and from every peer; ring = 2(n-1) steps
  of size/n to the right neighbour (n-1 for all_gather / reduce_scatter); naive = everyone to
  rank 0, then rank 0 to everyone (2 steps); pairwise all_to_all = n-1 steps of size/n. The
  tree is the exception: 2 x ceil(log2 n) steps of the whole buffer with partner rank XOR
  2^k (ceil(log2 n) for broadcast and reduce), recursive doubling's exchange, which takes as
  many steps as the binomial tree takes of the model's rounds. On a crowded host (2+ ranks per
  CPU: collectives/group/tuning.py, crowded) the library's small all_reduce is naive and its
  commit a star through rank 0 (2 steps of empty messages), and so is the floor's.
* `copy`, the copy floor: the bytes one rank must copy and reduce for that algorithm on this
  transport (copy_work below), copied with np.copyto and added with np.add on one core, at
  the bandwidth the machine gives at that moment (it runs interleaved with the others). For
  all_reduce only; the other collectives get no copy row.
"""

from __future__ import annotations

import math
import os
import tempfile

import numpy as np
import zmq

from collectives.algorithms.commit import ALL_TO_ALL_MAX

ZERO_COPY = 1 << 16  # as the library: below this a send copies into a ZeroMQ message


class PairMesh:
    """A PAIR socket to every other rank over ipc: the cheapest pyzmq link there is."""

    def __init__(self, rank: int, size: int, tag: str, timeout: float = 60.0):
        self.rank, self.size = rank, size
        self.ctx = zmq.Context()
        self.socks: dict[int, zmq.Socket] = {}
        self.paths = []
        for peer in range(size):
            if peer == rank:
                continue
            lo, hi = min(rank, peer), max(rank, peer)
            path = os.path.join(tempfile.gettempdir(), f"bench-floor-{tag}-{lo}-{hi}.sock")
            s = self.ctx.socket(zmq.PAIR)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))  # every wait has a deadline
            s.setsockopt(zmq.SNDTIMEO, int(timeout * 1000))
            if rank == lo:
                s.bind("ipc://" + path)
                self.paths.append(path)
            else:
                s.connect("ipc://" + path)
            self.socks[peer] = s

    def run(self, steps):
        """steps: [(sends [(peer, array)], receives [(peer, array)])]; each step sends all,
        then receives each into its array (recv_into: no allocation)."""
        socks = self.socks
        for sends, recvs in steps:
            for peer, a in sends:
                socks[peer].send(a, copy=a.nbytes < ZERO_COPY)
            for peer, a in recvs:
                try:
                    socks[peer].recv_into(a)
                except zmq.Again:
                    raise TimeoutError(
                        f"bench floor: rank {self.rank} timed out waiting for rank {peer}"
                    ) from None

    def close(self):
        for s in self.socks.values():
            s.close(0)
        self.ctx.term()
        for p in self.paths:
            if os.path.exists(p):
                os.unlink(p)


def crowded_here(n: int) -> bool:
    """Whether n ranks of this process's CPU affinity on this one host are crowded, as the
    library's group of them decides (collectives/group/tuning.py, crowded)."""
    from collectives.group import tuning
    from collectives.transport.zmq.addresses import cpu_mask, parse_cpu_mask

    return tuning.crowded([0] * n, [parse_cpu_mask(cpu_mask())] * n)


def algorithm_of(collective: str, nbytes: int, n: int, crowded: bool = False) -> str:
    """What this library runs for `collective` under algorithm="auto" (one host)."""
    if collective == "all_reduce":
        from collectives.group import tuning

        return tuning.all_reduce_algorithm(nbytes, n, crowded=crowded)
    if collective in ("broadcast", "reduce"):
        return "tree"
    if collective == "all_to_all":
        return "pairwise"
    return "ring"


def _star(rank: int, n: int, nbytes: int) -> list:
    """Everyone to rank 0, then rank 0 to everyone: two steps."""
    if rank == 0:
        others = [(p, nbytes) for p in range(1, n)]
        return [([], others), (others, [])]
    return [([(0, nbytes)], []), ([], [(0, nbytes)])]


def pattern(
    collective: str,
    algorithm: str,
    rank: int,
    n: int,
    nbytes: int,
    commit: bool,
    star: bool = False,
) -> list:
    """[(send [(peer, bytes)], recv [(peer, bytes)])] per step (see the module text); `star`:
    the commit is the star (a crowded host)."""
    others = [p for p in range(n) if p != rank]
    right, left = (rank + 1) % n, (rank - 1) % n
    piece = -(-nbytes // n)
    levels = max(1, math.ceil(math.log2(n)))
    if algorithm == "direct":
        steps = [([(p, nbytes) for p in others], [(p, nbytes) for p in others])]
    elif algorithm == "ring":
        hops = 2 * (n - 1) if collective == "all_reduce" else n - 1
        steps = [([(right, piece)], [(left, piece)])] * hops
    elif algorithm == "tree":
        partners = [rank ^ (1 << k) for k in range(levels)]
        # a partner past the last rank: this rank sits the step out (steps stay aligned)
        one = [(([(p, nbytes)], [(p, nbytes)]) if p < n else ([], [])) for p in partners]
        steps = one * (2 if collective == "all_reduce" else 1)
    elif algorithm == "naive":
        steps = _star(rank, n, nbytes)
    elif algorithm == "pairwise":
        steps = [([((rank + k) % n, piece)], [((rank - k) % n, piece)]) for k in range(1, n)]
    else:
        raise ValueError(f"no floor pattern for algorithm {algorithm!r}")
    if commit:  # the library's commit (algorithms/commit.py), message for message
        if star:
            steps = steps + _star(rank, n, 0)
        elif n <= ALL_TO_ALL_MAX:
            steps = steps + [([(p, 0) for p in others], [(p, 0) for p in others])]
        else:  # dissemination: step k to rank + 2^k, from rank - 2^k
            steps = steps + [
                ([((rank + d) % n, 0)], [((rank - d) % n, 0)])
                for d in (1 << k for k in range(math.ceil(math.log2(n))))
            ]
    return steps


def copy_work(algorithm: str, n: int, nbytes: int) -> tuple[int, int]:
    """(bytes copied, bytes reduced) by the busiest rank of an all_reduce: every byte sent is
    copied once (into a shared-memory slot, or into a ZeroMQ message below 64 KiB), every byte
    received is copied out or reduced from where it arrived.
      ring:   sends 2(n-1)/n S, reduces (n-1)/n S, copies out (n-1)/n S
      direct: sends (n-1) S, reduces (n-1) S; a rank other than 0 also keeps its own buffer
              (one copy) and starts from rank 0's (one copy out)
      naive:  rank 0 reduces (n-1) S and sends (n-1) S
      tree:   per level, one whole buffer in (reduced) and, in the broadcast, one out (sent,
              then copied out by the child): log2 n adds, 2 log2 n copies at the busiest rank."""
    s = nbytes
    if algorithm == "ring":
        return 3 * (n - 1) * s // n, (n - 1) * s // n
    if algorithm == "direct":
        return (n + 1) * s, (n - 1) * s
    if algorithm == "naive":  # rank 0 reduces n-1 buffers and sends n-1 copies of the result
        return (n - 1) * s, (n - 1) * s
    levels = max(1, math.ceil(math.log2(n)))
    return 2 * levels * s, levels * s


class _Floor:
    """What a floor backend does not need of the runner's backend protocol: no setup, no
    synchronisation, no buffers to load, no result to check."""

    def setup(self, ctx):
        pass

    def sync(self):
        pass

    def load(self, lay):
        pass

    def result(self, lay):
        return None

    def close(self):
        pass


class LatencyFloor(_Floor):
    """Backend `floor`: the bare pyzmq exchange of the algorithm's pattern (module text)."""

    name = "floor"

    def __init__(self, spec, mesh: PairMesh, rank: int, commit: bool):
        self.spec, self.mesh, self.rank, self.commit = spec, mesh, rank, commit
        self.crowded = crowded_here(spec.nproc)

    def bind(self, lay):
        n = self.spec.nproc
        alg = algorithm_of(self.spec.collective, lay.nbytes, n, self.crowded)
        steps = pattern(
            self.spec.collective, alg, self.rank, n, lay.nbytes, self.commit, self.crowded
        )
        cache: dict = {}

        def arr(nbytes, tag):
            key = (nbytes, tag)
            if key not in cache:
                cache[key] = np.ones(nbytes, np.uint8)
            return cache[key]

        # each send and each receive its own buffer, as the algorithm's chunks are
        plan = [
            (
                [(p, arr(b, ("s", i, p))) for p, b in sends],
                [(p, arr(b, ("r", i, p))) for p, b in recvs],
            )
            for i, (sends, recvs) in enumerate(steps)
        ]
        mesh = self.mesh
        return lambda: mesh.run(plan)


class CopyFloor(_Floor):
    """Backend `copy`: the copies and adds one rank must make (copy_work), on one core."""

    name = "copy"

    def __init__(self, spec):
        self.spec = spec

    def applies(self, lay) -> bool:
        return self.spec.collective == "all_reduce"

    def bind(self, lay):
        alg = algorithm_of(
            self.spec.collective, lay.nbytes, self.spec.nproc, crowded_here(self.spec.nproc)
        )
        copied, added = copy_work(alg, self.spec.nproc, lay.nbytes)
        dtype = lay.dtype
        per = max(copied, added, lay.nbytes)
        src = np.zeros(per // dtype.itemsize, dtype)  # 0 + 0: the same bandwidth, no overflow
        dst = np.zeros_like(src)
        plan = []
        for total, kind in ((copied, "copy"), (added, "add")):
            # in pieces of the buffer's size, as the algorithm's messages are
            step = max(lay.nbytes // dtype.itemsize, 1)
            count = total // dtype.itemsize
            plan += [(kind, a, min(a + step, count)) for a in range(0, count, step)]

        def run():
            for kind, a, b in plan:
                if kind == "copy":
                    np.copyto(dst[a:b], src[a:b])
                else:
                    np.add(dst[a:b], src[a:b], out=dst[a:b])

        return run
