"""What the member's background side -- the heartbeat thread (heartbeat.py) and the
re-registration with a restarted coordinator (restart.py) -- reads of its coordinator client
(client.py): declared here, apart from both, so that neither imports the other to name it."""

from __future__ import annotations

import threading
from typing import Any, Protocol

import zmq

from ..group.schedbook import ScheduleBook
from .clock import Clock
from .link import LinkState
from .protocol import Report


class Beating(Protocol):
    """What the heartbeat thread reads of its member's coordinator link (client.py)."""

    address: str
    clock: Clock  # the client's (clock.py)
    mid: str  # this member's id (identity.py)
    heartbeat_interval: float
    heartbeat_timeout: float
    link: LinkState
    stopping: threading.Event  # set: the thread ends
    beat_sent: threading.Event  # set: the thread's first beat went out
    transport: Any  # this generation's transport (None: a joiner, not in a group yet)
    # this generation's schedule book (group/schedbook.py), which its group reads and the
    # heartbeat writes; set before `transport`, so a book read after it is as new or newer
    book: ScheduleBook | None

    def new_socket(self) -> zmq.Socket[bytes]:
        """A socket to the coordinator that proves this member's key."""
        ...

    def report(self, transport: Any) -> Report:
        """This member's progress, as a beat carries it."""
        ...

    def who(self) -> str:
        """'rank r' or 'a joiner (pid p)', for messages."""
        ...
