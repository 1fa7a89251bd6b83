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
    validate.MAX_GENERATION), a forming generation at most MAX_ATTEMPTS past it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .validate import MAX_GENERATION

if TYPE_CHECKING:
    from .server import Coordinator

# Requests that only a member of a formed generation makes: a fresh coordinator that gets one
# before any re-registration was restarted under a running job.
MEMBER_REQUESTS = (
    "reconstruct",
    "diagnose",
    "outcome",
    "address",
    "progress",
    "state",
    "beat",
    "probed",
)
# Attempts to form a generation that may fail in a row (each takes a fresh number); far more
# than a job makes (each waits for a reconstruct() timeout or a vanished member).
MAX_ATTEMPTS = 1 << 16


def rejoin_out_of_bounds(msg) -> str | None:
    """Why a re-registration's generation numbers cannot be a real job's, or None."""
    gen, forming = msg["generation"], msg["forming"]
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


class Recovery:
    """Held by the Coordinator (server.py) as `recovery`: rebuilds its members, beats, failed,
    generation, tried, joined and dissolved from the re-registrations; sends through its
    _send, removes members with its _declare."""

    def __init__(self, c: Coordinator):
        self.c = c
        self.recovering: set | None = None  # members listed but not re-registered yet
        self.lost_forming: set[int] = set()  # generations that were forming when it died
        self._last_tick: float | None = None  # when forgive_pause last ran (monotonic)

    def passed_already(self, r, waiting) -> bool:
        """Whether a member this reconstruct round waits for is already past it: a beat since
        the round began shows it in a later op of this generation than any asker's last op.
        reconstruct() is collective, so with no failure to regroup for (the caller checks) it
        can only have passed with an "unchanged" that this round's askers never got: a
        coordinator that died while answering them (their requests came again here). They get
        the same answer; waiting would deadlock them against the ranks that wait for them in
        that op (seen in bench.stress.chaos)."""
        c = self.c
        seqs = list(r["seqs"].values())
        if not seqs or any(s is None for s in seqs):
            return False  # an asker that did not say (an older client)
        top = max(seqs)
        for m in waiting:
            beat = c.beats.get(m)
            if beat is None or beat[1] < r["start"]:
                continue  # nothing heard from it since the round began
            state = beat[2]
            if state.get("generation") == c.generation and state.get("seq", -1) > top:
                c._note(
                    f"generation {c.generation}: rank {c._rank_of(m)} is in op "
                    f"#{state['seq']}, past the reconstruct() that ranks "
                    f"{sorted(c._rank_of(a) for a in r['asked'])} ask for: it was "
                    "answered 'unchanged' already; so are they"
                )
                return True
        return False

    def on_rejoin(self, ident, msg):
        c = self.c
        mid, gen, rank = msg["mid"], msg["generation"], msg["rank"]
        members = msg["members"]
        if (
            len(members) != msg["world_size"]
            or not 0 <= rank < len(members)
            or members[rank] != mid
        ):
            c._send(
                ident,
                {
                    "t": "evicted",
                    "reason": "re-registration whose rank is not "
                    "its own in the member list it gives",
                },
            )
            return
        problem = rejoin_out_of_bounds(msg)
        if problem:
            c._send(ident, {"t": "evicted", "reason": problem})
            return
        fresh = c.members is None and not c.joined
        if fresh or (self.recovering is not None and gen > c.generation):
            self._install(gen, members)
        if gen != c.generation:
            problem = (
                f"re-registered with generation {gen}, but the job is at generation {c.generation}"
            )
        elif members != c.members:
            problem = f"re-registered with another member list for generation {gen}"
        elif mid in c.failed:
            problem = c.failed[mid]
        if problem:
            c._send(ident, {"t": "evicted", "reason": problem})
            return
        c.beats[mid] = (ident, time.monotonic(), msg)
        # Not restarted (nothing to rebuild): a connection that came back. The coordinator
        # knows the attempts and the failures better than the member: it only acknowledges.
        restarted = self.recovering is not None
        if restarted and msg["forming"] > c.generation:
            c.tried = max(c.tried, msg["forming"])
            self.lost_forming = set(self.lost_forming) | {msg["forming"]}
            c.dissolved = True
        if restarted:
            self.recovering.discard(mid)
        c._send(ident, {"t": "rejoined", "generation": gen})
        gone = [m for m in c.failed if m != mid]
        if gone:  # a notice it may have missed while its connection was down: again
            c._send(
                ident,
                {
                    "t": "failure",
                    "generation": gen,
                    "failed_ranks": sorted(c._rank_of(m) for m in gone),
                    "reason": c.failed[gone[0]],
                    "graceful": False,
                    "op": None,
                },
            )
        failed = [r for r in msg["failed"] if 0 <= r < len(members) and r != rank]
        if failed and restarted:
            c._declare(
                [members[r] for r in failed],
                f"reported failed by rank {rank} while the coordinator was away",
            )
        self.end_recovery()

    def _install(self, gen: int, members: list):
        c = self.c
        now = time.monotonic()
        c.generation = gen
        c.tried = max(c.tried, gen)
        c.members = list(members)
        c.failed = {}
        c.joined = {r: (b"", m, {}) for r, m in enumerate(members)}
        for m in members:
            hb = c.beats.get(m, (b"", now, {}))
            c.beats[m] = (hb[0], now, hb[2])  # a fresh start for the timeout clock
        self.recovering = set(members)
        c._note(
            f"restarted: rebuilding generation {gen} ({len(members)} ranks) from the "
            "members' re-registrations"
        )

    def end_recovery(self):
        c = self.c
        if self.recovering is None:
            return
        self.recovering -= set(c.failed)
        if not self.recovering:
            self.recovering = None
            c._note(
                f"generation {c.generation} rebuilt: "
                f"{len(c._live())} of {len(c.members)} ranks back"
            )

    def forgive_pause(self, now: float):
        """A coordinator that did not run for a while (SIGSTOP, a busy host) took no beats
        meanwhile, and may hold a backlog of them: that silence is its own. Every member's
        heartbeat clock moves on by the pause, so that nobody is declared dead for it."""
        c = self.c
        last, self._last_tick = self._last_tick, now
        pause = 0.0 if last is None else now - last
        if pause > c.heartbeat_timeout / 4:
            for m, (ident, t, state) in list(c.beats.items()):
                c.beats[m] = (ident, t + pause, state)
            c._note(
                f"did not run for {pause:.1f} s: the members' heartbeat clocks move on by as much"
            )

    def stranger(self, msg) -> bool:
        """A member's request that this restarted coordinator cannot place yet: dropped (its
        sender re-registers, then sends it again)."""
        c = self.c
        if msg["t"] not in MEMBER_REQUESTS or msg.get("generation", 0) < 0:
            return False  # a joiner's beat (generation -1) is always taken
        if c.members is None:
            return not c.joined
        return self.recovering is not None and msg["mid"] not in c.members

    def lost_address(self, ident, msg) -> bool:
        """An address for a generation that was forming when the coordinator died."""
        c = self.c
        if msg["generation"] not in self.lost_forming or c._forming_has(msg["mid"]):
            return False
        c._send(
            ident,
            {
                "t": "unformed",
                "generation": msg["generation"],
                "from_generation": c.generation,
                "failed_ranks": [],
                "reason": f"the coordinator restarted while generation {msg['generation']} formed",
            },
        )
        return True
