"""The coordinator's reconstruction round: a barrier of the live members at reconstruct(),
then the next generation formed from the survivors and the admitted joiners (or, when one of
them vanishes first, an 'unformed' answer and another attempt). Held by the Coordinator
(server.py) as `regroup`, so that the server file holds the loop and membership; the wire
messages are listed in protocol.py.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from . import tables

if TYPE_CHECKING:
    from .server import Coordinator

log = logging.getLogger("collectives")


class Regroup:
    """Held by the Coordinator (server.py) as `regroup`: moves its round, forming, members,
    failed, joiners, generation, tried and dissolved on; sends through its _send, removes
    members with its _declare."""

    def __init__(self, c: Coordinator):
        self.c = c

    def on_join_request(self, ident, msg):
        c = self.c
        if c._forming_has(msg["mid"]):
            # a joiner told 'unformed' asks again, but the next attempt already took it: its
            # regroup is on the way
            return
        if msg["mid"] not in c.joiners and not tables.room_for_joiner(c):
            c._send(
                ident,
                {
                    "t": "error",
                    "message": "too many replacement workers wait to be admitted already",
                },
            )
            return
        c.joiners[msg["mid"]] = ident
        if msg.get("spare"):
            c.formation.wait_as_spare(msg["mid"])
        c.beats.setdefault(msg["mid"], (b"", time.monotonic(), {}))
        # its process is watched from here (its pidfd, on this host): a joiner killed before
        # its first beat has no heartbeat connection to witness its death
        c.liveness.learn(msg["mid"], {"proc": msg.get("proc")})
        c._note(
            f"a {'spare' if msg.get('spare') else 'replacement'} worker waits to join "
            f"(pid {msg.get('pid')})"
        )
        c.formation.form_or_fill()  # before generation 0: the place of a rank that died

    def on_reconstruct(self, ident, msg):
        c = self.c
        mid = msg["mid"]
        if c.members is None or mid not in c.members or mid in c.failed:
            reason = c.failed.get(mid, f"not a member of generation {c.generation}")
            c._send(ident, {"t": "evicted", "reason": reason})
            return
        if msg["generation"] != c.generation:
            c._send(
                ident,
                {
                    "t": "error",
                    "message": f"reconstruct from generation {msg['generation']}, but the group "
                    f"is at generation {c.generation}",
                },
            )
            return
        if c.round is None:
            c.round = {
                "asked": {},
                "seqs": {},
                "timeout": float(msg["timeout"]),
                "start": time.monotonic(),
                "deadline": time.monotonic() + float(msg["timeout"]),
            }
        c.round["asked"][mid] = ident
        c.round["seqs"][mid] = msg.get("seq")

    def check_round(self):
        c = self.c
        r = c.round
        if r is None or c.forming is not None:
            if c.forming is not None:
                self._check_forming()
            return
        live = c._live()
        waiting = [m for m in live if m not in r["asked"]]
        if waiting and not c.failed and not c.dissolved and c.recovery.passed_already(r, waiting):
            c.round = None
            for ident in r["asked"].values():
                c._send(ident, {"t": "unchanged", "generation": c.generation})
            return
        if waiting and time.monotonic() < r["deadline"]:
            return
        c.round = None
        if waiting:
            ranks = sorted(c._rank_of(m) for m in waiting)
            if 2 * len([m for m in live if m in r["asked"]]) < len(live):
                # A minority must not expel a majority that is busy elsewhere (e.g. in an op):
                # the askers are told instead, and nobody is removed.
                for ident in r["asked"].values():
                    c._send(
                        ident,
                        {
                            "t": "error",
                            "message": f"rank(s) {ranks} did not call reconstruct() within the "
                            "deadline (are all ranks calling the same collectives?)",
                        },
                    )
                return
            c._declare(waiting, "did not call reconstruct() before the deadline")
        asked = {m: i for m, i in r["asked"].items() if m in c._live()}
        old = [m for m in c.members if m in asked]
        admit = c.formation.admissible(old)  # spares only into empty places
        if not c.failed and not admit and not c.dissolved:
            for ident in asked.values():
                c._send(ident, {"t": "unchanged", "generation": c.generation})
            return
        new_members = old + admit
        idents = dict(asked)
        idents.update({m: c.joiners.pop(m) for m in admit})
        c.formation.admitted(admit)
        # A fresh number for every attempt: an address sent for an attempt that failed
        # can never be taken for the next one.
        gen = c.tried = max(c.tried, c.generation) + 1
        c.forming = {
            "generation": gen,
            "members": new_members,
            "idents": idents,
            "infos": {},
            "gone": set(),
            "deadline": time.monotonic() + r["timeout"],
        }
        for rank, m in enumerate(new_members):
            c._send(
                idents[m],
                {"t": "regroup", "generation": gen, "rank": rank, "world_size": len(new_members)},
            )

    def on_address(self, ident, msg):
        c = self.c
        if c.recovery.lost_address(ident, msg):
            return
        f = c.forming
        gen = msg["generation"]
        if f is None or gen != f["generation"] or msg["mid"] not in f["members"]:
            if c.generation < gen <= c.tried:
                # for an attempt that failed: its sender has been told so ('unformed')
                log.debug("coordinator: dropped an address for failed generation %d", gen)
                return
            c._send(ident, {"t": "error", "message": "address for a generation not forming"})
            return
        f["infos"][msg["mid"]] = msg["info"]
        c.liveness.learn(msg["mid"], msg["info"])
        f["idents"][msg["mid"]] = ident
        self._check_forming()

    def _vanished(self, f) -> dict:
        """Forming members that cannot be part of it, each with why: removed from the old
        generation meanwhile (heartbeat timeout, leave), a joiner that left or went quiet,
        or one whose address is still missing at the deadline. Heartbeats, not only the
        deadline (the reconstruct timeout, 30 s by default): the members wait for this."""
        c = self.c
        now = time.monotonic()
        why = {}
        for m in f["members"]:
            quiet = now - c.beats.get(m, (b"", now, {}))[1]
            if m in f["gone"]:
                why[m] = f.get("why", {}).get(m, "left")  # liveness.py says how
            elif m in c.failed:
                why[m] = c.failed[m]
            elif quiet > c.heartbeat_timeout:
                why[m] = f"sent no heartbeat for {quiet:.1f} s"
            elif m not in f["infos"] and now >= f["deadline"]:
                why[m] = "sent no address before the deadline"
        return why

    def _unform(self, f, vanished: dict):
        """Give up generation f: tell every member of it that is still there ('unformed'; an
        old member's retry of reconstruct() then forms a new generation, see `dissolved`),
        requeue its joiners for that attempt, and evict the old members that vanished."""
        c = self.c
        gen = f["generation"]
        lost = [m for m in f["members"] if m in vanished]
        failed_ranks = sorted(c._rank_of(m) for m in lost if m in c.members)
        reason = f"generation {gen} did not form: " + "; ".join(
            f"new rank {f['members'].index(m)} "
            f"({'old rank %d' % c._rank_of(m) if m in c.members else 'a joiner'}) "
            f"{vanished[m]}"
            for m in lost
        )
        c._declare([m for m in lost if m in c.members], reason)
        requeued = {}
        for m in f["members"]:
            if m in vanished and m in c.members:
                # removed: if it is only slow, its wait for the welcome ends now
                c._send(f["idents"][m], {"t": "evicted", "reason": reason})
                continue
            c._send(
                f["idents"][m],
                {
                    "t": "unformed",
                    "generation": gen,
                    "from_generation": c.generation,
                    "failed_ranks": failed_ranks,
                    "reason": reason,
                },
            )
            if m not in c.members and m not in vanished:
                requeued[m] = f["idents"][m]
        c.joiners = {**requeued, **c.joiners}  # first in line, in their order
        c.forming = None
        c.dissolved = True
        c._note(reason)

    def _check_forming(self):
        c = self.c
        f = c.forming
        vanished = self._vanished(f)
        if vanished:
            self._unform(f, vanished)
            return
        if len(f["infos"]) < len(f["members"]):
            return
        old_size = len(c.members)
        c.generation = f["generation"]
        c.members = f["members"]
        c.failed = {}
        c.verdicts.forget_outcomes()
        c.dissolved = False
        infos = [f["infos"][m] for m in c.members]
        now = time.monotonic()
        for m in c.members:
            hb = c.beats.get(m, (b"", now, {}))
            c.beats[m] = (hb[0], now, hb[2])  # a fresh start for the timeout clock
            c._send(
                f["idents"][m],
                {
                    "t": "welcome",
                    "generation": c.generation,
                    "infos": infos,
                    "members": c.members,
                },
            )
        c.forming = None
        c._note(f"generation {c.generation} formed: {old_size} -> {len(c.members)} ranks")
