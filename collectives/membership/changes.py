"""The two ways membership changes: a generation is installed, members are removed from one.

Every path that makes a generation current -- generation 0 forming (formation.py), a
reconstruction's generation whose addresses are all in (regroup.py), a restarted
coordinator's first re-registration (recovery.py) -- goes through `install_generation`; every
path that removes members -- a heartbeat timeout, a witness's report of a death, a leave, a
stall's verdict, a generation that did not form -- goes through `declare`. Pure functions over
a State (state.py); what they send goes into the Outbox.
"""

from __future__ import annotations

from . import tables
from .protocol import Evicted, Failure, Info, Welcome
from .state import Beat, Mid, Outbox, State


def install_generation(
    s: State,
    out: Outbox,
    generation: int,
    members: list[Mid],
    now: float,
    welcome: tuple[dict[Mid, bytes], list[Info]] | None = None,
) -> None:
    """Make `members` (by rank) generation `generation`: nobody removed from it yet, every
    member's heartbeat clock starting afresh (a member is never declared dead for the time the
    generation took to form), the last generation's outcomes forgotten. welcome: (where each
    member's answer goes, their addresses by rank): each is sent the same `welcome`, with the
    same roster (invariant I3); None where nobody waits for one (a restart's rebuild)."""
    s.generation = generation
    s.tried = max(s.tried, generation)
    s.members = list(members)
    s.failed = {}
    s.dissolved = False
    s.judgements.outcome_asks, s.judgements.outcomes = {}, {}
    for m in s.members:
        old = s.beats.get(m)
        s.beats[m] = Beat(old.ident if old else b"", now, old.report if old else None)
    if welcome is not None:
        idents, infos = welcome
        fs = s.failslow  # the members' hosts, for the slow links kept by host (hostlinks.py)
        keep = set(members) | set(fs.roster)
        fs.hosts = {m: h for m, h in fs.hosts.items() if m in keep}
        fs.hosts.update((m, info.host) for m, info in zip(members, infos) if info.host)
        roster = list(s.members)
        for m in s.members:
            out.send(idents[m], Welcome(generation=generation, infos=infos, members=roster))


def failure_notice(
    s: State, gone: list[Mid], reason: str, graceful: bool = False, op: int | None = None
) -> Failure:
    """`failure {generation, failed_ranks, reason, graceful, op}`: what the others are told."""
    return Failure(
        generation=s.generation,
        failed_ranks=s.ranks_of(gone),
        reason=reason,
        graceful=graceful,
        op=op,
    )


def declare(
    s: State,
    out: Outbox,
    mids: list[Mid],
    reason: str,
    graceful: bool = False,
    op: int | None = None,
) -> None:
    """Remove members from the current generation and tell everybody: the others' heartbeat
    threads get `failure` (their current and next operations raise PeerFailure), the removed
    get `evicted`. `graceful`: they left on purpose, after sending everything they had to.
    `op`: they stalled that op (a diagnosis): the others raise PeerTimeout, as the rank whose
    deadline fired first does, not a plain PeerFailure."""
    live = s.live()
    mids = [m for m in mids if m in live]
    if not mids:
        return
    for m in mids:
        s.failed[m] = reason
        tables.remember_removed(s, m)
    out.note(f"generation {s.generation}: rank(s) {s.ranks_of(mids)} removed: {reason}")
    notice = failure_notice(s, mids, reason, graceful, op)
    for m in s.live():
        beat = s.beats.get(m)
        if beat is not None:
            out.send(beat.ident, notice)
    for m in mids:
        beat = s.beats.get(m)
        if beat is not None:
            out.send(beat.ident, Evicted(reason=reason))
        # one that waits in reconstruct() (say it left from a signal handler meanwhile)
        # gets its answer now, not a timeout after the round
        asked = s.round.asked.pop(m, None) if s.round is not None else None
        if asked is not None:
            out.send(asked, Evicted(reason=reason))
