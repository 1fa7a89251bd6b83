"""The coordinator's tables that what arrives can grow, and their bounds (state.py).

Every table keyed by something a message names is bounded, and pruned as the job moves on
(prune(), at every sweep of the periodic work: server.HEARTBEAT_CHECK_EVERY):

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
  link_history   the members of the current generation only.
  answered       the members of the current generation only.
  removed        member ids removed from a generation (never admitted again): the last
                 MAX_REMOVED.
  events         the last MAX_EVENTS notes (server.py).

And what one message may hold: every per-rank list at most max_ranks() entries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .state import Mid, State

MAX_BEATS = 1024
MAX_JOINERS = 64
MAX_PENDING = 64
MAX_VERDICTS = 256
MAX_EVENTS = 1000
MAX_REMOVED = 4096
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


def max_ranks(s: State) -> int:
    """The most ranks a group of this job can have: its members (or world size) and every
    joiner that may wait. A list in a message that has one entry per rank is at most this long
    (protocol.decode_request): one beat cannot make the coordinator keep a megabyte."""
    return max(s.world_size, len(s.members or ())) + max(MAX_JOINERS, s.world_size)


def room_for_joiner(s: State) -> bool:
    return len(s.joiners) < max(MAX_JOINERS, s.world_size)


def max_askers(s: State) -> int:
    """Askers kept per pending diagnosis or outcome (each member asks once, or a few times)."""
    return 4 * len(s.members or ()) + 16


def remember_removed(s: State, mid: Mid) -> None:
    s.removed[mid] = None
    _keep_last(s.removed, MAX_REMOVED)


def _keep_last(table: dict[Any, Any], n: int) -> None:
    while len(table) > n:
        del table[next(iter(table))]  # dicts keep insertion order: oldest first


def prune(s: State, now: float, known: set[Mid]) -> None:
    """Drop what the coordinator no longer needs (its periodic work); known: s.known()."""
    strangers = [(b.at, m) for m, b in s.beats.items() if m not in known]
    for t, m in strangers:
        if now - t > s.heartbeat_timeout:
            del s.beats[m]
    extra = len(s.beats) - max(MAX_BEATS, 4 * s.world_size)
    if extra > 0:
        for _, m in sorted((t, m) for t, m in strangers if m in s.beats)[:extra]:
            del s.beats[m]
    j = s.judgements
    for mid in [m for m in j.link_history if s.rank_of(m) is None]:
        del j.link_history[mid]  # of processes no longer members
    for mid in [m for m in j.answered if s.rank_of(m) is None]:
        del j.answered[mid]
    for key in [k for k in j.given if k[0] != s.generation]:
        del j.given[key]
    for key in [k for k in j.merged if k[0] != s.generation]:
        del j.merged[key]
    _keep_last(j.given, MAX_VERDICTS)
    _keep_last(j.merged, MAX_VERDICTS)
    _keep_last(j.outcomes, MAX_VERDICTS)
