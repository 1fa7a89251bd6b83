"""A NIC slower than its peers but not crawling: one rank's every link behind the links between
the other ranks, by about half, for seconds on end. No I/O.

failslow.py flags a link below a quarter of its peers' median (and names a NIC from such
links); a rank whose NIC runs at half its peers' bandwidth stays above that, yet a ring pays
for it in full: every step waits on the rank's two ring links. Here a rank is judged as a
whole, on the same window figures (failslow.Detector.window_rates: each link's throughput
over the last window, those that moved enough bytes to be judged):

* its links are the judged links to or from it; the others are the judged links between the
  other ranks. It is judged only with at least `min_links` of its own, going both in and out,
  and at least `min_others` others (a ring of 4 carries one link in and one out of each rank,
  and two between the others).
* It is *behind* when each of its links is below the median of the others / `ratio`, over the
  window and in its newest beat's figures too; it has *caught up* when the median of its links
  is at least the others' / `clear_ratio`. Newest figures back above the others' / `ratio`
  end a behind spell (a spell that has passed stays in the window for its length, and must not
  count as sustained: failslow.py's rule).
* Named once behind in every judgement for `sustain` seconds; cleared once caught up in every
  judgement for `clear_sustain` seconds. A judgement of neither kind resets neither clock.

Never a constant: a busy CPU slows every link together, the others' median with them. What a
busy CPU can do is slow one rank more than the rest (a rank descheduled: the frames to it are
noticed late, its own go out late), for a frame or two at a time; a verdict needs both
directions behind, steadily, for `sustain` seconds, which a clean run beside CPU burners does
not give (`python -m bench failslow --clean-minutes`). What the coordinator does about it is
reroute.py's: the ring with its chunks sized by bandwidth (algorithms/schedule.py,
plan_for_nics), where the cost model predicts it 10 % faster.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from ..algorithms.costmodel import DEFAULT_ALPHA, LinkCosts

Link = tuple[int, int]


@dataclass(frozen=True)
class NicThresholds:
    ratio: float = 1.6  # behind: each of its links below the others' median / this
    clear_ratio: float = 1.25  # caught up: its links' median at least the others' / this
    min_links: int = 2  # of its own links judged (in and out both among them)
    min_others: int = 2  # links between the other ranks judged
    sustain: float = 3.0  # s behind in every judgement before it is named
    clear_sustain: float = 3.0  # s caught up in every judgement before it is cleared


class NicFigures(NamedTuple):
    """A rank as judged: the median throughput of its links and of the others' (bytes/s)."""

    rank: int
    mine: float
    others: float

    def text(self) -> str:
        return (
            f"its links at {_mbit(self.mine)} against {_mbit(self.others)} between the other "
            f"ranks ({self.others / max(self.mine, 1.0):.1f}x slower)"
        )


class Behind(NamedTuple):
    figures: NicFigures


class CaughtUp(NamedTuple):
    figures: NicFigures


@dataclass
class _RankState:
    behind_since: float | None = None
    caught_up_since: float | None = None
    last: NicFigures | None = None


@dataclass
class NicJudge:
    """The coordinator's judge of slower NICs for one generation of `size` ranks."""

    size: int
    th: NicThresholds = field(default_factory=NicThresholds)
    behind: set[int] = field(default_factory=set)  # ranks named behind now
    _ranks: dict[int, _RankState] = field(default_factory=dict)

    def evaluate(
        self, rates: Mapping[Link, float], now: float, newest: Mapping[Link, float] | None = None
    ) -> list[Behind | CaughtUp]:
        """Judge every rank on this window's link throughputs (and each link's newest beat's,
        where given); who was named or cleared."""
        newest = rates if newest is None else newest
        th = self.th
        out: list[Behind | CaughtUp] = []
        for r in range(self.size):
            mine = {k: v for k, v in rates.items() if r in k}
            others = [v for k, v in rates.items() if r not in k]
            ins, outs = [k for k in mine if k[1] == r], [k for k in mine if k[0] == r]
            if len(mine) < th.min_links or not ins or not outs or len(others) < th.min_others:
                continue
            ref = float(statistics.median(others))
            figs = NicFigures(r, float(statistics.median(mine.values())), ref)
            st = self._ranks.setdefault(r, _RankState())
            st.last = figs
            latest = [newest.get(k, v) for k, v in mine.items()]
            if not all(v < ref / th.ratio for v in latest):
                st.behind_since = None  # back at pace now: a passing spell, still in the window
            if all(v < ref / th.ratio for v in [*mine.values(), *latest]):
                st.caught_up_since = None
                st.behind_since = st.behind_since if st.behind_since is not None else now
                if r not in self.behind and now - st.behind_since >= th.sustain:
                    self.behind.add(r)
                    out.append(Behind(figs))
            elif figs.mine >= ref / th.clear_ratio:
                st.behind_since = None
                st.caught_up_since = st.caught_up_since if st.caught_up_since is not None else now
                if r in self.behind and now - st.caught_up_since >= th.clear_sustain:
                    self.behind.discard(r)
                    out.append(CaughtUp(figs))
        return out

    def forget(self, rank: int) -> None:
        """A rank removed from the judgement (its NIC handled otherwise)."""
        self.behind.discard(rank)
        self._ranks.pop(rank, None)


def nic_costs(
    size: int,
    ranks: Iterable[int],
    rates: Mapping[Link, float],
    latency: Mapping[Link, float] | None = None,
) -> LinkCosts | None:
    """The figures a schedule around the NICs of `ranks` is priced on: every link to or from
    one of them at its own throughput where judged, else at the median of that rank's judged
    links (a NIC: the links that carried nothing go through it too), and where below the
    others'; every other link at the median of the judged links between the other ranks;
    latencies, the median of the others' measured ones. None where no link between the other
    ranks, or none of theirs, was judged."""
    nics = set(ranks)
    others = [v for k, v in rates.items() if not set(k) & nics]
    if not others:
        return None
    healthy = float(statistics.median(others))
    lat = dict(latency or {})
    fine = [x for k, x in lat.items() if not set(k) & nics]
    alpha = float(statistics.median(fine)) if fine else DEFAULT_ALPHA
    slow: dict[Link, float] = {}
    for r in sorted(nics):
        own = [v for k, v in rates.items() if r in k and v > 0]
        if not own:
            return None
        pace = float(statistics.median(own))
        for p in range(size):
            for link in ((r, p), (p, r)):
                v = rates.get(link, pace) if p != r else 0.0
                if 0 < v < healthy:
                    slow[link] = min(v, slow.get(link, v))
    return LinkCosts.of(size, slow, healthy, alpha, {k: lat[k] for k in slow if k in lat})


def describe(event: Behind | CaughtUp) -> str:
    f = event.figures
    if isinstance(event, Behind):
        return f"rank {f.rank}'s NIC runs behind its peers: {f.text()}"
    return f"rank {f.rank}'s NIC back to its peers' pace: {f.text()}"


def _mbit(rate: float) -> str:
    return f"{rate * 8 / 1e6:.0f} Mbit/s" if rate * 8 < 1e10 else f"{rate * 8 / 1e9:.1f} Gbit/s"


__all__ = ["Behind", "CaughtUp", "NicFigures", "NicJudge", "NicThresholds", "describe", "nic_costs"]
