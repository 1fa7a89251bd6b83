"""Routing the collectives around slow links: the coordinator's side, without I/O.

Events in: a member's beat (its rank, op sequence number and link summary), its answer to a
proposal (`ack`), and the clock (`tick`). Out: typed records for the shell (slowlinks.py) to
carry out -- messages to every member, log lines, a rank to replace.

The agreement (transport/schedbook.py is the member's side): the coordinator proposes a plan
(algorithms/schedule.py) from op `start`, a few ops past the furthest rank it has heard of;
every member accepts if it has not reached `start`, else refuses. All accept: `go`, and the
plan holds from `start` on every rank. One refuses, or not all answer within ACK_WAIT: `drop`,
and the proposal is made again further ahead. A member that reaches `start` before the
decision waits for it, so no rank runs op `start` on another plan than the others.

The policy ($COLLECTIVES_FAILSLOW_POLICY, common/config.py):
  report   flag and log, change nothing;
  reroute  (default) also hand out the schedule the cost model predicts fastest around the
           flagged links (algorithms/schedule.py, plan_around), where one beats the default;
           around a slow NIC -- flagged, or only behind its peers (slownic.py: a NIC at half
           speed) -- the ring with its chunks sized by bandwidth (plan_for_nics), where that
           beats the default;
  replace  also, where a rank's NIC is slow (no schedule avoids it) and a spare waits, remove
           that rank so that the next generation takes the spare in its place: when the NIC
           is flagged, or later, as soon as a spare waits (one that arrives after the flag);
           never more ranks in one generation than spares wait, so the group never shrinks
           -- unless asked (spare_wait): a slow NIC that no spare came for within spare_wait
           seconds of its flag is removed as under shrink;
  shrink   also, where a rank's NIC is slow, remove that rank without a spare: the others go
           on as one rank fewer, at their own pace. Never below min_world ranks (the user's
           smallest world): a slow NIC that would take the job below it is kept, and said so.

A coordinator that restarts knows nothing of the proposals its predecessor made; the members
do (transport/schedbook.py, BookState), and `orphans` decides each one a member holds
undecided from every member's book: go where a member applied it, else drop. Where a member
ran one of them, the ranks may be on a plan the new coordinator never made, which it could
neither retry nor clear: it proposes the schedule it wants (the default, until a link is
flagged again) from a fresh op, so that it and every rank agree again (Reroute.unsure).

A link routed around carries nothing, so nothing says when it recovers: after RETRY_AFTER
seconds (doubling each time it turns out still slow, up to RETRY_MAX) one op runs on the
default schedule again, a trial, and the plan around the link returns at the next op on its
own (a proposal may hold for a number of ops). The trial op's frames are judged like any: slow
still, the link is flagged again and the next trial waits twice as long; well, it is cleared
and the default schedule comes back for good.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from ..algorithms.schedule import Plan, plan_around, plan_for_nics
from ..transport.linkstats import LinkCounters
from ..transport.schedbook import BookState
from .failslow import Cleared, Detector, Flagged, Link, Thresholds, describe
from .protocol import FailSlowStatus, SchedDrop, SchedGo, Schedule
from .slownic import NicJudge, nic_costs
from .slownic import describe as describe_nic

POLICIES = ("report", "reroute", "replace", "shrink")
LEAD = 1  # a proposal starts this many ops past the furthest rank (doubled on each refusal)
ACK_WAIT = 2.0  # s for every member to answer a proposal
RETRY_AFTER = 30.0  # s before a routed-around link is tried again (a trial costs one slow op)
RETRY_MAX = 300.0
KEEP_DECISIONS = 8  # decisions remembered, to send again to a member that missed one


class ToAll(NamedTuple):
    """A message for every member's heartbeat socket."""

    msg: Schedule | SchedGo | SchedDrop


class Note(NamedTuple):
    """A log line (and an event in the coordinator's history)."""

    text: str


class Orphan(NamedTuple):
    """A proposal of a coordinator that died, held undecided by a member: the decision."""

    version: int
    start: int
    go: bool


def orphans(books: Iterable[BookState]) -> list[Orphan]:
    """The decision on every proposal a member holds undecided, from every member's book:
    go iff some member applied it (the same version from the same op: the old coordinator
    decided go, so every member had accepted it), else drop (nobody ran an op on it)."""
    books = list(books)
    applied = {(b.current_version, b.current_start) for b in books if b.current_version >= 0}
    held: dict[int, set[int]] = {}
    for b in books:
        if b.pending_version >= 0:
            held.setdefault(b.pending_version, set()).add(b.pending_start)
    out = []
    for version, starts in sorted(held.items()):
        start = min(starts)
        go = len(starts) == 1 and (version, start) in applied  # two starts: not one proposal
        out.append(Orphan(version, start, go))
    return out


class Replace(NamedTuple):
    """Remove this rank: a spare waits to take its place."""

    rank: int
    reason: str


class Shrink(NamedTuple):
    """Remove this rank with no spare to take its place: the group goes on one rank fewer."""

    rank: int
    reason: str


Out = ToAll | Note | Replace | Shrink


@dataclass
class _Proposal:
    version: int
    start: int
    plan: Plan | None
    at: float
    trial: tuple[Link, ...] = ()  # a trial: one op on `plan`, these links back in it
    acked: set[int] = field(default_factory=set)
    refused: bool = False


@dataclass
class _Trial:
    links: tuple[Link, ...]
    start: int  # the trial op
    judge_at: float | None = None  # once every rank is past it: when its figures are in


class Reroute:
    """Fail-slow detection and rescheduling for one generation of `size` ranks."""

    def __init__(
        self,
        size: int,
        generation: int,
        policy: str = "reroute",
        th: Thresholds | None = None,
        version: int = 0,
        unsure: bool = False,
        min_world: int = 1,
        spare_wait: float | None = None,
    ):
        """version: the proposals are numbered after it (a restarted coordinator's: past
        every version its predecessor gave out). unsure: the members may run a schedule
        this coordinator did not agree (its predecessor's, before a restart). min_world: a
        rank removed without a spare never leaves fewer ranks. spare_wait: under replace,
        seconds a slow NIC waits for a spare before it is removed without one (None: for
        good)."""
        if policy not in POLICIES:
            raise ValueError(f"fail-slow policy must be one of {', '.join(POLICIES)}: {policy!r}")
        self.size, self.generation, self.policy = size, generation, policy
        self.min_world, self.spare_wait = min_world, spare_wait
        self.nic_since: dict[int, float] = {}  # a slow NIC's rank -> when it was flagged
        self.shrunk: set[int] = set()  # ranks removed without a spare
        self.kept: set[int] = set()  # slow NICs kept: their removal would go below min_world
        self.detector = Detector(size, th)
        self.nic_judge = NicJudge(size)  # NICs behind their peers, short of a flag
        self.seqs = [-1] * size  # each rank's last reported op
        self.version = version
        self.current: Plan | None = None  # decided
        self.current_start = 0
        self.pending: _Proposal | None = None
        self.lead = LEAD
        self.retry = RETRY_AFTER
        self.retry_at: float | None = None  # when the routed-around links are tried again
        self.trial: _Trial | None = None
        self.replaced: set[int] = set()
        self._chosen: tuple[frozenset[Link], Plan | None] | None = None  # (slow links, their plan)
        self._nic_chosen: tuple[frozenset[int], Plan | None] | None = None  # (NICs, their plan)
        self.decisions: dict[int, bool] = {}  # the last few versions decided: go or drop
        # The members may run a plan this Reroute does not know (a restarted coordinator's
        # predecessor agreed it): nothing would ever retry or clear it, so the plan wanted now
        # is proposed even where it is the default, and the ranks and this agree again.
        self.unsure = unsure

    # --- events ---------------------------------------------------------------------------
    def beat(self, rank: int, seq: int, rows: list[LinkCounters], now: float) -> None:
        if 0 <= rank < self.size:
            self.seqs[rank] = max(self.seqs[rank], seq)
            self.detector.beat(rank, rows, now)

    def ack(self, rank: int, version: int, ok: bool) -> None:
        p = self.pending
        if p is None or version != p.version or not 0 <= rank < self.size:
            return
        if ok:
            p.acked.add(rank)
        else:
            p.refused = True

    def decided(self, version: int) -> bool | None:
        """Whether proposal `version` went ahead (None: not decided, or long ago), for a
        member that re-registers holding it undecided: the decision may have been sent
        while its connection was down, and a ROUTER socket drops what it cannot deliver."""
        return self.decisions.get(version)

    def tick(self, now: float, spare_waiting: int = 0) -> list[Out]:
        """spare_waiting: how many spares wait to be admitted (a bool: one or none)."""
        out: list[Out] = []
        spares = int(spare_waiting)
        for ev in self.detector.evaluate(now):
            out.extend(self._on_event(ev, now, spares))
        for nev in self.nic_judge.evaluate(self.detector.rates, now, self.detector.newest):
            out.append(Note(describe_nic(nev)))
        out.extend(self._replace(spares))
        out.extend(self._shrink(now))
        out.extend(self._settle(now))
        if self.policy == "report" or self.pending is not None:
            return out
        if (
            self.retry_at is not None
            and now >= self.retry_at
            and self.current is not None
            and self.trial is None
            and min(self.seqs) >= self.current_start
        ):
            self.retry_at = None
            return out + self._propose(None, now, trial=self.current.avoided)
        if self.trial is not None:
            out.extend(self._judge_trial(now))
        want = self._wanted()
        if (want != self.current or self.unsure) and min(self.seqs) >= self.current_start:
            out.extend(self._propose(want, now))
        return out

    # --- internals --------------------------------------------------------------------------
    def _judge_trial(self, now: float) -> list[Out]:
        t = self.trial
        assert t is not None
        if t.judge_at is None:
            if min(self.seqs) > t.start:  # every rank is past the trial op
                t.judge_at = now + self.detector.th.window
            return []
        if now < t.judge_at:
            return []
        self.trial = None
        flagged = {f.link for f in self.detector.flagged()}
        figs = [f for f in self.detector.figures() if f.link in t.links]
        well = [f for f in figs if f.rate >= f.reference / self.detector.th.clear_ratio]
        if flagged & set(t.links) or len(well) < len(t.links):
            self._still_slow(t.links, now)
            return (
                [] if flagged & set(t.links) else [Note(f"{_links(t.links)} not judged: kept off")]
            )
        self.retry = RETRY_AFTER
        return [Note(f"{_links(t.links)} cleared: " + "; ".join(f.text() for f in well))]

    def _still_slow(self, links: Iterable[Link], now: float) -> None:
        for link in links:
            self.detector.flag(link)
        self.retry = min(2 * self.retry, RETRY_MAX)
        self.retry_at = now + self.retry

    def _replace(self, spares: int) -> list[Out]:
        """Under `replace`: each slow NIC not replaced yet, while spares wait for its place."""
        if self.policy != "replace":
            return []
        out: list[Out] = []
        flagged = {f.link: f for f in self.detector.flagged()}
        for rank in sorted(self.detector.nics - self.replaced - self.shrunk):
            if len(self.replaced) >= spares:
                break
            self.replaced.add(rank)
            figs = "; ".join(f.text() for k, f in flagged.items() if rank in k)
            out.append(Replace(rank, f"its NIC is slow ({figs}); a waiting spare takes its place"))
        return out

    def _shrink(self, now: float) -> list[Out]:
        """Under shrink, each slow NIC; under replace with spare_wait, each that no spare
        came for within spare_wait of its flag: removed, while the ranks left stay at least
        min_world."""
        if self.policy == "shrink":
            due = self.detector.nics
        elif self.policy == "replace" and self.spare_wait is not None:
            due = {r for r in self.detector.nics if now - self.nic_since[r] >= self.spare_wait}
        else:
            return []
        out: list[Out] = []
        flagged = {f.link: f for f in self.detector.flagged()}
        for rank in sorted(due - self.replaced - self.shrunk - self.kept):
            figs = "; ".join(f.text() for k, f in flagged.items() if rank in k)
            left = self.size - len(self.replaced) - len(self.shrunk) - 1
            if left < self.min_world:
                self.kept.add(rank)
                out.append(
                    Note(
                        f"rank {rank}'s NIC is slow ({figs}), but removing it would leave "
                        f"{left} rank(s), below COLLECTIVES_FAILSLOW_MIN_WORLD={self.min_world}"
                        ": keeping it"
                    )
                )
                continue
            self.shrunk.add(rank)
            waited = (
                "" if self.policy == "shrink" else f"; no spare came within {self.spare_wait:g} s"
            )
            out.append(
                Shrink(rank, f"its NIC is slow ({figs}){waited}; the job goes on at {left} ranks")
            )
        return out

    def _on_event(self, ev: Flagged | Cleared, now: float, spares: int) -> list[Out]:
        out: list[Out] = [Note(describe(ev))]
        if isinstance(ev, Flagged) and ev.rank is not None:
            self.nic_since.setdefault(ev.rank, now)
        elif isinstance(ev, Cleared) and ev.rank is not None:
            self.nic_since.pop(ev.rank, None)
            self.kept.discard(ev.rank)
        if isinstance(ev, Flagged) and ev.link is not None and self.trial is not None:
            if ev.link in self.trial.links:  # still slow: around it again, and wait longer
                links, self.trial = self.trial.links, None
                self._still_slow(links, now)
        if isinstance(ev, Flagged) and ev.rank is not None and self.policy != "shrink":
            if self.policy != "replace" or len(self.replaced) >= spares:  # else _replace
                out.append(
                    Note(
                        f"no schedule avoids rank {ev.rank}'s links"
                        + ("" if self.policy == "replace" else "; policy " + self.policy)
                        + ("" if spares else "; no spare waits")
                        + (
                            f" (the rank is removed if none comes within {self.spare_wait:g} s)"
                            if self.policy == "replace" and self.spare_wait is not None
                            else ""
                        )
                        + ": keeping the schedule as it is"
                    )
                )
        return out

    def _wanted(self) -> Plan | None:
        if self.policy == "report":
            return None
        nics = self.detector.nics | self.nic_judge.behind
        slow = [f.link for f in self.detector.flagged() if not set(f.link) & nics]
        if self.trial is not None:  # on trial: kept off but for the trial op, until judged
            slow += [x for x in self.trial.links if x not in slow]
        if not slow:
            plan = self._nic_plan(nics - self.replaced - self.shrunk)
            if plan is not None:
                same = self.current is not None and plan.shape() == self.current.shape()
                return self.current if same else plan
            return self.current if nics else None  # a slow NIC no plan helps: keep what runs
        key = frozenset(slow)
        if self._chosen is None or self._chosen[0] != key:
            # priced once per set of slow links, on the figures of that moment: a plan that
            # followed every new figure would be proposed again at every tick
            costs = self.detector.link_costs(sorted(key))
            self._chosen = (key, plan_around(self.size, key, costs))
        plan = self._chosen[1]
        if plan is not None and self.current is not None and plan.shape() == self.current.shape():
            return self.current
        return plan

    def _nic_plan(self, nics: set[int]) -> Plan | None:
        """The ring with chunks sized around these slow NICs, where predicted faster (priced
        once per set of them, on the figures of that moment, as _wanted's plans are)."""
        if not nics:
            return None
        key = frozenset(nics)
        if self._nic_chosen is None or self._nic_chosen[0] != key:
            d = self.detector
            lat = {k: x for k in d.rates if (x := d.latency(k)) is not None}
            costs = nic_costs(self.size, key, d.rates, lat)
            plan = None if costs is None else plan_for_nics(self.size, key, costs)
            self._nic_chosen = (key, plan)
        return self._nic_chosen[1]

    def _propose(self, plan: Plan | None, now: float, trial: tuple[Link, ...] = ()) -> list[Out]:
        self.version += 1
        start = max(self.seqs) + self.lead
        self.pending = _Proposal(self.version, start, plan, now, tuple(trial))
        msg = Schedule(
            generation=self.generation,
            version=self.version,
            start=start,
            plan=None if plan is None else plan.wire(),
            ops=1 if trial else None,
        )
        return [ToAll(msg)]

    def _settle(self, now: float) -> list[Out]:
        p = self.pending
        if p is None:
            return []
        done = len(p.acked) == self.size
        if not done and not p.refused and now - p.at < ACK_WAIT:
            return []
        self.pending = None
        go = SchedGo(generation=self.generation, version=p.version)
        self.decisions[p.version] = done
        while len(self.decisions) > KEEP_DECISIONS:
            del self.decisions[min(self.decisions)]
        if not done:
            self.lead = min(2 * self.lead, 64)
            if p.trial:
                self.retry_at = now  # the trial again, further ahead
            return [ToAll(SchedDrop(generation=self.generation, version=p.version))]
        self.lead = LEAD
        if p.trial:
            for link in p.trial:  # judged afresh on the trial op's frames
                self.detector.clear(link, now)
            self.trial = _Trial(p.trial, p.start)
            note = f"trying {_links(p.trial)} again for op #{p.start} (the default schedule)"
            return [ToAll(go), Note(note)]
        before, self.current, self.current_start = self.current, p.plan, p.start
        was_unsure, self.unsure = self.unsure, False
        if p.plan is not None:
            # a ring sized around a NIC still carries its links' figures: no trial needed
            self.retry_at = None if p.plan.weights else now + self.retry
            what = f"rerouted from op #{p.start}: {p.plan.describe()}"
        else:
            self.retry_at = None
            what = f"back to the default schedule from op #{p.start}"
        if before == p.plan and not was_unsure:  # unsure: say which schedule runs now
            return [ToAll(go)]
        return [ToAll(go), Note(what)]

    # --- what to show -----------------------------------------------------------------------
    def status(self) -> FailSlowStatus:
        """What the coordinator's status answer and the launcher's progress line show."""
        return FailSlowStatus(
            policy=self.policy,
            flagged=[f.text() for f in self.detector.flagged()],
            nics=sorted(self.detector.nics),
            schedule=None if self.current is None else self.current.describe(),
            replaced=sorted(self.replaced | self.shrunk),
        )


def _links(links: Sequence[Link]) -> str:
    return ("links " if len(links) > 1 else "link ") + ", ".join(f"{a}->{b}" for a, b in links)


__all__ = [
    "POLICIES",
    "Note",
    "Orphan",
    "Out",
    "Replace",
    "Reroute",
    "Shrink",
    "ToAll",
    "orphans",
]
