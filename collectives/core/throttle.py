"""Rate-limited warnings, for whatever arrives from outside: a flood of bad frames or messages
must not become a flood of log lines (or a cost of its own)."""
from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("collectives")


class Throttle:
    """Rate-limited warnings: at most one line per kind every `every` seconds, the next one
    saying how many were left out. Kinds are the caller's fixed strings, never data."""

    def __init__(self, logger=log, every: float = 10.0, level: int = logging.WARNING):
        self.logger, self.every, self.level = logger, every, level
        self._seen: dict[str, list] = {}
        self._lock = threading.Lock()

    def __call__(self, kind: str, msg: str, *args):
        now = time.monotonic()
        with self._lock:
            seen = self._seen.setdefault(kind, [-1e18, 0])
            if now - seen[0] < self.every:
                seen[1] += 1
                return
            left_out, seen[0], seen[1] = seen[1], now, 0
        if left_out:
            msg += f" ({left_out} more like it left out)"
        self.logger.log(self.level, msg, *args)
