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
"""

from __future__ import annotations

import random
from dataclasses import dataclass

CULPRIT_KINDS = ("links", "nic", "partition", "isolated", "crash", "stop")
OTHER_KINDS = ("late", "starved", "coordinator")
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
    if f.kind in ("nic", "partition", "isolated"):
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
