"""The failure views (`python -m collectives.explain stall|crash|reconstruct|join`): each a
sequence of moments, built from what the run recorded (teaching/stall.py's diagnosis,
teaching/failures.py's events), drawn as a row of panels (PNG) and played by the page of
html.py -- the same model for both.

A model is {"kind": "graph", "title", "legend", "frames": [...], "summary"}; a frame is
{"title", "note", "nodes": [{label, sub, color, text, x, y, bold, dashed, hidden}],
"arrows": [{src, dst, color, dashed, label, bend}], "text": [lines]}, with nodes in a fixed
order (one per process, the coordinator last) so that a process keeps its place while its
rank changes.

The views live in stall_view.py (stall) and failure_views.py (crash, reconstruct, join), on
the vocabulary of graph_model.py; panels.py draws a model, text() below tells it. This module
is where callers (cli.py, the tutorial) find them all.
"""

from __future__ import annotations

from .failure_views import crash_model, join_model, reconstruct_model
from .graph_model import ALIVE, BLAMED, BLUE, COORD, DEAD, GREEN, GREY, JOINER, RED, STOPPED
from .panels import draw_panels
from .stall_view import stall_model


def text(model: dict) -> str:
    """A model told in lines: each moment's title and note, then its text indented."""
    out = [model["title"], ""]
    for i, f in enumerate(model["frames"]):
        out.append(f"{i}. {f['title']}" + (f" -- {f['note']}" if f.get("note") else ""))
        out += [f"     {ln}" if ln else "" for ln in f.get("text", [])]
    return "\n".join(out) + "\n"


__all__ = [
    "stall_model",
    "crash_model",
    "reconstruct_model",
    "join_model",
    "draw_panels",
    "text",
    "ALIVE",
    "DEAD",
    "STOPPED",
    "BLAMED",
    "JOINER",
    "COORD",
    "RED",
    "GREY",
    "BLUE",
    "GREEN",
]
