"""The coordinator's reconstruction round: a barrier of the live members at reconstruct(),
then the next generation formed from the survivors and the admitted joiners (or, when one of
them vanishes first, an 'unformed' answer and another attempt). A part of Coordinator
(server.py), kept apart so that the server file holds the loop and membership; the wire
messages are listed in protocol.py.
"""

from __future__ import annotations

import logging
import time

from . import tables

log = logging.getLogger("collectives")


class Regroup:
    """Mixed into Coordinator: uses its members, failed, joiners, round, forming, beats,
    generation, _send, _declare, _live, _rank_of and _note."""

    def _on_join_request(self, ident, msg):
        if self._forming_has(msg["mid"]):
            # a joiner told 'unformed' asks again, but the next attempt already took it: its
            # regroup is on the way
            return
        if msg["mid"] not in self.joiners and not tables.room_for_joiner(self):
            self._send(
                ident,
                {
                    "t": "error",
                    "message": "too many replacement workers wait to be admitted already",
                },
            )
            return
        self.joiners[msg["mid"]] = ident
        if msg.get("spare"):
            self.spares = self.spares | {msg["mid"]}
        self.beats.setdefault(msg["mid"], (b"", time.monotonic(), {}))
        self._note(
            f"a {'spare' if msg.get('spare') else 'replacement'} worker waits to join "
            f"(pid {msg.get('pid')})"
        )
        self._form_or_fill()  # before generation 0: the place of a rank that died

    def _on_reconstruct(self, ident, msg):
        mid = msg["mid"]
        if self.members is None or mid not in self.members or mid in self.failed:
            reason = self.failed.get(mid, f"not a member of generation {self.generation}")
            self._send(ident, {"t": "evicted", "reason": reason})
            return
        if msg["generation"] != self.generation:
            self._send(
                ident,
                {
                    "t": "error",
                    "message": f"reconstruct from generation {msg['generation']}, but the group "
                    f"is at generation {self.generation}",
                },
            )
            return
        if self.round is None:
            self.round = {
                "asked": {},
                "seqs": {},
                "timeout": float(msg["timeout"]),
                "start": time.monotonic(),
                "deadline": time.monotonic() + float(msg["timeout"]),
            }
        self.round["asked"][mid] = ident
        self.round["seqs"][mid] = msg.get("seq")

    def _check_round(self):
        r = self.round
        if r is None or self.forming is not None:
            if self.forming is not None:
                self._check_forming()
            return
        live = self._live()
        waiting = [m for m in live if m not in r["asked"]]
        if waiting and not self.failed and not self.dissolved and self._passed_already(r, waiting):
            self.round = None
            for ident in r["asked"].values():
                self._send(ident, {"t": "unchanged", "generation": self.generation})
            return
        if waiting and time.monotonic() < r["deadline"]:
            return
        self.round = None
        if waiting:
            ranks = sorted(self._rank_of(m) for m in waiting)
            if 2 * len([m for m in live if m in r["asked"]]) < len(live):
                # A minority must not expel a majority that is busy elsewhere (e.g. in an op):
                # the askers are told instead, and nobody is removed.
                for ident in r["asked"].values():
                    self._send(
                        ident,
                        {
                            "t": "error",
                            "message": f"rank(s) {ranks} did not call reconstruct() within the "
                            "deadline (are all ranks calling the same collectives?)",
                        },
                    )
                return
            self._declare(waiting, "did not call reconstruct() before the deadline")
        asked = {m: i for m, i in r["asked"].items() if m in self._live()}
        old = [m for m in self.members if m in asked]
        self.spares = self.spares & set(self.joiners)
        admit = self._admissible(old)  # spares only into empty places (formation.py)
        if not self.failed and not admit and not self.dissolved:
            for ident in asked.values():
                self._send(ident, {"t": "unchanged", "generation": self.generation})
            return
        new_members = old + admit
        idents = dict(asked)
        idents.update({m: self.joiners.pop(m) for m in admit})
        self.spares = self.spares - set(admit)
        # A fresh number for every attempt: an address sent for an attempt that failed
        # can never be taken for the next one.
        gen = self.tried = max(self.tried, self.generation) + 1
        self.forming = {
            "generation": gen,
            "members": new_members,
            "idents": idents,
            "infos": {},
            "gone": set(),
            "deadline": time.monotonic() + r["timeout"],
        }
        for rank, m in enumerate(new_members):
            self._send(
                idents[m],
                {"t": "regroup", "generation": gen, "rank": rank, "world_size": len(new_members)},
            )

    def _forming_has(self, mid):
        return self.forming is not None and mid in self.forming["members"]

    def _on_address(self, ident, msg):
        if self._lost_address(ident, msg):
            return
        f = self.forming
        gen = msg["generation"]
        if f is None or gen != f["generation"] or msg["mid"] not in f["members"]:
            if self.generation < gen <= self.tried:
                # for an attempt that failed: its sender has been told so ('unformed')
                log.debug("coordinator: dropped an address for failed generation %d", gen)
                return
            self._send(ident, {"t": "error", "message": "address for a generation not forming"})
            return
        f["infos"][msg["mid"]] = msg["info"]
        self.liveness.learn(msg["mid"], msg["info"])
        f["idents"][msg["mid"]] = ident
        self._check_forming()

    def _vanished(self, f) -> dict:
        """Forming members that cannot be part of it, each with why: removed from the old
        generation meanwhile (heartbeat timeout, leave), a joiner that left or went quiet,
        or one whose address is still missing at the deadline. Heartbeats, not only the
        deadline (the reconstruct timeout, 30 s by default): the members wait for this."""
        now = time.monotonic()
        why = {}
        for m in f["members"]:
            quiet = now - self.beats.get(m, (b"", now, {}))[1]
            if m in f["gone"]:
                why[m] = f.get("why", {}).get(m, "left")  # liveness.py says how
            elif m in self.failed:
                why[m] = self.failed[m]
            elif quiet > self.heartbeat_timeout:
                why[m] = f"sent no heartbeat for {quiet:.1f} s"
            elif m not in f["infos"] and now >= f["deadline"]:
                why[m] = "sent no address before the deadline"
        return why

    def _unform(self, f, vanished: dict):
        """Give up generation f: tell every member of it that is still there ('unformed'; an
        old member's retry of reconstruct() then forms a new generation, see `dissolved`),
        requeue its joiners for that attempt, and evict the old members that vanished."""
        gen = f["generation"]
        lost = [m for m in f["members"] if m in vanished]
        failed_ranks = sorted(self._rank_of(m) for m in lost if m in self.members)
        reason = f"generation {gen} did not form: " + "; ".join(
            f"new rank {f['members'].index(m)} "
            f"({'old rank %d' % self._rank_of(m) if m in self.members else 'a joiner'}) "
            f"{vanished[m]}"
            for m in lost
        )
        self._declare([m for m in lost if m in self.members], reason)
        requeued = {}
        for m in f["members"]:
            if m in vanished and m in self.members:
                # removed: if it is only slow, its wait for the welcome ends now
                self._send(f["idents"][m], {"t": "evicted", "reason": reason})
                continue
            self._send(
                f["idents"][m],
                {
                    "t": "unformed",
                    "generation": gen,
                    "from_generation": self.generation,
                    "failed_ranks": failed_ranks,
                    "reason": reason,
                },
            )
            if m not in self.members and m not in vanished:
                requeued[m] = f["idents"][m]
        self.joiners = {**requeued, **self.joiners}  # first in line, in their order
        self.forming = None
        self.dissolved = True
        self._note(reason)

    def _check_forming(self):
        f = self.forming
        vanished = self._vanished(f)
        if vanished:
            self._unform(f, vanished)
            return
        if len(f["infos"]) < len(f["members"]):
            return
        old_size = len(self.members)
        self.generation = f["generation"]
        self.members = f["members"]
        self.failed = {}
        self.outcome_asks, self.outcomes = {}, {}
        self.dissolved = False
        infos = [f["infos"][m] for m in self.members]
        now = time.monotonic()
        for m in self.members:
            hb = self.beats.get(m, (b"", now, {}))
            self.beats[m] = (hb[0], now, hb[2])  # a fresh start for the timeout clock
            self._send(
                f["idents"][m],
                {
                    "t": "welcome",
                    "generation": self.generation,
                    "infos": infos,
                    "members": self.members,
                },
            )
        self.forming = None
        self._note(f"generation {self.generation} formed: {old_size} -> {len(self.members)} ranks")
