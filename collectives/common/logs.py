"""COLLECTIVES_DEBUG, like NCCL_DEBUG: the library's log lines on stderr, off by default.

    WARN   what went wrong and was survived: dropped frames, failed peers, fallbacks
    INFO   plus, once each: the transport chosen per peer, the algorithm chosen per op kind and
           size; and every group change with its timing
    TRACE  plus every message header sent and taken (very verbose: one line per message)

Everything goes through the standard `logging` module, logger "collectives". Its level comes
from COLLECTIVES_DEBUG alone (WARN when unset), never from the root logger: a framework that
sets the root logger to INFO (Ray, Lightning, ...) does not get the per-op INFO lines. A program
that configures logging itself can leave COLLECTIVES_DEBUG unset and set that logger's level
itself (before or after importing collectives).
"""

from __future__ import annotations

import logging
import os
import sys

TRACE = 5
logging.addLevelName(TRACE, "TRACE")
LEVELS = {"WARN": logging.WARNING, "INFO": logging.INFO, "TRACE": TRACE}
_handler: logging.Handler | None = None


def setup(level: str | None) -> None:
    """Send the "collectives" logger's lines of `level` and above to stderr (once); with no
    level, give it WARN (see the module's docstring)."""
    global _handler
    logger = logging.getLogger("collectives")
    if not level:
        # Unset: WARN, on the program's own handlers (it propagates). A level of its own, so
        # that it does not inherit the root logger's; one the program set first is kept.
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)
        return
    logger.setLevel(LEVELS[level])
    if _handler is None:
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(
            logging.Formatter(f"%(asctime)s collectives[{os.getpid()}] %(levelname)s %(message)s")
        )
        logger.addHandler(_handler)
        logger.propagate = False  # not twice where the program logs to stderr too
