"""An ElasticTrainer's progress (elastic.py), shown by rank 0 alone: a live bar on a terminal,
a plain line every few seconds into a log, or nothing (COLLECTIVES_PROGRESS, common/config.py);
and the messages that must not tear the bar."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from ..common import config

if TYPE_CHECKING:
    from ..group.group import ProcessGroup

PROGRESS_LINE_S = 5.0  # progress style "lines": one line this often (common/config.py)


class TrainingProgress:
    """Mixed into ElasticTrainer (elastic.py), whose position and group it shows."""

    if TYPE_CHECKING:  # what ElasticTrainer (elastic.py) provides, for mypy only
        pg: ProcessGroup
        progress: bool
        epoch: int
        epochs: int
        pos: int
        global_batch: int
        _bar: Any
        _style: str | None
        _last_line: float

        @property
        def iters(self) -> int: ...
        @property
        def steps_per_epoch(self) -> int: ...

    def _show(self, loss, acc):
        if not self.progress:
            return
        if self.pg.rank != 0:
            if self._bar is not None:
                self._bar.close()
                self._bar = None
            return
        if self._style is None:
            self._style = config.progress_style()  # bar, lines or off (common/config.py)
        if self._style == "off":
            return
        done = self.epoch * self.steps_per_epoch + min(
            self.steps_per_epoch, -(-self.pos // self.global_batch)
        )
        if self._style == "lines":
            # Not a terminal (a log, CI): a plain line every few seconds, never a \r bar.
            now = time.monotonic()
            total = self.epochs * self.steps_per_epoch
            if now - self._last_line >= PROGRESS_LINE_S or done >= total:
                self._last_line = now
                print(
                    f"[collectives] train {done}/{total} loss {loss:.3f} acc {acc:.3f} "
                    f"world {self.pg.world_size} gen {self.pg.generation}",
                    file=sys.stderr,
                    flush=True,
                )
            return
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(
                total=self.epochs * self.steps_per_epoch,
                initial=self.iters,
                desc="train",
                dynamic_ncols=True,
                file=sys.stderr,
            )
        self._bar.n = self.epoch * self.steps_per_epoch + min(
            self.steps_per_epoch, -(-self.pos // self.global_batch)
        )
        self._bar.set_postfix(
            loss=f"{loss:.3f}",
            acc=f"{acc:.3f}",
            world=self.pg.world_size,
            gen=self.pg.generation,
            refresh=False,
        )
        self._bar.refresh()

    def _write(self, msg):
        if self._bar is not None:
            self._bar.write(msg, file=sys.stderr)
        else:
            print(msg, file=sys.stderr, flush=True)
