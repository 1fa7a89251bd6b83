"""What a coordinator's transition may do outside its state: the machine's effects.

A transition (machine.py and the parts it calls) returns what it wants done in an `Outbox`:
a message to send to a client's routing id (`Send`), a process for the crash witnesses to
watch (`Watch`), a line for the coordinator's log (`Note`), a transition that raised and
halted the machine (`Halt`: then the only effect). The I/O shell (server.py) carries them
out. Its own module, below state.py: a part the State holds (reroute.py's Reroute) writes
these effects too, and must not import what holds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from .protocol import AnyReply

Mid = str  # a member id: the fingerprint of the member's own key (identity.py)
Ident = bytes  # a client's routing id on the coordinator's socket: where an answer goes


@dataclass(frozen=True)
class Send:
    """Send `msg` to the client at routing id `to`."""

    to: Ident
    msg: AnyReply


@dataclass(frozen=True)
class Watch:
    """The crash witnesses should watch this member's process (its process key)."""

    mid: Mid
    proc: str


@dataclass(frozen=True)
class Note:
    """Something happened: for the coordinator's log and its events."""

    what: str
    warn: bool = False  # worth a warning (a slow link flagged), not just a line
    detail: bool = False  # for the debug log only, not one of the coordinator's events


@dataclass(frozen=True)
class Halt:
    """A transition raised: the machine dropped every effect of the event it was applying and
    halted (machine.Halted), its state possibly half changed. The shell logs it and starts the
    coordinator afresh; the members re-register as after a crash (recovery.py)."""

    during: str  # the event, or the piece of the periodic work, that raised
    error: Exception


Effect = Union[Send, Watch, Note, Halt]


@dataclass
class Outbox:
    """What the transitions of one event want done, in order. The shell carries it out."""

    effects: list[Effect] = field(default_factory=list)

    def send(self, to: Ident, msg: AnyReply) -> None:
        if to:  # b"": no connection known yet (a member that has not beaten)
            self.effects.append(Send(to, msg))

    def watch(self, mid: Mid, proc: object) -> None:
        if isinstance(proc, str):
            self.effects.append(Watch(mid, proc))

    def note(self, what: str, warn: bool = False, detail: bool = False) -> None:
        self.effects.append(Note(what, warn, detail))

    def sent(self) -> list[Send]:
        return [e for e in self.effects if isinstance(e, Send)]
