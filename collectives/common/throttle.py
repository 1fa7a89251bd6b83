"""Rate-limited warnings, for whatever arrives from outside: a flood of bad frames or messages
must not become a flood of log lines (or a cost of its own)."""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("collectives")


class Throttle:
    """Rate-limited warnings: at most `burst` lines per kind in any window of `every` seconds;
    the first line after some were left out says how many. Kinds are the caller's fixed
    strings, never data (so the table stays as small as the code that calls it)."""

    def __init__(
        self, logger=log, every: float = 10.0, burst: int = 5, level: int = logging.WARNING
    ):
        self.logger, self.every, self.burst, self.level = logger, every, burst, level
        self._seen: dict[str, list] = {}  # kind -> [window start, lines in it, left out]
        self._lock = threading.Lock()

    def __call__(self, kind: str, msg: str, *args):
        now = time.monotonic()
        with self._lock:
            seen = self._seen.setdefault(kind, [now, 0, 0])
            if now - seen[0] >= self.every:
                seen[0], seen[1] = now, 0
            if seen[1] >= self.burst:
                seen[2] += 1
                return
            seen[1] += 1
            left_out, seen[2] = seen[2], 0
        if left_out:
            msg += f" ({left_out} more like it left out)"
        self.logger.log(self.level, msg, *args)
