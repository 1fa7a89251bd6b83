"""The coordinator's tables that what arrives can grow, and their bounds (server.py).

Every table keyed by something a message names is bounded, and pruned as the job moves on:

  beats          member id -> last beat. Ids that are neither members, joiners nor forming are
                 forgotten once quiet for heartbeat_timeout; past MAX_BEATS, the oldest of
                 them go first.
  joiners        at most max(MAX_JOINERS, world size) replacement workers wait at a time;
                 one more is refused (an error reply), not kept.
  askers         of a pending diagnosis or outcome: max_askers().
  diagnoses      at most MAX_PENDING stalls of the current generation under diagnosis.
  given, merged  verdicts, and which op's stall waits on which: the current generation's
                 only, the last MAX_VERDICTS.
  outcome_asks   at most MAX_PENDING; outcomes: the last MAX_VERDICTS.
                 (diagnoses, given, outcome_asks and outcomes: verdicts.py)
  events         the last MAX_EVENTS notes.

And what one message may hold: every per-rank list at most max_ranks() entries.
"""

from __future__ import annotations

MAX_BEATS = 1024
MAX_JOINERS = 64
MAX_PENDING = 64
MAX_VERDICTS = 256
MAX_EVENTS = 1000
# Requests whose sender waits for an answer: an invalid one is answered with an error.
ANSWERED = (
    "join",
    "status",
    "diagnose",
    "outcome",
    "reconstruct",
    "address",
    "join_request",
    "leave",
)


def max_ranks(c) -> int:
    """The most ranks a group of this job can have: its members (or world size) and every
    joiner that may wait. A list in a message that has one entry per rank is at most this long
    (validate.check): one beat cannot make the coordinator keep a megabyte."""
    return max(c.world_size, len(c.members or ())) + max(MAX_JOINERS, c.world_size)


def room_for_joiner(c) -> bool:
    return len(c.joiners) < max(MAX_JOINERS, c.world_size)


def max_askers(c) -> int:
    """Askers kept per pending diagnosis or outcome (each member asks once, or a few times)."""
    return 4 * len(c.members or ()) + 16


def fit(state: dict, world_size: int) -> dict:
    """A progress report made to fit the group it is about: a waiting_on that names no rank,
    and sent/recv counts that are not one per rank, are taken as absent."""
    if state.get("waiting_on") is not None and not 0 <= state["waiting_on"] < world_size:
        state["waiting_on"] = None
    for key in ("sent", "recv"):
        if state.get(key) is not None and len(state[key]) != world_size:
            state[key] = None
    return state


def _keep_last(table: dict, n: int):
    while len(table) > n:
        del table[next(iter(table))]  # dicts keep insertion order: oldest first


def prune(c, now: float):
    """Drop what the coordinator `c` no longer needs (called from its loop)."""
    known = set(c.members or ()) | set(c.joiners) | {j[1] for j in c.joined.values()}
    if c.forming is not None:
        known |= set(c.forming["members"])
    strangers = [(t, m) for m, (_, t, _) in c.beats.items() if m not in known]
    for t, m in strangers:
        if now - t > c.heartbeat_timeout:
            del c.beats[m]
    extra = len(c.beats) - max(MAX_BEATS, 4 * c.world_size)
    if extra > 0:
        for _, m in sorted((t, m) for t, m in strangers if m in c.beats)[:extra]:
            del c.beats[m]
    given, merged = c.verdicts.given, c.verdicts.merged  # verdicts.py keeps the judgements
    for table in (given, merged):
        for key in [k for k in table if k[0] != c.generation]:
            del table[key]
    _keep_last(given, MAX_VERDICTS)
    _keep_last(merged, MAX_VERDICTS)
    _keep_last(c.verdicts.outcomes, MAX_VERDICTS)
