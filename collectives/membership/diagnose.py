"""Who is to blame when an operation stalls? Pure functions over a snapshot of the group.

Each rank reports the last op sequence it entered (`seq`), whether it is inside it (`in_op`),
whom it waits on (`waiting_on`), and how many messages of that op it has sent to and taken
from each peer (`sent`, `recv`). Given the op `seq` that passed its deadline:

  1. ranks that did not answer at all (dead, stopped) are to blame;
  2. else ranks that never entered op `seq` (still computing, or calling something else) --
     unless some of them are inside an earlier op: that op stalled first, and it is judged
     instead (a rank that got through it on a slow link waits in the next op for the others),
     and unless they were waiting on the coordinator's answer about an earlier op (a verdict,
     an outcome) until less than an op timeout ago (`excused`): then nobody;
  3. else bad links: stalled ones (rank r waits on p although p has sent r more messages than
     r has received, or p already finished the op -- and, where the pictures were taken at
     different moments, p's last send to r left long enough before r's picture: `Placed`),
     and -- once the coordinator has had the
     ranks probe their links (evidence.py) -- slow ones. The culprits are the fewest ranks
     that touch every bad link (two slowed links 2->0 and 0->1 point at rank 0). When more
     than one set of ranks would do (one bad link, whose two ends tie), the op's own picture
     cannot decide: `judge` asks for probes (`needs_probes`); with the probes' results and
     still a tie, the ranks that earlier stalls found on bad links go first (`history`),
     and only then, if every rank took part in the probes, the rule: the set with the
     highest ranks goes, so that rank 0, which may host the coordinator, stays (with a rank
     left out of the probes, late, nobody: it might have told the ends apart). The verdict says which of these decided.
  4. else the ends of the wait-for chains: ranks inside the op that others wait on and that
     wait on nobody themselves (stuck in compute inside the op); in a pure wait cycle, where
     the pictures were taken at different moments (`placed`), nobody: with no link proven
     stalled and none slow on its probe, the cycle is a late rank's picture, not a fault
     (probes asked first); in one snapshot, the highest of the ranks most waited on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from msgspec import to_builtins
from msgspec.structs import replace

from ..transport.base import COMPLETED, LACKED, ABANDONED  # noqa: F401  (how an op ended)
from ..transport.base import Progress
from .evidence import min_covers, named, probe_links
from .protocol import Evidence

# From this many ranks, two faults at once can leave a majority (the one-in-three a group of
# five or more survives), and they can show the picture of one: 0->1 slowed and rank 2's links
# cut stall 0->1 and 1->2, whose one cover is the healthy rank 1 between them. There a cover of
# stalled links the pictures found is confirmed by probes before anyone is evicted (a probe
# window longer). In smaller groups two culprits would be most of the group, and the one-rank
# cover is the answer to act on at once.
CONFIRM_FROM = 5
Links = set[tuple[int, int]]  # directed links (sender, receiver)
# rank -> its picture of the stalled op (transport/base.py's Progress, as reported), or None:
# it did not answer
States = dict[int, Progress | None]
Probes = dict[int, dict[int, float | None]]  # rank -> {peer: seconds until heard, or None}


@dataclass(frozen=True)
class Placed:
    """When a rank's picture was taken, on the judge's (the coordinator's) clock: no earlier
    than `after` (the ping it answers went out then; -inf: not known) and no later than
    `arrived` (it was in hand then)."""

    after: float
    arrived: float


UNPLACED_AFTER = float("-inf")


def causal_hold(timeout: float) -> float:
    """How long before the receiver's picture a sender's bytes must have left for its link to
    count as stalled: a quarter of the op timeout, within 0.25-1 s. A healthy link, and a
    receiver short of CPU, take their bytes within milliseconds; a stalled op's frames
    waited for most of its timeout."""
    return min(1.0, max(0.25, timeout / 4))


def proven(p: int, r: int, states: States, placed: dict[int, Placed] | None, hold: float) -> bool:
    """Whether p's last frame to r left at least `hold` s before r's picture was taken, so
    that r lacking it is the link's doing, not the order in which the pictures were taken
    (a sender that came late, short of CPU, sent just before its own picture). placed None:
    the pictures are one snapshot (the in-process world): every link is in time."""
    if placed is None:
        return True
    sender, receiver = placed.get(p), placed.get(r)
    picture = states.get(p)
    ages = None if picture is None else picture.sent_age
    age = ages[r] if ages is not None and r < len(ages) else None
    if sender is None or receiver is None or age is None:
        return False
    left_by = sender.arrived - age  # transit only makes the send earlier
    return left_by + hold <= receiver.after


def stalled_links(
    seq: int,
    states: States,
    placed: dict[int, Placed] | None = None,
    hold: float = 0.0,
    unproven: list[tuple[int, int]] | None = None,
) -> list[tuple[int, int]]:
    """The links (p, r) of op `seq` on which r waits for a frame p sent. With `placed`, only
    those `proven` in time; the others go to `unproven` when a list is given."""
    links = []
    for r, s in states.items():
        if s is None:
            continue
        p = s.waiting_on
        ps = None if p is None else states.get(p)
        if p is None or ps is None or s.seq != seq or not s.in_op:
            continue
        finished = ps.seq > seq or (ps.seq == seq and not ps.in_op)
        sent, got = ps.sent, s.recv
        ahead = (
            ps.seq == seq and sent and got and r < len(sent) and p < len(got) and sent[r] > got[p]
        )
        if not (finished or ahead):  # finished: everything it sent is in flight
            continue
        if proven(p, r, states, placed, hold):
            links.append((p, r))
        elif unproven is not None:
            unproven.append((p, r))
    return sorted(links)


@dataclass
class Judgement:
    """A verdict on a stalled op. `evidence` is what decided, for the error message, the
    demo's event line and `explain stall`: stalled links, probe results, and by what."""

    culprits: list[int]
    why: str
    needs_probes: bool = False  # the picture ties: probes would tell more
    evidence: Evidence = field(default_factory=Evidence)

    def __repr__(self) -> str:
        # the evidence as plain data: the coordinator's debug line of a verdict is read back
        # by bench/studies/stallmatrix.py (judged_from)
        return (
            f"Judgement(culprits={self.culprits!r}, why={self.why!r}, "
            f"needs_probes={self.needs_probes!r}, evidence={to_builtins(self.evidence)!r})"
        )

    @property
    def judged_op(self) -> int | None:
        """The earlier op whose stall this one waits on, judged in its place (None: this)."""
        return self.evidence.judged_op

    @property
    def bad(self) -> list[tuple[int, int]]:
        """The links found bad, which earlier stalls' history counts."""
        return list(self.evidence.bad)


def judge(
    seq: int,
    states: States,
    world_size: int,
    probes: Probes | None = None,
    history: dict[int, int] | None = None,
    placed: dict[int, Placed] | None = None,
    hold: float = 0.0,
    excused: set[int] | frozenset[int] = frozenset(),
) -> Judgement:
    """states: rank -> None (no answer) or its picture (Progress: seq, in_op, waiting_on,
    sent, recv, sent_age). probes: rank -> {peer: seconds or None} (evidence.probe_links), or None:
    none taken. history: rank -> how many bad links earlier stalls of this job found it on.
    placed, hold: when each picture was taken, and how long a stalled link's bytes must have
    been on their way (stalled_links); None: the pictures are one snapshot. excused: ranks
    that were waiting on the coordinator's answer about an earlier op until less than an op
    timeout ago: their absence from this op is the coordinator's doing, not theirs."""
    silent = sorted(r for r in range(world_size) if states.get(r) is None)
    if silent:
        return Judgement(
            silent, "did not answer (dead or stopped)", evidence=Evidence(decided_by="silence")
        )
    pictures = {r: s for r, s in states.items() if s is not None}
    absent = sorted(r for r, s in pictures.items() if s.seq < seq)
    blocked = [pictures[r].seq for r in absent if pictures[r].in_op]
    if blocked:
        # They are inside an earlier op, so that op stalled first: this one waits on it. A
        # rank past it (it got its part through a slow link) must not make the ranks still
        # in it the culprits of the next op; the earlier op's own picture decides.
        first = min(blocked)
        j = judge(first, states, world_size, probes, history, placed, hold, excused)
        j.evidence = replace(j.evidence, judged_op=first)
        return j
    if absent and set(absent) <= excused:
        return Judgement(
            [],
            f"rank(s) {absent} never entered op #{seq}, but they waited on the coordinator's "
            "answer about an earlier op until less than an op timeout ago: nobody is evicted",
            evidence=Evidence(decided_by="held by the coordinator"),
        )
    absent = [r for r in absent if r not in excused]
    if absent:
        return Judgement(
            absent, f"never entered op #{seq}", evidence=Evidence(decided_by="absence")
        )
    unproven: list[tuple[int, int]] = []
    stalled = stalled_links(seq, states, placed, hold, unproven)
    # unproven links are counted against nobody: the sender's bytes may have left after the
    # receiver's picture was taken; probes tell, if the rest ties
    evidence = Evidence(stalled=list(stalled), unproven=sorted(unproven))
    slow: Links = set()
    healthy: Links = set()
    if probes is not None:
        slow, healthy = probe_links(probes)
        heard = [(p, r, probes[r][p]) for r in probes for p in probes[r] if p != r and p in probes]
        evidence = replace(evidence, probes=sorted(heard, key=_probe_order))
    bad = (set(stalled) - healthy) | slow
    if bad:
        return _from_links(
            bad,
            stalled,
            slow,
            healthy,
            probes,
            history or {},
            evidence,
            world_size,
            confirm=placed is not None and world_size >= CONFIRM_FROM,
        )
    if stalled:  # every stalled link answered its probe: the links are not the cause
        evidence = replace(evidence, cleared=list(stalled))
    waited = Counter(
        s.waiting_on
        for s in pictures.values()
        if s.seq == seq and s.in_op and s.waiting_on is not None
    )
    # A rank that waits is blocked, not guilty: blame the ends of the wait-for chains, ranks
    # inside the op that others wait on and that wait on nobody (stuck in compute, stalled).
    ends = sorted(
        r for r in waited if r in pictures and pictures[r].in_op and pictures[r].waiting_on is None
    )
    if ends:
        evidence = replace(evidence, decided_by="wait-for chains")
        # a rank caught between two sends looks the same; with links whose frames may still
        # have been on their way, the probes speak first
        return Judgement(
            ends,
            "is inside the op but sends nothing",
            needs_probes=probes is None and bool(unproven),
            evidence=evidence,
        )
    if waited and placed is not None:
        # Pictures taken at different moments: with no stalled link proven in time and none
        # slow on its probe, a wait cycle is what a rank that came late (short of CPU) looks
        # like, or one that finished the op after its waiters' pictures -- no rank's doing.
        # The op times out everywhere (CollectiveTimeout) and nobody is evicted; a late rank
        # is not a culprit.
        evidence = replace(evidence, decided_by="nothing")
        return Judgement(
            [],
            "the ranks wait in a cycle, but no stalled link is proven and none is slow: "
            "a rank came late; nobody is evicted",
            needs_probes=probes is None,
            evidence=evidence,
        )
    if waited:
        top = max(waited.values())
        evidence = replace(evidence, decided_by="rule")
        return Judgement(
            [max(r for r, c in waited.items() if c == top)],
            "is not sending (a wait cycle; rule: the highest of the ranks most waited on)",
            needs_probes=probes is None,
            evidence=evidence,
        )
    evidence = replace(evidence, decided_by="nothing")
    return Judgement([], "no rank is waiting", evidence=evidence)


def _from_links(
    bad: Links,
    stalled: list[tuple[int, int]],
    slow: Links,
    healthy: Links,
    probes: Probes | None,
    history: dict[int, int],
    evidence: Evidence,
    world_size: int,
    confirm: bool = False,
) -> Judgement:
    covers = min_covers(bad)
    evidence = replace(evidence, bad=sorted(bad))
    kind = "slow" if probes is not None else "stalled"
    told = f"is on the {kind} link(s) {named(bad)}"
    if probes is not None:
        told += f" ({_probe_summary(slow, healthy)})"
    if len(covers) == 1:
        evidence = replace(
            evidence, decided_by="probes" if probes is not None else "the stalled op"
        )
        # confirm: the probes confirm the links first (see CONFIRM_FROM)
        return Judgement(
            list(covers[0]), told, needs_probes=confirm and probes is None, evidence=evidence
        )
    if probes is None:
        # Provisional: the coordinator asks for probes first; a caller that cannot probe (the
        # in-process world) takes the rule's answer.
        culprits, rule = _rule(covers)
        evidence = replace(evidence, decided_by="rule")
        return Judgement(culprits, f"{told} ({rule})", needs_probes=True, evidence=evidence)
    unjudged = _unjudged(probes, slow | healthy, {r for c in covers for r in c})
    if unjudged:
        # a probe left out (its sender started its window late, short of CPU: it says
        # nothing) might have told the tie apart -- two slowed links 2->0 and 0->1 with 0->1's
        # probe left out look like one link 2->0 -- so nobody goes on a guess; the next stall
        # probes again; history does not speak before it (an earlier stall's bad link says
        # nothing of a link this one could not measure)
        return _undecided(
            told, f"the probe(s) on {named(unjudged)} told nothing (sent late)", evidence
        )
    scores = {c: sum(history.get(r, 0) for r in c) for c in covers}
    best = max(scores.values())
    leaders = [c for c in covers if scores[c] == best]
    if best > 0 and len(leaders) == 1:
        evidence = replace(evidence, decided_by="history")
        return Judgement(
            list(leaders[0]),
            f"{told}; this stall's evidence ties, and earlier "
            f"stalls found rank(s) {_ranks(leaders[0])} on bad links",
            evidence=evidence,
        )
    unprobed = [r for r in range(world_size) if r not in probes]
    if unprobed:
        # a rank left out of the probes (it had not asked yet: late, short of CPU) might have
        # told the tie apart (a slow NIC is slow towards it too): the rule would evict one
        # end of the link at a guess, so nobody goes; the next stall probes again
        why = f"rank(s) {_ranks(tuple(unprobed))} took no part in the probes"
        return _undecided(told, why, evidence)
    culprits, rule = _rule(leaders)
    evidence = replace(evidence, decided_by="rule")
    return Judgement(culprits, f"{told}; {rule}", evidence=evidence)


def alone(j: Judgement, askers: list[int]) -> Judgement:
    """The judgement when probes were wanted but at most one rank asked (the others are past
    the op, or done with the job): no probe can run, and a tie the rule would decide -- one
    link, two ends -- evicts nobody, since the rank that asked is as likely the slow end."""
    if j.evidence.decided_by != "rule":
        return j
    told = f"is on the stalled link(s) {named(j.evidence.bad)}"  # as _from_links put it
    why = f"only rank(s) {_ranks(tuple(askers))} asked, so no probe could tell"
    return _undecided(told, why, j.evidence)


def _undecided(told: str, why: str, evidence: Evidence) -> Judgement:
    """A tie the evidence cannot decide, and `why` nothing else may: nobody is evicted (the
    next stall judges again)."""
    return Judgement(
        [],
        f"{told}; the evidence cannot decide and {why}: nobody is evicted",
        evidence=replace(evidence, decided_by="nothing"),
    )


def _unjudged(probes: Probes, judged: Links, tied: set[int]) -> Links:
    """The links between two ranks that took part in the probes, touching a rank of the tie,
    that no probe judged slow or healthy (probing.results left them out)."""
    return {
        (p, r)
        for r in probes
        for p in probes
        if p != r and (p in tied or r in tied) and (p, r) not in judged
    }


def _probe_order(heard: tuple[int, int, float | None]) -> tuple[int, int, float]:
    """Probe results in (sender, receiver) order; a probe with no answer sorts as the slowest."""
    p, r, seconds = heard
    return (p, r, float("inf") if seconds is None else seconds)


def _rule(covers: list[tuple[int, ...]]) -> tuple[list[int], str]:
    """The last resort: of equally small sets of ranks that each explain the bad links, the
    one with the highest ranks goes (rank 0, which may host the coordinator, stays)."""
    pick = max(covers, key=lambda c: sorted(c, reverse=True))
    options = " or ".join(_ranks(c) for c in sorted(covers))
    return list(pick), (
        f"the evidence cannot decide between rank(s) {options}; rule: the "
        "highest rank goes, keeping rank 0"
    )


def _ranks(c: tuple[int, ...]) -> str:
    return "+".join(map(str, c))


def _probe_summary(slow: Links, healthy: Links) -> str:
    parts = []
    if slow:
        parts.append(f"probes not heard on {named(slow)}")
    if healthy:
        parts.append(f"{len(healthy)} link(s) answered")
    return "; ".join(parts) or "no probe answered"


def blame(
    seq: int,
    states: States,
    world_size: int,
    probe: Callable[[], Probes] | None = None,
) -> tuple[list[int], str]:
    """(culprits, why): judge() from the op's own picture and, where that ties and `probe`
    is given, from the probe results it returns (rank -> {peer: seconds or None}); the rule
    decides what is left. The in-process world (transport/inproc.py) calls it so."""
    j = judge(seq, states, world_size)
    if j.needs_probes and probe is not None:
        j = judge(seq, states, world_size, probes=probe())
    return j.culprits, j.why


# --- the outcome of an op that failed somewhere -------------------------------------------------
# A rank may finish an op while another survivor of the same failure is still missing data for
# it (its last message came from the rank that was then evicted). If the first returned and the
# second raised, the two would from then on pair up different steps. So a group that can
# survive failures ends every collective with a commit round (algorithms/commit.py): a rank
# returns only once every rank holds its result. A rank caught by a failure in that round holds
# its result but does not know whether the others do; the coordinator answers, the same for
# every survivor, from what each survivor reports of op `seq`:
#   COMPLETED  the rank finished the op;
#   LACKED     it stopped in the op without its result (a timeout, a failure, an abort);
#   ABANDONED  it held its result, but the verdict on the op was "abort";
#   (in the op with has_data set: it holds its result and waits in the commit round.)
# The op counts ("commit") once every survivor holds its result; it is dropped ("abort") as soon
# as one survivor stopped without it. A survivor that stopped never gains its result later and
# one that holds it never loses it, so the two answers exclude each other and never change.


def holds_result(
    seq: int, last: int, has_data: bool, done: Iterable[tuple[int, int]]
) -> bool | None:
    """True: this rank holds op `seq`'s result; False: it stopped without it; None: not yet
    known (still moving data). last, has_data, done: its report's (the last op it entered,
    whether it holds that op's result, how its last ops ended)."""
    for done_seq, how in done:
        if done_seq == seq:
            return how != LACKED
    # has_data is cleared when an op begins: with `seq` the last op begun and not ended, this
    # rank reached the commit round of it -- in it still, or stopped there by the failure and
    # asking for the outcome (OpRunner abandons the op before it asks, so in_op is off then;
    # a death detected within milliseconds leaves no beat of the commit wait to go by)
    if last == seq and has_data:
        return True
    return None


def outcome(held: Iterable[bool | None]) -> str | None:
    """held: for each survivor, holds_result() of the op. 'commit', 'abort', or None."""
    held = list(held)
    if any(h is False for h in held):
        return "abort"
    if held and all(h is True for h in held):
        return "commit"
    return None
