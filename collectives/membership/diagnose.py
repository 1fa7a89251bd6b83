"""Who is to blame when an operation stalls? A pure function over a snapshot of the group.

Each rank reports the last op sequence it entered (`seq`), whether it is inside it (`in_op`),
whom it waits on (`waiting_on`), and how many messages of that op it has sent to and taken
from each peer (`sent`, `recv`). Given the op `seq` that passed its deadline:

  1. ranks that did not answer at all (dead, stopped) are to blame;
  2. else ranks that never entered op `seq` (still computing, or calling something else);
  3. else stalled links: rank r waits on p although p has sent r more messages than r has
     received (or p already finished the op). A rank on several stalled links is the common
     cause (two slowed links through rank 1 point at rank 1). On a tie the highest rank is
     blamed, so that rank 0, which may host the coordinator, survives;
  4. else the ends of the wait-for chains: ranks inside the op that others wait on and that
     wait on nobody themselves (stuck in compute inside the op); in a pure wait cycle, the
     highest of the ranks most waited on.
"""
from __future__ import annotations

from collections import Counter

from ..transport.base import COMPLETED, LACKED, ABANDONED  # noqa: F401  (how an op ended)


def stalled_links(seq: int, states: dict) -> list[tuple[int, int]]:
    links = []
    for r, s in states.items():
        p = s.get("waiting_on")
        if p is None or s["seq"] != seq or not s["in_op"] or p not in states:
            continue
        ps = states[p]
        if ps["seq"] > seq or (ps["seq"] == seq and not ps["in_op"]):
            links.append((p, r))          # p finished op seq: everything it sent is in flight
            continue
        sent, got = ps.get("sent"), s.get("recv")
        if ps["seq"] == seq and sent and got and r < len(sent) and p < len(got) \
                and sent[r] > got[p]:
            links.append((p, r))
    return sorted(links)


def blame(seq: int, states: dict, world_size: int) -> tuple[list[int], str]:
    """states: rank -> None (no answer) or dict(seq, in_op, waiting_on[, sent, recv])."""
    silent = sorted(r for r in range(world_size) if states.get(r) is None)
    if silent:
        return silent, "did not answer (dead or stopped)"
    absent = sorted(r for r, s in states.items() if s["seq"] < seq)
    if absent:
        return absent, f"never entered op #{seq}"
    links = stalled_links(seq, states)
    if links:
        count = Counter(r for link in links for r in link)
        top = max(count.values())
        tied = sorted(r for r, c in count.items() if c == top)
        named = ", ".join(f"{p}->{r}" for p, r in links)
        if len(tied) == 1 or top > 1:
            return tied[-1:] if top == 1 else tied, f"is on the stalled link(s) {named}"
        return [tied[-1]], f"is on the stalled link(s) {named} (tie: highest rank blamed)"
    waited = Counter(s["waiting_on"] for s in states.values()
                     if s["seq"] == seq and s["in_op"] and s["waiting_on"] is not None)
    # A rank that waits is blocked, not guilty: blame the ends of the wait-for chains, ranks
    # inside the op that others wait on and that wait on nobody (stuck in compute, stalled).
    ends = sorted(r for r in waited if states.get(r) and states[r]["in_op"]
                  and states[r]["waiting_on"] is None)
    if ends:
        return ends, "is inside the op but sends nothing"
    if waited:
        top = max(waited.values())
        return [max(r for r, c in waited.items() if c == top)], "is not sending (a wait cycle)"
    return [], "no rank is waiting"


# --- the outcome of an op that failed somewhere -------------------------------------------------
# A rank may finish an op while another survivor of the same failure is still missing data for
# it (its last message came from the rank that was then evicted). If the first returned and the
# second raised, the two would from then on pair up different steps. So a group that can
# survive failures ends every collective with a commit round (algorithms/commit.py): a rank
# returns only once every rank holds its result. A rank caught by a failure in that round holds
# its result but does not know whether the others do; the coordinator answers, the same for
# every survivor, from what each survivor reports of op `seq`:
#   COMPLETED  the rank finished the op;
#   LACKED     it stopped in the op without its result (a timeout, a failure, an abort);
#   ABANDONED  it held its result, but the verdict on the op was "abort";
#   (in the op with has_data set: it holds its result and waits in the commit round.)
# The op counts ("commit") once every survivor holds its result; it is dropped ("abort") as soon
# as one survivor stopped without it. A survivor that stopped never gains its result later and
# one that holds it never loses it, so the two answers exclude each other and never change.


def holds_result(seq: int, state: dict | None) -> bool | None:
    """True: this rank holds op `seq`'s result; False: it stopped without it; None: not yet
    known (still moving data, or not reported)."""
    if not state:
        return None
    for done_seq, how in state.get("done") or ():
        if done_seq == seq:
            return how != LACKED
    # has_data is cleared when an op begins: with `seq` the last op begun and not ended, this
    # rank reached the commit round of it -- in it still, or stopped there by the failure and
    # asking for the outcome (OpRunner abandons the op before it asks, so in_op is off then;
    # a death detected within milliseconds leaves no beat of the commit wait to go by)
    if state.get("seq") == seq and state.get("has_data"):
        return True
    return None


def outcome(held) -> str | None:
    """held: for each survivor, holds_result() of the op. 'commit', 'abort', or None."""
    held = list(held)
    if any(h is False for h in held):
        return "abort"
    if held and all(h is True for h in held):
        return "commit"
    return None
