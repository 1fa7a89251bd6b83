"""Generation 0 despite a death before it formed, and warm spares (a part of Coordinator).

Before generation 0 forms, every rank waits in init_process_group for all world_size ranks to
join. A rank that joined and then died (its pidfd, its closed connection, its launcher's
report: liveness.py) would make them all wait for their timeout. Instead its place is given
to a replacement that waits to be admitted (a spare, or the one an elastic launcher starts):
the coordinator answers its join_request with `regroup {generation 0, rank, world_size}`, and
it joins with that rank as if it had been started with it. Where the job accepts fewer ranks
(min_world_size, the launcher's --min-nproc) and every other rank has joined, generation 0
forms at once with the dead rank in it and declares it failed: the others' first operation
raises PeerFailure, and they reconstruct without it (a replacement is admitted there).

Spares (`join_request {spare: true}`; the launcher's --spares) wait like any replacement, but
are admitted only to fill a place: a reconstruct admits them while the new generation is
smaller than the job's world_size, never beyond it, so that a spare never grows the group.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .server import Coordinator


class Formation:
    """Held by the Coordinator (server.py) as `formation`: fills and forms generation 0 from
    its joined and joiners, and says which waiting joiners a reconstruct admits; sends through
    its _send, removes the dead with its _declare."""

    def __init__(self, c: Coordinator, min_world_size: int | None):
        self.c = c
        self.min_world_size = min_world_size  # None: world_size (no generation 0 with a dead rank)
        self.pre_dead: dict[int, str] = {}  # rank -> why, died before generation 0 formed
        self.spares: frozenset = frozenset()  # mids of waiting joiners that are spares

    def lost_before_formation(self, mid: str, why: str):
        """A rank that joined died before generation 0 formed (liveness.py)."""
        c = self.c
        rank = next((r for r, j in c.joined.items() if j[1] == mid), None)
        if rank is None or c.members is not None:
            return
        self.pre_dead = {**self.pre_dead, rank: why}
        c._note(f"rank {rank} ended before generation 0 formed: {why}")
        self.form_or_fill()

    def form_or_fill(self):
        """Generation 0: give dead ranks' places to waiting replacements; form it once every
        place is taken (by a rank that joined, or a dead one where min_world_size allows)."""
        c = self.c
        if c.members is not None:
            return
        dead = self.pre_dead
        for rank in sorted(dead):
            if not c.joiners:
                break
            mid, ident = next(iter(c.joiners.items()))
            del c.joiners[mid]
            self.spares = self.spares - {mid}
            del dead[rank], c.joined[rank]
            c._send(
                ident,
                {"t": "regroup", "generation": 0, "rank": rank, "world_size": c.world_size},
            )
            c._note(
                f"a replacement worker takes the place of rank {rank} before generation 0 formed"
            )
        least = c.world_size if self.min_world_size is None else self.min_world_size
        if len(c.joined) == c.world_size and len(c.joined) - len(dead) >= least:
            self._form_generation_0()
            if dead:
                mids = [c.joined[r][1] for r in sorted(dead)]
                c._declare(
                    mids,
                    "; ".join(f"rank {r} {dead[r]}" for r in sorted(dead))
                    + " (before generation 0 formed; it formed without it)",
                )
                self.pre_dead = {}

    def _form_generation_0(self):
        c = self.c
        c.members = [c.joined[r][1] for r in range(c.world_size)]
        infos = [c.joined[r][2] for r in range(c.world_size)]
        now = time.monotonic()
        for r in range(c.world_size):
            ident_r, mid_r, _ = c.joined[r]
            c.beats.setdefault(mid_r, (b"", now, {}))
            c._send(
                ident_r, {"t": "welcome", "generation": 0, "infos": infos, "members": c.members}
            )
        c._note(f"generation 0 formed with {c.world_size} ranks")

    def wait_as_spare(self, mid: str):
        """A waiting joiner is a spare: admitted only into an empty place."""
        self.spares = self.spares | {mid}

    def admissible(self, old: list) -> list:
        """The waiting joiners a reconstruct admits: every one that is not a spare, and spares
        while the new generation is below the job's world_size. Spares that no longer wait
        (withdrawn, gone quiet) are forgotten first."""
        c = self.c
        self.spares = self.spares & set(c.joiners)
        room = c.world_size - len(old) - len([m for m in c.joiners if m not in self.spares])
        out = []
        for m in c.joiners:
            if m not in self.spares:
                out.append(m)
            elif room > 0:
                out.append(m)
                room -= 1
        return out

    def admitted(self, mids: list):
        """These joiners were admitted: spares no more."""
        self.spares = self.spares - set(mids)
