"""A restarted coordinator rebuilds its state from the members (their side: restart.py).

A coordinator keeps its state in memory only. Started again at the same address after a
crash, it knows nothing; the members do, and each re-registers when it finds the coordinator
back: `rejoin {mid, rank, world_size, generation, members (by rank), failed, forming, ...}`.

  * The first re-registration installs its generation as it is -- number, member list, ranks
    -- with no generation change; every member it lists gets a fresh heartbeat clock, so one
    that does not come back within the heartbeat timeout is declared dead as usual, and the
    survivors reconstruct. A member is never declared dead at once for being late.
  * A later re-registration must agree: same generation, same member list, the rank it
    claims is its own, not removed since. A conflicting one is refused (`evicted`), except
    that a higher generation wins while the recovery is open (a member that missed the
    welcome of the newest generation installed the older one first).
  * `failed`: ranks the member knows failed (a PeerFailure it holds): removed again here,
    the old coordinator's declaration having died with it. `forming`: the member was forming
    a next generation when the coordinator died; that attempt is gone, so the next
    reconstruct() forms a fresh one (`dissolved`), and an address for it is answered
    `unformed` (the member asks again) instead of waiting for its timeout.
  * Until every listed member is back (or declared dead), requests from members it does not
    know yet are dropped, not refused: their sender re-registers, then asks again.
  * Only a restart is recovered from. A member also re-registers when its connection to a
    coordinator that never went away dropped and came back; such a coordinator, not
    recovering, only acknowledges it (or refuses one that disagrees): what a re-registration
    says about others (`failed`) or about attempts (`forming`) is taken only while the
    coordinator rebuilds its state. And only within bounds: a generation that leaves room for
    MAX_ATTEMPTS more (the numbers the coordinator hands out must stay valid:
    protocol.MAX_GENERATION), a forming generation at most MAX_ATTEMPTS past it.
"""

from __future__ import annotations

from . import slowlinks
from .changes import declare, failure_notice, install_generation
from .protocol import (
    MAX_GENERATION,
    Address,
    AnyRequest,
    Beat as BeatMsg,
    Diagnose,
    Evicted,
    Info,
    Outcome,
    Probed,
    Progress,
    Reconstruct,
    Rejoin,
    Rejoined,
    State as StateMsg,
    Unformed,
)
from .state import Beat, Ident, Joined, Mid, Outbox, Round, State

# Requests that only a member of a formed generation makes: a fresh coordinator that gets one
# before any re-registration was restarted under a running job.
MEMBER_REQUESTS = (Reconstruct, Diagnose, Outcome, Address, Progress, StateMsg, BeatMsg, Probed)
# Attempts to form a generation that may fail in a row (each takes a fresh number); far more
# than a job makes (each waits for a reconstruct() timeout or a vanished member).
MAX_ATTEMPTS = 1 << 16


def rejoin_out_of_bounds(gen: int, forming: int) -> str | None:
    """Why a re-registration's generation numbers (its generation, the one it was forming or
    -1) cannot be a real job's, or None."""
    if gen > MAX_GENERATION - 2 * MAX_ATTEMPTS:
        return (
            f"re-registration with generation {gen}: no job gets there (at most "
            f"{MAX_GENERATION - 2 * MAX_ATTEMPTS})"
        )
    if forming != -1 and not gen < forming <= gen + MAX_ATTEMPTS:
        return (
            f"re-registration with generation {gen} forming generation {forming} (at "
            f"most {MAX_ATTEMPTS} past it)"
        )
    return None


def passed_already(s: State, out: Outbox, r: Round, waiting: list[Mid]) -> bool:
    """Whether a member this reconstruct round waits for is already past it: a beat since the
    round began shows it in a later op of this generation than any asker's last op.
    reconstruct() is collective, so with no failure to regroup for (the caller checks) it can
    only have passed with an "unchanged" that this round's askers never got: a coordinator
    that died while answering them (their requests came again here). They get the same
    answer; waiting would deadlock them against the ranks that wait for them in that op (seen
    in bench.stress.chaos)."""
    seqs = list(r.seqs.values())
    if not seqs or any(q is None for q in seqs):
        return False  # an asker that did not say (an older client)
    top = max(q for q in seqs if q is not None)
    for m in waiting:
        beat = s.beats.get(m)
        if beat is None or beat.at < r.start or beat.report is None:
            continue  # nothing heard from it since the round began
        report = beat.report
        if report.generation == s.generation and report.seq > top:
            out.note(
                f"generation {s.generation}: rank {s.rank_of(m)} is in op "
                f"#{report.seq}, past the reconstruct() that ranks "
                f"{s.ranks_of(list(r.asked))} ask for: it was "
                "answered 'unchanged' already; so are they"
            )
            return True
    return False


def on_rejoin(s: State, out: Outbox, ident: Ident, msg: Rejoin, now: float) -> None:
    """`rejoin {mid, rank, world_size, generation, members, failed, forming, ...}`."""
    mid, gen, rank = msg.mid, msg.report.generation, msg.rank
    members = msg.members
    if len(members) != msg.world_size or not 0 <= rank < len(members) or members[rank] != mid:
        out.send(
            ident,
            Evicted(reason="re-registration whose rank is not its own in the member list it gives"),
        )
        return
    problem = rejoin_out_of_bounds(gen, msg.forming)
    if problem:
        out.send(ident, Evicted(reason=problem))
        return
    fresh = s.members is None and not s.joined
    if fresh or (s.recovering is not None and gen > s.generation):
        _rebuild(s, out, gen, members, now)
    if gen != s.generation:
        problem = (
            f"re-registered with generation {gen}, but the job is at generation {s.generation}"
        )
    elif members != s.members:
        problem = f"re-registered with another member list for generation {gen}"
    elif mid in s.failed:
        problem = s.failed[mid]
    if problem:
        out.send(ident, Evicted(reason=problem))
        return
    s.beats[mid] = Beat(ident, now, msg.report)
    if msg.host:  # where it runs: slow links are kept by host (hostlinks.py)
        s.failslow.hosts[mid] = msg.host
    # Not restarted (nothing to rebuild): a connection that came back. The coordinator knows
    # the attempts and the failures better than the member: it only acknowledges.
    restarted = s.recovering is not None
    if restarted and msg.forming > s.generation:
        s.tried = max(s.tried, msg.forming)
        s.lost_forming = s.lost_forming | {msg.forming}
        s.dissolved = True
    if msg.sched:  # a schedule it holds undecided (group/schedbook.py)
        slowlinks.feed(s, out, slowlinks.BookBack(mid, list(msg.sched), restarted), now)
    if s.recovering is not None:
        s.recovering.discard(mid)
    out.send(ident, Rejoined(generation=gen))
    gone = [m for m in s.failed if m != mid]
    if gone:  # a notice it may have missed while its connection was down: again
        out.send(ident, failure_notice(s, gone, s.failed[gone[0]]))
    failed = [r for r in msg.failed if 0 <= r < len(members) and r != rank]
    if failed and restarted:
        declare(
            s,
            out,
            [members[r] for r in failed],
            f"reported failed by rank {rank} while the coordinator was away",
        )
    end_recovery(s, out)


def _rebuild(s: State, out: Outbox, gen: int, members: list[Mid], now: float) -> None:
    """The first re-registration after a restart: its generation, installed as it is."""
    install_generation(s, out, gen, members, now)
    s.joined = {r: Joined(b"", m, Info()) for r, m in enumerate(members)}
    s.recovering = set(members)
    out.note(
        f"restarted: rebuilding generation {gen} ({len(members)} ranks) from the "
        "members' re-registrations"
    )


def end_recovery(s: State, out: Outbox) -> None:
    if s.recovering is None:
        return
    s.recovering -= set(s.failed)
    if not s.recovering:
        s.recovering = None
        out.note(
            f"generation {s.generation} rebuilt: "
            f"{len(s.live())} of {len(s.members or ())} ranks back"
        )


def forgive_pause(s: State, out: Outbox, now: float) -> None:
    """A coordinator that did not run for a while (SIGSTOP, a busy host) took no beats
    meanwhile, and may hold a backlog of them: that silence is its own. Every member's
    heartbeat clock moves on by the pause, so that nobody is declared dead for it."""
    last, s.last_tick = s.last_tick, now
    pause = 0.0 if last is None else now - last
    if pause > s.heartbeat_timeout / 4:
        for beat in s.beats.values():
            beat.at += pause
        out.note(f"did not run for {pause:.1f} s: the members' heartbeat clocks move on by as much")


def stranger(s: State, msg: AnyRequest) -> bool:
    """A member's request that this restarted coordinator cannot place yet: dropped (its
    sender re-registers, then sends it again)."""
    if not isinstance(msg, MEMBER_REQUESTS):
        return False
    if isinstance(msg, (BeatMsg, StateMsg, Progress, Diagnose, Outcome)) and (
        msg.report.generation < 0
    ):
        return False  # a joiner's beat (generation -1) is always taken
    if s.members is None:
        return not s.joined
    return s.recovering is not None and msg.mid not in s.members


def lost_address(s: State, out: Outbox, ident: Ident, msg: Address) -> bool:
    """An address for a generation that was forming when the coordinator died."""
    if msg.generation not in s.lost_forming or s.forming_has(msg.mid):
        return False
    out.send(
        ident,
        Unformed(
            generation=msg.generation,
            from_generation=s.generation,
            failed_ranks=[],
            reason=f"the coordinator restarted while generation {msg.generation} formed",
        ),
    )
    return True
