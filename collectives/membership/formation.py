"""Generation 0: the ranks' joins, a death before it formed, and warm spares.

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

from .changes import declare, install_generation
from .protocol import Error, Join, Regroup
from .state import Ident, Joined, Mid, Outbox, State


def on_join(s: State, out: Outbox, ident: Ident, msg: Join, now: float) -> None:
    """`join {rank, world_size, mid, info}`: a rank of generation 0 is there."""
    rank, size, mid, info = msg.rank, msg.world_size, msg.mid, msg.info
    problem = None
    if size != s.world_size:
        problem = (
            f"rank {rank} joined with world_size {size}, but the job has world_size {s.world_size}"
        )
    elif not 0 <= rank < s.world_size:
        problem = f"rank {rank} is out of range for world_size {s.world_size}"
    elif s.members is not None:
        problem = (
            f"rank {rank} joined after the group was formed; a replacement worker "
            "joins with init_process_group(join=True)"
        )
    elif rank in s.joined and s.joined[rank].mid != mid:
        problem = (
            f"rank {rank} joined twice (pids {s.joined[rank].info.pid} and "
            f"{info.pid}): two workers were given the same RANK"
        )
    if problem:
        out.send(ident, Error(message=problem))
        return
    s.joined[rank] = Joined(ident, mid, info)
    out.watch(mid, info.proc)
    form_or_fill(s, out, now)  # once every rank is there


def lost_before_formation(s: State, out: Outbox, mid: Mid, why: str, now: float) -> None:
    """A rank that joined died before generation 0 formed (a witness said so)."""
    rank = next((r for r, j in s.joined.items() if j.mid == mid), None)
    if rank is None or s.members is not None:
        return
    s.pre_dead = {**s.pre_dead, rank: why}
    out.note(f"rank {rank} ended before generation 0 formed: {why}")
    form_or_fill(s, out, now)


def form_or_fill(s: State, out: Outbox, now: float) -> None:
    """Generation 0: give dead ranks' places to waiting replacements; form it once every
    place is taken (by a rank that joined, or a dead one where min_world_size allows)."""
    if s.members is not None:
        return
    dead = dict(s.pre_dead)
    for rank in sorted(dead):
        if not s.joiners:
            break
        mid, ident = next(iter(s.joiners.items()))
        del s.joiners[mid]
        s.spares = s.spares - {mid}
        del dead[rank], s.joined[rank]
        out.send(ident, Regroup(generation=0, rank=rank, world_size=s.world_size))
        out.note(f"a replacement worker takes the place of rank {rank} before generation 0 formed")
    s.pre_dead = dead
    least = s.world_size if s.min_world_size is None else s.min_world_size
    if len(s.joined) == s.world_size and len(s.joined) - len(dead) >= least:
        members = [s.joined[r].mid for r in range(s.world_size)]
        infos = [s.joined[r].info for r in range(s.world_size)]
        idents = {s.joined[r].mid: s.joined[r].ident for r in range(s.world_size)}
        install_generation(s, out, 0, members, now, welcome=(idents, infos))
        out.note(f"generation 0 formed with {s.world_size} ranks")
        if dead:
            declare(
                s,
                out,
                [s.joined[r].mid for r in sorted(dead)],
                "; ".join(f"rank {r} {dead[r]}" for r in sorted(dead))
                + " (before generation 0 formed; it formed without it)",
            )
            s.pre_dead = {}


def admissible(s: State, old: list[Mid]) -> list[Mid]:
    """The waiting joiners a reconstruct admits: every one that is not a spare, and spares
    while the new generation is below the job's world_size. Spares that no longer wait
    (withdrawn, gone quiet) are forgotten first."""
    s.spares = s.spares & frozenset(s.joiners)
    room = s.world_size - len(old) - len([m for m in s.joiners if m not in s.spares])
    chosen = []
    for m in s.joiners:
        if m not in s.spares:
            chosen.append(m)
        elif room > 0:
            chosen.append(m)
            room -= 1
    return chosen
