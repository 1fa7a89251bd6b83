"""Routing the collectives around slow links: the coordinator's side, without I/O.

One Reroute per generation holds what the coordinator knows of its links and schedules. Fed a
member's figures (`beat`: its rank, op sequence number and link summary), its answer to a
proposal (`ack`), and the judgement due at a tick (`tick`), it speaks the coordinator
machine's own effects (effects.py): a message to every live member's heartbeat connection
(`Outbox.send`), a line for the log (`Outbox.note`), a rank removed (`Members.remove`, which
slowlinks.py carries out with changes.declare). The handlers that feed it are slowlinks.py's;
the judgements it acts on are data: which links are slow and their figures (failslow.py:
`Flagged`, `Cleared`), which NICs run behind (slownic.py), which old proposals hold
(`orphans`).

The agreement (group/schedbook.py is the member's side): the coordinator proposes a plan
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

One Reroute serves one generation. The next inherits what it learnt (`handover`, `Carried`):
its flagged links and slow NICs, renumbered from old ranks to new (the shell maps them
through the members' ids), with the figures they were flagged on, and the tests' back-off.
So a regroup does not cost the 1.5-3 s of evidence and the ops on the default schedule that
learning a link again would; the plan around them is proposed once every member has beaten.

A coordinator that restarts knows nothing of the proposals its predecessor made; the members
do (group/schedbook.py, BookState), and `orphans` decides each one a member holds
undecided from every member's book: go where a member applied it, else drop. Where a member
ran one of them, the ranks may be on a plan the new coordinator never made, which it could
neither retry nor clear: it proposes the schedule it wants (the default, until a link is
flagged again) from a fresh op, so that it and every rank agree again (Reroute.unsure).

A link routed around carries next to nothing, so its own figures never say when it recovers:
after RETRY_AFTER seconds (doubling each time it turns out still slow, up to RETRY_MAX) it is
tested (`TestLinks`, transport/linktest.py), off the schedule: its sender posts a frame at
each of its next TEST_FRAMES ops, and so does the sender of a healthy link into the same
receiver, its witness. The frames are the kind the link was flagged on: large (TEST_BYTES)
for a throughput, small (TEST_SMALL) for a latency. The link is well when its fastest frame's
transit is nearer, in ratio, to the healthy pace -- the witness's fastest, at least the time
a frame takes at the link's peers' pace when it was flagged (two healthy frames of a
millisecond differ by more than a ratio says) -- than to the link's own pace when flagged
(at most their geometric mean), or slow_ratio times quicker than that own pace (the ratio
that flagged it). Not within clear_ratio of the healthy pace: a connection that carried only
commit messages since its congestion window was cut under the slowdown sends a test frame
slowly whatever the link (TCP grows the window only while it is used in full), so a
recovered link read 7.1-7.6 ms for 256 KiB where its busy witness read 1.4-4.2 ms, and the
link held to 40 Mbit/s 45-54 ms. Well, it is cleared and the default schedule comes back (a link only
partly recovered is flagged again by its figures within seconds: then the next test waits
twice as long, as if this one had said slow); slow, or too few figures within TEST_WAIT, the
next test waits twice as long. The fastest:
on two loaded cores a descheduled sender or receiver delays a frame by tens of ms, the
witness's as much as the link's (one frame of 64 KiB each: a 40 Mbit/s link read 5-41 ms,
its witness 0.8-19 ms, and was cleared twice when it was not), while no frame crosses a slow
link faster than its bytes allow. The schedule never changes for a test: each frame costs
the receiver's next wait on that sender one frame's time on the link (the commit message
queued behind it), not an op on the default schedule.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from ..algorithms.schedule import Plan, plan_around, plan_for_nics
from ..transport.linkstats import LARGE_BYTES, LinkCounters
from ..group.schedbook import BookState
from .effects import Ident, Outbox
from .failslow import Cleared, Detector, Figures, Flagged, Known, Link, Thresholds, describe
from .protocol import FailSlowStatus, SchedDrop, SchedGo, Schedule, TestLinks
from .slownic import NicJudge, nic_costs
from .slownic import describe as describe_nic

POLICIES = ("report", "reroute", "replace", "shrink")
LEAD = 1  # a proposal starts this many ops past the furthest rank (doubled on each refusal)
ACK_WAIT = 2.0  # s for every member to answer a proposal
RETRY_AFTER = 30.0  # s before a routed-around link is tested
RETRY_MAX = 300.0
TEST_BYTES = LARGE_BYTES  # a throughput's test frame: the least that linkstats times so
# a latency's: a small frame, but two of the kernel's 64 KiB send segments: a link shaped by
# tc (htb) lets one whole segment through at once after idling (its debt comes after), so a
# 64 KiB frame crossed a 40 Mbit/s link in 1-2 ms (and cleared it, falsely, twice)
TEST_SMALL = LARGE_BYTES // 2
TEST_FRAMES = 4  # frames a test sends over each link, one an op: the fastest counts
TEST_WAIT = 10.0  # s for a test's figures: both senders' next ops, and a beat
KEEP_DECISIONS = 8  # decisions remembered, to send again to a member that missed one


class Members(Protocol):
    """What a Reroute reaches of the coordinator beyond the Outbox (slowlinks.py hands it
    one over the machine's State, for the event being applied)."""

    def heartbeats(self) -> list[Ident]:
        """The heartbeat connection of every live member of the current generation, by rank
        (of those that have beaten), at the moment of asking."""
        ...

    def size(self) -> int:
        """The current generation's ranks."""
        ...

    def remove(self, rank: int, reason: str) -> None:
        """Declare rank `rank` of the current generation removed (changes.declare: its
        effects go into the same Outbox)."""
        ...


def to_all(out: Outbox, members: Members, msg: Schedule | SchedGo | SchedDrop | TestLinks) -> None:
    """`msg` to every live member's heartbeat connection."""
    for ident in members.heartbeats():
        out.send(ident, msg)


def _note(out: Outbox, text: str) -> None:
    """A line for the log, worth a warning: every fail-slow note is one."""
    out.note(text, warn=True)


def _remove(out: Outbox, members: Members, rank: int, verb: str, reason: str) -> None:
    """Rank `rank` of the current generation removed for its slow NIC: `verb` says whether a
    spare takes its place ("replacing") or none does ("removing")."""
    if 0 <= rank < members.size():
        _note(out, f"{verb} rank {rank}: {reason}")
        members.remove(rank, reason)


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


@dataclass(frozen=True)
class Carried:
    """What one generation's Reroute hands the next (Reroute.handover), by the next
    generation's ranks: the links it flagged and the figures they were flagged on, when
    each slow NIC was flagged, the links a test cleared lately, and the tests' back-off --
    the next test's interval and when it is due (None: when a plan around the links is
    decided, after that interval)."""

    links: tuple[Known, ...] = ()
    nic_since: Mapping[int, float] = field(default_factory=dict)
    cleared_at: Mapping[Link, float] = field(default_factory=dict)
    retry: float = RETRY_AFTER
    due: float | None = None


@dataclass
class _Proposal:
    version: int
    start: int
    plan: Plan | None
    at: float
    acked: set[int] = field(default_factory=set)
    refused: bool = False


@dataclass(frozen=True)
class _Tested:
    """One link under test: its figures when flagged, its witness (a healthy link into the
    same receiver, tested beside it; None where there is none) and the test frame's size."""

    link: Link
    flag: Figures
    witness: Link | None
    nbytes: int

    def floor(self) -> float:
        """The frame's transit at the link's peers' pace when it was flagged (s)."""
        return self._at(self.flag.reference)

    def slow(self) -> float:
        """The frame's transit at the link's own pace when it was flagged (s)."""
        return self._at(self.flag.rate)

    def _at(self, rate: float) -> float:
        rate = max(rate, 1e-9)
        return 1.0 / rate if self.flag.latency else self.nbytes / rate

    def well(self, own: float, witness: float | None, slow_ratio: float) -> bool:
        """Its test frames' fastest transit says it recovered: nearer, in ratio, to the
        healthy pace (the witness's, at least the floor) than to its own when flagged, or
        at least slow_ratio times quicker than that (the ratio that flagged it)."""
        healthy = max(witness or 0.0, self.floor())
        slow = max(self.slow(), healthy)
        return own <= max(math.sqrt(healthy * slow), slow / slow_ratio)


@dataclass
class _Test:
    token: int
    at: float
    links: tuple[_Tested, ...]


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
        carried: Carried | None = None,
    ):
        """version: the proposals are numbered after it (a restarted coordinator's: past
        every version its predecessor gave out). unsure: the members may run a schedule
        this coordinator did not agree (its predecessor's, before a restart). min_world: a
        rank removed without a spare never leaves fewer ranks. spare_wait: under replace,
        seconds a slow NIC waits for a spare before it is removed without one (None: for
        good). carried: what the generation before learnt (handover): its slow links are
        avoided from this generation's first proposal, not learnt again."""
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
        self.retry_at: float | None = None  # when the routed-around links are tested
        self.test: _Test | None = None
        self.tokens = 0
        self.cleared_at: dict[Link, float] = {}  # links a test cleared, and when
        self.replaced: set[int] = set()
        self._chosen: tuple[frozenset[Link], Plan | None] | None = None  # (slow links, their plan)
        self._nic_chosen: tuple[frozenset[int], Plan | None] | None = None  # (NICs, their plan)
        self.decisions: dict[int, bool] = {}  # the last few versions decided: go or drop
        # The members may run a plan this Reroute does not know (a restarted coordinator's
        # predecessor agreed it): nothing would ever retry or clear it, so the plan wanted now
        # is proposed even where it is the default, and the ranks and this agree again.
        self.unsure = unsure
        self._due: float | None = None  # the carried back-off: when the next test is due
        self._carried: tuple[Link, ...] = ()  # links inherited, said once at the first tick
        if carried is not None:
            self.detector.inherit(carried.links)
            self.nic_since = {r: t for r, t in carried.nic_since.items() if 0 <= r < size}
            self.cleared_at = dict(carried.cleared_at)
            self.retry, self._due = carried.retry, carried.due
            self._carried = tuple(sorted(k.link for k in carried.links))

    def handover(self, ranks: Mapping[int, int]) -> Carried:
        """What the next generation's Reroute inherits; `ranks`: this generation's rank ->
        the next one's, for the members in both (a link with an end that left is dropped;
        a link a test cleared is not flagged, so not carried). A test under way when the
        generation ended is due again at once; the back-off goes on where it stood."""

        def moved(link: Link) -> Link | None:
            a, b = link
            return (ranks[a], ranks[b]) if a in ranks and b in ranks else None

        due = self.retry_at
        if self.test is not None:
            due = self.test.at  # cut short by the generation's end: no verdict, test again
        cleared = {m: t for k, t in self.cleared_at.items() if (m := moved(k)) is not None}
        return Carried(
            links=tuple(self.detector.known(ranks)),
            nic_since={ranks[r]: t for r, t in self.nic_since.items() if r in ranks},
            cleared_at=cleared,
            retry=self.retry,
            due=due,
        )

    def leaving(self, ranks: Mapping[int, int]) -> list[Known]:
        """The flagged links with an end not in `ranks` (this generation's rank -> the
        next one's), by this generation's ranks: handover drops them; the coordinator keeps
        them by host (hostlinks.py)."""
        return self.detector.leaving(ranks)

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

    def tick(self, out: Outbox, members: Members, now: float, spare_waiting: int = 0) -> None:
        """The judgement due now, and what it does: the links and NICs judged (notes), slow
        NICs removed, a proposal decided, a routed-around link tested, a schedule proposed
        (each a message to every live member). spare_waiting: how many spares wait to be
        admitted (a bool: one or none)."""
        spares = int(spare_waiting)
        if self._carried:
            _note(
                out,
                f"generation {self.generation}: {_links(self._carried)} flagged in the "
                "generation before: avoided from its first schedule",
            )
            self._carried = ()
        for ev in self.detector.evaluate(now):
            self._on_event(out, ev, now, spares)
        for nev in self.nic_judge.evaluate(
            self.detector.window_rates, now, self.detector.newest_rates
        ):
            _note(out, describe_nic(nev))
        self._replace(out, members, spares)
        self._shrink(out, members, now)
        self._settle(out, members, now)
        if self.policy == "report" or self.pending is not None:
            return
        if (
            self.retry_at is not None
            and now >= self.retry_at
            and self.current is not None
            and self.test is None
            and min(self.seqs) >= self.current_start
        ):
            self.retry_at = None
            self._start_test(out, members, self.current.avoided, now)
        if self.test is not None:
            self._judge_test(out, now)
        want = self._wanted()
        if (want != self.current or self.unsure) and min(self.seqs) >= self.current_start:
            self._propose(out, members, want, now)

    # --- internals --------------------------------------------------------------------------
    def _start_test(self, out: Outbox, members: Members, links: Iterable[Link], now: float) -> None:
        """Test each flagged link of `links`, each beside its witness."""
        flagged = {f.link: f for f in self.detector.flagged()}
        tested = []
        for link in links:
            if link not in flagged:
                continue
            # what it was flagged on (routed around, it is judged on its commit messages)
            flag = self.detector.flagged_on(link) or flagged[link]
            nbytes = TEST_SMALL if flag.latency else TEST_BYTES
            tested.append(_Tested(link, flag, self._witness(link, flagged), nbytes))
        if not tested:
            return
        self.tokens += 1
        self.test = _Test(self.tokens, now, tuple(tested))
        for nbytes in sorted({x.nbytes for x in tested}):
            pairs = [x.link for x in tested if x.nbytes == nbytes]
            pairs += [x.witness for x in tested if x.nbytes == nbytes and x.witness is not None]
            msg = TestLinks(
                generation=self.generation,
                token=self.tokens,
                links=sorted(set(pairs)),
                bytes=nbytes,
                frames=TEST_FRAMES,
            )
            to_all(out, members, msg)
        _note(out, f"testing {_links([x.link for x in tested])} (the schedule stays)")

    def _witness(self, link: Link, flagged: dict[Link, Figures]) -> Link | None:
        """A link into the same receiver that is not flagged: tested beside `link`, the
        receiver's wake-up and load the same for both."""
        src, dst = link
        for other in range(self.size):
            if other not in (src, dst) and (other, dst) not in flagged:
                return (other, dst)
        return None

    def _judge_test(self, out: Outbox, now: float) -> None:
        """Each tested link, once its figures and its witness's are in (or the wait is
        over): well, cleared; else kept off, and the next test waits longer."""
        t = self.test
        assert t is not None
        since = t.at
        figs = {x.link: self.detector.tested(x.link, since) for x in t.links}
        wits = {
            x.link: (0, 0.0) if x.witness is None else self.detector.tested(x.witness, since)
            for x in t.links
        }
        all_in = all(
            figs[x.link][0] >= TEST_FRAMES and (x.witness is None or wits[x.link][0] >= TEST_FRAMES)
            for x in t.links
        )
        if not all_in and now - t.at < TEST_WAIT:
            return
        self.test = None
        slow: list[Link] = []
        for x in t.links:
            (n, own), (nw, best) = figs[x.link], wits[x.link]
            wit = best if nw else None
            a, b = x.link
            if not n:
                slow.append(x.link)
                _note(out, f"link {a}->{b} not tested (no figures in {TEST_WAIT:g} s): kept off")
            elif x.well(own, wit, self.detector.th.slow_ratio):
                self.detector.clear(x.link, now)
                self.cleared_at[x.link] = now
                _note(out, f"link {a}->{b} cleared: {_tested(x, own, wit)}")
            else:
                slow.append(x.link)
                _note(out, f"link {a}->{b} still slow: {_tested(x, own, wit)}")
        if slow:
            self.retry = min(2 * self.retry, RETRY_MAX)
            self.retry_at = now + self.retry

    def _replace(self, out: Outbox, members: Members, spares: int) -> None:
        """Under `replace`: each slow NIC not replaced yet, while spares wait for its place,
        removed (the next generation takes a spare in its place)."""
        if self.policy != "replace":
            return
        flagged = {f.link: f for f in self.detector.flagged()}
        for rank in sorted(self.detector.nics - self.replaced - self.shrunk):
            if len(self.replaced) >= spares:
                break
            self.replaced.add(rank)
            figs = "; ".join(f.text() for k, f in flagged.items() if rank in k)
            reason = f"its NIC is slow ({figs}); a waiting spare takes its place"
            _remove(out, members, rank, "replacing", reason)

    def _shrink(self, out: Outbox, members: Members, now: float) -> None:
        """Under shrink, each slow NIC; under replace with spare_wait, each that no spare
        came for within spare_wait of its flag: removed, while the ranks left stay at least
        min_world."""
        if self.policy == "shrink":
            due = self.detector.nics
        elif self.policy == "replace" and self.spare_wait is not None:
            due = {r for r in self.detector.nics if now - self.nic_since[r] >= self.spare_wait}
        else:
            return
        flagged = {f.link: f for f in self.detector.flagged()}
        for rank in sorted(due - self.replaced - self.shrunk - self.kept):
            figs = "; ".join(f.text() for k, f in flagged.items() if rank in k)
            left = self.size - len(self.replaced) - len(self.shrunk) - 1
            if left < self.min_world:
                self.kept.add(rank)
                _note(
                    out,
                    f"rank {rank}'s NIC is slow ({figs}), but removing it would leave "
                    f"{left} rank(s), below COLLECTIVES_FAILSLOW_MIN_WORLD={self.min_world}"
                    ": keeping it",
                )
                continue
            self.shrunk.add(rank)
            waited = (
                "" if self.policy == "shrink" else f"; no spare came within {self.spare_wait:g} s"
            )
            reason = f"its NIC is slow ({figs}){waited}; the job goes on at {left} ranks"
            _remove(out, members, rank, "removing", reason)

    def _on_event(self, out: Outbox, ev: Flagged | Cleared, now: float, spares: int) -> None:
        """A link or NIC flagged or cleared: said, and the tests' back-off moved."""
        _note(out, describe(ev))
        if isinstance(ev, Flagged) and ev.link is not None:
            cleared = self.cleared_at.pop(ev.link, None)
            if cleared is not None and now - cleared < RETRY_AFTER:
                # a test cleared it, wrongly: the next test waits longer, as if it said slow
                self.retry = min(2 * self.retry, RETRY_MAX)
                _note(
                    out,
                    f"{_links([ev.link])} flagged again {now - cleared:.1f} s "
                    f"after a test cleared it: the next test in {self.retry:g} s",
                )
            elif self.current is None or ev.link not in self.current.avoided:
                self.retry = RETRY_AFTER  # a new slowdown: tested first after RETRY_AFTER
        if isinstance(ev, Flagged) and ev.rank is not None:
            self.nic_since.setdefault(ev.rank, now)
        elif isinstance(ev, Cleared) and ev.rank is not None:
            self.nic_since.pop(ev.rank, None)
            self.kept.discard(ev.rank)
        if isinstance(ev, Flagged) and ev.rank is not None and self.policy != "shrink":
            if self.policy != "replace" or len(self.replaced) >= spares:  # else _replace
                _note(
                    out,
                    f"no schedule avoids rank {ev.rank}'s links"
                    + ("" if self.policy == "replace" else "; policy " + self.policy)
                    + ("" if spares else "; no spare waits")
                    + (
                        f" (the rank is removed if none comes within {self.spare_wait:g} s)"
                        if self.policy == "replace" and self.spare_wait is not None
                        else ""
                    )
                    + ": keeping the schedule as it is",
                )

    def _wanted(self) -> Plan | None:
        if self.policy == "report":
            return None
        nics = self.detector.nics | self.nic_judge.behind
        # a NIC only behind its peers (half speed) explains none of the links flagged at a
        # quarter or less: they are routed around (a NIC flagged from its links explains them)
        slow = [f.link for f in self.detector.flagged() if not set(f.link) & self.detector.nics]
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
            lat = {k: x for k in d.window_rates if (x := d.latency(k)) is not None}
            costs = nic_costs(self.size, key, d.window_rates, lat)
            plan = None if costs is None else plan_for_nics(self.size, key, costs)
            self._nic_chosen = (key, plan)
        return self._nic_chosen[1]

    def _propose(self, out: Outbox, members: Members, plan: Plan | None, now: float) -> None:
        self.version += 1
        start = max(self.seqs) + self.lead
        self.pending = _Proposal(self.version, start, plan, now)
        msg = Schedule(
            generation=self.generation,
            version=self.version,
            start=start,
            plan=None if plan is None else plan.wire(),
        )
        to_all(out, members, msg)

    def _settle(self, out: Outbox, members: Members, now: float) -> None:
        """The pending proposal decided, once every rank accepted (go), or one refused or
        ACK_WAIT passed (drop): the decision to every member, a note of a new schedule."""
        p = self.pending
        if p is None:
            return
        done = len(p.acked) == self.size
        if not done and not p.refused and now - p.at < ACK_WAIT:
            return
        self.pending = None
        go = SchedGo(generation=self.generation, version=p.version)
        self.decisions[p.version] = done
        while len(self.decisions) > KEEP_DECISIONS:
            del self.decisions[min(self.decisions)]
        if not done:
            self.lead = min(2 * self.lead, 64)
            to_all(out, members, SchedDrop(generation=self.generation, version=p.version))
            return
        self.lead = LEAD
        before, self.current, self.current_start = self.current, p.plan, p.start
        was_unsure, self.unsure = self.unsure, False
        if p.plan is not None:
            # a ring sized around a NIC still carries its links' figures: no test needed
            self.retry_at = None if p.plan.weights else now + self.retry
            if self.retry_at is not None and self._due is not None:
                self.retry_at = self._due  # the generation before's back-off goes on
            what = f"rerouted from op #{p.start}: {p.plan.describe()}"
        else:
            self.retry_at = None
            what = f"back to the default schedule from op #{p.start}"
        self._due = None
        to_all(out, members, go)
        if before != p.plan or was_unsure:  # unsure: say which schedule runs now
            _note(out, what)

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


def _tested(x: _Tested, own: float, witness: float | None) -> str:
    """A test's figures, for its log line."""
    w = ""
    if x.witness is not None and witness is not None:
        w = f", its witness {x.witness[0]}->{x.witness[1]} {_s(witness)}"
    return (
        f"the fastest of its {x.nbytes >> 10} KiB test frames took {_s(own)}{w}, "
        f"{_s(x.floor())} at its peers' pace when flagged"
    )


def _s(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _links(links: Sequence[Link]) -> str:
    return ("links " if len(links) > 1 else "link ") + ", ".join(f"{a}->{b}" for a, b in links)


__all__ = [
    "POLICIES",
    "Carried",
    "Members",
    "Orphan",
    "Reroute",
    "orphans",
    "to_all",
]
