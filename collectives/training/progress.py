"""An ElasticTrainer's progress (elastic.py), shown by rank 0 alone: a live bar on a terminal,
a plain line every few seconds into a log, or nothing (COLLECTIVES_PROGRESS, common/config.py);
and the messages that must not tear the bar. The trainer holds one (ElasticTrainer.display)
and calls it after every step."""

from __future__ import annotations

import sys
import time
from typing import Any, Protocol

from ..common import config

PROGRESS_LINE_S = 5.0  # progress style "lines": one line this often (common/config.py)


class Position(Protocol):
    """What TrainingProgress reads of its trainer (elastic.py, ElasticTrainer)."""

    @property
    def progress(self) -> bool: ...  # show anything at all

    @property
    def pg(self) -> Any: ...  # its group: rank, world_size, generation

    @property
    def epoch(self) -> int: ...

    @property
    def epochs(self) -> int: ...

    @property
    def pos(self) -> int: ...  # global position in this epoch's permutation

    @property
    def global_batch(self) -> int: ...

    @property
    def steps_per_epoch(self) -> int: ...

    @property
    def iters(self) -> int: ...


class TrainingProgress:
    """What rank 0 shows of an ElasticTrainer's position and group; owns the bar (or the
    time of the last plain line) and the style chosen."""

    def __init__(self, trainer: Position):
        self.trainer = trainer
        self.bar: Any = None  # tqdm's bar, once shown
        self.style: str | None = None  # bar, lines or off: chosen at the first step shown
        self.last_line = 0.0  # when style "lines" printed last

    def show(self, loss, acc):
        """After a step: its mean loss and accuracy, with the position and the group."""
        tr = self.trainer
        if not tr.progress:
            return
        if tr.pg.rank != 0:
            if self.bar is not None:
                self.bar.close()
                self.bar = None
            return
        if self.style is None:
            self.style = config.progress_style()  # bar, lines or off (common/config.py)
        if self.style == "off":
            return
        done = tr.epoch * tr.steps_per_epoch + min(
            tr.steps_per_epoch, -(-tr.pos // tr.global_batch)
        )
        if self.style == "lines":
            # Not a terminal (a log, CI): a plain line every few seconds, never a \r bar.
            now = time.monotonic()
            total = tr.epochs * tr.steps_per_epoch
            if now - self.last_line >= PROGRESS_LINE_S or done >= total:
                self.last_line = now
                around = tr.pg.rerouted  # fail-slow: the schedule around slow links, if any
                print(
                    f"[collectives] train {done}/{total} loss {loss:.3f} acc {acc:.3f} "
                    f"world {tr.pg.world_size} gen {tr.pg.generation}"
                    + (f" rerouted: {around}" if around else ""),
                    file=sys.stderr,
                    flush=True,
                )
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(
                total=tr.epochs * tr.steps_per_epoch,
                initial=tr.iters,
                desc="train",
                dynamic_ncols=True,
                file=sys.stderr,
            )
        self.bar.n = tr.epoch * tr.steps_per_epoch + min(
            tr.steps_per_epoch, -(-tr.pos // tr.global_batch)
        )
        self.bar.set_postfix(
            loss=f"{loss:.3f}",
            acc=f"{acc:.3f}",
            world=tr.pg.world_size,
            gen=tr.pg.generation,
            refresh=False,
            **({"rerouted": tr.pg.rerouted} if tr.pg.rerouted else {}),
        )
        self.bar.refresh()

    def write(self, msg):
        """Print `msg` to stderr without tearing the bar."""
        if self.bar is not None:
            self.bar.write(msg, file=sys.stderr)
        else:
            print(msg, file=sys.stderr, flush=True)

    def close(self):
        """Close the bar, if one is shown (the end of fit())."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
