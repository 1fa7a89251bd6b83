"""Explain an algorithm by running it (`python -m collectives.explain`): run.py runs and
replays, text.py and drawing.py show, cli.py is the command line."""

from .cli import main, step_interactively
from .drawing import crossover_plot, draw
from .run import crossover, explain_run
from .text import crossover_text, text

__all__ = [
    "explain_run",
    "text",
    "draw",
    "crossover",
    "crossover_text",
    "crossover_plot",
    "step_interactively",
    "main",
]
