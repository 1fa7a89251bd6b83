"""The reconstruction round: a barrier of the live members at reconstruct(), then the next
generation formed from the survivors and the admitted joiners (or, when one of them vanishes
first, an 'unformed' answer and another attempt). Functions over a State (state.py); the wire
messages are listed in protocol.py.
"""

from __future__ import annotations


from . import formation, recovery, tables
from .changes import declare, install_generation
from .protocol import (
    Address,
    Error,
    Evicted,
    JoinRequest,
    Reconstruct,
    Regroup,
    Unchanged,
    Unformed,
)
from .state import Beat, Forming, Ident, Mid, Outbox, Round, State


def on_join_request(s: State, out: Outbox, ident: Ident, msg: JoinRequest, now: float) -> None:
    """`join_request {mid, spare, proc}`: a replacement waits to be admitted."""
    mid = msg.mid
    if s.forming_has(mid):
        # a joiner told 'unformed' asks again, but the next attempt already took it: its
        # regroup is on the way
        return
    if mid in s.live():
        # a member of the current generation is in its roster already (invariant I2)
        out.send(ident, Error(message="a member cannot wait to join its own group"))
        return
    if mid in s.removed:
        # invariant I5: a process removed from a generation joins again under a new member
        # id (a new link), so that nothing addressed to the old one reaches the new
        out.send(
            ident,
            Error(message="this member was removed from the group; join as a new one"),
        )
        return
    if mid not in s.joiners and not tables.room_for_joiner(s):
        out.send(
            ident,
            Error(message="too many replacement workers wait to be admitted already"),
        )
        return
    s.joiners[mid] = ident
    if msg.spare:
        s.spares = s.spares | {mid}
    if mid not in s.beats:
        s.beats[mid] = Beat(b"", now)
    # its process is watched from here (its pidfd, on this host): a joiner killed before
    # its first beat has no heartbeat connection to witness its death
    out.watch(mid, msg.proc)
    out.note(f"a {'spare' if msg.spare else 'replacement'} worker waits to join (pid {msg.pid})")
    formation.form_or_fill(s, out, now)  # before generation 0: the place of a rank that died


def on_reconstruct(s: State, out: Outbox, ident: Ident, msg: Reconstruct, now: float) -> None:
    """`reconstruct {mid, generation, timeout, seq, exclude}`: a member enters the barrier,
    naming the ranks it drops (dist.shrink_group's ranks_to_exclude; usually none)."""
    mid = msg.mid
    if s.members is None or s.rank_of(mid) is None or mid in s.failed:
        reason = s.failed.get(mid, f"not a member of generation {s.generation}")
        out.send(ident, Evicted(reason=reason))
        return
    if msg.generation != s.generation:
        out.send(
            ident,
            Error(
                message=f"reconstruct from generation {msg.generation}, but the group "
                f"is at generation {s.generation}",
            ),
        )
        return
    size = len(s.members)
    outside = [r for r in msg.exclude if r >= size]
    if outside or s.rank_of(mid) in msg.exclude:
        why = (
            f"rank(s) {outside} are not ranks of generation {s.generation} ({size} ranks)"
            if outside
            else f"rank {s.members.index(mid)} excludes itself"
        )
        out.send(ident, Error(message=f"reconstruct: exclude {list(msg.exclude)}: {why}"))
        return
    if s.round is None:
        s.round = Round({}, {}, msg.timeout, now, now + msg.timeout)
    s.round.asked[mid] = ident
    s.round.seqs[mid] = msg.seq
    if msg.exclude:
        s.round.exclude[mid] = tuple(msg.exclude)
    else:
        s.round.exclude.pop(mid, None)


def _lists(s: State, r: Round) -> str:
    return "; ".join(
        f"rank {rank} excludes {list(r.exclude.get(m, ()))}"
        for m in r.asked
        for rank in s.ranks_of([m])
    )


def _disagree(s: State, out: Outbox, r: Round) -> bool:
    """Askers whose exclusion lists differ: the round ends and every asker is told the lists
    (nothing changes; they ask again with one list)."""
    if len({r.exclude.get(m, ()) for m in r.asked}) <= 1:
        return False
    s.round = None
    message = (
        f"reconstruct: the members disagree about the ranks to exclude: {_lists(s, r)}. "
        "Nothing changed: every member must ask with the same list"
    )
    for ident in r.asked.values():
        out.send(ident, Error(message=message))
    return True


def _still_waiting(s: State, r: Round, now: float) -> bool:
    """The common case after a failure, in O(1) per tick, not O(members): some live member has
    not asked yet, none excludes anybody, the deadline has not come -- what check_round would
    find, after looking at every member, with nothing to do. Every survivor's request is
    followed by a tick: without this, a round costs O(members^2)
    (bench/studies/membership_scale.py)."""
    live = len(s.members or ()) - len(s.failed)  # failed: members of this generation
    return bool(s.failed) and len(r.asked) < live and now < r.deadline and not r.exclude


def check_round(s: State, out: Outbox, now: float) -> None:
    """The periodic work: a round whose members all asked (or whose deadline passed) forms
    the next generation; a generation forming is formed or given up."""
    if s.forming is not None:
        _check_forming(s, out, s.forming, now)
        return
    r = s.round
    if r is None or _still_waiting(s, r, now):
        return
    if _disagree(s, out, r):
        return
    members = s.members or []
    live = s.live()
    exclude = next((r.exclude.get(m, ()) for m in r.asked), ())  # one list: _disagree
    # The live members the askers exclude: not waited for, removed once the others asked.
    listed = [m for m in live if s.rank_of(m) in exclude] if exclude else []
    waiting = [m for m in live if m not in r.asked and m not in listed]
    if (
        waiting
        and not exclude
        and not s.failed
        and not s.dissolved
        and recovery.passed_already(s, out, r, waiting)
    ):
        s.round = None
        for ident in r.asked.values():
            out.send(ident, Unchanged(generation=s.generation))
        return
    if waiting and now < r.deadline:
        return
    s.round = None
    if (waiting or listed) and 2 * len([m for m in live if m in r.asked]) < len(live):
        # A minority must not expel a majority that is busy elsewhere (e.g. in an op):
        # the askers are told instead, and nobody is removed.
        message = (
            f"rank(s) {s.ranks_of(waiting)} did not call reconstruct() within the deadline "
            "(are all ranks calling the same collectives?)"
            if waiting
            else f"reconstruct: {_lists(s, r)}: a minority of the {len(live)} live ranks "
            f"cannot exclude live rank(s) {s.ranks_of(listed)}"
        )
        for ident in r.asked.values():
            out.send(ident, Error(message=message))
        return
    if listed:
        declare(s, out, listed, f"excluded by shrink_group (exclude {list(exclude)})")
    if waiting:
        declare(s, out, waiting, "did not call reconstruct() before the deadline")
    still = set(s.live())
    asked = {m: i for m, i in r.asked.items() if m in still}
    old = [m for m in members if m in asked]
    admit = formation.admissible(s, old)  # spares only into empty places
    if not s.failed and not admit and not s.dissolved:
        for ident in asked.values():
            out.send(ident, Unchanged(generation=s.generation))
        return
    new_members = old + admit
    idents = dict(asked)
    idents.update({m: s.joiners.pop(m) for m in admit})
    spares = [m for m in admit if m in s.spares]
    s.spares = s.spares - set(admit)
    # A fresh number for every attempt: an address sent for an attempt that failed can never
    # be taken for the next one.
    gen = s.tried = max(s.tried, s.generation) + 1
    s.forming = Forming(gen, new_members, idents, {}, now + r.timeout)
    gone = sorted(s.ranks_of([m for m in members if m not in asked]))  # not in old
    for rank, m in zip(gone, spares):
        out.note(
            f"generation {gen}: a spare takes the place of rank {rank} "
            f"(rank {new_members.index(m)} of {len(new_members)})",
            warn=True,
        )
    for rank, m in enumerate(new_members):
        out.send(
            idents[m],
            Regroup(generation=gen, rank=rank, world_size=len(new_members)),
        )


def on_address(s: State, out: Outbox, ident: Ident, msg: Address, now: float) -> None:
    """`address {mid, generation, info}`: a member of the generation forming is ready."""
    if recovery.lost_address(s, out, ident, msg):
        return
    f = s.forming
    gen, mid = msg.generation, msg.mid
    if f is None or gen != f.generation or mid not in f.roster:
        if s.generation < gen <= s.tried:
            # for an attempt that failed: its sender has been told so ('unformed')
            out.note(f"dropped an address for failed generation {gen}", detail=True)
            return
        out.send(ident, Error(message="address for a generation not forming"))
        return
    f.infos[mid] = msg.info
    out.watch(mid, msg.info.proc)
    f.idents[mid] = ident
    _check_forming(s, out, f, now)


def _vanished(s: State, f: Forming, now: float) -> dict[Mid, str]:
    """Forming members that cannot be part of it, each with why: removed from the old
    generation meanwhile (heartbeat timeout, leave), a joiner that left or went quiet, or one
    whose address is still missing at the deadline. Heartbeats, not only the deadline (the
    reconstruct timeout, 30 s by default): the members wait for this."""
    if now < f.calm_until:
        # nobody can have been quiet that long yet, nor the deadline come: only a removal or
        # a departure since the last full look (O(removed), not O(members) per address)
        return {
            m: f.gone[m] if m in f.gone else s.failed[m]
            for m in (*f.gone, *s.failed)
            if m in f.roster
        }
    why = {}
    oldest = now
    for m in f.members:
        beat = s.beats.get(m)
        quiet = now - beat.at if beat is not None else 0.0
        if beat is not None:
            oldest = min(oldest, beat.at)
        if m in f.gone:
            why[m] = f.gone[m]
        elif m in s.failed:
            why[m] = s.failed[m]
        elif quiet > s.heartbeat_timeout:
            why[m] = f"sent no heartbeat for {quiet:.1f} s"
        elif m not in f.infos and now >= f.deadline:
            why[m] = "sent no address before the deadline"
    # a beat's time only moves on (the clock is monotonic): none is quiet before this
    f.calm_until = min(oldest + s.heartbeat_timeout, f.deadline)
    return why


def _unform(s: State, out: Outbox, f: Forming, vanished: dict[Mid, str]) -> None:
    """Give up generation f: tell every member of it that is still there ('unformed'; an old
    member's retry of reconstruct() then forms a new generation, see `dissolved`), requeue
    its joiners for that attempt, and evict the old members that vanished."""
    members = s.members or []
    lost = [m for m in f.members if m in vanished]
    failed_ranks = s.ranks_of(lost)

    def who(m: Mid) -> str:
        return f"old rank {members.index(m)}" if m in members else "a joiner"

    reason = f"generation {f.generation} did not form: " + "; ".join(
        f"new rank {f.members.index(m)} ({who(m)}) {vanished[m]}" for m in lost
    )
    declare(s, out, [m for m in lost if m in members], reason)
    requeued = {}
    for m in f.members:
        if m in vanished and m in members:
            # removed: if it is only slow, its wait for the welcome ends now
            out.send(f.idents[m], Evicted(reason=reason))
            continue
        out.send(
            f.idents[m],
            Unformed(
                generation=f.generation,
                from_generation=s.generation,
                failed_ranks=failed_ranks,
                reason=reason,
            ),
        )
        if m not in members and m not in vanished:
            requeued[m] = f.idents[m]
    s.joiners = {**requeued, **s.joiners}  # first in line, in their order
    s.forming = None
    s.dissolved = True
    out.note(reason)


def _check_forming(s: State, out: Outbox, f: Forming, now: float) -> None:
    vanished = _vanished(s, f, now)
    if vanished:
        _unform(s, out, f, vanished)
        return
    if len(f.infos) < len(f.members):
        return
    old_size = len(s.members or ())
    infos = [f.infos[m] for m in f.members]
    install_generation(s, out, f.generation, f.members, now, welcome=(f.idents, infos))
    s.forming = None
    out.note(f"generation {s.generation} formed: {old_size} -> {len(f.members)} ranks")
