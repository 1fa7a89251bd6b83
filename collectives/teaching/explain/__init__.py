"""Explain an algorithm by running it (`python -m collectives.explain`)."""
from .run import (crossover, crossover_plot, crossover_text, draw, explain_run, main,
                  step_interactively, text)

__all__ = ["explain_run", "text", "draw", "crossover", "crossover_text", "crossover_plot",
           "step_interactively", "main"]
