"""Ending a ZeroMQ context without hanging the caller (the transport's and the coordinator
link's, membership/client.py)."""

from __future__ import annotations

from typing import Any

import logging
import threading

import zmq

log = logging.getLogger("collectives")


def term_context(ctx: zmq.Context[Any], timeout: float, what: str) -> bool:
    """ctx.term() with a deadline. It runs on a daemon thread of its own: term() blocks
    until every socket of the context is closed, and makes a thread blocked in ZeroMQ on one
    of them raise ContextTerminated, but a thread stuck elsewhere keeps its socket (a
    heartbeat loop, a socket monitor) -- then the context is left to the process exit
    (logged) instead of hanging the caller. True if the context terminated in time."""
    done = threading.Thread(target=ctx.term, name="collectives-term", daemon=True)
    done.start()
    done.join(timeout)
    if done.is_alive():
        log.warning(
            "%s: its ZeroMQ context did not terminate within %g s (a socket is "
            "still open); left to the process exit",
            what,
            timeout,
        )
        return False
    return True
