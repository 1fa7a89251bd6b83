"""Who is to blame when an operation stalls? A pure function over a snapshot of the group.

Each rank reports (last op sequence it entered, whether it is inside an op, whom it waits on).
Given the op `seq` that timed out:
  1. ranks that did not answer at all (dead, stopped) are to blame;
  2. else ranks that never entered op `seq` (still computing, or calling something else);
  3. else every rank is inside the op and someone's messages are not arriving: blame the
     rank(s) that the most waiters wait on (a stalled link points at its sender).
"""
from __future__ import annotations

from collections import Counter


def blame(seq: int, states: dict, world_size: int) -> tuple[list[int], str]:
    """states: rank -> None (no answer) or dict(seq=..., in_op=..., waiting_on=...)."""
    silent = sorted(r for r in range(world_size) if states.get(r) is None)
    if silent:
        return silent, "did not answer (dead or stopped)"
    absent = sorted(r for r, s in states.items() if s["seq"] < seq)
    if absent:
        return absent, f"never entered op #{seq}"
    waited = Counter(s["waiting_on"] for s in states.values()
                     if s["seq"] == seq and s["in_op"] and s["waiting_on"] is not None)
    if waited:
        top = max(waited.values())
        return sorted(r for r, c in waited.items() if c == top), "its messages are not arriving"
    return [], "no rank is waiting"
