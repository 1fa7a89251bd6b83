"""The coordinator as one member sees it: there or away, back how often, lost for good; and
what the member must say when it re-registers. No I/O: the heartbeat thread (heartbeat.py,
restart.py) feeds it what its socket's connection does, at times it passes in, and the
client's requests (client.py) read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LinkState:
    """The coordinator's comings and goings (restart.py says how they are seen)."""

    address: str  # the coordinator's
    grace: float  # s: how long it may stay away before every operation raises CoordinatorLost
    away_since: float | None = None  # monotonic, while it is gone
    epoch: int = 0  # its returns: a request in flight is sent again when this changes
    lost: str | None = None  # why it is lost for good, once it stayed away past the grace
    members: dict[int, list[str]] = field(default_factory=dict)  # generation -> roster
    forming: int = -1  # the generation this member is forming, if any
    # the host its last address named: a re-registration names it (the coordinator keeps slow
    # links by host, hostlinks.py); kept here, where both of the member's machines read it
    host: str | None = None

    def went_away(self, now: float) -> bool:
        """Its connection closed; whether that is news (it was there until now)."""
        if self.away_since is not None:
            return False
        self.away_since = now
        return True

    def came_back(self, now: float) -> float | None:
        """It answers again (or never went): requests in flight are sent again. How long it
        was away, or None if it was not."""
        away = None if self.away_since is None else now - self.away_since
        self.away_since = None
        self.epoch += 1
        return away

    def overdue(self, now: float) -> str | None:
        """Why it is lost for good, the first time it has stayed away past the grace."""
        if self.away_since is None or self.lost is not None or now - self.away_since <= self.grace:
            return None
        self.lost = (
            f"the coordinator at {self.address} has been unreachable for "
            f"{now - self.away_since:.1f} s, longer than the grace of {self.grace:g} s "
            "(COLLECTIVES_COORDINATOR_GRACE): restart it at the same address sooner, "
            "or run it where it survives (the launcher, a standalone coordinator)"
        )
        return self.lost

    def welcomed(self, generation: int, members: list[str]) -> None:
        """A generation formed: its roster, which a re-registration names."""
        self.members = {generation: list(members)}
