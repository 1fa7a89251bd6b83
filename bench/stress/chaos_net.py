"""The network of a chaos run on network-namespace hosts (tests/support/netns.py): the link
faults that need real links, a slow pair held by tc and a partitioned host.

A slow pair (i, j): both directed links between hosts i and j held to a rate for the rest of
the run, by an htb class and a u32 filter on each host's egress (packets to the other host's
address); every other packet goes through a class as fast as the veth, so that only those
links slow down (netem is not available here). A worker that replaces one on either host
inherits the slow link, as it would a slow cable. Pairs are chosen disjoint while the hosts
allow (a ring can then avoid every one of them), at most `max_pairs` of them.

A partition: the host's link set down, then up after `seconds`: its worker loses every peer
and the coordinator at once, is evicted, and rejoins when the link is back.
"""

from __future__ import annotations

import itertools
import random
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Protocol

FAST = "100gbit"  # the class of every packet not on a slow link: the veth's own speed


def _run(*argv: str) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, text=True, timeout=20)


class NamespaceHosts(Protocol):
    """What this module needs of tests/support/netns.Hosts."""

    names: list[str]
    devs: list[str]
    ips: list[str]


@dataclass
class Network:
    hosts: NamespaceHosts
    workers: int  # hosts 0..workers-1 carry workers (the coordinator's host is left alone)
    rate: str
    max_pairs: int
    slow: list[tuple[int, int]] = field(default_factory=list)
    _shaped: set[int] = field(default_factory=set)

    def can_slow(self) -> bool:
        return len(self.slow) < self.max_pairs and bool(self._free_pairs())

    def _free_pairs(self) -> list[tuple[int, int]]:
        taken = {h for pair in self.slow for h in pair}
        pairs = [p for p in itertools.combinations(range(self.workers), 2) if p not in self.slow]
        disjoint = [p for p in pairs if not taken & set(p)]
        return disjoint or pairs

    def slow_pair(self, host: int, rng: random.Random) -> tuple[int, int] | None:
        """Slow a pair that includes `host` where one is free, else any free pair."""
        free = self._free_pairs()
        mine = [p for p in free if host in p]
        if not free:
            return None
        pair = rng.choice(mine or free)
        for a, b in (pair, pair[::-1]):
            self._shape(a)
            ns, dev = self.hosts.names[a], self.hosts.devs[a]
            _run("tc", "-n", ns, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip",
                 "prio", "2", "u32", "match", "ip", "dst", f"{self.hosts.ips[b]}/32",
                 "flowid", "1:20")  # fmt: skip
        self.slow.append(pair)
        return pair

    def _shape(self, host: int) -> None:
        """The host's egress: htb with a fast default class and a slow one (once per host)."""
        if host in self._shaped:
            return
        ns, dev = self.hosts.names[host], self.hosts.devs[host]
        on_dev = ("dev", dev, "parent", "1:")
        _run("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb",
             "default", "10")  # fmt: skip
        _run("tc", "-n", ns, "class", "add", *on_dev, "classid", "1:10", "htb", "rate", FAST)
        _run("tc", "-n", ns, "class", "add", *on_dev, "classid", "1:20", "htb", "rate",
             self.rate, "ceil", self.rate, "burst", "2k", "cburst", "2k")  # fmt: skip
        self._shaped.add(host)

    def partition(self, host: int, seconds: float) -> None:
        """The host's link down now, up again after `seconds` (on a timer thread)."""
        ns, dev = self.hosts.names[host], self.hosts.devs[host]
        _run("ip", "-n", ns, "link", "set", dev, "down")

        def heal():
            # the namespace may be gone already (the run ended): nothing to heal then
            subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], capture_output=True,
                           timeout=20)  # fmt: skip

        t = threading.Timer(seconds, heal)
        t.daemon = True
        t.start()
