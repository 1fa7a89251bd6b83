"""Which ops may lend registered buffers (zmq/registered.py) instead of copying them: a rule of
the schedules, read by every OpChannel (channel.py) whatever its transport.
"""

from __future__ import annotations

from .wire import Descriptor

# The (kind, algorithm) pairs whose schedules may lend. A lend completes only when its reader
# has used it, so a rank that writes a region it lent waits for that peer -- which deadlocks if
# the peer reads it only after it got something this rank sends after the write (direct
# all_reduce: everyone lends its buffer, then receives into it). In these schedules a rank
# writes a region it sent only after the reader's own schedule has used it unconditionally
# earlier (ring: the reduce-scatter step before; tree and naive: the reduce phase before the
# broadcast), so the wait always ends. Any other op sends as before (slots, sockets).
LENDING = {
    ("all_reduce", "ring"),
    ("all_reduce", "tree"),
    ("all_reduce", "naive"),
    ("reduce", "tree"),
    ("broadcast", "tree"),
    ("all_gather", "ring"),
    ("reduce_scatter", "ring"),
}


def may_lend(desc: Descriptor | None) -> bool:
    """Whether the op an OpChannel describes may lend registered memory instead of copying it
    (see LENDING)."""
    return desc is not None and (desc.kind, desc.algorithm) in LENDING


__all__ = ["LENDING", "may_lend"]
