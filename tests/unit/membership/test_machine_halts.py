"""A transition that raises halts the coordinator's machine (machine.Halted): none of the
raising event's effects leave, its state is not trusted again (every later event is refused
with a note), and the shell (server.py) starts the coordinator afresh at the same address."""

from __future__ import annotations

import time

import msgpack
import pytest
import zmq

from collectives.membership import machine
from collectives.membership.clock import RealClock
from collectives.membership.machine import Arrived, Tick
from collectives.membership.protocol import Bye, Status, StatusAnswer, pack
from collectives.membership.server import Coordinator
from collectives.membership.state import Halt, Note, Outbox, Send, State

from support.machine import Driver
from support.timing import scaled

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]


class Broken(RuntimeError):
    pass


def half_done(s: State, out: Outbox, ident: bytes, msg: Status, now: float) -> None:
    """A transition that queues a send, a watch and a note, then raises half-way."""
    out.send(ident, Bye())
    out.watch("m0", "proc-key")
    out.note("half of a change")
    raise Broken("half-way")


def test_the_raising_events_effects_never_leave_and_later_events_are_refused(monkeypatch):
    d = Driver(2)
    d.join_all()
    monkeypatch.setitem(machine.HANDLERS, Status, half_done)
    effects = d.machine.feed(Arrived(b"x", Status()), d.now)
    assert [type(e) for e in effects] == [Halt], effects  # no Send, Watch or Note of it
    [halt] = effects
    assert isinstance(halt.error, Broken) and halt.during == "a 'status' request"
    assert d.machine.halted is not None and "half-way" in d.machine.halted.reason
    monkeypatch.undo()  # the handler is sound again: the machine still refuses
    for event in (Arrived(b"x", Status()), Tick()):
        [note] = d.machine.feed(event, d.now + 1)
        assert isinstance(note, Note) and note.what.startswith("refused"), note


def test_a_periodic_piece_that_raises_halts_the_machine_too(monkeypatch):
    d = Driver(2)
    d.join_all()

    def noisy_then_broken(s: State, out: Outbox, now: float) -> None:
        out.note("would have been said")
        raise Broken("tick")

    monkeypatch.setattr(machine, "PERIODIC", (*machine.PERIODIC, noisy_then_broken))
    effects = d.machine.feed(Tick(sweep=False), d.now)
    assert [type(e) for e in effects] == [Halt]
    assert effects[0].during == "the periodic work noisy_then_broken"


def test_a_sound_event_keeps_its_effects():
    d = Driver(2)
    effects = d.machine.feed(Arrived(b"x", Status()), d.now)
    assert [type(e) for e in effects] == [Send] and d.machine.halted is None


class Stamped(RealClock):
    """The real monotonic clock (the loop's deadlines), and wall time of the test's own."""

    def time(self) -> float:
        return 42.0


def test_the_shell_starts_afresh_at_the_same_address_and_serves_on(monkeypatch):
    coord = Coordinator("127.0.0.1", 0, world_size=2, keys=None, clock=Stamped()).start()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(f"tcp://{coord.address}")
        first = coord.machine
        monkeypatch.setitem(machine.HANDLERS, Status, half_done)
        sock.send(pack(Status()))
        deadline = time.monotonic() + scaled(10.0)
        while coord.machine is first:
            assert time.monotonic() < deadline, "the coordinator did not start afresh"
            time.sleep(0.01)
        assert first.halted is not None and coord.machine.halted is None
        # its record, stamped by the clock it was given (membership/clock.py)
        assert [at for at, what in coord.events if "starts afresh" in what] == [42.0]
        assert sock.poll(int(scaled(0.1) * 1000)) == 0  # the halted event's answer never left
        monkeypatch.undo()
        sock.send(pack(Status()))  # the same connection, made again to the new listener
        assert sock.poll(int(scaled(10.0) * 1000)), "no answer after the restart"
        answer = msgpack.unpackb(sock.recv())
        assert answer["t"] == str(StatusAnswer.__struct_config__.tag)
        assert answer["missing"] == [0, 1]
    finally:
        sock.close()
        ctx.term()
        coord.stop()
