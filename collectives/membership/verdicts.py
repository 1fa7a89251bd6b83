"""The coordinator's judgements on a stalled or half-finished op: whom a stall blames (the
diagnosis, the same verdict for every rank that asks) and whether an op that failed while
some ranks held its result counts on every survivor or on none (diagnose.py says how). A part
of Coordinator (server.py), kept apart so that the server file holds the loop and membership.
"""

from __future__ import annotations

import logging
import time

from . import diagnose, probing, tables
from .protocol import state_of

log = logging.getLogger("collectives")


class Verdicts:
    """Mixed into Coordinator: uses its members, failed, beats, generation, link_history,
    _send, _declare, _live, _rank_of and _note."""

    # --- stall diagnosis -----------------------------------------------------------------------
    def _on_diagnose(self, ident, msg):
        rank = self._rank_of(msg["mid"])
        gen = msg["generation"]
        if rank is None or gen != self.generation:
            self._send(
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
        if key in self.verdicts:
            self._send(ident, self.verdicts[key])
            return
        d = self.diagnoses.get(key)
        if d is None and len(self.diagnoses) >= tables.MAX_PENDING:
            self._send(ident, {"t": "error", "message": "too many diagnoses pending"})
            return
        now = time.monotonic()
        if d is None:
            d = {
                "askers": [],
                "states": {},
                "until": now + self.diagnose_window,
                "first": now,
                "timeout": 0.0,
                "ranks": {},
                "can_probe": {},
            }
            self.diagnoses[key] = d
            for m in self.members:
                hb = self.beats.get(m)
                if m in self.failed:
                    d["states"][self._rank_of(m)] = None
                elif hb and hb[0]:
                    self._send(hb[0], {"t": "ping"})
        if len(d["askers"]) < tables.max_askers(self):
            d["askers"].append(ident)
        d["ranks"][rank] = ident  # the socket its op thread waits on
        d["can_probe"][rank] = bool(msg.get("probe"))
        d["timeout"] = max(d["timeout"], float(msg.get("timeout") or 0.0))
        d["states"][rank] = tables.fit(state_of(msg), len(self.members))

    def _on_probed(self, ident, msg):
        rank = self._rank_of(msg["mid"])
        d = self.diagnoses.get((msg["generation"], msg["seq"]))
        if rank is not None and d is not None:
            probing.take_report(d, rank, msg, len(self.members))

    def _finish_diagnoses(self):
        now = time.monotonic()
        n = len(self.members or [])
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
            if gen != self.generation:
                verdict = {
                    "t": "verdict",
                    "culprits": [],
                    "why": "stale generation",
                    "evicted": False,
                    "seq": seq,
                }
            elif key in self.verdicts:
                verdict = self.verdicts[key]  # the same verdict for every asker
            else:
                j = diagnose.judge(seq, d["states"], n, probes=probes, history=self._link_history())
                if j.needs_probes and probes is None and d["timeout"] > 0:
                    if not probing.ready_to_probe(d, [self._rank_of(m) for m in self._live()], now):
                        continue  # every member's deadline passes soon: wait
                    if probing.start(self, d, seq):
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
            for ident in d["askers"]:
                self._send(ident, verdict)

    def _verdict(self, seq: int, j) -> dict:
        log.debug("coordinator: op #%d of generation %d judged: %r", seq, self.generation, j)
        culprits, why = j.culprits, j.why
        # One event, one error on every rank: culprits this stall removes make it a stall
        # everywhere (PeerTimeout, the notice says so); culprits already removed (dead,
        # left) were announced as a PeerFailure, and the askers raise that too.
        earlier = [r for r in culprits if self.members[r] in self.failed]
        stalled = bool(culprits) and not earlier
        if earlier:
            why = self.failed[self.members[earlier[0]]]
        verdict = {
            "t": "verdict",
            "culprits": culprits,
            "why": why,
            "evicted": True,
            "stall": stalled,
            "seq": seq,
            "evidence": j.evidence,
        }
        self.verdicts[(self.generation, seq)] = verdict
        if stalled:
            for p, r in j.evidence.get("bad", ()):
                for rank in (p, r):
                    mid = self.members[rank]
                    self.link_history[mid] = self.link_history.get(mid, 0) + 1
            self._declare(
                [self.members[r] for r in culprits],
                f"stalled op #{seq}: rank(s) {culprits} {why}",
                op=seq,
            )
        return verdict

    def _link_history(self) -> dict:
        """rank -> bad links earlier stalls found it on, for this generation's members (the
        table is keyed by member id, so it follows a process across generations)."""
        for mid in [m for m in self.link_history if m not in self.members]:
            del self.link_history[mid]
        return {self._rank_of(m): k for m, k in self.link_history.items()}

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
            self._send(
                ident, {"t": "outcome", "seq": seq, "verdict": None, "why": "stale generation"}
            )
            return
        if seq in self.outcomes:
            self._send(ident, {"t": "outcome", "seq": seq, "verdict": self.outcomes[seq]})
            return
        ask = self.outcome_asks.get(seq)
        if ask is None and len(self.outcome_asks) >= tables.MAX_PENDING:
            self._send(ident, {"t": "error", "message": "too many outcomes asked"})
            return
        if ask is None:
            ask = self.outcome_asks[seq] = {
                "askers": [],
                "held": {},
                "until": time.monotonic() + float(msg["timeout"]),
            }
            for m in self._live():
                hb = self.beats.get(m)
                if hb:
                    self._learn(m, hb[2])
                    if hb[0] and m != msg["mid"]:
                        self._send(hb[0], {"t": "ping"})  # fresh states, sooner
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
                self._note(
                    f"generation {self.generation}: op #{seq} "
                    f"{'counts' if verdict == 'commit' else 'is dropped'} on every "
                    "survivor"
                )
            for ident in ask["askers"]:
                self._send(ident, {"t": "outcome", "seq": seq, "verdict": verdict})
