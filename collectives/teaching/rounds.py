"""Counting a trace's rounds and its depth (invariants.py checks both against theory).

* port_rounds: the single-port model of docs/proofs.md and emulate.py, with alpha = 1 and
  beta = 0: each rank sends one message at a time and its port takes one at a time, each for a
  round. What the alpha term of an algorithm's cost counts.
* assign_depth: the depth, the longest chain of messages each sent after the previous one
  arrived: what a model with unlimited ports would call rounds (naive 2, direct 1). Not a
  count of rounds: the single-port model prices naive at 2(n-1) rounds, direct at 2n-3.

Both read only each rank's program order (the events' "i"), never the threads' timing, so they
give the same numbers on every run.
"""

from __future__ import annotations

from .trace import match_messages

__all__ = ["assign_depth", "port_rounds"]


def _per_rank_order(events: list) -> dict:
    per_rank: dict = {}
    for e in events:
        per_rank.setdefault((e["opkey"], e["rank"]), []).append(e)
    for evs in per_rank.values():
        evs.sort(key=lambda e: e["i"])
    return per_rank


def port_rounds(events: list) -> int:
    """The trace's time in the single-port model (emulate.LinkModel with alpha = 1, beta = 0):
    a send takes its rank's next round; a message arrives in the round after both its send
    and its receiver's previous receive; a receive waits for its message. Gives every event
    a "slot" (the round by whose end its rank has done it: non-decreasing in each rank's
    program order), every receive an "arrival" (the round its port took the message in: at
    most one a round per rank), and returns the last slot.

    Like assign_depth it reads only each rank's program order, so it is the same every run.
    """
    pairs = match_messages(events)
    per_rank = _per_rank_order(events)
    clock = {k: 0 for k in per_rank}
    port = {k: 0 for k in per_rank}  # when this rank's receiving port is next free
    cursor = {k: 0 for k in per_rank}
    remaining = sum(len(v) for v in per_rank.values())
    total = 0
    while remaining:
        progressed = False
        for k, evs in per_rank.items():
            while cursor[k] < len(evs):
                e = evs[cursor[k]]
                if e["kind"] == "send":
                    clock[k] += 1
                    e["slot"] = clock[k]
                else:
                    s = pairs[(e["opkey"], e["src"], e["dst"], e["msg"])].get("send")
                    if s is None or "slot" not in s:
                        break
                    port[k] = max(s["slot"], port[k] + 1)
                    clock[k] = max(clock[k], port[k])
                    e["arrival"] = port[k]  # the round its port takes it in
                    e["slot"] = clock[k]  # when this rank has it: never before its last send
                total = max(total, e["slot"])
                cursor[k] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ValueError("trace: receives wait on each other; the trace is incomplete")
    return total


def assign_depth(events: list) -> int:
    """Give every event its "depth" and return the trace's depth (the deepest message's).

    A message's depth is 1 + the highest depth among the messages its sender had received
    (in this operation) before sending it; a receive has its message's depth. Program order on
    each rank fixes this, so it is the same on every run whatever the thread timing.
    """
    pairs = match_messages(events)
    per_rank = _per_rank_order(events)
    cursor = {k: 0 for k in per_rank}
    seen = {k: 0 for k in per_rank}  # highest depth received so far on that rank
    # Walk all ranks together; a receive can be resolved once its send has a depth. Every
    # message is sent before it is received, so this always makes progress.
    remaining = sum(len(v) for v in per_rank.values())
    total = 0
    while remaining:
        progressed = False
        for k, evs in per_rank.items():
            while cursor[k] < len(evs):
                e = evs[cursor[k]]
                if e["kind"] == "send":
                    e["depth"] = seen[k] + 1
                else:
                    s = pairs[(e["opkey"], e["src"], e["dst"], e["msg"])].get("send")
                    if s is None:
                        raise ValueError(
                            f"trace: rank {e['rank']} received message #{e['msg']}"
                            f" from rank {e['src']} that was never sent"
                        )
                    if "depth" not in s:
                        break
                    e["depth"] = s["depth"]
                    seen[k] = max(seen[k], e["depth"])
                total = max(total, e["depth"])
                cursor[k] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ValueError("trace: receives wait on each other; the trace is incomplete")
    return total
