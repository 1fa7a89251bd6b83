"""The coordinator's judgements on a stalled or half-finished op: whom a stall blames (the
diagnosis, the same verdict for every rank that asks) and whether an op that failed while
some ranks held its result counts on every survivor or on none (diagnose.py says how). Held by
the Coordinator (server.py) as `verdicts`, so that the server file holds the loop and
membership: the tables of pending and given judgements are kept here.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from . import diagnose, probing, tables
from .protocol import state_of

if TYPE_CHECKING:
    from .server import Coordinator

log = logging.getLogger("collectives")


class Verdicts:
    """The coordinator's diagnoses and outcomes. Reads the coordinator's members, failed,
    beats and generation; sends through its _send and removes culprits with its _declare."""

    def __init__(self, c: Coordinator, diagnose_window: float):
        self.c = c
        self.diagnose_window = diagnose_window  # s: how long a diagnosis gathers states
        self.diagnoses: dict[tuple, dict] = {}  # (generation, seq) -> pending verdict
        self.given: dict[tuple, dict] = {}  # (generation, seq) -> verdict given
        # (generation, seq) -> (generation, earlier seq): a stall of op seq that waits on an
        # earlier op's (some ranks are still inside that one) is judged with it (_merge)
        self.merged: dict[tuple, tuple] = {}
        # member id -> bad links earlier stalls found it on (a tie's first breaker,
        # diagnose.judge); only members are kept (_link_history)
        self.link_history: dict[str, int] = {}
        # Ops of the current generation whose outcome was asked: seq -> {"askers": [ident],
        # "held": {rank: bool}, "until": t}; and the outcomes given (see diagnose.outcome).
        self.outcome_asks: dict[int, dict] = {}
        self.outcomes: dict[int, str] = {}

    # --- stall diagnosis -----------------------------------------------------------------------
    def on_diagnose(self, ident, msg):
        c = self.c
        rank = c._rank_of(msg["mid"])
        gen = msg["generation"]
        if rank is None or gen != c.generation:
            c._send(
                ident,
                {
                    "t": "verdict",
                    "culprits": [],
                    "why": "stale generation",
                    "evicted": False,
                    "seq": msg["seq"],
                },
            )
            return
        key = (gen, msg["seq"])
        key = self.merged.get(key, key)
        if key in self.given:
            c._send(ident, dict(self.given[key], seq=msg["seq"]))
            return
        d = self.diagnoses.get(key)
        if d is None and len(self.diagnoses) >= tables.MAX_PENDING:
            c._send(ident, {"t": "error", "message": "too many diagnoses pending"})
            return
        now = time.monotonic()
        if d is None:
            d = self._pending(now)
            self.diagnoses[key] = d
            for m in c.members:
                hb = c.beats.get(m)
                if m in c.failed:
                    d["states"][c._rank_of(m)] = None
                elif hb and hb[0]:
                    c._send(hb[0], {"t": "ping"})
        if len(d["askers"]) < tables.max_askers(c):
            d["askers"].append((ident, msg["seq"]))
        d["ranks"][rank] = ident  # the socket its op thread waits on
        d["asked"][rank] = msg["seq"]  # the op it asked about: what its messages name
        d["can_probe"][rank] = bool(msg.get("probe"))
        d["timeout"] = max(d["timeout"], float(msg.get("timeout") or 0.0))
        d["states"][rank] = tables.fit(state_of(msg), len(c.members))

    def _pending(self, now: float) -> dict:
        return {
            "askers": [],  # (socket, the op it asked about)
            "states": {},
            "until": now + self.diagnose_window,
            "first": now,
            "timeout": 0.0,
            "ranks": {},
            "asked": {},
            "can_probe": {},
        }

    def _merge(self, key: tuple, d: dict, earlier: int):
        """Op key[1]'s stall waits on op `earlier`'s: its askers join that op's diagnosis
        (created if none of the ranks inside it has asked yet), so that they take part in its
        probes and get its verdict -- one event, judged once, with every rank's links."""
        gen = key[0]
        into = self.diagnoses.get((gen, earlier))
        if into is None:
            into = self.diagnoses[(gen, earlier)] = self._pending(d["first"])
            into["until"] = d["until"]
        for r, state in d["states"].items():
            into["states"].setdefault(r, state)
        room = tables.max_askers(self.c) - len(into["askers"])
        into["askers"] += d["askers"][: max(0, room)]
        into["ranks"].update(d["ranks"])
        into["asked"].update(d["asked"])
        into["can_probe"].update(d["can_probe"])
        into["timeout"] = max(into["timeout"], d["timeout"])
        into["first"] = min(into["first"], d["first"])
        self.merged[key] = (gen, earlier)  # bounded with `given` (tables.py)
        del self.diagnoses[key]

    def take_state(self, rank: int, msg):
        """A member's answer to a ping (`state`): its progress, for the stalls of its
        generation under diagnosis."""
        for (gen, _), d in self.diagnoses.items():
            if gen == msg.get("generation"):
                d["states"][rank] = tables.fit(state_of(msg), len(self.c.members))

    def on_probed(self, ident, msg):
        c = self.c
        rank = c._rank_of(msg["mid"])
        key = (msg["generation"], msg["seq"])
        d = self.diagnoses.get(self.merged.get(key, key))
        if rank is not None and d is not None:
            probing.take_report(d, rank, msg, len(c.members))

    def finish_diagnoses(self):
        c = self.c
        now = time.monotonic()
        n = len(c.members or [])
        for key in list(self.diagnoses):
            d = self.diagnoses[key]
            gen, seq = key
            if "probe" in d:
                if not probing.done(d, now):
                    continue
                probes = probing.results(d)
            elif now >= d["until"] or len(d["states"]) == n:
                probes = None
            else:
                continue
            if gen != c.generation:
                verdict = {
                    "t": "verdict",
                    "culprits": [],
                    "why": "stale generation",
                    "evicted": False,
                    "seq": seq,
                }
            elif key in self.given:
                verdict = self.given[key]  # the same verdict for every asker
            else:
                j = diagnose.judge(seq, d["states"], n, probes=probes, history=self._link_history())
                earlier = j.evidence.get("judged_op")
                if earlier is not None and earlier < seq and probes is None:
                    self._merge(key, d, earlier)
                    continue
                if j.needs_probes and probes is None and d["timeout"] > 0:
                    if not probing.ready_to_probe(d, [c._rank_of(m) for m in c._live()], now):
                        continue  # every member's deadline passes soon: wait
                    if probing.start(c, d, seq):
                        log.info(
                            "coordinator: op #%d of generation %d: the stalled links "
                            "tie; probing the links of rank(s) %s",
                            seq,
                            gen,
                            d["probe"]["ranks"],
                        )
                        continue
                verdict = self._verdict(seq, j)
            del self.diagnoses[key]
            for ident, asked in d["askers"]:
                c._send(ident, dict(verdict, seq=asked))
                if asked != seq and verdict.get("evicted"):
                    self.given.setdefault((gen, asked), dict(verdict, seq=asked))

    def _verdict(self, seq: int, j) -> dict:
        c = self.c
        log.debug("coordinator: op #%d of generation %d judged: %r", seq, c.generation, j)
        culprits, why = j.culprits, j.why
        # One event, one error on every rank: culprits this stall removes make it a stall
        # everywhere (PeerTimeout, the notice says so); culprits already removed (dead,
        # left) were announced as a PeerFailure, and the askers raise that too.
        earlier = [r for r in culprits if c.members[r] in c.failed]
        stalled = bool(culprits) and not earlier
        if earlier:
            why = c.failed[c.members[earlier[0]]]
        verdict = {
            "t": "verdict",
            "culprits": culprits,
            "why": why,
            "evicted": True,
            "stall": stalled,
            "seq": seq,
            "evidence": j.evidence,
        }
        self.given[(c.generation, seq)] = verdict
        if stalled:
            for p, r in j.evidence.get("bad", ()):
                for rank in (p, r):
                    mid = c.members[rank]
                    self.link_history[mid] = self.link_history.get(mid, 0) + 1
            c._declare(
                [c.members[r] for r in culprits],
                f"stalled op #{seq}: rank(s) {culprits} {why}",
                op=seq,
            )
        return verdict

    def _link_history(self) -> dict:
        """rank -> bad links earlier stalls found it on, for this generation's members (the
        table is keyed by member id, so it follows a process across generations)."""
        c = self.c
        for mid in [m for m in self.link_history if m not in c.members]:
            del self.link_history[mid]
        return {c._rank_of(m): k for m, k in self.link_history.items()}

    # --- the outcome of an op that failed while some held its result ---------------------------
    def learn(self, mid, state):
        """What a member's report says of the ops whose outcome is asked. Facts only ever
        accumulate (an older report, arriving late over another socket, adds nothing false)."""
        c = self.c
        if not self.outcome_asks or state.get("generation") != c.generation:
            return
        rank = c._rank_of(mid)
        if rank is None:
            return
        for seq, ask in self.outcome_asks.items():
            if rank not in ask["held"]:
                held = diagnose.holds_result(seq, state)
                if held is not None:
                    ask["held"][rank] = held

    def forget_outcomes(self):
        """A new generation formed: the outcomes asked and given were the old one's ops."""
        self.outcome_asks, self.outcomes = {}, {}

    def on_progress(self, ident, msg):
        self.learn(msg["mid"], msg)

    def on_outcome(self, ident, msg):
        c = self.c
        rank = c._rank_of(msg["mid"])
        seq = int(msg["seq"])
        if rank is None or msg["generation"] != c.generation:
            c._send(ident, {"t": "outcome", "seq": seq, "verdict": None, "why": "stale generation"})
            return
        if seq in self.outcomes:
            c._send(ident, {"t": "outcome", "seq": seq, "verdict": self.outcomes[seq]})
            return
        ask = self.outcome_asks.get(seq)
        if ask is None and len(self.outcome_asks) >= tables.MAX_PENDING:
            c._send(ident, {"t": "error", "message": "too many outcomes asked"})
            return
        if ask is None:
            ask = self.outcome_asks[seq] = {
                "askers": [],
                "held": {},
                "until": time.monotonic() + float(msg["timeout"]),
            }
            for m in c._live():
                hb = c.beats.get(m)
                if hb:
                    self.learn(m, hb[2])
                    if hb[0] and m != msg["mid"]:
                        c._send(hb[0], {"t": "ping"})  # fresh states, sooner
        if len(ask["askers"]) < tables.max_askers(c):
            ask["askers"].append(ident)
        self.learn(msg["mid"], msg)

    def finish_outcomes(self):
        c = self.c
        now = time.monotonic()
        for seq in list(self.outcome_asks):
            ask = self.outcome_asks[seq]
            verdict = diagnose.outcome(ask["held"].get(c._rank_of(m)) for m in c._live())
            if verdict is None and now < ask["until"]:
                continue
            del self.outcome_asks[seq]
            if verdict is not None:
                self.outcomes[seq] = verdict
                c._note(
                    f"generation {c.generation}: op #{seq} "
                    f"{'counts' if verdict == 'commit' else 'is dropped'} on every "
                    "survivor"
                )
            for ident in ask["askers"]:
                c._send(ident, {"t": "outcome", "seq": seq, "verdict": verdict})
