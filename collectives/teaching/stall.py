"""The stalled-allreduce scenario as a story for teaching: who waited on whom, and why the
culprit was blamed (`python -m collectives.explain stall`).

Three ranks (or more) run a ring all_reduce in one process (cl.simulate) while the library's
fault injection holds back every message on the links into and out of one rank, as an unstable
network would. The op passes its deadline; the rank that times out first asks for a diagnosis,
which takes a snapshot of every rank -- the op it is in, the peer it waits on, how many
messages it has sent to and taken from each peer -- and blames (diagnose.blame):

  * a link p -> r is *stalled* when r waits on p although p has sent r more messages than r
    has taken (they are somewhere on the wire);
  * the culprits are the fewest ranks that touch every stalled link (evidence.min_covers):
    two slowed links through rank 1 (0 -> 1 and 1 -> 2) point at rank 1 alone, however the
    others happen to wait; where several sets are as small (one link, two ends), probes and
    then a stated rule decide (diagnose.py).

Over ZeroMQ the coordinator takes the same snapshot, evicts the culprit, and the survivors
form a new group (make demo-stall runs that with real processes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from ..common.errors import CollectiveTimeout
from ..membership.diagnose import stalled_links
from ..membership.evidence import named

try:
    from ..membership.diagnose import judge
except ImportError:  # a diagnosis without evidence records
    judge = None  # type: ignore[assignment]
from ..transport.base import Progress
from ..transport.faults import inject_faults
from .simulate import simulate


@dataclass
class Stall:
    n: int
    culprit: int  # the rank whose links were slowed
    seq: int
    states: dict  # rank -> snapshot (see diagnose.py)
    blamed: list
    why: str
    links: list  # stalled links (p, r) as found
    errors: dict  # rank -> what that rank raised
    # what decided the verdict: {"probes": [{"src", "dst", "seconds" (None: no answer)}],
    # "decided_by": a line}, from the verdict where it carries one (evidence_of)
    evidence: dict = field(default_factory=dict)
    slowed: list = field(default_factory=list)  # the links held back


def evidence_of(diagnosis: tuple) -> dict:
    """The evidence a recorded diagnosis (seq, states, culprits, why[, evidence]) carries, in
    one plain shape: {"probes": [{"src", "dst", "seconds"}], "decided_by": str}. A verdict
    without any gives no probes and its reason as the deciding line."""
    why = diagnosis[3]
    raw: Any = diagnosis[4] if len(diagnosis) > 4 else getattr(why, "evidence", None)
    if raw is None:
        return {"probes": [], "decided_by": str(why)}
    if isinstance(raw, msgspec.Struct):  # a Judgement's or a Verdict's protocol.Evidence
        raw = msgspec.structs.asdict(raw)
    if not isinstance(raw, dict):
        raw = vars(raw) if hasattr(raw, "__dict__") else {"probes": raw}
    probes = []
    for pr in raw.get("probes") or ():
        if isinstance(pr, dict):
            src, dst = pr.get("src"), pr.get("dst")
            sec = pr.get("seconds", pr.get("seconds_or_none", pr.get("rtt")))
        else:
            src, dst, sec = tuple(pr)[:3]
        probes.append(
            {"src": int(src), "dst": int(dst), "seconds": None if sec is None else float(sec)}
        )
    return {"probes": probes, "decided_by": str(raw.get("decided_by") or raw.get("decided") or why)}


def run_stall(
    n: int = 3, culprit: int = 1, count: int = 6, timeout: float = 0.5, links: list | None = None
) -> Stall:
    """Run the scenario in-process; the first diagnosis made is the one told. `links`: the
    (src, dst) links to hold back (default: into and out of `culprit`)."""
    if n < 3:
        raise ValueError(
            "explain stall: needs at least 3 ranks (a rank with a slowed link "
            "on each side and a third to tell them apart)"
        )
    if not 0 <= culprit < n:
        raise ValueError(f"explain stall: culprit {culprit} is not a rank of {n}")
    left, right = (culprit - 1) % n, (culprit + 1) % n
    links = [tuple(link) for link in links] if links else [(left, culprit), (culprit, right)]
    for a, b in links:
        if not (0 <= a < n and 0 <= b < n) or a == b:
            raise ValueError(f"explain stall: link {a}->{b} is not a link between two of {n} ranks")
    spec = ";".join(f"delay:{a}->{b}:30s" for a, b in links)
    worlds = []

    def fn(pg):
        worlds.append(pg.transport.world)
        inject_faults(pg, spec)
        x = np.full(count, 1 << pg.rank, np.int64)
        pg.all_reduce(x, algorithm="ring", timeout=timeout)
        return x

    results = simulate(n, fn, timeout=timeout + 5, return_errors=True)
    errors = {r: e for r, e in enumerate(results) if isinstance(e, BaseException)}
    world = worlds[0]
    diagnoses = world.diagnoses
    if not diagnoses or not all(isinstance(e, CollectiveTimeout) for e in errors.values()):
        raise RuntimeError(f"explain stall: the op did not stall as expected: {results!r}")
    seq, states, blamed, why = diagnoses[0][:4]
    # The verdict's evidence: judge() again on the same snapshot and the probe round the
    # diagnosis asked for (the in-process world records both), as the coordinator judged it.
    heard = next((h for q, h in getattr(world, "probes", []) if q == seq), None)
    evidence = evidence_of(diagnoses[0])
    if judge is not None:
        j = judge(seq, states, n, probes=heard)
        evidence = evidence_of((seq, states, j.culprits, j.why, j.evidence))
        evidence["decided_by"] = f"{j.evidence.decided_by or '?'} -- {j.why}"
    story = Stall(
        n, culprit, seq, states, blamed, why, stalled_links(seq, states), errors, evidence
    )
    story.slowed = links
    return story


def text(s: Stall) -> str:
    out = [
        f"Stalled ring all_reduce on {s.n} ranks: link{'s' if len(s.slowed) > 1 else ''} "
        f"{named(s.slowed)} hold{'' if len(s.slowed) > 1 else 's'} back every message (an "
        "unstable network).",
        "",
        f"The snapshot taken when the first rank timed out (op #{s.seq}):",
    ]
    for r in range(s.n):
        st = s.states[r]
        if st is None:
            out.append(f"  rank {r}: did not answer")
            continue
        p = st.waiting_on
        if p is None:
            out.append(f"  rank {r}: waits on nobody")
            continue
        sent = sent_by(s.states[p], s.n)
        took = st.recv or [0] * s.n
        verdict = "STALLED link" if (p, r) in s.links else "nothing lost in flight"
        out.append(
            f"  rank {r} waits on rank {p}: rank {p} has sent it {sent[r]} message(s), "
            f"it has taken {took[p]}  -> {p}->{r}: {verdict}"
        )
    count = {r: sum(r in link for link in s.links) for r in range(s.n)}
    out += [
        "",
        "Stalled links per rank: " + ", ".join(f"rank {r}: {c}" for r, c in count.items()),
        f"Blamed: rank {', '.join(map(str, s.blamed))} -- {s.why}.",
    ]
    probes = s.evidence.get("probes") or []
    if probes:
        out.append(
            "Evidence, every link probed (a timed probe over the data links): "
            + ", ".join(
                f"{p['src']}->{p['dst']} "
                + ("no answer" if p["seconds"] is None else f"{p['seconds'] * 1e3:.0f} ms")
                for p in probes
            )
        )
    out += [
        f"Decided by: {s.evidence.get('decided_by') or s.why}.",
        "Over ZeroMQ the coordinator evicts it; the survivors drop the stalled operation and "
        "form a new group (make demo-stall).",
        "",
    ]
    return "\n".join(out)


def draw(s: Stall, path) -> str:
    """Ranks on a circle; grey arrows: who waits on whom; red arrows: stalled links (messages
    sent but not taken); the blamed rank in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    angle = np.pi / 2 - 2 * np.pi * np.arange(s.n) / s.n
    xy = np.stack([np.cos(angle), np.sin(angle)], 1)
    fig, ax = plt.subplots(figsize=(6.4, 6.0))
    for r in range(s.n):
        bad = r in s.blamed
        ax.add_patch(plt.Circle(xy[r], 0.17, color="#d62728" if bad else "#9ecae1", zorder=3))
        ax.text(
            *xy[r],
            f"rank {r}",
            ha="center",
            va="center",
            zorder=4,
            fontsize=11,
            color="white" if bad else "black",
            weight="bold",
        )

    def arrow(a, b, color, style, label, bend):
        ax.annotate(
            "",
            xy=xy[b],
            xytext=xy[a],
            zorder=2,
            arrowprops=dict(
                arrowstyle="-|>",
                color=color,
                lw=2.4 if style == "-" else 1.4,
                linestyle=style,
                shrinkA=22,
                shrinkB=22,
                connectionstyle=f"arc3,rad={bend}",
            ),
        )
        mid = (xy[a] + xy[b]) / 2
        normal = np.array([xy[b][1] - xy[a][1], xy[a][0] - xy[b][0]])
        pos = mid - bend * 0.75 * normal  # on the side the arc bulges to
        ax.text(
            *pos,
            label,
            ha="center",
            va="center",
            fontsize=8.5,
            color=color,
            bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="none", alpha=0.85),
        )

    for p, r in s.links:
        sent = sent_by(s.states[p], s.n)
        took = taken_by(s.states[r], s.n)
        arrow(p, r, "#d62728", "-", f"stalled {p}->{r}\nsent {sent[r]}, taken {took[p]}", 0.18)
    for r in range(s.n):
        st = s.states[r]
        if st and st.waiting_on is not None and (st.waiting_on, r) not in s.links:
            arrow(r, st.waiting_on, "#555555", "--", f"{r} waits on {st.waiting_on}", -0.18)
    for pr in s.evidence.get("probes") or []:
        if pr["seconds"] is None and (pr["src"], pr["dst"]) not in s.links:
            arrow(pr["src"], pr["dst"], "#1f77b4", ":", "probe: no answer", -0.35)
    ax.text(
        0,
        -1.3,
        f"decided by: {s.evidence.get('decided_by') or s.why}"[:110],
        ha="center",
        fontsize=8,
        color="#1f77b4",
    )
    ax.set_xlim(-1.6, 1.6)
    ax.set_ylim(-1.55, 1.45)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(
        f"Stalled all_reduce, {s.n} ranks: rank {', '.join(map(str, s.blamed))} blamed\n({s.why})",
        fontsize=10,
    )
    ax.text(
        0,
        -1.45,
        "red: stalled link (sent, not taken)   grey dashed: waits on, nothing lost",
        ha="center",
        fontsize=8.5,
        color="#333333",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def sent_by(picture: Progress | None, n: int) -> Sequence[int]:
    """Messages of the op a rank's picture says it sent each peer (none said: zeros)."""
    return (picture.sent if picture is not None else None) or [0] * n


def taken_by(picture: Progress | None, n: int) -> Sequence[int]:
    """Messages of the op a rank's picture says it took from each peer (none said: zeros)."""
    return (picture.recv if picture is not None else None) or [0] * n
