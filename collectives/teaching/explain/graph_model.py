"""The vocabulary of the failure views' model (views.py): the colours of a process's state and
of a link, places on a circle, a node, the ring's links."""

from __future__ import annotations

import math
from typing import Any

ALIVE, DEAD, STOPPED, BLAMED, JOINER, COORD = (
    "#9ecae1",
    "#333333",
    "#bdbdbd",
    "#d62728",
    "#74c476",
    "#fdd0a2",
)
RED, GREY, BLUE, GREEN = "#d62728", "#555555", "#1f77b4", "#2ca02c"
CX, CY, R = 260.0, 200.0, 135.0


def circle(n: int) -> list:
    return [
        (
            CX + R * math.cos(math.pi / 2 - 2 * math.pi * r / n),
            CY - R * math.sin(math.pi / 2 - 2 * math.pi * r / n),
        )
        for r in range(n)
    ]


def node(
    label: str, xy: Any, color: str = ALIVE, sub: str = "", text: str = "#000", **kw: Any
) -> dict:
    return {
        "label": label,
        "sub": sub,
        "color": color,
        "text": text,
        "x": round(xy[0], 1),
        "y": round(xy[1], 1),
        **kw,
    }


def ring_links(ranks: list, color: str = GREY) -> list:
    """The ring's links between the given node indices (in rank order)."""
    k = len(ranks)
    return (
        [
            {
                "src": ranks[i],
                "dst": ranks[(i + 1) % k],
                "color": color,
                "dashed": False,
                "label": "",
                "bend": 0.12,
            }
            for i in range(k)
        ]
        if k > 1
        else []
    )
