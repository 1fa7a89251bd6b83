"""The client runs the rank machine's request side (membership/client.py, _exchange).

Invariant: a real job's join (and the status it falls back on), diagnosis, outcome,
reconstruct, address exchange and admission go through the rank machine's transitions
(membership/rank.py: on_ask_join, on_ask_status, on_stalled, _on_reply, _on_diagnosis,
on_probes_done, on_ask_outcome, on_ask_reconstruct, on_ask_address, on_ask_admission,
on_abandoned), the ones the simulator's sweep runs; the client only moves
their messages and runs the probe round the machine bounded. In-process: no coordinator; the
client's request socket is stood in for by a script of answers.
"""

from __future__ import annotations

import pytest

from collectives.common.errors import CollectiveError, CollectiveTimeout, Evicted, PeerFailure
from collectives.membership.client import CoordinatorClient
from collectives.membership.protocol import (
    Diagnose,
    Error,
    Evicted as EvictedMsg,
    Info,
    Join,
    JoinRequest,
    Outcome,
    Probe,
    Probed,
    Reconstruct,
    Regroup,
    Report,
    Status,
    StatusAnswer,
    Unchanged,
    Unformed,
    Verdict,
    Welcome,
    decode_request,
)
from collectives.transport.base import Progress

pytestmark = [pytest.mark.fast, pytest.mark.timeout(20)]

HANDED = Progress(7, 4, True, 2, (1, 0, 3), (0, 0, 2), False, ((3, 1),), (0.5, None, 0.25))


class _Transport:
    rank, size, generation, failure = 1, 3, 7, None


class _Socket:
    """The request socket: keeps what is sent; answers each ask with the script's next
    answers (a function of the ask)."""

    def __init__(self, script):
        self.script = script
        self.asked: list = []
        self.queued: list = []

    def send(self, data, deadline, op):
        msg = decode_request(data)
        self.asked.append(msg)
        self.queued += self.script(msg)
        return True

    def next_reply(self, wait, op):
        return self.queued.pop(0) if self.queued else None


class _Steps:
    """A clock that moves `step` s at every reading: no test waits in real time."""

    def __init__(self) -> None:
        self.now, self.step = 100.0, 0.001

    def monotonic(self) -> float:
        self.now += self.step
        return self.now

    def time(self) -> float:
        return self.monotonic()


@pytest.fixture
def client():
    c = CoordinatorClient("127.0.0.1:9", 1, 3, keys=None, heartbeat_interval=0.05, clock=_Steps())
    c.transport = _Transport()
    c.link_probes = c.machine.state.link_probes = True
    yield c
    c.close()


def shell(client, monkeypatch, script) -> _Socket:
    sock = _Socket(script)
    monkeypatch.setattr(client, "_send", sock.send)
    monkeypatch.setattr(client, "_next_reply", sock.next_reply)
    return sock


def test_a_diagnosis_probes_as_the_machine_bounds_it_then_blames(client, monkeypatch):
    def script(msg):
        if isinstance(msg, Diagnose):
            # an earlier op's verdict first (skipped), then the probe instruction: a peer out of
            # the group and more bytes than a probe may carry
            return [
                Verdict(seq=4, culprits=[0], why="old", evicted=True, stall=True),
                Probe(seq=5, token=11, peers=[0, 2, 9], bytes=1 << 30, window=99.0),
            ]
        assert isinstance(msg, Probed)
        return [Verdict(seq=5, culprits=[2], why="probes", evicted=True, stall=True)]

    sock = shell(client, monkeypatch, script)
    probed: list = []

    def prober(token, peers, nbytes, window):
        probed.append((token, peers, nbytes, window))
        return {0: 0.01, 2: None}

    culprits, why, evicted = client.diagnose(5, 2, progress=HANDED, prober=prober, timeout=1.0)
    assert (culprits, why, evicted) == ([2], "probes", "stalled")
    assert probed == [(11, [0, 2], 1 << 20, 10.0)]  # rank.MAX_PROBE_BYTES, MAX_PROBE_WINDOW
    ask, report = sock.asked
    assert ask.probe and (ask.report.seq, ask.report.waiting_on) == (5, 2)
    assert ask.report.generation == 7
    assert (report.token, report.seq, report.generation) == (11, 5, 7)
    assert report.heard == [0.01, None, None]


def test_an_error_or_an_eviction_raises_naming_the_op_and_the_rank(client, monkeypatch):
    shell(client, monkeypatch, lambda msg: [Error(message="no such op")])
    with pytest.raises(CollectiveError, match="diagnose: .*no such op") as info:
        client.diagnose(5, 2, progress=HANDED, timeout=1.0)
    assert (info.value.op, info.value.rank) == ("diagnose", 1)
    shell(client, monkeypatch, lambda msg: [EvictedMsg(reason="it stalled")])
    with pytest.raises(Evicted, match="outcome: rank 1 was removed") as ev:
        client.outcome(5, 1.0, HANDED)
    assert list(ev.value.failed_ranks) == [1]


def test_no_answer_ends_at_the_machines_deadline(client, monkeypatch):
    sock = shell(client, monkeypatch, lambda msg: [])
    client.clock.step = 0.5  # the machine's wait, max(2, 4 * 0.05) s, passes in a few readings
    with pytest.raises(CollectiveTimeout, match="diagnose: rank 1: no verdict"):
        client.diagnose(5, 2, progress=HANDED, timeout=0.0)
    assert client.machine.state.pending is None
    assert client.outcome(5, 1.0, HANDED) is None  # nobody can tell in time: None, no error
    assert [type(m) for m in sock.asked] == [Diagnose, Outcome]


def test_a_coordinator_back_is_asked_again_with_how_long_it_waited(client, monkeypatch):
    def script(msg):
        if len(sock.asked) == 1:
            client.link.epoch += 1  # the heartbeat thread saw it come back (restart.py)
            return []
        return [Verdict(seq=5, culprits=[2], why="sent nothing", evicted=False, stall=True)]

    sock = shell(client, monkeypatch, script)
    assert client.diagnose(5, 2, progress=HANDED, timeout=1.0) == ([2], "sent nothing", False)
    first, again = sock.asked
    assert isinstance(again, Diagnose) and again.report == first.report
    assert first.waited == 0.0 and again.waited > 0  # rank._ask_again


def test_a_regroup_and_its_addresses_go_through_the_machine(client, monkeypatch):
    """reconstruct's two requests: the answer counted is the machine's, the roster a
    re-registration names is kept (rank._on_reply), the forming generation is set while the
    address waits and cleared after; an unformed generation raises PeerFailure."""
    mine = Info(tcp="tcp://a:1")
    forming: list = []

    def script(msg):
        if isinstance(msg, Reconstruct):
            return [Unchanged(generation=7), Regroup(generation=8, rank=0, world_size=2)]
        forming.append(client.link.forming)
        return [Welcome(generation=8, infos=[msg.info, mine], members=["m1", "m2"])]

    sock = shell(client, monkeypatch, script)
    monkeypatch.setattr(client, "report", lambda t: Report(generation=7, seq=4, in_op=False))
    # the first answer of a type it waits for counts: nothing changed
    assert client.regroup(7, 1.0, exclude=(2,)) is None
    infos = client.exchange_addresses(8, Info(tcp="tcp://b:2"), 1.0)
    assert [i.tcp for i in infos] == ["tcp://b:2", "tcp://a:1"]
    assert forming == [8] and client.link.forming == -1
    assert client.link.members[8] == ["m1", "m2"]
    ask = sock.asked[0]
    assert isinstance(ask, Reconstruct) and (ask.seq, ask.exclude) == (4, [2])

    unformed = Unformed(generation=9, from_generation=8, failed_ranks=[1], reason="rank 1 died")
    shell(client, monkeypatch, lambda msg: [unformed])
    with pytest.raises(PeerFailure, match="rank 1 died") as info:
        client.exchange_addresses(9, Info(tcp="tcp://b:2"), 1.0)
    assert (info.value.op, info.value.peer, client.link.forming) == ("reconstruct", 1, -1)


def test_a_joiner_waits_to_be_admitted_until_it_gives_up(client, monkeypatch):
    """request_join: the admission the machine counts is taken even once abandoned (it was
    already there); with nothing there, abandon_join ends the wait (rank.Abandoned)."""
    client.transport = None  # a joiner
    admitted = Regroup(generation=3, rank=2, world_size=3)
    sock = shell(client, monkeypatch, lambda msg: [admitted])
    client.abandon_join("SIGTERM")
    assert client.request_join(5.0) == admitted
    (ask,) = sock.asked
    assert isinstance(ask, JoinRequest) and ask.pid is not None and ask.proc

    shell(client, monkeypatch, lambda msg: [])
    with pytest.raises(CollectiveError, match="gave up waiting to be admitted .*: SIGTERM"):
        client.request_join(5.0)
    assert client.machine.state.pending is None


class _Handshakes:
    """The request socket's handshakes (security.HandshakeWatch): one more is a new
    connection, a coordinator that may have forgotten the join."""

    succeeded, handshakes = True, 1

    def poll(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_join_goes_through_the_machine_and_is_sent_again_on_a_new_connection(client, monkeypatch):
    """join: the ask and the answer counted are the machine's (rank.on_ask_join, _on_reply);
    a new handshake of the request socket (the coordinator restarted before the group formed)
    sends the join again (Resume); the roster a re-registration names is kept."""
    client.transport = None  # generation 0: no group yet
    monkeypatch.setattr(client, "handshake", _Handshakes())
    mine = Info(tcp="tcp://a:1")

    def script(msg):
        assert isinstance(msg, Join)
        if len(sock.asked) == 1:
            client.handshake.handshakes += 1  # forgotten with the coordinator that died
            return []
        return [Welcome(generation=0, infos=[mine, msg.info], members=["m0", "m1"])]

    sock = shell(client, monkeypatch, script)
    generation, infos = client.join(Info(tcp="tcp://b:2"), 5.0)
    assert generation == 0 and [i.tcp for i in infos] == ["tcp://a:1", "tcp://b:2"]
    first, again = sock.asked
    assert first == again and (first.rank, first.world_size) == (1, 3) and first.info.pid
    assert client.link.members == {0: ["m0", "m1"]}
    assert client.machine.state.pending is None


def test_a_join_that_times_out_says_who_is_missing(client, monkeypatch):
    """No welcome within the timeout: the machine ends the join (its deadline) and the
    status it then asks names the ranks missing; an error answer raises naming the rank."""
    client.transport = None
    sock = shell(
        client,
        monkeypatch,
        lambda msg: (
            [StatusAnswer(missing=[2], generation=-1, world_size=3)]
            if isinstance(msg, Status)
            else []
        ),
    )
    client.clock.step = 0.5
    with pytest.raises(CollectiveTimeout, match=r"waiting for rank\(s\) 2 to join") as info:
        client.join(Info(tcp="tcp://b:2"), 3.0)
    assert (info.value.op, info.value.rank, info.value.peer) == ("init_process_group", 1, 2)
    assert [type(m) for m in sock.asked] == [Join, Status]

    shell(client, monkeypatch, lambda msg: [Error(message="rank 1 joined twice")])
    with pytest.raises(CollectiveError, match="join: rank 1: .*joined twice") as err:
        client.join(Info(tcp="tcp://b:2"), 3.0)
    assert (err.value.op, err.value.rank) == ("init_process_group", 1)
