"""pyzmq's socket-monitor events as a typed record. pyzmq hands each event as a dict
(zmq.utils.monitor.recv_monitor_message): not a message of ours, and read here only, so
the rest of the library never reads a string key."""

from __future__ import annotations

from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message


@dataclass(frozen=True)
class MonitorEvent:
    kind: int  # zmq.EVENT_*
    value: int  # EVENT_ACCEPTED, EVENT_DISCONNECTED: the connection's fd; a failure: its code
    endpoint: str  # the socket's endpoint the event is about


def next_event(mon: zmq.Socket[bytes], flags: int = 0) -> MonitorEvent:
    """The monitor socket's next event; zmq.Again with NOBLOCK when none is queued."""
    raw = recv_monitor_message(mon, flags)
    return MonitorEvent(
        int(raw["event"]),
        int(raw["value"]),
        bytes(raw.get("endpoint") or b"").decode(errors="replace"),
    )
