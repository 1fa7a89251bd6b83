"""The stall view (`python -m collectives.explain stall`): teaching/stall.py's story as a
sequence of moments -- the ring, the slowed links, who waits on whom, the stalled links, the
probes, the verdict (the model: views.py)."""

from __future__ import annotations

from typing import Any

from ..stall import sent_by, taken_by
from .graph_model import ALIVE, BLAMED, BLUE, GREY, RED, circle, node, ring_links


def stall_model(s: Any) -> dict:
    """Moments of teaching/stall.py's story: the ring, the slowed links, who waits on whom,
    the stalled links, the probes (when the verdict carries them), the verdict."""
    n = s.n
    xy = circle(n)

    def nodes(blamed: Any = ()) -> list:
        return [
            node(
                f"rank {r}",
                xy[r],
                BLAMED if r in blamed else ALIVE,
                text="#fff" if r in blamed else "#000",
                bold=r in blamed,
            )
            for r in range(n)
        ]

    slowed = [
        {"src": a, "dst": b, "color": RED, "dashed": False, "label": "held back", "bend": 0.12}
        for a, b in s.slowed
    ]
    waits, lines = [], []
    for r in range(n):
        st = s.states[r]
        if st and st.waiting_on is not None:
            p = st.waiting_on
            sent = sent_by(s.states[p], n)[r]
            took = (st.recv or [0] * n)[p]
            waits.append(
                {
                    "src": r,
                    "dst": p,
                    "color": GREY,
                    "dashed": True,
                    "label": f"waits on {p}",
                    "bend": -0.18,
                }
            )
            lines.append(f"rank {r} waits on rank {p}: rank {p} sent it {sent}, it took {took}")
    stalled = []
    for p, r in s.links:
        sent = sent_by(s.states[p], n)[r]
        took = taken_by(s.states[r], n)[p]
        stalled.append(
            {
                "src": p,
                "dst": r,
                "color": RED,
                "dashed": False,
                "label": f"stalled: sent {sent}, taken {took}",
                "bend": 0.12,
            }
        )
    probes, plines = [], []
    for pr in s.evidence.get("probes", []):
        sec = pr.get("seconds")
        label = "no answer" if sec is None else f"{sec * 1e3:.0f} ms"
        plines.append(f"probe {pr['src']}->{pr['dst']}: {label}")
        if sec is None:  # the links the probes found slow; the others answered
            probes.append(
                {
                    "src": pr["src"],
                    "dst": pr["dst"],
                    "color": BLUE,
                    "dashed": True,
                    "label": "probe: no answer",
                    "bend": -0.3,
                }
            )
    decided = s.evidence.get("decided_by") or s.why
    frames = [
        {
            "title": f"ring all_reduce on {n} ranks (op #{s.seq})",
            "nodes": nodes(),
            "arrows": ring_links(list(range(n))),
            "text": ["each rank sends to its right neighbour"],
            "note": "the ring's links",
        },
        {
            "title": f"link(s) {', '.join(f'{a}->{b}' for a, b in s.slowed)} hold every "
            "message back",
            "nodes": nodes(),
            "arrows": slowed,
            "note": "an unstable network (fault injection)",
            "text": [" and ".join(f"delay:{a}->{b}" for a, b in s.slowed)],
        },
        {
            "title": "the op passes its deadline: a snapshot of who waits on whom",
            "nodes": nodes(),
            "arrows": waits,
            "text": lines,
            "note": "each rank's op, peer, messages sent and taken",
        },
        {
            "title": "stalled links: sent but not taken",
            "nodes": nodes(),
            "arrows": stalled,
            "text": [f"stalled {p}->{r}" for p, r in s.links] or ["no stalled link"],
            "note": "a message on the wire for longer than the deadline",
        },
    ]
    if plines:
        frames.append(
            {
                "title": "evidence: every link probed",
                "nodes": nodes(),
                "arrows": probes,
                "text": plines,
                "note": "a timed probe over each data link; blue: not heard",
            }
        )
    frames.append(
        {
            "title": f"verdict: rank {', '.join(map(str, s.blamed))} blamed",
            "nodes": nodes(s.blamed),
            "arrows": stalled + probes,
            "text": [f"decided by: {decided}"],
            "note": f"decided by: {decided}"[:90],
        }
    )
    return {
        "kind": "graph",
        "title": f"Stalled all_reduce, {n} ranks",
        "frames": frames,
        "legend": "red: slowed or stalled link; grey dashed: waits on; blue dashed: a "
        "probe; the blamed rank in red",
        "summary": "",
    }
