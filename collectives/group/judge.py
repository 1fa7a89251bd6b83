"""Who judges a stalled op and settles a failed one: what the group asks, above the transport.

A collective's channel stops at its deadline and reports the stall (transport/stall.py); it
never calls up. The group's op runner (core.py, submit) takes the report and asks a Judge whom
to blame, handing it this rank's progress as the channel took it when it stopped and the
channel's prober (a probe round over the stalled op's channel, transport/linkprobe.py), then
has the channel raise what the verdict calls for. An op that failed is settled the same way:
the runner asks the Arbiter how it ends where this rank held its result (the commit round),
and publishes a failed end at once.

Both are declared here and injected by whoever builds the group: the coordinator's client
(membership/lifecycle.py) is both; the in-process world (transport/inproc.py, InprocWorld) is
a Judge. Without one, the peer waited on is blamed and a failed op is dropped here.
"""

from __future__ import annotations

import logging
from typing import Protocol

from ..transport.base import Progress, Prober, Transport
from ..transport.channel import OpChannel
from ..transport.stall import Blame, Stall

log = logging.getLogger("collectives")


class Judge(Protocol):
    """Whom to blame for a stalled op (membership/diagnose.py, through the client)."""

    def diagnose(
        self,
        seq: int,
        waiting_on: int | None,
        *,
        progress: Progress,
        prober: Prober | None,
        timeout: float | None,
    ) -> tuple[list[int], str, bool | str]:
        """(culprits, why, evicted) for op `seq`, which stalled waiting on `waiting_on`:
        evicted is False, "stalled" (this stall removed them) or "failed" (removed before).
        progress: this rank's, taken as the op stopped (Stall.progress); prober(token, peers, nbytes, window)
        runs this rank's side of a probe round, should the judgement ask for one; timeout:
        the op's, which bounds the judgement."""
        ...


class Arbiter(Protocol):
    """How an op that failed in its commit round ends (membership/client.py); each call
    carries this rank's progress, taken as the runner asks."""

    def outcome(self, seq: int, timeout: float, progress: Progress) -> str | None:
        """'commit' (every survivor holds the op's result), 'abort', or None: nobody can
        tell in time."""
        ...

    def publish(self, progress: Progress) -> None:
        """Send this rank's progress now: its op just ended without counting."""
        ...


def blame(judge: Judge | None, t: Transport, ch: OpChannel, stall: Stall) -> Blame:
    """The verdict on `stall` of `ch`'s op: the judge's, else (no judge, or no answer) the
    peer waited on."""
    if judge is None:
        return Blame.waited_on(stall)
    try:
        culprits, why, evicted = judge.diagnose(
            stall.seq,
            stall.peer,
            progress=stall.progress,
            prober=ch.probe_links,
            timeout=ch.timeout,
        )
    except Exception as exc:  # no coordinator: blame whom we waited on
        log.warning("rank %d could not ask whom to blame: %s", t.rank, exc)
        return Blame.waited_on(stall)
    return Blame(tuple(culprits), why, evicted)


def settle(arbiter: Arbiter | None, t: Transport, ch: OpChannel, exc: BaseException) -> bool:
    """After `exc` ended `ch`'s op early (abandoned already): True if the op counts all the
    same (OpChannel.settle_failure, with the arbiter's verdict where it owes one). A
    collective that does not count is published at once, so that survivors waiting for its
    verdict need not wait for the next heartbeat."""
    if ch.stream != 0:
        return False
    verdict = _outcome(arbiter, t, ch) if ch.owes_outcome(exc) else None
    if ch.settle_failure(exc, verdict):
        return True
    if arbiter is not None:
        try:
            arbiter.publish(t.progress())
        except Exception as exc2:  # the heartbeat carries it anyway
            log.debug("rank %d could not publish the end of op #%d: %s", t.rank, ch.seq, exc2)
    return False


def _outcome(arbiter: Arbiter | None, t: Transport, ch: OpChannel) -> str | None:
    """The arbiter's verdict on `ch`'s op, which failed while this rank held its result;
    None where nobody can tell (no arbiter, or no answer in time)."""
    if arbiter is None:
        return None
    try:
        return arbiter.outcome(ch.seq, ch.timeout, t.progress())
    except Exception as exc:
        log.warning("rank %d could not learn the outcome of op #%d: %s", t.rank, ch.seq, exc)
        return None


__all__ = ["Arbiter", "Judge", "blame", "settle"]
