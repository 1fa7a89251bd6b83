"""The coordinator's judgements on a stalled or half-finished op: whom a stall blames (the
diagnosis, the same verdict for every rank that asks) and whether an op that failed while
some ranks held its result counts on every survivor or on none (diagnose.py says how). A part
of Coordinator (server.py), kept apart so that the server file holds the loop and membership.
"""
from __future__ import annotations

import logging
import time

from . import diagnose, tables
from .protocol import state_of

log = logging.getLogger("collectives")


class Verdicts:
    """Mixed into Coordinator: uses its members, failed, beats, generation, _send, _declare,
    _live, _rank_of and _note."""

    # --- stall diagnosis -----------------------------------------------------------------------
    def _on_diagnose(self, ident, msg):
        rank = self._rank_of(msg["mid"])
        gen = msg["generation"]
        if rank is None or gen != self.generation:
            self._send(ident, {"t": "verdict", "culprits": [], "why": "stale generation",
                               "evicted": False, "seq": msg["seq"]})
            return
        key = (gen, msg["seq"])
        if key in self.verdicts:
            self._send(ident, self.verdicts[key])
            return
        d = self.diagnoses.get(key)
        if d is None and len(self.diagnoses) >= tables.MAX_PENDING:
            self._send(ident, {"t": "error", "message": "too many diagnoses pending"})
            return
        if d is None:
            d = {"askers": [], "states": {}, "until": time.monotonic() + self.diagnose_window}
            self.diagnoses[key] = d
            for m in self.members:
                hb = self.beats.get(m)
                if m in self.failed:
                    d["states"][self._rank_of(m)] = None
                elif hb and hb[0]:
                    self._send(hb[0], {"t": "ping"})
        if len(d["askers"]) < tables.max_askers(self):
            d["askers"].append(ident)
        d["states"][rank] = tables.fit(state_of(msg), len(self.members))

    def _finish_diagnoses(self):
        now = time.monotonic()
        n = len(self.members or [])
        for key in [k for k, d in self.diagnoses.items()
                    if now >= d["until"] or len(d["states"]) == n]:
            d = self.diagnoses.pop(key)
            gen, seq = key
            if gen != self.generation:
                verdict = {"t": "verdict", "culprits": [], "why": "stale generation",
                           "evicted": False, "seq": seq}
            elif key in self.verdicts:
                verdict = self.verdicts[key]     # the same verdict for every asker
            else:
                log.debug("coordinator: diagnosing op #%d of generation %d from %r", seq, gen,
                          d["states"])
                culprits, why = diagnose.blame(seq, d["states"], n)
                # One event, one error on every rank: culprits this stall removes make it a
                # stall everywhere (PeerTimeout, the notice says so); culprits already removed
                # (dead, left) were announced as a PeerFailure, and the askers raise that too.
                earlier = [r for r in culprits if self.members[r] in self.failed]
                stalled = bool(culprits) and not earlier
                if earlier:
                    why = self.failed[self.members[earlier[0]]]
                verdict = {"t": "verdict", "culprits": culprits, "why": why, "evicted": True,
                           "stall": stalled, "seq": seq}
                self.verdicts[key] = verdict
                if stalled:
                    self._declare([self.members[r] for r in culprits],
                                  f"stalled op #{seq}: rank(s) {culprits} {why}", op=seq)
            for ident in d["askers"]:
                self._send(ident, verdict)

    # --- the outcome of an op that failed while some held its result ---------------------------
    def _learn(self, mid, state):
        """What a member's report says of the ops whose outcome is asked. Facts only ever
        accumulate (an older report, arriving late over another socket, adds nothing false)."""
        if not self.outcome_asks or state.get("generation") != self.generation:
            return
        rank = self._rank_of(mid)
        if rank is None:
            return
        for seq, ask in self.outcome_asks.items():
            if rank not in ask["held"]:
                held = diagnose.holds_result(seq, state)
                if held is not None:
                    ask["held"][rank] = held

    def _on_progress(self, ident, msg):
        self._learn(msg["mid"], msg)

    def _on_outcome(self, ident, msg):
        rank = self._rank_of(msg["mid"])
        seq = int(msg["seq"])
        if rank is None or msg["generation"] != self.generation:
            self._send(ident, {"t": "outcome", "seq": seq, "verdict": None,
                               "why": "stale generation"})
            return
        if seq in self.outcomes:
            self._send(ident, {"t": "outcome", "seq": seq, "verdict": self.outcomes[seq]})
            return
        ask = self.outcome_asks.get(seq)
        if ask is None and len(self.outcome_asks) >= tables.MAX_PENDING:
            self._send(ident, {"t": "error", "message": "too many outcomes asked"})
            return
        if ask is None:
            ask = self.outcome_asks[seq] = {"askers": [], "held": {},
                                            "until": time.monotonic() + float(msg["timeout"])}
            for m in self._live():
                hb = self.beats.get(m)
                if hb:
                    self._learn(m, hb[2])
                    if hb[0] and m != msg["mid"]:
                        self._send(hb[0], {"t": "ping"})   # fresh states, sooner
        if len(ask["askers"]) < tables.max_askers(self):
            ask["askers"].append(ident)
        self._learn(msg["mid"], msg)

    def _finish_outcomes(self):
        now = time.monotonic()
        for seq in list(self.outcome_asks):
            ask = self.outcome_asks[seq]
            verdict = diagnose.outcome(ask["held"].get(self._rank_of(m)) for m in self._live())
            if verdict is None and now < ask["until"]:
                continue
            del self.outcome_asks[seq]
            if verdict is not None:
                self.outcomes[seq] = verdict
                self._note(f"generation {self.generation}: op #{seq} "
                           f"{'counts' if verdict == 'commit' else 'is dropped'} on every "
                           "survivor")
            for ident in ask["askers"]:
                self._send(ident, {"t": "outcome", "seq": seq, "verdict": verdict})
