"""Slow links kept by the hosts at their ends, for the member that takes a departed one's place.

A slow link is a slow path between two hosts: a NIC, a cable, a switch port, a tc rule on a
network namespace. It stays slow whoever runs there. The coordinator's detector
(failslow.py) knows links by rank, and a generation hands its flagged links to the next
through the members who stay (Reroute.handover, slowlinks.py): a member that leaves takes
its links with it, and a new member's links start unknown. So a replacement started on the
host of the worker it replaces (a preempted or crashed worker restarted in place, a worker
evicted and joining again) learnt the same slow link again in every generation: in a
chaos run with slow links, 3-4 s at a tenth of the job's pace after every join, until the
link was flagged afresh.

HostLinks keeps each flagged link whose end left, by the two hosts' ids (the transport's
`host`: the machine and its network namespace, transport/zmq/addresses.py), and hands it to
the first generation that has exactly one member on each of those hosts, one of them new.
The link is then flagged from that generation's first schedule, on the figures it was
flagged on; the link tests (linktest.py) clear it, as any other, if it is not slow. Hosts
with several members are left out: which of them the link was is not known. The members'
hosts come from their addresses as each generation forms (changes.install_generation), and
after a coordinator restart from their re-registrations (protocol.Rejoin's host).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from .effects import Mid
from .failslow import Known, relinked

HostPair = tuple[str, str]  # (the sender's host, the receiver's): the direction the bytes go
MAX_KEPT = 64  # links kept; the oldest go first


@dataclass
class HostLinks:
    """Flagged links whose end left, by the hosts at their two ends (see the module)."""

    kept: dict[HostPair, Known] = field(default_factory=dict)

    def remember(
        self, leaving: Iterable[Known], roster: list[Mid], hosts: Mapping[Mid, str]
    ) -> None:
        """Keep `leaving` (flagged links with an end that left, by the ranks of `roster`) by
        their ends' hosts; a link with an end whose host is unknown is not kept."""
        for known in leaving:
            a, b = known.link
            if not (0 <= a < len(roster) and 0 <= b < len(roster)):
                continue
            ha, hb = hosts.get(roster[a]), hosts.get(roster[b])
            if ha is None or hb is None or ha == hb:
                continue
            self.kept.pop((ha, hb), None)  # the newest figures, at the end
            self.kept[(ha, hb)] = known
        while len(self.kept) > MAX_KEPT:
            del self.kept[next(iter(self.kept))]

    def adopt(
        self, members: list[Mid], hosts: Mapping[Mid, str], stayed: Collection[Mid]
    ) -> list[Known]:
        """The kept links this roster (`members`, by rank) takes over, by its ranks: those
        whose two hosts have one member each here, one of them not in `stayed` (the members
        that came from the generation before: their links came over by rank). Each is
        handed over once."""
        on_host: dict[str, list[int]] = {}
        for rank, mid in enumerate(members):
            host = hosts.get(mid)
            if host is not None:
                on_host.setdefault(host, []).append(rank)
        adopted = []
        for (ha, hb), known in list(self.kept.items()):
            ra, rb = on_host.get(ha, ()), on_host.get(hb, ())
            if len(ra) != 1 or len(rb) != 1:
                continue
            if members[ra[0]] in stayed and members[rb[0]] in stayed:
                continue
            adopted.append(relinked(known, (ra[0], rb[0])))
            del self.kept[(ha, hb)]
        return adopted


__all__ = ["MAX_KEPT", "HostLinks", "HostPair"]
