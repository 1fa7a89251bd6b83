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


class Formation:
    """Mixed into Coordinator (server.py): uses its joined, joiners, members, world_size,
    _send, _declare, _note."""

    min_world_size: int | None = None  # None: world_size (no generation 0 with a dead rank)
    spares: frozenset = frozenset()  # mids of waiting joiners that are spares

    def _lost_before_formation(self, mid: str, why: str):
        """A rank that joined died before generation 0 formed (liveness.py)."""
        rank = next((r for r, j in self.joined.items() if j[1] == mid), None)
        if rank is None or self.members is not None:
            return
        self.pre_dead = {**getattr(self, "pre_dead", {}), rank: why}
        self._note(f"rank {rank} ended before generation 0 formed: {why}")
        self._form_or_fill()

    def _form_or_fill(self):
        """Generation 0: give dead ranks' places to waiting replacements; form it once every
        place is taken (by a rank that joined, or a dead one where min_world_size allows)."""
        if self.members is not None:
            return
        dead = getattr(self, "pre_dead", {})
        for rank in sorted(dead):
            if not self.joiners:
                break
            mid, ident = next(iter(self.joiners.items()))
            del self.joiners[mid]
            self.spares = self.spares - {mid}
            del dead[rank], self.joined[rank]
            self._send(
                ident,
                {"t": "regroup", "generation": 0, "rank": rank, "world_size": self.world_size},
            )
            self._note(
                f"a replacement worker takes the place of rank {rank} before generation 0 formed"
            )
        least = self.world_size if self.min_world_size is None else self.min_world_size
        if len(self.joined) == self.world_size and len(self.joined) - len(dead) >= least:
            self._form_generation_0()
            if dead:
                mids = [self.joined[r][1] for r in sorted(dead)]
                self._declare(
                    mids,
                    "; ".join(f"rank {r} {dead[r]}" for r in sorted(dead))
                    + " (before generation 0 formed; it formed without it)",
                )
                self.pre_dead = {}

    def _form_generation_0(self):
        self.members = [self.joined[r][1] for r in range(self.world_size)]
        infos = [self.joined[r][2] for r in range(self.world_size)]
        now = time.monotonic()
        for r in range(self.world_size):
            ident_r, mid_r, _ = self.joined[r]
            self.beats.setdefault(mid_r, (b"", now, {}))
            self._send(
                ident_r, {"t": "welcome", "generation": 0, "infos": infos, "members": self.members}
            )
        self._note(f"generation 0 formed with {self.world_size} ranks")

    def _admissible(self, old: list) -> list:
        """The waiting joiners a reconstruct admits: every one that is not a spare, and spares
        while the new generation is below the job's world_size."""
        room = self.world_size - len(old) - len([m for m in self.joiners if m not in self.spares])
        out = []
        for m in self.joiners:
            if m not in self.spares:
                out.append(m)
            elif room > 0:
                out.append(m)
                room -= 1
        return out
