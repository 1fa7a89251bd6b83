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
* Small ops move too few large-frame bytes for a throughput, and their frames' time is their
  latency: every link is also judged by its small frames' mean transit, once `min_frames`
  of them crossed it in the window, against the median latency of the other links into
  the same rank, with the same share, newest-figures and sustain rules: slow at
  `latency_ratio` times that, well within `clear_ratio` of it. A frame found queued counts
  (linkstats.py) at the bound its finding gives, never below its time on the wire: a
  healthy link of small ops, whose frames are nearly all found queued, has figures to be
  compared with. Its share is the timed frames' transit only (what the link cost its
  receivers' waits). The latency figures are kept as rates (1 / latency), so that every
  rule reads alike; `Figures.latency` says which kind a figure is.
  Why the same rank, and a wider ratio than throughput's: a frame its receiver waited for
  carries the receiver's wake-up, which a frame found queued does not, and on a loaded host
  that alone spreads healthy links' latencies. Two cores at a load of 10-12, 4 ranks of
  64 KiB ops, the beats replayed into this detector: healthy links read up to 7x the
  median of the links into the same rank (9-11x against every link's), a link held to
  40 Mbit/s 8-18x.
* A link judged both ways is slow when either figure is, and well when every figure it was
  judged on is (a latency judgement lets a link whose throughput reads healthy -- its large
  frames found queued, its small ones held behind them -- be flagged). A flagged link is
  never cleared on its latency: routed around, it still carries the ops' small commit
  messages, which a link slow for bulk delivers in time; a test of it (reroute.py) clears
  it.
* A rank is a slow NIC when its flagged links number at least 3, lead to or from at least 2
  peers, and go both in and out, and every link of the rank that the judgement had figures
  of is flagged (one at its peers' pace clears it). Links
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
from collections.abc import Iterable, Mapping
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
    min_frames: int = 16  # small frames (timed or found queued) a latency judgement needs
    latency_ratio: float = 8.0  # slow: a latency above the reference's times this
    sustain: float = 1.5  # s slow in every judgement before it is flagged
    clear_sustain: float = 3.0  # s well in every judgement before it is cleared


Link = tuple[int, int]  # (src, dst): the direction the bytes go
MANY_LINKS = 16  # above this many judged links, one reference median serves them all
LATENCY_FRAMES = 16  # small frames a link must have carried for its latency to be used
KEEP_TESTS = 8  # beats with test frames remembered per link (a test reads those after it)


class Figures(NamedTuple):
    """A link as judged: its throughput and its reference (bytes/s), its transit share;
    latency: judged on its small frames, rate and reference being 1 / their mean transit."""

    link: Link
    rate: float
    reference: float
    share: float
    latency: bool = False

    def text(self) -> str:
        if self.latency:
            return (
                f"{self.link[0]}->{self.link[1]}'s small frames at {_ms(self.rate)} against its "
                f"peers' {_ms(self.reference)} ({self.reference / max(self.rate, 1e-9):.1f}x "
                "slower)"
            )
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


class Known(NamedTuple):
    """A flagged link handed from one generation's detector to the next's (Detector.known,
    Detector.inherit), by the next generation's ranks: the figures it was flagged on (None:
    flagged on evidence from elsewhere) and its last judgement's."""

    link: Link
    flagged_on: Figures | None
    last: Figures | None


class _Sample(NamedTuple):
    """What one beat added to a link's counters (linkstats.LinkCounters, differenced)."""

    at: float
    large_bytes: int
    large_seconds: float
    small_frames: int
    small_seconds: float
    queued_frames: int
    queued_seconds: float


class TestSample(NamedTuple):
    """A link's test frames (transport/linktest.py) as one beat reported them: how many came
    since the beat before, and the fastest transit among the latest test's frames so far."""

    at: float
    frames: int
    best: float


class _Verdict(NamedTuple):
    """One kind of figures' judgement of a link in one evaluation."""

    figures: Figures
    slow: bool
    well: bool
    newest_well: bool  # its newest figures are at the well pace


@dataclass
class _LinkState:
    samples: deque[_Sample] = field(default_factory=deque)
    slow_since: dict[bool, float] = field(default_factory=dict)  # kind (latency?): spell began
    well_since: float | None = None
    flagged: bool = False
    last: Figures | None = None  # the figures of its last judgement (the slow kind's if any)
    flagged_on: Figures | None = None  # the figures it was flagged on
    last_rate: Figures | None = None  # its last throughput figures
    last_latency: Figures | None = None  # its last latency figures


class Detector:
    """The coordinator's fail-slow detector for one generation's ranks."""

    def __init__(self, size: int, thresholds: Thresholds | None = None):
        self.size = size
        self.th = thresholds or Thresholds()
        self._totals: dict[Link, LinkCounters] = {}  # the last cumulative counters per link
        self._links: dict[Link, _LinkState] = {}
        self._tests: dict[Link, deque[TestSample]] = {}  # the last few beats' test frames
        self.nics: set[int] = set()  # ranks flagged as slow NICs
        self.window_rates: dict[
            Link, float
        ] = {}  # the last judgement's throughput of each judged link
        self.newest_rates: dict[Link, float] = {}  # ... and its newest beat's
        self.judged: frozenset[Link] = frozenset()  # the links the last judgement had figures of

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
            if before is None or any(
                b > a
                for a, b in (
                    (row.large_bytes, before.large_bytes),
                    (row.small_frames, before.small_frames),
                    (row.queued_frames, before.queued_frames),
                    (row.tested_frames, before.tested_frames),
                )
            ):
                continue  # the first figures (or a new transport's): only a baseline
            if row.tested_frames > before.tested_frames:
                self._tests.setdefault(key, deque(maxlen=KEEP_TESTS)).append(
                    TestSample(
                        now,
                        row.tested_frames - before.tested_frames,
                        row.tested_best,
                    )
                )
            got = _Sample(
                now,
                row.large_bytes - before.large_bytes,
                max(row.large_seconds - before.large_seconds, 0.0),
                row.small_frames - before.small_frames,
                max(row.small_seconds - before.small_seconds, 0.0),
                row.queued_frames - before.queued_frames,
                max(row.queued_seconds - before.queued_seconds, 0.0),
            )
            if got.large_bytes or got.small_frames or got.queued_frames:
                self._links.setdefault(key, _LinkState()).samples.append(got)

    def evaluate(self, now: float) -> list[Flagged | Cleared]:
        """Judge every link on its window; what was flagged or cleared just now."""
        th = self.th
        by_rate: dict[Link, tuple[float, float]] = {}  # link -> (rate, share)
        by_latency: dict[Link, tuple[float, float]] = {}  # link -> (1 / latency, share)
        for key, st in self._links.items():
            while st.samples and st.samples[0].at < now - th.window:
                st.samples.popleft()
            b = sum(x.large_bytes for x in st.samples)
            sec = sum(x.large_seconds for x in st.samples)
            if b >= th.min_bytes:
                by_rate[key] = (b / max(sec, 1e-6), sec / th.window)
            frames = sum(x.small_frames + x.queued_frames for x in st.samples)
            if frames >= th.min_frames:
                timed = sum(x.small_seconds for x in st.samples)
                bound = timed + sum(x.queued_seconds for x in st.samples)
                by_latency[key] = (frames / max(bound, 1e-9), timed / th.window)
        verdicts: dict[Link, list[_Verdict]] = {}
        for judged, latency in ((by_rate, False), (by_latency, True)):
            for key, v in self._judge(judged, latency).items():
                verdicts.setdefault(key, []).append(v)
        self.judged = frozenset(by_rate) | frozenset(by_latency)
        # slownic.py judges on them: each judged link's window throughput and its newest beat's
        self.window_rates = {k: rate for k, (rate, _) in by_rate.items()}
        self.newest_rates = {
            k: _newest(self._links[k].samples, False, r) for k, r in self.window_rates.items()
        }
        out: list[Flagged | Cleared] = []
        for key, vs in verdicts.items():
            st = self._links[key]
            for v in vs:  # each kind's slow spell runs on its own figures
                if v.slow:
                    st.slow_since.setdefault(v.figures.latency, now)
                elif v.newest_well:  # a slowdown that has passed, though still in the window
                    st.slow_since.pop(v.figures.latency, None)
            slow = [v for v in vs if v.slow]
            st.last = (slow or vs)[0].figures
            if slow:
                st.well_since = None
                spell = now - min(st.slow_since[v.figures.latency] for v in slow)
                if not st.flagged and spell >= th.sustain:
                    st.flagged, st.flagged_on = True, st.last
                    out.append(Flagged(key, None, (st.last,)))
                continue
            # Routed around, a link still carries the ops' small commit messages, quick on
            # a link slow only for bulk: its latency never clears it (its throughput may)
            vs = [v for v in vs if not (st.flagged and v.figures.latency)]
            if vs and all(v.well for v in vs):
                st.well_since = st.well_since if st.well_since is not None else now
                if st.flagged and now - st.well_since >= th.clear_sustain:
                    st.flagged = False
                    out.append(Cleared(key, None, (st.last,)))
        out.extend(self._nics())
        return out

    def _judge(
        self, judged: dict[Link, tuple[float, float]], latency: bool
    ) -> dict[Link, _Verdict]:
        """Every link of `judged` (one kind of figures) against the others of that kind."""
        th = self.th
        out: dict[Link, _Verdict] = {}
        # Many links: one median for all (a link's own figure moves it little), not one per
        # link over the others (quadratic in the links).
        many = len(judged) > MANY_LINKS and not latency
        shared = self._reference(list(judged), judged) if many else None
        for key, (rate, share) in judged.items():
            # a latency against the other links into the same rank: a frame waited for
            # carries its receiver's wake-up, the same for all of them
            others = [k for k in judged if k != key and (not latency or k[1] == key[1])]
            if len(others) < th.min_peers:
                continue
            ref = shared if shared is not None else self._reference(others, judged)
            st = self._links[key]
            fig = Figures(key, rate, ref, share, latency)
            if latency:
                st.last_latency = fig
            else:
                st.last_rate = fig
            now_rate = _newest(st.samples, latency, rate)
            ratio = th.latency_ratio if latency else th.slow_ratio
            slow = rate < ref / ratio and share >= th.min_share and now_rate < ref / ratio
            out[key] = _Verdict(
                fig, slow, rate >= ref / th.clear_ratio, now_rate >= ref / th.clear_ratio
            )
        return out

    def known(self, ranks: Mapping[int, int]) -> list[Known]:
        """Every flagged link whose two ends stay, renumbered by `ranks` (this generation's
        rank -> the next one's; a rank absent left): what the next generation's detector
        inherits. A member that left takes its links with it; a new one's start unknown."""
        out = []
        for (a, b), st in self._links.items():
            if st.flagged and a in ranks and b in ranks:
                out.append(relinked(Known((a, b), st.flagged_on, st.last), (ranks[a], ranks[b])))
        return out

    def leaving(self, ranks: Mapping[int, int]) -> list[Known]:
        """Every flagged link with an end that leaves (absent from `ranks`, as in known()),
        by this generation's ranks: what the coordinator keeps by host (hostlinks.py)."""
        return [
            Known((a, b), st.flagged_on, st.last)
            for (a, b), st in self._links.items()
            if st.flagged and not (a in ranks and b in ranks)
        ]

    def inherit(self, known: Iterable[Known]) -> None:
        """Take over links the generation before flagged: flagged from the start, on the
        figures they were flagged on (a test of one reads them; a plan around them is priced
        on them), until a test or their own fresh figures clear them."""
        for k in known:
            if not (0 <= k.link[0] < self.size and 0 <= k.link[1] < self.size):
                continue
            st = self._links.setdefault(k.link, _LinkState())
            st.flagged, st.flagged_on, st.last = True, k.flagged_on, k.last or k.flagged_on
            fig = k.flagged_on or k.last
            if fig is not None and fig.latency:
                st.last_latency = fig
            elif fig is not None:
                st.last_rate = fig
        # the slow NICs these links name are named at the first judgement (evaluate)

    def flag(self, link: Link) -> None:
        """Flag a link on evidence from elsewhere."""
        self._links.setdefault(link, _LinkState()).flagged = True

    def clear(self, link: Link, now: float) -> None:
        """Forget a flagged link's verdict (a test found it well: it goes back into the
        schedules, and the next judgements on fresh figures flag it again if it is slow)."""
        st = self._links.get(link)
        if st is not None:
            st.flagged, st.slow_since, st.well_since = False, {}, None
            st.last = st.last_rate = st.last_latency = None  # judged afresh, on fresh figures
            st.samples.clear()

    def tested(self, link: Link, since: float) -> tuple[int, float]:
        """The link's test frames reported after `since` (a test began then), and the fastest
        transit among them (s; 0.0 where none came)."""
        got = [x for x in self._tests.get(link, ()) if x.at > since]
        return sum(x.frames for x in got), got[-1].best if got else 0.0

    # --- what is flagged now ----------------------------------------------------------------
    def flagged(self) -> list[Figures]:
        return [st.last or Figures(k, 0.0, 0.0, 0.0) for k, st in self._links.items() if st.flagged]

    def _reference(self, links: list[Link], judged: dict[Link, Any]) -> float:
        fine = [k for k in links if not self._links[k].flagged]
        pool = fine if len(fine) >= self.th.min_peers else links
        return float(statistics.median(judged[k][0] for k in pool))

    def flagged_on(self, link: Link) -> Figures | None:
        """The figures a flagged link was flagged on (None: flagged on evidence from
        elsewhere, or not flagged): routed around, its later judgements are of its commit
        messages' latency."""
        st = self._links.get(link)
        return st.flagged_on if st is not None and st.flagged else None

    def figures(self) -> list[Figures]:
        """Every judged link's last figures (the slow kind's, where one was)."""
        return [st.last for st in self._links.values() if st.last is not None]

    def rates(self) -> list[Figures]:
        """Every link's last throughput figures."""
        return [st.last_rate for st in self._links.values() if st.last_rate is not None]

    def latency(self, link: Link) -> float | None:
        """The link's mean small-frame transit over its life (s), once it carried enough."""
        row = self._totals.get(link)
        if row is None or row.small_frames < LATENCY_FRAMES:
            return None
        return row.small_seconds / row.small_frames

    def link_costs(self, slow: list[Link]) -> LinkCosts:
        """The figures a schedule around `slow` is priced on (algorithms/costmodel.py): each
        of `slow` at its own throughput (at most the reference / slow_ratio where it has no
        figures of its own: flagged on evidence from elsewhere), every other link at the median of
        the unflagged judged links (the reference where none is), latencies likewise: a link
        judged on its latency at its window's, not its life's mean."""
        figs = {f.link: f for f in self.rates()}
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
        slow_lat = {k: lat[k] for k in slow if k in lat}
        for link in slow:
            st = self._links.get(link)
            if st is not None and st.last_latency is not None:
                slow_lat[link] = 1.0 / max(st.last_latency.rate, 1e-9)
        return LinkCosts.of(self.size, rates, rate, alpha, slow_lat)

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
        before it explains. And a rank with a link measured at its peers' pace is no slow
        NIC, however many of its links are flagged: a healthy rank between a slow NIC and a
        slow link into it holds three flagged links, in and out, to two peers."""
        held = {r: sum(r in f.link for f in flagged) for r in range(self.size)}
        slow = {f.link for f in flagged}
        named: set[int] = set()
        for r in sorted(held, key=lambda q: (-held[q], q)):
            if any(r in link and link not in slow for link in self.judged):
                continue
            mine = [f.link for f in flagged if r in f.link and not named & set(f.link)]
            peers = {a if b == r else b for a, b in mine}
            both = {a == r for a, _ in mine} == {True, False}
            if len(mine) >= 3 and len(peers) >= 2 and both:
                named.add(r)
        return named


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


def _renamed(fig: Figures | None, link: Link) -> Figures | None:
    return None if fig is None else fig._replace(link=link)


def relinked(known: Known, link: Link) -> Known:
    """`known` as the link `link` (another generation's ranks), its figures renamed too."""
    return Known(link, _renamed(known.flagged_on, link), _renamed(known.last, link))


def _newest(samples: deque[_Sample], latency: bool, otherwise: float) -> float:
    """A link's newest figures of one kind (of the last beat that carried that kind);
    `otherwise` where none in the window did."""
    for x in reversed(samples):
        if not latency and x.large_bytes:
            return x.large_bytes / max(x.large_seconds, 1e-6)
        frames = x.small_frames + x.queued_frames
        if latency and frames:
            return frames / max(x.small_seconds + x.queued_seconds, 1e-9)
    return otherwise


def _ms(per_second: float) -> str:
    """A latency kept as its inverse, in ms."""
    return f"{1e3 / max(per_second, 1e-9):.2f} ms"


def _mbit(rate: float) -> str:
    return f"{rate * 8 / 1e6:.0f} Mbit/s" if rate * 8 < 1e10 else f"{rate * 8 / 1e9:.1f} Gbit/s"


__all__ = [
    "Cleared",
    "Detector",
    "Figures",
    "Flagged",
    "Known",
    "Link",
    "TestSample",
    "Thresholds",
    "describe",
    "relinked",
]
