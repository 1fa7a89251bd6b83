"""The faults of one simulated run, drawn from its seed, and the network they act on.

Faults persist as real ones do (DESIGN.md, principle 11): a slowed link stays slow in every
generation, a partition never heals, a crashed or stopped process never comes back. Each
fault names the ranks (by launch id: the rank a process started with) whose eviction it
justifies, `culprits`; a late or CPU-starved rank and a coordinator restart justify none.

  links        the seed's pattern around c: (c-1)->c and c->(c+1) slowed to a crawl
  nic          a slow NIC: every link into and out of c slowed
  partition    c's data links cut both ways (its coordinator link works)
  isolated     c cut off from everyone, the coordinator too (heartbeats find it)
  crash        c's process ends; a witness reports it a few ms later
  stop         c is SIGSTOPped: no beats, no progress, never resumed
  late         c enters step k's op late (CPU starvation in its compute); half of them
               starved too from the moment they enter (their pictures come late as well)
  starved      c handles everything that reaches it late by tens to hundreds of ms (its
               answers to pings, its pictures, its frames) for a while
  coordinator  the coordinator dies, and is restarted after a while (recovery.py)

Fail-slow (slower than its peers, never past the op's deadline; drawn in a share of the seeds,
FAILSLOW_SHARE, from a stream of their own, which makes the run a longer one of larger ops:
draw_failslow):
  slowlink     c->(c+1) at its bandwidth / factor (5-50x)
  slownic      every link into and out of c at its bandwidth / 2 or / 4 (a NIC at half or a
               quarter of its speed)
Neither justifies an eviction: the coordinator routes around them (its policy reroute), and
under shrink or replace may remove the rank of a slow NIC (only that rank).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from ..transport.linkstats import LARGE_BYTES
from .programs import programs

CULPRIT_KINDS = ("links", "nic", "partition", "isolated", "crash", "stop")
OTHER_KINDS = ("late", "starved", "coordinator")
FAILSLOW_KINDS = ("slowlink", "slownic")
FAILSLOW_SHARE = 0.12  # of the seeds: a fail-slow run
# the fail-slow draw's own stream (world.py): this one leaves every regression seed of the
# sweep that came before fail-slow (tests/unit/simulation) the run it was found in
FAILSLOW_SALT = 121
FAILSLOW_SPAN = 8.0  # virtual s a fail-slow run's ops last, about (detection takes 2-4 s)
FAILSLOW_OP = 0.35  # of the op timeout: the most a slowed op takes (never past the deadline)
MOST_SLOW = 50.0  # the most a link is slowed by fail-slow faults together
WORST_BANDWIDTH = 0.5e9  # bytes/s: the slowest healthy link the network draws (world.py)
HOLD = 30.0  # s: what a slowed link adds to every message (tc holding it: far past any deadline)
CRAWL = 2500.0  # bytes/s on a slowed link (~20 kbit/s, the seed's tc)


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int  # the launch id it strikes (-1: the coordinator)
    step: int  # it strikes when the first rank begins this training step ...
    after: float  # ... this many seconds later
    delay: float = 0.0  # late: how late; starved: how long each event waits; coordinator:
    #                     how long until the restart
    span: float = 0.0  # starved: for how long
    factor: float = 1.0  # fail-slow: the links' bandwidth is divided by this

    @property
    def culprits(self) -> frozenset[int]:
        return frozenset((self.rank,)) if self.kind in CULPRIT_KINDS else frozenset()

    def describe(self) -> str:
        what = {
            "links": f"links {self.rank - 1}->{self.rank} and {self.rank}->{self.rank + 1} slowed",
            "nic": f"every link of rank {self.rank} slowed (a slow NIC)",
            "partition": f"rank {self.rank}'s data links cut",
            "isolated": f"rank {self.rank} cut off from everyone",
            "crash": f"rank {self.rank} crashes",
            "stop": f"rank {self.rank} stopped (SIGSTOP)",
            "late": f"rank {self.rank} enters the op {self.delay * 1000:.0f} ms late",
            "starved": f"rank {self.rank} starved: {self.delay * 1000:.0f} ms per event for "
            f"{self.span:.2f} s",
            "coordinator": f"the coordinator dies, restarted after {self.delay:.2f} s",
            "slowlink": f"link {self.rank}->(its ring successor) {self.factor:.0f}x slower "
            "(fail-slow)",
            "slownic": f"every link of rank {self.rank} {self.factor:.0f}x slower (a slow NIC, "
            "fail-slow)",
        }[self.kind]
        return f"{what} (step {self.step} + {self.after * 1000:.0f} ms)"


def slowed_links(f: Fault, ring: list[int]) -> set[tuple[int, int]]:
    """The directed links (launch ids) a link fault slows or cuts, among the processes of
    `ring` (the current generation's launch ids in rank order: the seed's pattern is around
    c's neighbours as they are now, not as they were at launch)."""
    c = f.rank
    if c not in ring:
        return set()
    if f.kind == "links":
        i = ring.index(c)
        before, after = ring[i - 1], ring[(i + 1) % len(ring)]
        return {(a, b) for a, b in ((before, c), (c, after)) if a != b}
    if f.kind == "slowlink":
        after = ring[(ring.index(c) + 1) % len(ring)]
        return {(c, after)} if after != c else set()
    if f.kind in ("nic", "partition", "isolated", "slownic"):
        return {(c, p) for p in ring if p != c} | {(p, c) for p in ring if p != c}
    return set()


def blamed(f: Fault, links: set[tuple[int, int]] | frozenset[tuple[int, int]]) -> frozenset[int]:
    """Whose eviction the fault justifies once it struck on `links`: its rank; where its
    links are one link alone (c's two neighbours are one process), either end of it, which
    no judge can tell apart from a slow NIC at the other end."""
    if not f.culprits:
        return frozenset()
    if f.kind == "links" and len(links) == 1:
        ((a, b),) = links
        return frozenset((a, b))
    return f.culprits


def draw(rng: random.Random, n: int, ops: int, op_timeout: float) -> list[Fault]:
    """A mix: at most one culprit fault per three ranks (a majority survives), some late or
    starved ranks, sometimes a coordinator death; each strikes early enough that an op
    follows it."""
    faults: list[Fault] = []
    struck: set[int] = set()
    for _ in range(rng.choice((0, 1, 1, 1, 2) if n >= 5 else (0, 1, 1, 1))):
        c = rng.choice([r for r in range(n) if r not in struck])
        struck.add(c)
        faults.append(
            Fault(rng.choice(CULPRIT_KINDS), c, rng.randrange(ops - 1), rng.uniform(0, 0.02))
        )
    for _ in range(rng.choice((0, 1, 1, 2))):
        c = rng.randrange(n)
        if rng.random() < 0.5:
            delay = rng.uniform(0.05, 0.6) * op_timeout
            faults.append(Fault("late", c, rng.randrange(ops), 0.0, delay))
        else:
            faults.append(
                Fault(
                    "starved",
                    c,
                    rng.randrange(ops),
                    rng.uniform(0, 0.05),
                    rng.uniform(0.02, 0.3),
                    rng.uniform(0.5, 3.0),
                )
            )
    for f in [f for f in faults if f.kind == "late"]:
        if rng.random() < 0.5:  # short of CPU as it enters: its pictures come late too
            lag = rng.uniform(0.02, 0.2)
            faults.append(Fault("starved", f.rank, f.step, f.delay, lag, rng.uniform(0.5, 2.0)))
    if rng.random() < 0.15:
        faults.append(
            Fault(
                "coordinator", -1, rng.randrange(ops), rng.uniform(0, 0.05), rng.uniform(0.2, 1.5)
            )
        )
    return faults


@dataclass(frozen=True)
class FailSlowRun:
    """What a fail-slow run changes in the job (world.py, Config): its size and length, its
    compute gap, the coordinator's policy."""

    count: int
    ops: int
    compute: tuple[float, float]
    failslow: str
    spare_wait: float | None


def draw_failslow(
    rng: random.Random, n: int, algorithm: str, op_timeout: float, culprits: set[int]
) -> tuple[FailSlowRun, list[Fault]]:
    """A fail-slow run: one slow link or slow NIC (two where n >= 5), on ranks no culprit
    fault strikes; ops large enough that every ring step's frame is timed for throughput
    (linkstats.LARGE_BYTES) yet small enough that the slowest op stays within FAILSLOW_OP of
    the deadline; enough of them, a compute gap apart, for FAILSLOW_SPAN seconds; a policy
    drawn (reroute mostly; shrink, and replace with a spare wait, which no spare answers)."""
    free = [r for r in range(n) if r not in culprits]
    faults = []
    for _ in range(min(len(free), 2 if n >= 5 and rng.random() < 0.3 else 1)):
        c = free.pop(rng.randrange(len(free)))
        if rng.random() < 0.6:
            f = Fault("slowlink", c, rng.randrange(1, 5), rng.uniform(0, 0.02))
            f = replace(f, factor=rng.uniform(5.0, 50.0))
        else:
            f = Fault("slownic", c, rng.randrange(1, 5), rng.uniform(0, 0.02))
            f = replace(f, factor=rng.choice((2.0, 4.0)))
        faults.append(f)
    # a slow link may come to lie at a slow NIC (a regroup renumbers the ring): together
    # they stay within MOST_SLOW, so that no op passes its deadline
    nics = [f.factor for f in faults if f.kind == "slownic"]
    cap = MOST_SLOW / (nics[0] * nics[1] if len(nics) == 2 else nics[0] if nics else 1.0)
    faults = [replace(f, factor=min(f.factor, cap)) if f.kind == "slowlink" else f for f in faults]
    links = [f.factor for f in faults if f.kind == "slowlink"]
    worst = max(links, default=1.0) * MOST_SLOW / cap  # the slowest any link can be
    # the busiest link's bytes per op, per float (the programs scale with the count)
    unit = 64 * 1024 * n
    load = _busiest(algorithm, n, unit) / unit
    most = FAILSLOW_OP * op_timeout * WORST_BANDWIDTH / worst / load
    least = (LARGE_BYTES * 1.2) * n / 4  # a ring frame (count * 4 / n) is a large one
    count = int(max(least, min(most, 4 * least)))
    healthy = _busiest(algorithm, n, count) / (2 * WORST_BANDWIDTH)
    compute = (0.03, 0.08)
    ops = int(FAILSLOW_SPAN / (sum(compute) / 2 + healthy * 2))
    policy = rng.choice(("reroute", "reroute", "reroute", "reroute", "shrink", "replace"))
    spare_wait = rng.uniform(0.5, 2.0) if policy == "replace" else None
    run = FailSlowRun(count, max(30, min(ops, 160)), compute, policy, spare_wait)
    return run, faults


def _busiest(algorithm: str, n: int, count: int) -> int:
    """The most bytes one directed link carries in an op (of any rank's program)."""
    per: dict[tuple[int, int], int] = {}
    for r, prog in enumerate(programs(algorithm, n, count)):
        for s in prog:
            if s.kind == "send":
                per[(r, s.peer)] = per.get((r, s.peer), 0) + s.nbytes
    return max(per.values(), default=1)
