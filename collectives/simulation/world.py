"""One simulated job, from a seed: the real coordinator machine (membership/machine.py), a rank
machine per process (membership/rank.py), the real algorithms' programs (programs.py) and a
network, all on one virtual clock: a heap of timed events, one random.Random(seed), no wall
clock, no threads, no sockets. The same seed gives the same run, event for event.

Each process replays what a training script over a ProcessGroup does: `ops` steps, each a
compute gap and then an all_reduce (its program, commit round included), the op's deadline
asking the coordinator whom to blame (its rank machine), a failed step dropped and the group
reconstructed, an evicted process leaving. Its progress -- op sequence, in_op, waiting_on,
messages sent to and taken from each peer, has_data, how its last ops ended -- is what a real
transport would report at that virtual moment.

Fail-slow as a real member has it: each generation's transport stands in as a Place -- its
inbound links' figures (transport/linkstats.py, LinkStats, fed each data frame's posting,
arrival and whether the rank waited for it, in virtual time), its link tests (LinkTests) and
the group's schedule book (group/schedbook.py, ScheduleBook) -- which the heartbeat side's
hooks (membership/slowlinks.py: on_notice, on_test) read and write as the real shell's do;
a beat carries the figures, a re-registration the book's state. An op asks its book for
the plan in force (ScheduleBook.ask), waits in virtual time for a decision it is owed, and
runs the schedule group/rerouted.py chooses for that plan (programs.py).

What happened is kept for the properties (properties.py): the removals the coordinator made,
every op's span (and the plan it ran, the bytes it sent over slowed links), the generations
each process went through, each survivor's committed steps.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ..algorithms.schedule import Plan
from ..group.schedbook import ScheduleBook
from ..membership import rank as rm
from ..membership import slowlinks
from ..membership.machine import Arrived, Died, Machine, Tick
from ..membership.protocol import (
    AnyReply,
    AnyRequest,
    Error,
    Evicted,
    Failure,
    Info,
    OutcomeAnswer,
    Regroup,
    Rejoined,
    Report,
    Request,
    Unchanged,
    Unformed,
    Verdict,
    Welcome,
)
from ..membership.state import FailSlow, Halt, Note, Send, State
from ..transport.base import ABANDONED, COMPLETED, LACKED
from ..transport.linkstats import LARGE_BYTES, LinkStats
from ..transport.linktest import LinkTests
from . import faults as fl
from .faults import Fault
from .programs import Step, chosen, programs, rerouted_programs

EAGER_LINKS = 64  # members: up to this many, every link's figures are drawn up front
WITNESS = (0.002, 0.02)  # s: a crash witness (pidfd, launcher) reports within this
COORD_LATENCY = 0.0002  # s: a message between a rank and the coordinator
WAKE_FIRST, WAKE_EVERY = 0.1, 0.5  # s: a starved receive looks at the failure notice (channel)


@dataclass(frozen=True)
class Config:
    n: int = 4
    ops: int = 4
    algorithm: str = "ring"
    count: int = 1000
    op_timeout: float = 1.0
    heartbeat_interval: float = 0.2
    heartbeat_timeout: float = 1.0
    reconstruct_timeout: float = 3.0
    tick: float = 0.05  # the coordinator's loop (a sweep every tick)
    compute: tuple[float, float] = (0.005, 0.02)  # s between two ops
    horizon: float = 120.0  # virtual s: a run still going then is a hang
    max_events: int = 200_000  # events: a run that takes more is a hang (a zero-time loop)
    # the coordinator's fail-slow policy (membership/reroute.py), and its spare wait (replace)
    failslow: str = "reroute"
    spare_wait: float | None = None

    @property
    def grace(self) -> float:
        return 3 * self.heartbeat_timeout  # common/variables.py, GRACE_TIMEOUTS


@dataclass
class OpRun:
    gen: int
    seq: int
    step: int
    program: tuple[Step, ...]
    begun: float
    deadline: float
    sent: list[int]
    recv: list[int]
    pc: int = 0
    in_op: bool = True
    waiting_on: int | None = None
    waiting_since: float = 0.0
    has_data: bool = False
    stalled: bool = False  # its deadline passed: the diagnosis runs
    ended: float | None = None
    book_wait: bool = False  # waiting for the decision on a schedule (ScheduleBook.ask)
    span: OpSpan | None = None


@dataclass
class Removal:
    at: float
    generation: int
    lid: int
    why: str


@dataclass
class OpSpan:
    lid: int
    gen: int
    seq: int
    begun: float
    ended: float | None
    how: str
    plan: tuple[Any, ...] | None = None  # the shape of the plan its book chose (None: default)
    planned: bool = False  # its book answered (the op ran a schedule)
    # bytes of large frames it sent over each slowed (fail-slow) link, by launch ids
    slow_bytes: dict[tuple[int, int], int] = field(default_factory=dict)


@dataclass
class Place:
    """What a generation's transport is to a member's fail-slow hooks (slowlinks.Member):
    its group, its inbound links' figures (transport/linkstats.py, from the virtual times of
    the frames taken), the link tests asked of it, and the group's schedule book."""

    generation: int
    size: int
    rank: int
    linktests: LinkTests
    stats: LinkStats
    book: ScheduleBook


@dataclass
class Proc:
    """One process: its rank machine and what its training loop and transport hold."""

    lid: int
    machine: rm.RankMachine
    status: str = "up"  # up, done, evicted, error, crashed, stopped
    why: str = ""
    gen: int = -1
    rank: int = -1
    roster: list[int] = field(default_factory=list)  # launch ids by rank
    seq: int = 0  # the next op's sequence number in this generation
    step: int = 0  # the training step
    op: OpRun | None = None  # the current (or last) collective of this generation
    failure: rm.Fault | None = None  # what the transport raises at its next wait
    done: dict[int, int] = field(default_factory=dict)
    inbox: dict[tuple[int, int, int], int] = field(default_factory=dict)  # (gen, seq, src)
    # each data frame that arrived, in order: (posted at, arrived at, bytes)
    frames: dict[tuple[int, int, int], deque[tuple[float, float, int]]] = field(
        default_factory=dict
    )
    place: Place | None = None  # this generation's
    aborts: set[tuple[int, int]] = field(default_factory=set)
    waiting_for: str = ""  # the request its op thread waits on
    pending_fault: rm.Fault | None = None  # the error being settled (outcome)
    busy_until: float = 0.0  # a starved CPU: events wait their turn
    on_cpu: bool = False  # running an event that waited its turn
    tick_at: float | None = None
    committed: dict[int, tuple[int, int]] = field(default_factory=dict)  # step -> (gen, value)
    generations: list[int] = field(default_factory=list)
    probes: dict[int, dict[int, float]] = field(default_factory=dict)  # token -> src -> at
    last_sent: dict[int, float] = field(default_factory=dict)  # peer rank -> its last frame


class World:
    def __init__(
        self,
        seed: int,
        cfg: Config | None = None,
        trace: bool = False,
        faults: list[Fault] | None = None,
    ) -> None:
        """The run of `seed`; cfg and faults, when given, replace what the seed draws (a
        scenario written out: the seed still draws the network and every timing)."""
        self.seed = seed
        self.rng = random.Random(seed)
        rng = self.rng
        if cfg is None:
            cfg = Config(
                n=rng.randint(3, 6),
                ops=rng.randint(3, 5),
                algorithm=rng.choice(("ring", "ring", "tree")),
                count=rng.choice((16, 1000, 25000)),
            )
        # a fault strikes before an op that follows it: a run of fewer than 2 ops draws none
        drawn = fl.draw(rng, cfg.n, cfg.ops, cfg.op_timeout) if cfg.ops >= 2 else []
        if faults is None:
            # fail-slow from a stream of its own: the seeds drawn before it keep their runs
            slow = random.Random(f"{seed}:failslow{fl.FAILSLOW_SALT}")
            if slow.random() < fl.FAILSLOW_SHARE:
                culprits = {f.rank for f in drawn if f.culprits}
                run, more = fl.draw_failslow(slow, cfg.n, cfg.algorithm, cfg.op_timeout, culprits)
                cfg = replace(
                    cfg,
                    count=run.count,
                    ops=run.ops,
                    compute=run.compute,
                    failslow=run.failslow,
                    spare_wait=run.spare_wait,
                )
                drawn += more
        self.cfg = cfg
        self.faults: list[Fault] = drawn if faults is None else list(faults)
        self.tracing = trace
        self.trace: list[str] = []
        self.now = 0.0
        self.heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self.counter = 0
        n = cfg.n
        # the network: per directed link (launch ids) its latency, bandwidth, when it is free
        # per directed link; drawn up front for a small world (every link carries data), link
        # by link from its own seed for a large one (n^2 links: 10,000 members would be 10^8)
        self.latency: dict[tuple[int, int], float] = {}
        self.bandwidth: dict[tuple[int, int], float] = {}
        if n <= EAGER_LINKS:
            for a in range(n):
                for b in range(n):
                    self.latency[(a, b)] = rng.uniform(50e-6, 300e-6)
            for a in range(n):
                for b in range(n):
                    self.bandwidth[(a, b)] = rng.uniform(0.5e9, 2e9)
        self.free_at: dict[tuple[int, int], float] = {}
        self.slowed: set[tuple[int, int]] = set()
        self.slowdown: dict[tuple[int, int], float] = {}  # fail-slow: a link's bandwidth / this
        self.excused: dict[int, frozenset[int]] = {}  # fault index -> whom it may remove
        self.cut: set[tuple[int, int]] = set()
        self.isolated: set[int] = set()
        self.coord: Machine | None = None
        self.coord_alive = False
        self.coord_epoch = 0  # a restart: ticks of the dead one stop
        self.removals: list[Removal] = []
        self.spans: list[OpSpan] = []
        # the verdicts that blamed nobody, one per diagnosis (the ops merged into it hear the
        # same one): (generation, why) -> when the first of its ops began
        self.unblamed: dict[tuple[int, str], float] = {}
        self.struck: dict[int, float] = {}  # fault index -> when it struck
        self.blamed: dict[int, frozenset[int]] = {}  # fault index -> whom it justifies
        self.links_of: dict[int, frozenset[tuple[int, int]]] = {}  # fault index -> its links
        self.coord_down: list[tuple[float, float]] = []
        self.troubles: list[str] = []
        self.events = 0
        self.rosters: dict[int, tuple[list[int], dict[int, int]]] = {}  # gen -> by rank, lid->rank
        self.hang: str | None = None  # why the run was cut short: the horizon or the event cap
        self.procs = [
            Proc(
                lid,
                rm.machine(
                    f"m{lid}",
                    "coordinator",
                    cfg.heartbeat_interval,
                    cfg.heartbeat_timeout,
                    cfg.grace,
                ),
            )
            for lid in range(n)
        ]
        # late ranks: (launch id, step) -> how much longer its compute takes
        self.late = {(f.rank, f.step): f.delay for f in self.faults if f.kind == "late"}
        self.starved: dict[int, tuple[float, float, float]] = {}  # lid -> (from, until, lag)

    # --- the clock -----------------------------------------------------------------------------
    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        self.counter += 1
        heapq.heappush(self.heap, (t, self.counter, fn, args))

    def log(self, what: str) -> None:
        if self.tracing:
            self.trace.append(f"{self.now:9.6f} {what}")

    def run(self) -> World:
        self._start_coordinator()
        for p in self.procs:
            self.at(self.rng.uniform(0, 0.005), self._join, p)
        for i, f in enumerate(self.faults):
            self.log(f"fault planned: {f.describe()}")
        n = self.cfg.n
        while self.heap:
            t, _, fn, args = heapq.heappop(self.heap)
            if t > self.cfg.horizon:
                self.hang = f"the virtual horizon of {self.cfg.horizon:g} s passed"
                break
            if self.events >= self.cfg.max_events:
                self.hang = f"{self.events} events by {self.now:.6f} s (the cap)"
                break
            self.events += 1
            self.now = t
            fn(*args)
            # a large world looks whether every process ended once per n events, not per event
            if (n <= EAGER_LINKS or self.events % n == 0) and self._finished():
                break
        if self.hang is not None:
            self.log(f"HANG: {self.hang}")
        return self

    def digest(self) -> str:
        """The trace's fingerprint: two runs of one seed give the same (with trace=True)."""
        return hashlib.sha256("\n".join(self.trace).encode()).hexdigest()

    def _finished(self) -> bool:
        return all(p.status != "up" for p in self.procs)

    # --- the coordinator -----------------------------------------------------------------------
    def _start_coordinator(self) -> None:
        cfg = self.cfg
        self.coord = Machine(
            State(
                world_size=cfg.n,
                heartbeat_timeout=cfg.heartbeat_timeout,
                diagnose_window=max(0.3, 2 * cfg.heartbeat_interval),
                failslow=FailSlow(cfg.failslow, min_world=2, spare_wait=cfg.spare_wait),
            )
        )
        self.coord_alive = True
        self.coord_epoch += 1
        self.at(self.now + cfg.tick, self._coord_tick, self.coord_epoch)

    def _coord_tick(self, epoch: int) -> None:
        if not self.coord_alive or epoch != self.coord_epoch:
            return
        self._coord_feed(Tick(True))
        self.at(self.now + self.cfg.tick, self._coord_tick, epoch)

    def _coord_feed(self, event: Any) -> None:
        assert self.coord is not None
        s = self.coord.state
        before = {m for m in s.failed}
        gen = s.generation
        effects = self.coord.feed(event, self.now)
        if s.generation == gen:
            for m in s.failed:
                if m not in before:
                    self.removals.append(Removal(self.now, gen, int(m[1:]), s.failed[m]))
        for e in effects:
            if isinstance(e, Note):
                self.log(f"coordinator: {e.what}")
            elif isinstance(e, Halt):
                self.troubles.append(f"{e.during}: {e.error!r}")
                self.log(f"coordinator HALT {e.during}: {e.error!r}")
        for e in effects:
            if isinstance(e, Send):
                self._to_rank(e.to, e.msg)

    def _to_rank(self, ident: bytes, msg: AnyReply) -> None:
        via: rm.Via = "heartbeat" if ident[:1] == b"h" else "request"
        lid = int(ident[1:])
        if lid in self.isolated:
            return
        self.at(self.now + COORD_LATENCY, self._received, self.procs[lid], msg, via)

    def _to_coordinator(self, p: Proc, request: Request, via: rm.Via) -> None:
        if p.lid in self.isolated:
            return
        self.at(self.now + COORD_LATENCY, self._arrive, self.coord_epoch, p.lid, request, via)

    def _arrive(self, epoch: int, lid: int, request: AnyRequest, via: rm.Via) -> None:
        if not self.coord_alive or epoch != self.coord_epoch or self.coord is None:
            return  # sent to a coordinator that died meanwhile
        if self.coord.stranger(request):
            return
        ident = (b"h" if via == "heartbeat" else b"q") + str(lid).encode()
        self._coord_feed(Arrived(ident, request))

    # --- a process's events --------------------------------------------------------------------
    def _cpu(self, p: Proc, fn: Callable[..., None], *args: Any) -> bool:
        """Run fn now, or later when the process is starved of CPU; False if it never runs
        (the process crashed or is stopped)."""
        if p.status in ("crashed", "stopped"):
            return False
        if p.on_cpu:
            return True  # it waited its turn already
        lag = self.starved.get(p.lid)
        if lag is not None and lag[0] <= self.now < lag[1]:
            t = max(self.now + lag[2], p.busy_until)
            p.busy_until = t
            self.at(t, self._later, p, fn, args)
            return False
        if p.busy_until > self.now:
            self.at(p.busy_until, self._later, p, fn, args)
            return False
        return True

    def _later(self, p: Proc, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        if p.status not in ("crashed", "stopped"):
            p.on_cpu = True
            try:
                fn(*args)
            finally:
                p.on_cpu = False

    def report(self, p: Proc) -> Report:
        c = p.op
        if p.gen < 0:
            return Report(generation=-1, seq=-1, in_op=False)
        done = sorted(p.done.items())
        ages = [
            None if r not in p.last_sent else self.now - p.last_sent[r]
            for r in range(len(p.roster))
        ]
        if c is None or c.gen != p.gen:
            return Report(generation=p.gen, seq=-1, in_op=False, done=done, sent_age=ages)
        return Report(
            generation=p.gen,
            seq=c.seq,
            in_op=c.in_op,
            waiting_on=c.waiting_on,
            sent=list(c.sent),
            recv=list(c.recv),
            has_data=c.has_data,
            done=done,
            sent_age=ages,
        )

    def feed(self, p: Proc, event: rm.Event) -> None:
        if p.status in ("crashed", "stopped"):
            return
        effects = p.machine.feed(event, self.now)
        for e in effects:
            self._effect(p, e)
        self._schedule_tick(p)

    def _schedule_tick(self, p: Proc) -> None:
        t = max(p.machine.due(), self.now)
        if p.tick_at is None or t < p.tick_at or p.tick_at < self.now:
            p.tick_at = t
            self.at(t, self._tick, p, t)

    def _tick(self, p: Proc, t: float) -> None:
        if p.tick_at != t or p.status in ("crashed", "stopped", "evicted", "error"):
            return
        p.tick_at = None
        if self._cpu(p, self._tick_now, p):
            self._tick_now(p)

    def _tick_now(self, p: Proc) -> None:
        if p.status not in ("evicted", "error"):
            self.feed(p, rm.Tick(self.report(p), self._links(p), self._sched(p)))

    def _links(self, p: Proc) -> tuple[Any, ...]:
        """The inbound links' figures a beat carries (slowlinks.beat_links)."""
        return () if p.place is None else tuple(r.wire() for r in p.place.stats.summary())

    def _sched(self, p: Proc) -> tuple[int, ...]:
        return () if p.place is None else tuple(p.place.book.state().wire())

    def _received(self, p: Proc, msg: AnyReply, via: rm.Via) -> None:
        if p.status in ("evicted", "error"):
            return
        if self._cpu(p, self._received_now, p, msg, via):
            self._received_now(p, msg, via)

    def _received_now(self, p: Proc, msg: AnyReply, via: rm.Via) -> None:
        if p.status in ("evicted", "error"):
            return
        self.log(f"m{p.lid} <- {via}: {msg.kind} {_short(msg)}")
        self.feed(p, rm.Received(msg, via, self.report(p)))

    def _effect(self, p: Proc, e: rm.Effect) -> None:
        if isinstance(e, rm.Send):
            self.log(f"m{p.lid} -> {e.request.kind} ({e.via})")
            self._to_coordinator(p, e.request, e.via)
        elif isinstance(e, rm.Interrupt):
            self.log(f"m{p.lid} interrupted: {e.fault.kind}: {e.fault.message}")
            p.failure = e.fault
            op = p.op
            if op is not None and op.in_op and op.book_wait:
                self.at(self.now, self._book_failed, p, op)  # ScheduleBook.interrupt
            elif op is not None and op.in_op and not op.stalled and op.waiting_on is not None:
                k = max(0, int((self.now - op.waiting_since - WAKE_FIRST) // WAKE_EVERY) + 1)
                wake = op.waiting_since + WAKE_FIRST + k * WAKE_EVERY
                self.at(max(wake, self.now), self._wake, p, op)
        elif isinstance(e, rm.Blame):
            self._verdict(p, e)
        elif isinstance(e, rm.RunProbes):
            self._run_probes(p, e)
        elif isinstance(e, rm.Replied):
            self._replied(p, e)
        elif isinstance(e, rm.Failed):
            self._failed(p, e)
        elif isinstance(e, rm.ToBook):
            self._to_book(p, e.notice)
        elif isinstance(e, rm.ToTests):
            slowlinks.on_test(p.place, e.notice)
        elif isinstance(e, rm.Note):
            self.log(f"m{p.lid}: {e.what}")

    # --- the schedule book, link tests ---------------------------------------------------------
    def _to_book(self, p: Proc, notice: rm.BookNotice) -> None:
        """The heartbeat shell's ToBook (membership/heartbeat.py): the notice to the book, its
        answer to the machine; an op waiting for the decision goes on."""
        place = p.place
        book = None if place is None else place.book
        answer = slowlinks.on_notice(place, book, notice)
        if self.tracing:
            self.log(f"m{p.lid} book: {notice.kind} v{notice.version} -> {answer}")
        if answer is not None:
            self.feed(p, answer)
        op = p.op
        if op is not None and op.in_op and op.book_wait:
            self.at(self.now, self._book_decided, p, op)

    def _book_decided(self, p: Proc, op: OpRun) -> None:
        if p.op is op and op.in_op and op.book_wait and p.status == "up":
            if self._cpu(p, self._book_decided, p, op):
                self._planned(p, op)

    def _book_failed(self, p: Proc, op: OpRun) -> None:
        if p.op is op and op.in_op and op.book_wait and p.failure is not None:
            op.book_wait = False
            self._op_failed(p, op, p.failure)

    def _post_tests(self, p: Proc, place: Place) -> None:
        """LinkTests.post_due: each test frame due, on the simulated link, timed from now."""
        for f in place.linktests.take_due(place.rank, place.size):
            t = self._link_time(p.lid, p.roster[f.dst], f.nbytes)
            if t is not None:
                self.at(t, self._test_frame, self.procs[p.roster[f.dst]], place, f.token, self.now)

    def _test_frame(self, p: Proc, src: Place, token: int, sent_at: float) -> None:
        place = p.place
        if p.status == "up" and place is not None and place.generation == src.generation:
            place.stats.tested(src.rank, sent_at, self.now, token)

    # --- joining -------------------------------------------------------------------------------
    def _join(self, p: Proc) -> None:
        self.feed(p, rm.Back(self.report(p), self._sched(p)))
        p.waiting_for = "join"
        self.feed(p, rm.AskJoin(p.lid, self.cfg.n, Info(rank=p.lid), 30.0))

    def _install(self, p: Proc, gen: int, infos: list[Info]) -> None:
        p.gen = gen
        if gen not in self.rosters:  # one welcome per generation: read once, not per member
            roster = [int(i.rank or 0) for i in infos]
            self.rosters[gen] = (roster, {lid: r for r, lid in enumerate(roster)})
        roster, ranks = self.rosters[gen]
        p.roster = roster  # shared: nobody writes it
        p.last_sent = {}
        p.rank = ranks[p.lid]
        p.seq = 0
        p.op = None
        p.failure = None
        p.done = {}
        p.generations.append(gen)
        n = len(roster)
        p.frames = {k: q for k, q in p.frames.items() if k[0] >= gen}  # the frames of ops gone
        p.place = Place(gen, n, p.rank, LinkTests(), LinkStats(n), ScheduleBook(gen))
        if self.tracing:  # the roster is n long: not formatted where nobody reads it
            self.log(f"m{p.lid} is rank {p.rank} of generation {gen} ({p.roster})")
        self.feed(p, rm.NewGroup(gen, p.rank, len(p.roster)))
        self._next_op(p)

    # --- the training loop ---------------------------------------------------------------------
    def _next_op(self, p: Proc) -> None:
        if p.step >= self.cfg.ops:
            p.status, p.why = "done", f"finished in generation {p.gen}"
            self.log(f"m{p.lid} done: {p.committed}")
            return
        gap = self.rng.uniform(*self.cfg.compute) + self.late.pop((p.lid, p.step), 0.0)
        self._strike(p.step)
        self.at(self.now + gap, self._begin, p, p.gen, p.step)

    def _begin(self, p: Proc, gen: int, step: int) -> None:
        if p.gen != gen or p.step != step or p.status != "up":
            return
        if not self._cpu(p, self._begin, p, gen, step):
            return
        n = len(p.roster)
        cfg = self.cfg
        op = OpRun(gen, p.seq, step, (), self.now, self.now + cfg.op_timeout, [0] * n, [0] * n)
        p.seq += 1
        p.op = op
        span = OpSpan(p.lid, gen, op.seq, self.now, None, "")
        op.span = span
        self.spans.append(span)
        self.log(f"m{p.lid} begins step {step}: op #{op.seq} of generation {gen}")
        # begin(): the failure notice and an abort that came early raise before the op runs
        # (outside its try: nothing is recorded)
        if p.failure is not None or (gen, op.seq) in p.aborts:
            op.in_op = False  # it never ran: a later abort frame for it finds nothing to fail
            failed = p.failure is not None
            self._end_span(p, op, "failed at begin" if failed else "aborted at begin")
            aborted = rm.Fault("Timeout", "aborted by a peer", (), gen, p.rank)
            self._error(p, p.failure if p.failure is not None else aborted)
            return
        self.at(op.deadline, self._deadline, p, op)
        if p.place is not None:
            self._post_tests(p, p.place)
        self._planned(p, op)

    def _planned(self, p: Proc, op: OpRun) -> None:
        """all_reduce asks its book for the plan in force at its op (group/rerouted.py, the
        book's for_op): it waits for a decision it is owed, or runs the plan's schedule."""
        place = p.place
        assert place is not None
        answer = place.book.ask(op.seq)
        if answer.waits:
            if not op.book_wait:
                self.log(f"m{p.lid}: op #{op.seq} waits for the schedule's decision")
            op.book_wait = True
            return
        op.book_wait = False
        plan: Plan | None = answer.plan
        n, count = len(p.roster), self.cfg.count
        schedule = chosen(plan, self.cfg.algorithm, count)
        if schedule is None:
            op.program = programs(self.cfg.algorithm, n, count)[p.rank]
        else:
            op.program = rerouted_programs(schedule, n, count)[p.rank]
        if op.span is not None:
            op.span.planned = True
            op.span.plan = None if plan is None else plan.shape()
        if plan is not None and self.tracing:
            self.log(f"m{p.lid}: op #{op.seq} runs {schedule or 'the default'} ({plan.describe()})")
        self._advance(p, op)

    def _advance(self, p: Proc, op: OpRun) -> None:
        prog = op.program
        while op.pc < len(prog):
            s = prog[op.pc]
            if s.kind == "send":
                self._send_frame(p, s.peer, s.nbytes, op)
                op.sent[s.peer] += 1
            elif s.kind == "hold":
                op.has_data = True
            else:
                if p.inbox.get((op.gen, op.seq, s.peer), 0) <= op.recv[s.peer]:
                    if op.waiting_on != s.peer:
                        op.waiting_on = s.peer
                        op.waiting_since = self.now
                    return
                op.recv[s.peer] += 1
                self._taken(p, op, s.peer)
                op.waiting_on = None
            op.pc += 1
        # finish(): the op is over, it counts
        op.in_op = False
        op.waiting_on = None
        self._record(p, op, COMPLETED)
        self._commit(p, op)
        self._end_span(p, op, "completed")
        p.step += 1
        self._next_op(p)

    def _commit(self, p: Proc, op: OpRun) -> None:
        value = sum((lid + 1) * (op.step + 1) for lid in p.roster)
        p.committed[op.step] = (op.gen, value)

    def _record(self, p: Proc, op: OpRun, how: int) -> None:
        p.done[op.seq] = how
        while len(p.done) > 4:
            del p.done[min(p.done)]
        if how != COMPLETED:
            self.feed(p, rm.OpFailed(self.report(p)))

    def _end_span(self, p: Proc, op: OpRun, how: str) -> None:
        op.ended = self.now
        for sp in reversed(self.spans):
            if sp.lid == p.lid and sp.gen == op.gen and sp.seq == op.seq:
                sp.ended, sp.how = self.now, how
                return

    # --- frames --------------------------------------------------------------------------------
    def _taken(self, p: Proc, op: OpRun, peer: int) -> None:
        """The transport takes a data frame from `peer`: its link's figures (linkstats.py),
        from the frame's posting, its arrival and whether this rank waited for it."""
        q = p.frames.get((op.gen, op.seq, peer))
        if not q or p.place is None:
            return
        sent_at, arrived, nbytes = q.popleft()
        if not q:
            del p.frames[(op.gen, op.seq, peer)]
        waited = op.waiting_on == peer and op.waiting_since <= arrived
        since = op.waiting_since if waited else self.now
        p.place.stats.arrived(peer, nbytes, sent_at, self.now, since, waited)

    def _link_time(self, a: int, b: int, nbytes: int) -> float | None:
        """When a message of nbytes sent now from launch id a arrives at b; None: never."""
        if (a, b) in self.cut or a in self.isolated or b in self.isolated:
            return None
        slow = (a, b) in self.slowed
        if (a, b) not in self.latency:
            link = random.Random(f"{self.seed}:{a}:{b}")
            self.latency[(a, b)] = link.uniform(50e-6, 300e-6)
            self.bandwidth[(a, b)] = link.uniform(0.5e9, 2e9)
        bw = fl.CRAWL if slow else self.bandwidth[(a, b)] / self.slowdown.get((a, b), 1.0)
        start = max(self.now, self.free_at.get((a, b), 0.0))
        end = start + (nbytes + 64) / bw
        self.free_at[(a, b)] = end
        return end + self.latency[(a, b)] + (fl.HOLD if slow else 0.0)

    def _send_frame(self, p: Proc, peer: int, nbytes: int, op: OpRun) -> None:
        dst = p.roster[peer]
        p.last_sent[peer] = self.now
        if nbytes >= LARGE_BYTES and (p.lid, dst) in self.slowdown and op.span is not None:
            got = op.span.slow_bytes
            got[(p.lid, dst)] = got.get((p.lid, dst), 0) + nbytes
        t = self._link_time(p.lid, dst, nbytes)
        if t is not None:
            sent = (self.now, nbytes)
            self.at(t, self._frame, self.procs[dst], op.gen, op.seq, p.rank, False, sent)

    def _frame(
        self,
        p: Proc,
        gen: int,
        seq: int,
        src: int,
        abort: bool,
        sent: tuple[float, int] = (0.0, 0),
    ) -> None:
        if p.status in ("crashed", "stopped"):
            return
        if abort:
            p.aborts.add((gen, seq))
        else:
            key = (gen, seq, src)
            p.inbox[key] = p.inbox.get(key, 0) + 1
            p.frames.setdefault(key, deque()).append((sent[0], self.now, sent[1]))
        if self._cpu(p, self._frame_now, p, gen, seq, src, abort):
            self._frame_now(p, gen, seq, src, abort)

    def _frame_now(self, p: Proc, gen: int, seq: int, src: int, abort: bool) -> None:
        op = p.op
        if op is None or op.gen != gen or op.seq != seq or not op.in_op or op.stalled:
            return
        if p.status != "up":
            return
        if abort:
            self.log(f"m{p.lid}: op #{seq} aborted by rank {src}")
            self._op_failed(p, op, rm.Fault("Timeout", f"aborted by rank {src}", (), gen, p.rank))
        elif op.waiting_on == src:
            self._advance(p, op)

    def _wake(self, p: Proc, op: OpRun) -> None:
        """A starved receive looks at the failure notice (channel.check_failure)."""
        if p.op is not op or not op.in_op or op.stalled or op.waiting_on is None:
            return
        if p.failure is not None and self._cpu(p, self._wake, p, op):
            self._op_failed(p, op, p.failure)

    # --- the deadline, the diagnosis -----------------------------------------------------------
    def _deadline(self, p: Proc, op: OpRun) -> None:
        if p.op is op and op.in_op and op.book_wait:  # the book's for_op: CollectiveTimeout
            if self._cpu(p, self._deadline, p, op):
                op.book_wait = False
                why = "no decision from the coordinator on the schedule it proposed"
                self._op_failed(p, op, rm.Fault("Timeout", why, (), op.gen, p.rank))
            return
        if p.op is not op or not op.in_op or op.stalled or op.waiting_on is None:
            return
        if not self._cpu(p, self._deadline, p, op):
            return
        if p.failure is not None:
            self._op_failed(p, op, p.failure)
            return
        op.stalled = True
        self.log(f"m{p.lid}: op #{op.seq} passed its deadline waiting on rank {op.waiting_on}")
        p.waiting_for = "diagnose"
        self.feed(
            p,
            rm.OpStalled(op.seq, op.waiting_on, self.report(p), self.cfg.op_timeout, True),
        )

    def _verdict(self, p: Proc, v: rm.Blame) -> None:
        op = p.op
        if op is None or not op.stalled:
            return
        p.waiting_for = ""
        self.log(f"m{p.lid}: verdict on op #{v.seq}: {list(v.culprits)} {v.why} ({v.evicted})")
        if not v.culprits:
            key = (op.gen, v.why)
            self.unblamed[key] = min(op.begun, self.unblamed.get(key, op.begun))
        self._timed_out(p, op, list(v.culprits), v.evicted)

    def _timed_out(self, p: Proc, op: OpRun, culprits: list[int], evicted: str | bool) -> None:
        kw = dict(failed_ranks=tuple(culprits), generation=op.gen, rank=p.rank)
        if evicted and culprits:
            if p.rank in culprits:
                fault = rm.Fault("Evicted", "this rank was evicted", **kw)  # type: ignore[arg-type]
            elif evicted == "failed":
                fault = rm.Fault("PeerFailure", "removed already", **kw)  # type: ignore[arg-type]
            else:
                fault = rm.Fault("PeerTimeout", "evicted", **kw)  # type: ignore[arg-type]
        else:
            if not op.has_data:
                for peer in range(len(p.roster)):
                    if peer != p.rank:
                        t = self._link_time(p.lid, p.roster[peer], 0)
                        if t is not None:
                            self.at(
                                t,
                                self._frame,
                                self.procs[p.roster[peer]],
                                op.gen,
                                op.seq,
                                p.rank,
                                True,
                            )
            fault = rm.Fault("Timeout", "timed out", **kw)  # type: ignore[arg-type]
        self._op_failed(p, op, fault)

    def _run_probes(self, p: Proc, e: rm.RunProbes) -> None:
        start = self.now
        for peer in e.peers:
            if peer != p.rank and peer < len(p.roster):
                dst = p.roster[peer]
                t = self._link_time(p.lid, dst, e.nbytes)
                if t is not None:
                    self.at(t, self._probe_frame, self.procs[dst], e.token, p.rank)
        self.at(start + e.window, self._probes_done, p, e, start)

    def _probe_frame(self, p: Proc, token: int, src: int) -> None:
        if p.status in ("crashed", "stopped"):
            return
        p.probes.setdefault(token, {}).setdefault(src, self.now)

    def _probes_done(self, p: Proc, e: rm.RunProbes, start: float) -> None:
        if not self._cpu(p, self._probes_done, p, e, start):
            return
        got = p.probes.pop(e.token, {})
        heard: list[float | None] = [None] * len(p.roster)
        for peer in e.peers:
            if peer == p.rank or peer >= len(heard):
                continue
            at = got.get(peer)
            heard[peer] = None if at is None or at > start + e.window else max(0.0, at - start)
        self.feed(p, rm.ProbesDone(e.token, tuple(heard), self.now - start))

    # --- an op that failed, and the group after it ---------------------------------------------
    def _op_failed(self, p: Proc, op: OpRun, fault: rm.Fault) -> None:
        """abandon(), then the group's settle (group/judge.py): an op whose result this rank
        held asks the coordinator whether it counts on every survivor."""
        op.in_op = False
        op.waiting_on = None
        op.stalled = False
        self.log(f"m{p.lid}: op #{op.seq} failed: {fault.kind}: {fault.message}")
        settles = fault.kind in ("Timeout", "PeerTimeout", "PeerFailure")
        if not op.has_data or not settles:
            self._record(p, op, LACKED)
            self._end_span(p, op, f"failed: {fault.kind}")
            self._error(p, fault)
            return
        p.pending_fault = fault
        p.waiting_for = "outcome"
        self.feed(p, rm.AskOutcome(op.seq, self.report(p), self.cfg.op_timeout))

    def _settled(self, p: Proc, verdict: str | None) -> None:
        op = p.op
        fault = p.pending_fault
        assert op is not None and fault is not None
        p.pending_fault = None
        if verdict == "commit":
            self._record(p, op, COMPLETED)
            self._commit(p, op)
            self._end_span(p, op, "settled: commit")
            if fault.kind in ("PeerFailure", "PeerTimeout") and p.failure is None:
                p.failure = fault  # the group is broken: the next op raises at once
            p.step += 1
            self._next_op(p)
            return
        self._record(p, op, ABANDONED)
        self._end_span(p, op, f"settled: {verdict}")
        self._error(p, fault)

    def _error(self, p: Proc, fault: rm.Fault) -> None:
        """What the training loop does with the op's error."""
        if fault.kind == "Evicted":
            p.status, p.why = "evicted", fault.message
            self.log(f"m{p.lid} leaves: evicted")
            return
        if fault.kind in ("CoordinatorLost", "CollectiveError"):
            p.status, p.why = "error", f"{fault.kind}: {fault.message}"
            self.log(f"m{p.lid} ends: {p.why}")
            return
        p.step += 1  # the step is dropped
        self._reconstruct(p)

    def _reconstruct(self, p: Proc) -> None:
        p.waiting_for = "reconstruct"
        self.feed(
            p,
            rm.AskReconstruct(p.gen, self.report(p), self.cfg.reconstruct_timeout),
        )

    def _replied(self, p: Proc, e: rm.Replied) -> None:
        r = e.reply
        p.waiting_for = ""
        if isinstance(r, Welcome):
            self._install(p, r.generation, r.infos)
        elif isinstance(r, Unchanged):
            self.log(f"m{p.lid}: reconstruct: unchanged")
            self._next_op(p)
        elif isinstance(r, Regroup):
            p.waiting_for = "address"
            ask = rm.AskAddress(r.generation, Info(rank=p.lid), self.cfg.reconstruct_timeout)
            self.feed(p, ask)
        elif isinstance(r, Unformed):
            self.log(f"m{p.lid}: generation {r.generation} did not form: {r.reason}")
            self._reconstruct(p)
        elif isinstance(r, OutcomeAnswer):
            self._settled(p, r.verdict)

    def _failed(self, p: Proc, e: rm.Failed) -> None:
        self.log(f"m{p.lid}: {e.request} failed: {e.fault.kind}: {e.fault.message}")
        p.waiting_for = ""
        if e.request == "diagnose":
            op = p.op
            if op is not None and op.stalled:
                # group/judge.py, blame: no verdict, blame whom it waited on
                self._timed_out(p, op, [op.waiting_on] if op.waiting_on is not None else [], False)
            return
        if e.request == "outcome":
            self._settled(p, None)
            return
        if e.request == "address" and e.fault.kind not in ("Evicted", "Timeout"):
            self._reconstruct(p)  # lifecycle: a formation that failed is asked again
            return
        p.status, p.why = (
            ("evicted" if e.fault.kind == "Evicted" else "error"),
            (f"{e.request}: {e.fault.kind}: {e.fault.message}"),
        )

    # --- faults --------------------------------------------------------------------------------
    def _strike(self, step: int) -> None:
        for i, f in enumerate(self.faults):
            if f.step == step and i not in self.struck:
                self.struck[i] = self.now + f.after
                self.at(self.now + f.after, self._fault, i, f)

    def _fault(self, i: int, f: Fault) -> None:
        self.struck[i] = self.now
        self.log(f"FAULT {f.describe()}")
        p = self.procs[f.rank] if f.rank >= 0 else None
        links = fl.slowed_links(f, self._ring())
        self.blamed[i] = fl.blamed(f, links)
        self.links_of[i] = frozenset(links)
        if f.kind in ("links", "nic"):
            self.slowed |= links
        elif f.kind in fl.FAILSLOW_KINDS:
            for link in links:
                self.slowdown[link] = self.slowdown.get(link, 1.0) * f.factor
            if f.kind == "slownic" and self.cfg.failslow in ("shrink", "replace"):
                self.excused[i] = frozenset((f.rank,))
        elif f.kind == "partition":
            self.cut |= links
        elif f.kind == "isolated":
            self.isolated.add(f.rank)
        elif f.kind == "crash" and p is not None:
            p.status, p.why = "crashed", "crashed"
            self.at(self.now + self.rng.uniform(*WITNESS), self._witness, p)
        elif f.kind == "stop" and p is not None:
            p.status, p.why = "stopped", "stopped"
        elif f.kind == "late":
            pass  # self.late: its compute gap before that step is longer
        elif f.kind == "starved":
            self.starved[f.rank] = (self.now, self.now + f.span, f.delay)
        elif f.kind == "coordinator":
            self.coord_alive = False
            self.coord_down.append((self.now, self.now + f.delay))
            for q in self.procs:
                self.at(self.now + self.rng.uniform(0.001, 0.005), self._gone, q)
            self.at(self.now + f.delay, self._restart)

    def _ring(self) -> list[int]:
        """The newest generation's launch ids in rank order (as its live members have it)."""
        up = [p for p in self.procs if p.status == "up" and p.gen >= 0]
        if not up:
            return list(range(self.cfg.n))
        return list(max(up, key=lambda p: p.gen).roster)

    def _witness(self, p: Proc) -> None:
        if self.coord_alive:
            self._coord_feed(Died(f"m{p.lid}", "died: its process ended (witness)"))

    def _gone(self, p: Proc) -> None:
        if p.status not in ("crashed", "stopped") and self._cpu(p, self._gone, p):
            self.feed(p, rm.Gone())

    def _restart(self) -> None:
        self.log("coordinator restarted")
        self._start_coordinator()
        for q in self.procs:
            self.at(self.now + self.rng.uniform(0.01, 0.05), self._back, q)

    def _back(self, p: Proc) -> None:
        if p.status not in ("crashed", "stopped") and self._cpu(p, self._back, p):
            self.feed(p, rm.Back(self.report(p)))


def _short(msg: AnyReply) -> str:
    if isinstance(msg, Verdict):
        return f"#{msg.seq} culprits {list(msg.culprits)}: {msg.why}"
    if isinstance(msg, Failure):
        return f"gen {msg.generation} ranks {list(msg.failed_ranks)}: {msg.reason}"
    if isinstance(msg, (Regroup, Unchanged, Rejoined, Welcome)):
        return f"gen {msg.generation}"
    if isinstance(msg, OutcomeAnswer):
        return f"#{msg.seq} {msg.verdict}"
    if isinstance(msg, Evicted):
        return msg.reason
    if isinstance(msg, Error):
        return msg.message
    return ""
