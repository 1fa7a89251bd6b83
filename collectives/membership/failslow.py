"""Fail-slow detection: which links (or which rank's NIC) run far behind their peers. No I/O.

Events in: a member's link summary from its heartbeat (`beat`: cumulative counters of its
inbound links, transport/linkstats.py), and the clock (`evaluate`). Out: `Flagged` / `Cleared`
records naming the link or the rank and the figures, for the coordinator to log, show and
route around (reroute.py).

The rule (the thresholds are Thresholds' defaults):

* A directed link's throughput over the last `window` seconds is the bytes of its large frames
  over their summed transit (linkstats.py). A link is judged only on `min_bytes` or more in the
  window, and only against at least `min_peers` other links judged in the same window.
* Its reference is the median throughput of the other judged links that are not flagged (all
  the other judged links where fewer than `min_peers` are unflagged).
* It is *slow* when its throughput is below reference / `slow_ratio`, its newest figures (the
  last beat's) are too, and its transit filled at least `min_share` of the window (a slow link
  that costs nothing is not worth a new schedule); it is *well* when its throughput is at
  least reference / `clear_ratio`.
* Flagged once slow in every judgement for `sustain` seconds; cleared once well in every
  judgement for `clear_sustain` seconds. A judgement of neither kind (between the ratios, or
  too few bytes) resets neither clock -- the hysteresis holds both ways -- except that newest
  figures back at the well pace end a slow spell (a passing slowdown stays in the window for
  its length, and must not count as sustained).
* A rank is a slow NIC when its flagged links number at least 3, lead to or from at least 2
  peers, and go both in and out: every link of the rank that was measured is behind. Links
  that a rank named before it explains (the ranks judged in order of how many flagged links
  each holds) do not count: beside two slow NICs, a healthy rank's links to them are flagged
  too, in and out, to two peers, and it must not be named.

Why a clean run stays quiet under CPU load on two cores: a busy CPU delays every frame's
receiver (the frame is noticed at its next wait) and every sender's transport thread, so it
slows every link together; the reference falls with them. A link must lag its peers fourfold,
steadily for seconds, while costing a sixth of the time, to be flagged; a descheduled process
slows the links around it for one or two frames, which the window's byte-weighted mean and the
sustain time absorb.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..algorithms.costmodel import DEFAULT_ALPHA, DEFAULT_RATE, LinkCosts
from ..transport.linkstats import LinkCounters


@dataclass(frozen=True)
class Thresholds:
    window: float = 3.0  # s of recent figures each judgement reads
    slow_ratio: float = 4.0  # slow: below the reference / this
    clear_ratio: float = 2.0  # well: at least the reference / this
    min_share: float = 0.15  # slow also needs its transit to fill this share of the window
    min_bytes: int = 1 << 20  # bytes a link must have moved in the window to be judged
    min_peers: int = 2  # other links judged in the same window to compare with
    sustain: float = 1.5  # s slow in every judgement before it is flagged
    clear_sustain: float = 3.0  # s well in every judgement before it is cleared


Link = tuple[int, int]  # (src, dst): the direction the bytes go
MANY_LINKS = 16  # above this many judged links, one reference median serves them all
LATENCY_FRAMES = 16  # small frames a link must have carried for its latency to be used


class Figures(NamedTuple):
    """A link as judged: its throughput and its reference (bytes/s), its transit share."""

    link: Link
    rate: float
    reference: float
    share: float

    def text(self) -> str:
        return (
            f"{self.link[0]}->{self.link[1]} at {_mbit(self.rate)} against its peers' "
            f"{_mbit(self.reference)} ({self.reference / max(self.rate, 1.0):.1f}x slower)"
        )


class Flagged(NamedTuple):
    """A link (rank None) or a whole rank's NIC (links: all of its flagged ones) flagged."""

    link: Link | None
    rank: int | None
    figures: tuple[Figures, ...]


class Cleared(NamedTuple):
    link: Link | None
    rank: int | None
    figures: tuple[Figures, ...]


class _Sample(NamedTuple):
    at: float
    large_bytes: int
    large_seconds: float


@dataclass
class _LinkState:
    samples: deque[Any] = field(default_factory=deque)
    slow_since: float | None = None
    well_since: float | None = None
    flagged: bool = False
    last: Figures | None = None


class Detector:
    """The coordinator's fail-slow detector for one generation's ranks."""

    def __init__(self, size: int, thresholds: Thresholds | None = None):
        self.size = size
        self.th = thresholds or Thresholds()
        self._totals: dict[Link, LinkCounters] = {}  # the last cumulative counters per link
        self._links: dict[Link, _LinkState] = {}
        self.nics: set[int] = set()  # ranks flagged as slow NICs
        self.rates: dict[Link, float] = {}  # the last judgement's throughput of each judged link
        self.newest: dict[Link, float] = {}  # ... and its newest beat's

    # --- events ---------------------------------------------------------------------------
    def beat(self, rank: int, rows: list[LinkCounters], now: float) -> None:
        """Rank `rank`'s inbound links, cumulative (a restarted count starts again)."""
        if not 0 <= rank < self.size:
            return
        for row in rows[: self.size]:
            if not 0 <= row.src < self.size or row.src == rank:
                continue
            key = (row.src, rank)
            before = self._totals.get(key)
            self._totals[key] = row
            if before is None or row.large_bytes < before.large_bytes:
                continue  # the first figures (or a new transport's): only a baseline
            db = row.large_bytes - before.large_bytes
            ds = row.large_seconds - before.large_seconds
            if db > 0:
                state = self._links.setdefault(key, _LinkState())
                state.samples.append(_Sample(now, db, max(ds, 0.0)))

    def evaluate(self, now: float) -> list[Flagged | Cleared]:
        """Judge every link on its window; what was flagged or cleared just now."""
        th = self.th
        judged: dict[Link, tuple[float, float]] = {}  # link -> (rate, share)
        for key, st in self._links.items():
            while st.samples and st.samples[0].at < now - th.window:
                st.samples.popleft()
            b = sum(s.large_bytes for s in st.samples)
            sec = sum(s.large_seconds for s in st.samples)
            if b >= th.min_bytes:
                judged[key] = (b / max(sec, 1e-6), sec / th.window)
        # slownic.py judges on them: each judged link's window figure and its newest beat's
        self.rates = {k: rate for k, (rate, _) in judged.items()}
        self.newest = {k: _newest(self._links[k]) for k in judged}
        out: list[Flagged | Cleared] = []
        # Many links: one median for all (a link's own figure moves it little), not one per
        # link over the others (quadratic in the links).
        shared = self._reference(list(judged), judged) if len(judged) > MANY_LINKS else None
        for key, (rate, share) in judged.items():
            others = [k for k in judged if k != key]
            if len(others) < th.min_peers:
                continue
            ref = shared if shared is not None else self._reference(others, judged)
            st = self._links[key]
            st.last = Figures(key, rate, ref, share)
            newest = st.samples[-1]
            now_rate = newest.large_bytes / max(newest.large_seconds, 1e-6)
            if (
                rate < ref / th.slow_ratio
                and share >= th.min_share
                and now_rate < ref / th.slow_ratio
            ):
                st.well_since = None
                st.slow_since = st.slow_since if st.slow_since is not None else now
                if not st.flagged and now - st.slow_since >= th.sustain:
                    st.flagged = True
                    out.append(Flagged(key, None, (st.last,)))
                continue
            if now_rate >= ref / th.clear_ratio:
                st.slow_since = None  # a slowdown that has passed, though still in the window
            if rate >= ref / th.clear_ratio:
                st.well_since = st.well_since if st.well_since is not None else now
                if st.flagged and now - st.well_since >= th.clear_sustain:
                    st.flagged = False
                    out.append(Cleared(key, None, (st.last,)))
        out.extend(self._nics())
        return out

    def flag(self, link: Link) -> None:
        """Flag a link on evidence from elsewhere (a trial not judged well)."""
        self._links.setdefault(link, _LinkState()).flagged = True

    def clear(self, link: Link, now: float) -> None:
        """Forget a flagged link's verdict (it goes back into the schedules on trial: the
        next judgements on fresh figures flag it again if it is still slow)."""
        st = self._links.get(link)
        if st is not None:
            st.flagged, st.slow_since, st.well_since = False, None, None
            st.samples.clear()

    # --- what is flagged now ----------------------------------------------------------------
    def flagged(self) -> list[Figures]:
        return [st.last or Figures(k, 0.0, 0.0, 0.0) for k, st in self._links.items() if st.flagged]

    def _reference(self, links: list[Link], judged: dict[Link, Any]) -> float:
        fine = [k for k in links if not self._links[k].flagged]
        pool = fine if len(fine) >= self.th.min_peers else links
        return float(statistics.median(judged[k][0] for k in pool))

    def figures(self) -> list[Figures]:
        """Every judged link's last figures."""
        return [st.last for st in self._links.values() if st.last is not None]

    def latency(self, link: Link) -> float | None:
        """The link's mean small-frame transit over its life (s), once it carried enough."""
        row = self._totals.get(link)
        if row is None or row.small_frames < LATENCY_FRAMES:
            return None
        return row.small_seconds / row.small_frames

    def link_costs(self, slow: list[Link]) -> LinkCosts:
        """The figures a schedule around `slow` is priced on (algorithms/costmodel.py): each
        of `slow` at its own throughput (at most the reference / slow_ratio where it has no
        figures of its own: flagged on a trial's evidence), every other link at the median of
        the unflagged judged links (the reference where none is), latencies likewise."""
        figs = {f.link: f for f in self.figures()}
        fine = [f.rate for k, f in figs.items() if not self._links[k].flagged]
        refs = [f.reference for f in figs.values() if f.reference > 0]
        rate = statistics.median(fine or refs or [DEFAULT_RATE])
        lat = {k: x for k in self._totals if (x := self.latency(k)) is not None}
        alpha = statistics.median([x for k, x in lat.items() if k not in slow] or [DEFAULT_ALPHA])
        rates = {}
        for link in slow:
            f = figs.get(link)
            own = f.rate if f is not None and f.rate > 0 else 0.0
            rates[link] = own if 0 < own < rate else rate / self.th.slow_ratio
        return LinkCosts.of(self.size, rates, rate, alpha, {k: lat[k] for k in slow if k in lat})

    def _nics(self) -> list[Flagged | Cleared]:
        out: list[Flagged | Cleared] = []
        flagged = self.flagged()
        named = self._slow_nics(flagged)
        for r in range(self.size):
            mine = [f for f in flagged if r in f.link]
            nic = r in named
            if nic and r not in self.nics:
                self.nics.add(r)
                out.append(Flagged(None, r, tuple(mine)))
            elif not nic and r in self.nics:
                self.nics.discard(r)
                out.append(Cleared(None, r, tuple(mine)))
        return out

    def _slow_nics(self, flagged: list[Figures]) -> set[int]:
        """The ranks whose NIC the flagged links name (the rule in the module's docstring).
        A healthy rank beside two slow NICs also holds flagged links, in and out, to two
        peers: its links to them. So the ranks are judged in order of how many flagged links
        they hold (the lower rank first on a tie), each on the links that no rank named
        before it explains."""
        held = {r: sum(r in f.link for f in flagged) for r in range(self.size)}
        named: set[int] = set()
        for r in sorted(held, key=lambda q: (-held[q], q)):
            mine = [f.link for f in flagged if r in f.link and not named & set(f.link)]
            peers = {a if b == r else b for a, b in mine}
            both = {a == r for a, _ in mine} == {True, False}
            if len(mine) >= 3 and len(peers) >= 2 and both:
                named.add(r)
        return named


def _newest(st: _LinkState) -> float:
    newest = st.samples[-1]
    return float(newest.large_bytes / max(newest.large_seconds, 1e-6))


def describe(event: Flagged | Cleared) -> str:
    """A log line's worth: what was flagged or cleared, with the figures."""
    verb = "flagged" if isinstance(event, Flagged) else "cleared"
    figs = "; ".join(f.text() for f in event.figures)
    if event.rank is not None:
        return f"rank {event.rank}'s NIC {verb} as slow (every link of it measured behind: {figs})"
    assert event.link is not None
    a, b = event.link
    what = "as slow" if verb == "flagged" else "(back to its peers' pace)"
    return f"link {a}->{b} {verb} {what}: {figs}"


def _mbit(rate: float) -> str:
    return f"{rate * 8 / 1e6:.0f} Mbit/s" if rate * 8 < 1e10 else f"{rate * 8 / 1e9:.1f} Gbit/s"


__all__ = ["Cleared", "Detector", "Figures", "Flagged", "Link", "Thresholds", "describe"]
